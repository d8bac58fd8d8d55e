"""`gradc` on unusual input, each case a hole found by an adversarial pass
over the command line: arguments NumPy cannot hold, programs with no
kernels, odd file names, bad options.  In-process (`dsl.cli.main`), but for
the one that needs a real stdout."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import dsl
import dsl.cli
from dsl.cli import main
from helpers import import_compiled

ROOT = Path(__file__).resolve().parent.parent
LOG1PEXP = str(ROOT / "examples" / "log1pexp.grad")


def run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_an_integer_beyond_64_bits_is_a_float_argument_or_a_clear_error(tmp_path, capsys):
    # Each was "argument '...' is not a numeric array" (NumPy holds it as an
    # object), though a float argument takes it as `float()` makes it.
    code, out, _ = run(["run", LOG1PEXP, "log1pexp", f"[{-2**64}, 1]"], capsys)
    assert code == 0 and out.splitlines()[1] == "d/dx = [0.        , 0.73105858]"
    code, _, err = run(["run", LOG1PEXP, "log1pexp", str(10**400)], capsys)
    assert code == 2
    assert err == ("gradc: error: argument '10000000000000000000...00000000000000000000' is "
                   "out of range for f64: it holds an integer beyond 1.797693e+308\n")
    # for an integer, one message, the range, on either side of it: 2**63
    # (which NumPy holds as a uint64) said the range, -2**63 - 1 and 2**64
    # (as objects) "an integer beyond 64 bits"
    scale = tmp_path / "scale.grad"
    scale.write_text("def f(x, n: i64):\n    return x * n\n")
    for n in (2**63, -2**63 - 1, 2**64):
        code, _, err = run(["run", str(scale), "f", "1.0", str(n)], capsys)
        assert code == 1 and err.split("\n")[0] == (
            f"{scale}:1:5: error: argument 'n' of f() is out of range for i64: its values must "
            "lie in [-9223372036854775808, 9223372036854775807]"), err


@pytest.mark.parametrize("emit,name", [("llvm", "pool"), ("grad-llvm", "pool_value_and_grad")])
def test_llvm_of_a_program_with_no_kernels_says_so(emit, name, capsys):
    # printed nothing: every step of segment_pool's programs is a runtime call
    code, out, _ = run(["show", str(ROOT / "examples" / "segment_pool.grad"), "--emit", emit],
                       capsys)
    assert code == 0
    assert out == f"; {name} has no kernels: its driver does every step (--emit kernels " \
        "shows it)\n"


@pytest.mark.parametrize("argv,message", [
    (["run", LOG1PEXP, "nope", "1"], f"no function 'nope' in {LOG1PEXP} (it defines: log1pexp)"),
    (["show", str(ROOT / "examples" / "linear_poly.grad"), "--fn", "weights", "--emit", "ir"],
     f"'weights' is a param of {ROOT / 'examples' / 'linear_poly.grad'}, not a function "
     "(it defines: linear_poly)"),
    (["check", LOG1PEXP, "--fn", "nope"], "no function 'nope'"),
])
def test_naming_no_function_is_a_usage_error(argv, message, capsys):
    # was a user error at FILE:1:1 with no line to show (exit 1), while a
    # directory's `check --fn nope` was a usage error (exit 2)
    code, _, err = run(argv, capsys)
    assert code == 2 and err.startswith(f"gradc: error: {message}")


def test_an_argument_error_shows_the_line_of_the_def(tmp_path, capsys):
    # printed only FILE:LINE:COL: error: ..., without the line and caret
    path = tmp_path / "scale.grad"
    path.write_bytes(b"# scale\r\ndef scale(x, k):\r\n    return x * k\r\n")
    np.save(tmp_path / "x.npy", np.array([1, 2], np.int8))
    code, _, err = run(["run", str(path), "scale", str(tmp_path / "x.npy"), "2"], capsys)
    assert code == 1
    assert err.split("\n") == [
        f"{path}:2:5: error: argument 'x' of scale() has unsupported dtype int8; use "
        "float32, float64, int32, int64 or bool", "    def scale(x, k):", "        ^^^^^", ""]


def test_a_file_that_is_not_npy_says_so(tmp_path, capsys):
    # NumPy's message: "This file contains pickled (object) data ..."
    (tmp_path / "x.npy").write_text("1.0\n")
    code, _, err = run(["run", LOG1PEXP, "log1pexp", str(tmp_path / "x.npy")], capsys)
    assert code == 2 and err == f"gradc: error: cannot read {tmp_path / 'x.npy'}: it is not " \
        "a .npy file\n"


@pytest.mark.parametrize("command", [["check"], ["show", "--emit", "ast"],
                                     ["show", "--emit", "ir"], ["show", "--emit", "kernels"]])
def test_a_file_with_no_functions_says_so(tmp_path, capsys, command):
    # check printed a table header with no rows, show nothing at all
    empty = tmp_path / "empty.grad"
    empty.write_text("param w: f64\n")
    code, out, _ = run([command[0], str(empty), *command[1:]], capsys)
    assert code == 0 and out == f"{empty}\n  (it defines no functions)\n"
    if command[-1] in ("ir", "kernels"):  # (the AST takes no signature)
        # a --sig names a function, which the file lacks: a usage error, as before
        code, _, err = run(["show", str(empty), *command[1:], "--sig", "f(f64)"], capsys)
        assert code == 2 and "names no function" in err, err


@pytest.mark.parametrize("source,argv,message", [
    ("def f(x, y):\n    return x * y\n", ["1", "2", "--wrt", "5"],
     "wrt=5 is out of range: f() has 2 parameter(s)"),
    ("def f(x, n: i64):\n    return x * n\n", ["1.5", "2", "--wrt", "n"],
     "cannot differentiate f() with respect to 'n': it is of dtype i64"),
])
def test_a_gradient_that_fails_prints_no_value_first(source, argv, message, tmp_path, capsys):
    # the value was printed, then the error: output that looked like a result
    (tmp_path / "f.grad").write_text(source)
    code, out, err = run(["run", str(tmp_path / "f.grad"), "f", *argv], capsys)
    assert code == 1 and out == "" and message in err


@pytest.mark.parametrize("sig", ["bar(f64[a0], f64[:])", "bar(f64[:], f64[a0])"])
def test_a_size_named_like_an_any_size_is_not_it(sig, capsys):
    # ':' is named a0, a1, ... inside: a size the user named a0 was the same
    # size, and bar compiled for x and y of one size, which the signature
    # does not say (each call with other sizes then failed)
    code, out, err = run(["show", str(ROOT / "examples" / "bar.grad"), "--emit", "ir",
                          "--sig", sig], capsys)
    assert code == 1 and out == "" and "do not broadcast" in err


def test_a_result_too_big_for_memory_is_an_error_not_a_traceback(capsys):
    # pool's result has m rows: NumPy's MemoryError left as a traceback, then
    # said as "out of memory: Unable to allocate 14.6 TiB" with no place;
    # now refused before it is allocated, at the expression making it
    pool = ROOT / "examples" / "segment_pool.grad"
    code, out, err = run(["run", str(pool), "pool", "[[1, 2], [3, 4]]", "[0, 1]",
                          str(10**12)], capsys)
    assert code == 1 and out == ""
    lines = err.split("\n")
    assert lines[0].startswith(f"{pool}:5:12: error: pool(): its result would be "
                               "f64[1000000000000, 2], 14.6 TiB, which cannot be allocated: "
                               "this machine's memory (with swap) has ")
    assert lines[1:] == ["        return segment_sum(x, seg, m)", " " * 15 + "^" * 22, ""]
    # beyond what a byte count can hold: a usage error of the same form
    code, out, err = run(["run", str(pool), "pool", "[[1, 2], [3, 4]]", "[0, 1]",
                          str(2**62)], capsys)
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.startswith(f"{pool}:5:12: error: pool(): its result would be f64[{2**62}, 2]: "
                          f"{2**63} elements of 8 bytes, a byte count beyond")


def test_an_index_out_of_range_is_an_error_at_its_line(capsys):
    # was "error: index 5 in 'seg' (at FILE:5:12) is out of range ...": no
    # position of its own, so no line and caret either
    pool = ROOT / "examples" / "segment_pool.grad"
    code, out, err = run(["run", str(pool), "pool", "[[1, 2], [3, 4]]", "[0, 5]", "2"], capsys)
    assert code == 1 and out == ""
    assert err.split("\n") == [
        f"{pool}:5:12: error: index 5 in 'seg' is out of range for an axis of size 2 "
        "(valid: -2 to 1)", "        return segment_sum(x, seg, m)", " " * 15 + "^" * 22, ""]


def test_a_size_a_signature_leaves_symbolic_is_an_error_at_the_expression_needing_it(
        tmp_path, capsys):
    # the position was found (NeedsConcrete's span) and then not printed: a
    # --sig error shows its message alone, here "f() cannot be compiled..."
    # with no line of the function's body
    path = tmp_path / "pooled.grad"
    path.write_text("def helper(x):\n    return max_pool2d(x, 2)\n\n"
                    "def f(x):\n    return helper(x * 2.0)\n")
    for command in (["compile", str(path), "-o", str(tmp_path)], ["show", str(path), "--emit", "ir"]):
        code, out, err = run(command + ["--sig", "f(f64[n, c, h, w])"], capsys)
        assert code == 2 and out == ""
        assert err.split("\n") == [
            f"{path}:2:12: error: f() cannot be compiled for any size: max_pool2d() of "
            "symbolic spatial sizes; give concrete sizes in --sig, e.g. "
            "f(f64[128, 128, 128, 128])", "        return max_pool2d(x, 2)",
            " " * 15 + "^" * 16, ""]


def test_a_slices_length_is_named_in_a_message_as_what_it_is(tmp_path, capsys):
    # (it was named `n\u00b7less1`, the driver's name of the size)
    path = tmp_path / "last.grad"
    path.write_text("def f(x):\n    y = x[1:]\n    return y[-1] * 2.0\n")
    code, out, err = run(["compile", str(path), "-o", str(tmp_path), "--sig", "f(f64[n])"],
                         capsys)
    assert code == 2 and out == ""
    assert err.split("\n")[0] == (
        f"{path}:3:12: error: f() cannot be compiled for any size: axis 0 of size "
        "max(0, n - 1) is indexed from its end; give concrete sizes in --sig, e.g. "
        "f(f64[128])")


def test_a_size_needed_in_an_imported_function_is_an_error_at_the_call_leading_there(
        tmp_path, capsys):
    # the expression needing it is in lib.grad: the error is at the line of
    # main.grad that calls into it (it was at main's `def f`)
    # (x[n // 2:]: a slice from a number of n, which a slice needs known)
    (tmp_path / "lib.grad").write_text("def shifted(x):\n"
                                       "    return x[x.shape[0] // 2:] * 2.0\n")
    path = tmp_path / "main.grad"
    path.write_text("from lib import shifted\n\ndef f(x):\n    return sum(shifted(x * 2.0))\n")
    code, out, err = run(["compile", str(path), "-o", str(tmp_path), "--sig", "f(f64[n])"],
                         capsys)
    assert code == 2 and out == ""
    assert err.split("\n")[1:] == ["        return sum(shifted(x * 2.0))",
                                    " " * 19 + "^" * 16, ""]


@pytest.mark.parametrize("stem", ["numpy", "math", "gradlang", "dsl", "torch", "__main__",
                                  "__init__"])
def test_compile_refuses_a_module_that_would_shadow_an_import(stem, tmp_path, capsys):
    # numpy.py beside the kernels: every module compiled there then failed to
    # import (the kernels' `import numpy` found it); a __main__.py or
    # __init__.py was written that no import reaches
    (tmp_path / f"{stem}.grad").write_text("def f(x):\n    return x\n")
    code, out, err = run(["compile", str(tmp_path / f"{stem}.grad"), "-o",
                          str(tmp_path / "out")], capsys)
    assert code == 2 and out == "" and not (tmp_path / "out").exists()
    assert err.startswith(f"gradc: error: cannot write a module named {stem}: ")


def test_an_interrupt_ends_quietly(monkeypatch, capsys):
    # Ctrl-C in a long `gradc check` printed a KeyboardInterrupt traceback

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(dsl.cli, "cmd_check", interrupted)
    assert run(["check", LOG1PEXP], capsys) == (130, "", "gradc: interrupted\n")


def test_an_f32_scalar_prints_in_its_own_precision(tmp_path, capsys):
    # printed its f64 digits: 1.31326162815094 for the f32 1.3132616
    np.save(tmp_path / "one.npy", np.float32(1.0))
    code, out, _ = run(["run", LOG1PEXP, "log1pexp", str(tmp_path / "one.npy")], capsys)
    assert code == 0 and out.splitlines() == ["log1pexp = 1.3132616", "d/dx = 0.7310586"]
    # the text reads back as the very value
    assert np.float32(out.split()[2]) == dsl.load(LOG1PEXP).log1pexp(np.float32(1.0))


def test_compile_onto_a_file_says_it_is_one(tmp_path, capsys):
    # "cannot create the output directory FILE: File exists"
    (tmp_path / "out").write_text("")
    code, _, err = run(["compile", LOG1PEXP, "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and err == f"gradc: error: the output directory {tmp_path / 'out'} is " \
        "a file\n"


def test_check_of_a_directory_skips_a_subdirectory_named_like_a_module(tmp_path, capsys):
    # "cannot read DIR/sub.grad: [Errno 21] Is a directory", and exit 1
    (tmp_path / "sub.grad").mkdir()
    (tmp_path / "f.grad").write_text("def f(n: i64):\n    return n\n")
    code, out, err = run(["check", str(tmp_path)], capsys)
    assert (code, err) == (0, "") and "skipped: no differentiable arguments" in out



def test_check_of_a_function_infinite_at_every_point_says_so(tmp_path, capsys):
    # it said "skipped: no differentiable arguments" of x: an integer
    # taken by value is held at 0 at every point (x.shape[n] at rank 1),
    # and dividing by it made every value infinite
    (tmp_path / "f.grad").write_text("def f(x, n: i64):\n    return sum(x) / n * x.shape[n]\n")
    code, out, err = run(["check", str(tmp_path / "f.grad")], capsys)
    assert (code, err) == (0, "") and "skipped: not finite at any point tried" in out

def test_a_bad_param_value_names_the_param(capsys):
    # was "argument '[1, 2j]' is complex": the run's arguments were fine
    code, _, err = run(["run", str(ROOT / "examples" / "linear_poly.grad"), "linear_poly", "1",
                        "--param", "weights=[1, 2j]"], capsys)
    assert code == 2 and err == "gradc: error: --param weights '[1, 2j]' is complex; " \
        "gradlang computes with real numbers\n"
    # a param given twice is a usage error (the last value silently won)
    code, _, err = run(["run", str(ROOT / "examples" / "linear_poly.grad"), "linear_poly", "1",
                        "--param", "weights=[1, 2]", "--param", " weights=[3, 4]"], capsys)
    assert code == 2 and err == "gradc: error: --param weights is given twice\n"


def test_an_odd_file_name_goes_through_every_command(tmp_path, capsys):
    # quotes, braces, a newline and non-ASCII in the name, which drivers hold
    # (an index error's place) and compiled modules record: each repr()'d
    path = tmp_path / "q'x\"{n}\n\u00fc.grad"
    path.write_text("def pick(x, i: i64[k]):\n    return x[i] * 2.0\n")
    code, out, _ = run(["run", str(path), "pick", "[1.5, 2.5]", "[1, 1]"], capsys)
    assert code == 0 and out.splitlines() == ["pick = [5., 5.]", "d/dx = [0., 4.]"]
    code, _, err = run(["run", str(path), "pick", "[1.5, 2.5]", "[2]"], capsys)
    # (the newline shown as U+FFFD: a file name's controls do not reach the terminal)
    shown = str(path).replace("\n", "\ufffd")
    assert code == 1 and err.startswith(f"{shown}:2:12: error: index 2 in 'i' is out of range")
    assert run(["show", str(path), "--emit", "kernels"], capsys)[0] == 0
    assert run(["check", str(path), "--order", "1"], capsys)[0] == 0
    out_dir = tmp_path / "out {x}"
    code, out, err = run(["compile", str(path), "-o", str(out_dir), "--sig",
                          "pick(f64[:], i64[:])"], capsys)
    assert code == 0 and out == f"wrote {out_dir / path.stem}.py\n".replace("\n", "\ufffd", 1)
    # (it said nothing of the name, which no import statement takes)
    assert err.startswith(f"note: {path.stem!r} is no name an import statement takes")
    spec = importlib.util.spec_from_file_location("odd", out_dir / f"{path.stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.SOURCE == path.name
    np.testing.assert_array_equal(module.pick(np.array([1.5, 2.5]), np.array([0])), [3.0])
    with pytest.raises(dsl.ArgumentError, match=re.escape(f"{shown}:2:12: error: index 2")):
        module.pick(np.array([1.5]), np.array([2]))


def test_a_file_name_gradc_prints_reaches_the_terminal_as_an_errors_does(tmp_path, capsys):
    # printed as it was: an escape sequence acted on the terminal, a newline
    # forged a line, and a name that is not UTF-8 (os.fsdecode's surrogate)
    # was a UnicodeEncodeError traceback on a strict UTF-8 stdout
    name = "a\x1b[2Jb\nwrote x\udcff"
    source = tmp_path / f"{name}.grad"
    try:
        source.write_text("def f(x):\n    return x\n")
    except (OSError, UnicodeEncodeError):
        pytest.skip("this file system takes no such name")
    shown = "a\ufffd[2Jb\ufffdwrote x\ufffd"
    out_dir = tmp_path / "out"
    code, out, _ = run(["compile", str(source), "-o", str(out_dir)], capsys)
    assert code == 0 and out == f"wrote {out_dir}/{shown}.py\n"
    code, out, _ = run(["check", str(source), "--order", "1"], capsys)
    assert code == 0 and out.splitlines()[0] == f"{tmp_path}/{shown}.grad"
    source.write_text("# no functions\n")
    code, out, _ = run(["show", str(source), "--emit", "ir"], capsys)
    assert code == 0 and out.splitlines()[0] == f"{tmp_path}/{shown}.grad"
    code, _, err = run(["run", f"{tmp_path}/{name}.npy", "f", "1"], capsys)
    assert code == 2 and err == f"gradc: error: no such file: {tmp_path}/{shown}.npy\n"


def test_show_ast_of_an_imported_function(tmp_path, capsys):
    # printed nothing (exit 0): only the file's own definitions were looked at
    (tmp_path / "lib.grad").write_text("def g(x):\n    return x * 2.0\n")
    (tmp_path / "main.grad").write_text("from lib import g\ndef h(x):\n    return g(x)\n")
    code, out, _ = run(["show", str(tmp_path / "main.grad"), "--fn", "g", "--emit", "ast"],
                       capsys)
    assert code == 0 and out.startswith("FuncDef(name='g', ") and "Param(name='x'" in out
    assert f"span={tmp_path / 'lib.grad'}:1:" in out


def test_show_ast_checks_each_sig_and_shows_the_functions_they_name(tmp_path, capsys):
    # --emit ast ignored --sig: a malformed one, or one naming no function,
    # printed every function's AST (exit 0)
    (tmp_path / "two.grad").write_text("def f(x):\n    return x\ndef g(y):\n    return y\n")
    two = str(tmp_path / "two.grad")
    code, out, err = run(["show", two, "--emit", "ast", "--sig", "f(f64[3, oops"], capsys)
    assert code == 2 and not out and "cannot read signature 'f(f64[3, oops'" in err
    code, out, err = run(["show", two, "--emit", "ast", "--sig", "h(f64[:])"], capsys)
    assert code == 2 and not out and "names no function" in err
    code, out, _ = run(["show", two, "--emit", "ast", "--sig", "g(f64[:])"], capsys)
    assert code == 0 and out.startswith("FuncDef(name='g'") and "name='f'" not in out


@pytest.mark.parametrize("sig", ["pool(f32[:, :], i64[:], 2)", "pool(f64[:], i64[:], 2)"])
def test_the_any_size_note_comes_only_with_an_error_of_sizes(sig, capsys):
    # "note: each ':' in a signature is a size of its own" followed a dtype
    # or a rank error, which no naming of sizes fixes
    code, _, err = run(["show", str(ROOT / "examples" / "segment_pool.grad"), "--emit", "ir",
                        "--sig", sig], capsys)
    assert code == 1 and "its annotation" in err and "each ':'" not in err
    # (a note says what a size the message names is, where it names one of a ':')
    notes = [line for line in err.splitlines() if line.startswith("note:")]
    assert notes == (["note: a0: the size a ':' of the signature stands for (numbered from a0, "
                      "in order)"] if "[a0]" in err else []), err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_to_a_full_disk_is_an_error_not_a_traceback():
    # an OSError traceback from print (or Python's own complaint at exit)
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "dsl.cli", "run", LOG1PEXP, "log1pexp",
                                 "1"], stdout=full, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert (result.returncode, result.stderr) == (1, "gradc: error: No space left on device\n")


def test_nan_and_inf_are_arguments(tmp_path, capsys):
    # Python literals cannot write them: "cannot read argument 'nan'", and
    # argparse took -inf for an option
    code, out, _ = run(["run", LOG1PEXP, "log1pexp", "[nan, inf, 0]"], capsys)
    assert code == 0 and out.splitlines() == ["log1pexp = [       nan,        inf, 0.69314718]",
                                              "d/dx = [nan, 1. , 0.5]"]
    assert run(["run", LOG1PEXP, "log1pexp", "-inf"], capsys)[:2] == (0, "log1pexp = 0.0\n"
                                                                         "d/dx = 0.0\n")
    (tmp_path / "f.grad").write_text("def f(x, nan):\n    return x * nan\n")  # a name still
    code, out, _ = run(["run", str(tmp_path / "f.grad"), "f", "2", "3", "--wrt", "nan"], capsys)
    assert code == 0 and out.splitlines() == ["f = 6.0", "d/dnan = 2.0"]


def test_show_without_sig_gives_a_const_bool_a_value(tmp_path, capsys):
    # the default signature gave it as the type bool: "signature 'f(f64[n],
    # bool)' gives 'flag' as bool, but it is const", so no --sig, no program
    (tmp_path / "f.grad").write_text("def f(x, flag: const bool):\n    y = x\n    if flag:\n"
                                     "        y = x * 2.0\n    return y\n")
    code, out, _ = run(["show", str(tmp_path / "f.grad"), "--emit", "ir"], capsys)
    assert code == 0 and "mul %x0, 2.0:f64" in out


def test_compile_without_sig_says_where_it_fixed_the_sizes(tmp_path, capsys):
    # pick() indexes an axis from its end, so its default signature is
    # f64[4] (sizes fixed at 4): the module then refused every other size
    # at the call, and compile had said nothing; then it said so without
    # saying why ("(one shared size n)", also of annotated sizes): it names
    # the expression now
    (tmp_path / "fixed.grad").write_text("def pick(x):\n    return x[-2] * x\n"
                                         "def scale(x):\n    return x * 2.0\n")
    code, out, err = run(["compile", str(tmp_path / "fixed.grad"), "-o", str(tmp_path)], capsys)
    assert code == 0 and out == f"wrote {tmp_path / 'fixed.py'}\n"
    assert err == (f"note: no --sig, and pick() compiled for no signature of symbolic sizes "
                   f"({tmp_path / 'fixed.grad'}:2:12: axis 0 of size n is indexed from its "
                   "end): it is compiled for pick(f64[4]) only; give the sizes it is "
                   "called with in --sig (a name for sizes that must agree, an integer for a "
                   "fixed one)\n")
    # a size used as a number that must be known at compile time (the
    # step of an arange), in a function whose sizes are annotated; a
    # float made of a size (`1.0 / x.shape[0]`) is computed at run time,
    # for any size (it too needed its sizes)
    (tmp_path / "scaled.grad").write_text("def scaled(x: f64[m]):\n"
                                          "    return x * (1.0 / x.shape[0])\n"
                                          "def started(x: f64[m]):\n"
                                          "    return arange(0.0, 1.0, 1.0 / x.shape[0])\n")
    code, _, err = run(["compile", str(tmp_path / "scaled.grad"), "-o", str(tmp_path)], capsys)
    assert code == 0 and err == (
        f"note: no --sig, and started() compiled for no signature of symbolic sizes "
        f"({tmp_path / 'scaled.grad'}:4:29: the size m is used as a number): it is compiled "
        "for started(f64[4]) only; give the sizes it is called with in --sig (a name for "
        "sizes that must agree, an integer for a fixed one)\n")
    scaled = import_compiled(tmp_path / "scaled.py")
    for n in (3, 5):
        x = np.arange(1.0, n + 1)
        np.testing.assert_array_equal(scaled.scaled(x), x * (1.0 / n))


def test_compile_without_sig_says_the_error_is_of_its_default_signature(tmp_path, capsys):
    # an embedding's ids are unannotated: every default signature makes them
    # f64, and gradc said only "an index must be an integer array (i32 or
    # i64), not f64" at table[ids], of arguments the user never gave
    (tmp_path / "emb.grad").write_text("def embed(table, ids: const):\n"
                                       "    return sum(table[ids] ** 2)\n")
    code, out, err = run(["compile", str(tmp_path / "emb.grad"), "-o", str(tmp_path)], capsys)
    assert code == 1 and out == ""
    assert err.splitlines() == [
        f"{tmp_path / 'emb.grad'}:2:22: error: an index must be an integer array (i32 or i64), "
        "not f64", "        return sum(table[ids] ** 2)", "                         ^^^",
        "note: no --sig, and embed() compiles for none of the signatures gradc gives a function "
        "by default (f64 arrays for its unannotated parameters, as embed(f64[n], f64[n])): give "
        "the signature it is called with in --sig"]


def test_a_scalar_prints_to_the_digits_an_array_does(tmp_path, capsys):
    # a scalar result printed all 17 digits, the gradient array beside it 8
    (tmp_path / "third.grad").write_text("def s(x):\n    return sum(x * x) / 3.0\n")
    code, out, _ = run(["run", str(tmp_path / "third.grad"), "s", "[1.0, 2.0]"], capsys)
    assert code == 0 and out.splitlines() == ["s = 1.66666667", "d/dx = [0.66666667, 1.33333333]"]
    code, out, _ = run(["run", str(tmp_path / "third.grad"), "s", "[0.0, 3.0]"], capsys)
    assert code == 0 and out.splitlines() == ["s = 3.0", "d/dx = [0., 2.]"]


def test_a_source_that_is_no_regular_file_says_what_it_is(tmp_path, capsys):
    # each was "cannot read PATH", as if its permissions were the matter
    # (`gradc run /dev/stdin` or a shell's `<(...)`, a pipe, is readable)
    (tmp_path / "d.grad").mkdir()
    pipe = tmp_path / "p.grad"
    os.mkfifo(pipe)
    for path, why in ((tmp_path / "d.grad", "it is a directory"),
                      (pipe, r"it is not a regular file \(a pipe or a device\); write the "
                             "source to a file")):
        for argv in (["run", str(path), "f", "1"], ["show", str(path), "--emit", "ast"]):
            code, _, err = run(argv, capsys)
            assert code == 2 and re.fullmatch(rf"gradc: error: cannot read {re.escape(str(path))}"
                                              rf": {why}\n", err), err


def test_compile_of_a_param_used_as_an_axis_says_to_pass_it_as_an_argument(tmp_path, capsys):
    # a module param read as an axis (or a count) cannot be compiled ahead
    # of time for its value; the error said to declare "its argument 'k'"
    # `k: const i64`, which f() has no parameter for (a param has no const)
    (tmp_path / "axis.grad").write_text("param k: i64\ndef f(x):\n    return sum(x, axis=k)\n")
    code, _, err = run(["compile", str(tmp_path / "axis.grad"), "-o", str(tmp_path),
                        "--sig", "f(f64[a, b])"], capsys)
    assert code == 2 and err == (  # (a signature's error, as the argument's is)
        "gradc: error: f() uses the param 'k' as a size or an axis, which a program compiled "
        "ahead of time cannot take at call time; pass it to f() as an argument `k: const i64` "
        "and give its value in the signature\n")


@pytest.mark.parametrize("argv", [["check", ""], ["run", "", "f"], ["show", "", "--emit", "ast"],
                                  ["compile", ""]])
def test_an_empty_path_names_no_file(argv, tmp_path, monkeypatch, capsys):
    # Path('') is '.': `gradc check ''` checked every .grad file of the
    # working directory, and the others said "cannot read : it is a directory"
    (tmp_path / "here.grad").write_text("def f(x):\n    return x\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(argv, capsys)
    assert (code, out, err) == (2, "", "gradc: error: no such file: '' (an empty path)\n")


def test_an_empty_output_directory_names_none(tmp_path, monkeypatch, capsys):
    # `gradc compile f.grad -o ''` wrote f.py into the working directory
    (tmp_path / "here.grad").write_text("def f(x):\n    return x\n")
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["compile", "here.grad", "-o", ""], capsys)
    assert (code, out, err) == (2, "", "gradc: error: no such directory: '' (an empty path)\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["here.grad"]


def test_a_const_slice_step_of_zero_in_a_signature_names_its_argument(tmp_path, capsys):
    # on an axis of symbolic size (a --sig's f64[n]) x[::k] for k = 0 said
    # "slice step cannot be zero", an error in the source, where a call's
    # says it is the argument's value (f5f30a6)
    path = tmp_path / "step.grad"
    path.write_text("def f(x: f64[n], k: const i64):\n    return sum(x[::k])\n")
    code, out, err = run(["show", str(path), "--emit", "ir", "--sig", "f(f64[n], 0)"], capsys)
    assert (code, out) == (1, "")
    assert err.splitlines()[0] == (f"{path}:2:18: error: slice step cannot be zero (the value "
                                   "of argument 'k')")


def test_a_wrt_position_of_more_digits_than_int_reads_is_out_of_range(tmp_path, capsys):
    # int() of over 4300 digits raised ValueError: a traceback
    (tmp_path / "f.grad").write_text("def f(x, y):\n    return x * y\n")
    code, out, err = run(["run", str(tmp_path / "f.grad"), "f", "1", "2", "--wrt", "9" * 5000],
                         capsys)
    assert code == 2 and out == ""
    assert err == (f"gradc: error: --wrt '{'9' * 27}...{'9' * 28}' is out of range: f() has 2 "
                   "parameter(s)\n")


def test_check_prints_a_function_s_error_with_its_source_line_and_caret(tmp_path, capsys):
    # a function that could not be checked had its error printed as one
    # line, each line break shown as U+FFFD: "...shape [3]\ufffd        return
    # stack([d, d])\ufffd               ^^^^^^^^^^^^^"
    path = tmp_path / "shaped.grad"
    path.write_text("def f(x: f64[n]):\n    return sum(x)\ngrad(d):\n    return stack([d, d])\n")
    code, _, err = run(["check", str(path), "--order", "1"], capsys)
    assert code == 1
    assert err.splitlines() == [
        f"{path}:4:12: error: grad block 1 of f() (line 3) returns a cotangent of shape [2] "
        "for 'x', which has shape [3]",
        "        return stack([d, d])",
        "               ^^^^^^^^^^^^^"]


def test_show_ast_prints_a_file_name_as_one_line_without_its_escapes(tmp_path, capsys):
    # the outline's first span wrote the file name as it is: its escape
    # sequence acted on the terminal, and its line break forged a line
    path = tmp_path / "red\x1b[31m\nname.grad"
    path.write_text("def f(x):\n    return x * 2.0\n")
    code, out, _ = run(["show", str(path), "--emit", "ast"], capsys)
    assert code == 0
    assert out.splitlines()[0] == (f"FuncDef(name='f', ret=None, grads=(), decorators=(), "
                                   f"span={tmp_path}/red\ufffd[31m\ufffdname.grad:1:5-1:6,")
