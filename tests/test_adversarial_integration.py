"""Holes found by adversarial testing of gradlang's ways in: the `gradc`
command line, imports of `.grad` files and of compiled modules, and the
bridges to PyTorch, JAX and Dask."""

import importlib
import re
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import dsl
from dsl.aot import compile_module
from dsl.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_reloading_a_recompiled_module_runs_the_new_source(tmp_path, monkeypatch):
    source = tmp_path / "scaled.grad"
    source.write_text("def f(x):\n    return x * 2.0\n")
    compile_module(str(source), str(tmp_path), ["f(f64[:])"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "scaled", raising=False)
    import scaled
    np.testing.assert_array_equal(scaled.f(np.ones(2)), [2.0, 2.0])
    source.write_text("def f(x):\n    return x * 7.0\n")
    compile_module(str(source), str(tmp_path), ["f(f64[:])"])
    importlib.reload(scaled)
    np.testing.assert_array_equal(scaled.f(np.ones(2)), [7.0, 7.0])
    np.testing.assert_array_equal(scaled.functions["f"](np.ones(2)), [7.0, 7.0])
    np.testing.assert_array_equal(scaled.f.grad(np.ones(2)), [7.0, 7.0])


LOG1PEXP = str(EXAMPLES / "log1pexp.grad")


@pytest.mark.parametrize("argv,text", [
    (["check", LOG1PEXP, "--seed", "-1"], "--seed"),
    (["show", LOG1PEXP, "--emit", "ir", "--sig", "nope(f64[:])"], "names no function"),
    # sample arguments that NumPy cannot make (run once to compile now)
    (["compile", LOG1PEXP, "--sig", "log1pexp(f64[99999999999999999999999])"],
     "cannot compile 'log1pexp(f64[99999999999999999999999])': argument 'x' of type "
     "f64[99999999999999999999999] needs more memory than can be addressed"),
    (["compile", LOG1PEXP, "--sig", f"log1pexp(f64[{', '.join(['1'] * 65)}])"],
     "cannot compile 'log1pexp(f64["),
])
def test_bad_flags_are_usage_errors_without_a_traceback(argv, text, tmp_path, capsys):
    try:
        status = main(argv + (["-o", str(tmp_path)] if argv[0] == "compile" else []))
    except SystemExit as exit:  # argparse's own usage errors
        status = exit.code
    assert status == 2
    err = capsys.readouterr().err
    assert "error: " in err and text in err, err
    assert "Traceback" not in err
    assert not list(tmp_path.glob("*.py"))  # no module written


def test_show_llvm_of_a_gradient_compiles_the_kernels_of_loop_bodies_too(capsys):
    """Each kernel of the program (of a `for` loop's body, forward and
    backward, too) with the argument types of a loop it runs."""
    path = str(EXAMPLES / "rnn.grad")
    assert main(["show", path, "--emit", "grad-kernels"]) == 0
    kernels = set(re.findall(r"^def (k_[0-9a-f]+)\(", capsys.readouterr().out, re.M))
    assert main(["show", path, "--emit", "grad-llvm"]) == 0
    shown = re.findall(r"^; kernel (k_[0-9a-f]+) \(", capsys.readouterr().out, re.M)
    assert sorted(shown) == sorted(kernels) and kernels


POLY = str(EXAMPLES / "linear_poly.grad")


@pytest.mark.parametrize("params,text", [
    ([], "linear_poly() reads param 'weights', which is not set; set it with "
         "--param weights=VALUE"),
    (["--param", "weights=[1, 2, 3]"], "--param weights: param 'weights' has size 3 on axis 0, "
                                       "but its annotation says 2"),
    (["--param", "weights=[[1, 2]]"], "--param weights: param 'weights' has rank 2"),
])
def test_a_param_run_cannot_use_is_a_usage_error_about_the_flag(params, text, capsys):
    # these were `error: ...` with exit status 1, and the unset param's
    # advice was Python's (module.params[...] = ...)
    assert main(["run", POLY, "linear_poly", "1", *params]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gradc: error: ") and text in err and "weights()" not in err, err


def test_a_compiled_module_warns_when_its_source_changed_since(tmp_path, monkeypatch):
    """It keeps running what was compiled (it needs no source), but says
    so when the .grad file it was compiled from, or one it imports, is
    there and differs (an edited import once said nothing); an unchanged
    or absent source says nothing."""
    source, helper = tmp_path / "src" / "drifted.grad", tmp_path / "src" / "drift_helper.grad"
    source.parent.mkdir()
    source.write_text("from drift_helper import g\ndef f(x):\n    return g(x) * 2.0\n")
    helper.write_text("def g(x):\n    return x\n")
    compile_module(str(source), str(tmp_path / "out"), ["f(f64[:])"])
    monkeypatch.syspath_prepend(str(tmp_path / "out"))

    def fresh_import():
        monkeypatch.delitem(sys.modules, "drifted", raising=False)
        return importlib.import_module("drifted")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh_import()
    helper.write_text("def g(x):\n    return x + 1.0\n")
    with pytest.warns(RuntimeWarning, match=r"drift_helper\.grad has changed since gradc "
                                            r"compiled this module \(drifted\)"):
        fresh_import()
    helper.write_text("def g(x):\n    return x\n")
    source.write_text("def f(x):\n    return x * 3.0\n")
    with pytest.warns(RuntimeWarning, match=r"drifted\.grad has changed since gradc compiled "
                                            r"this module.*gradc compile"):
        stale = fresh_import()
    np.testing.assert_array_equal(stale.f(np.ones(1)), [2.0])
    source.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh_import()


def test_a_copied_module_warns_about_its_own_source_not_a_file_of_that_name(tmp_path,
                                                                            monkeypatch):
    """The warning follows the .grad file the module was compiled from: a
    copy of the output directory beside an unrelated file of the source's
    name warned that this file "has changed" (the module kept the path
    from its directory only).  Now it says nothing while the source is
    unchanged, warns about the source once that changed, and, once that is
    gone, about the file at its place beside the copy, saying so."""
    source = tmp_path / "a" / "copied.grad"
    source.parent.mkdir()
    source.write_text("def f(x):\n    return x * 2.0\n")
    compile_module(str(source), str(tmp_path / "a" / "out"), ["f(f64[:])"])
    shutil.copytree(tmp_path / "a" / "out", tmp_path / "b" / "out")
    unrelated = tmp_path / "b" / "copied.grad"
    unrelated.write_text("def other(x):\n    return x\n")
    monkeypatch.syspath_prepend(str(tmp_path / "b" / "out"))

    def warnings_of_import() -> list[str]:
        monkeypatch.delitem(sys.modules, "copied", raising=False)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module("copied")
        assert Path(module.__file__).parent == tmp_path / "b" / "out"
        return [str(w.message) for w in caught]
    assert warnings_of_import() == []
    source.write_text("def f(x):\n    return x * 3.0\n")
    assert warnings_of_import() == [
        f"{source.resolve()} has changed since gradc compiled this module (copied) from it, "
        "which runs what was compiled then; compile it again with gradc compile"]
    source.unlink()
    assert warnings_of_import() == [
        f"{unrelated} differs from the .grad file gradc compiled this module (copied) from, "
        f"{source.resolve()}, which is gone; it is at that file's place beside the module: if "
        "it is that file, moved and edited, compile it again with gradc compile (the module "
        "runs what was compiled then)"]


def test_check_of_a_directory_and_a_function_checks_it_where_it_is_defined(tmp_path, capsys):
    # the first file without it was an error, so no file after it was checked
    (tmp_path / "a.grad").write_text("def f(x):\n    return sin(x)\n")
    (tmp_path / "b.grad").write_text("def g(x):\n    return x * x\n")
    assert main(["check", str(tmp_path), "--fn", "g", "--order", "1"]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "b.grad") in out and str(tmp_path / "a.grad") not in out
    assert re.search(r"^\s+g\s+f64\s+1\s+x\s.*\sok", out, re.M), out
    assert main(["check", str(tmp_path), "--fn", "h"]) == 2
    assert capsys.readouterr().err == f"gradc: error: no function 'h' in any .grad file of " \
                                      f"{tmp_path}\n"


def test_run_takes_negative_numbers_in_exponent_notation(capsys):
    # argparse took "-1e3" for an unknown option (its pattern of negative
    # numbers has no exponent): "unrecognized arguments"
    bar = str(EXAMPLES / "bar.grad")
    assert main(["run", bar, "bar", "-1e3", "-2.5E-1", "--wrt", "0"]) == 0
    assert capsys.readouterr().out.splitlines() == ["bar = 250.0", "d/dx = -0.25"]


def test_a_signature_of_unrelated_sizes_that_must_agree_says_to_name_them(capsys):
    argv = ["show", str(EXAMPLES / "bar.grad"), "--emit", "ir", "--sig"]
    assert main(argv + ["bar(f64[:], f64[:])"]) == 1
    err = capsys.readouterr().err
    assert "do not broadcast" in err and "note: each ':' in a signature is a size of its " \
        "own" in err and "f(f64[n], f64[n])" in err, err
    assert main(argv + ["bar(f64[n], f64[n])"]) == 0


def test_a_const_label_array_does_not_turn_the_signature_hint_into_a_value_hint(tmp_path,
                                                                                 capsys):
    # labels `const i64[n]` made the note say "a const integer used as an
    # axis or index needs its value in the signature, e.g. labels given as 1"
    # (an array of labels has no one value) instead of naming the sizes
    path = tmp_path / "mlp.grad"
    path.write_text("def loss(x, w, labels: const i64[n]):\n"
                    "    return sum(take_along_axis(x @ w, labels[:, None], axis=1))\n")
    assert main(["show", str(path), "--emit", "ir", "--sig",
                 "loss(f64[:, :], f64[:, :], i64[:])"]) == 1
    err = capsys.readouterr().err
    assert "needs its value" not in err and "note: each ':' in a signature is a size of its " \
        "own" in err, err
    assert main(["show", str(path), "--emit", "ir", "--sig",
                 "loss(f64[n, d], f64[d, c], i64[n])"]) == 0


def test_a_signature_hint_follows_the_note_of_a_called_function(tmp_path, capsys):
    # the note naming the call into add() took the place of the hint
    path = tmp_path / "helper.grad"
    path.write_text("def add(a, b):\n    return a + b\n\ndef f(x, y):\n    return sum(add(x, y))\n")
    assert main(["show", str(path), "--emit", "ir", "--sig", "f(f64[:], f64[:])"]) == 1
    assert capsys.readouterr().err.splitlines()[3:] == [
        f"note: in add(), called at {path}:5:16",
        "note: a0, a1: the sizes ':'s of the signature stand for (numbered from a0, in order)",
        "note: each ':' in a signature is a size of its own, which need not equal any other; "
        "name the sizes that must agree, as in f(f64[n], f64[n])"]


def test_signatures_differing_only_in_fixed_sizes_each_keep_their_program(tmp_path,
                                                                            monkeypatch):
    # programs were picked by dtype and rank: the last of f(f64[3]) and
    # f(f64[4]) replaced the other, and a call of 3 elements failed
    source = tmp_path / "sized.grad"
    source.write_text("def f(x):\n    return x * 2.0\n")
    compile_module(str(source), str(tmp_path), ["f(f64[3])", "f(f64[4])", "f(f32[:])"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "sized", raising=False)
    import sized
    for n in (3, 4):
        np.testing.assert_array_equal(sized.f(np.arange(n, dtype=float)), 2 * np.arange(n))
        np.testing.assert_array_equal(sized.f.grad(np.arange(n, dtype=float)), np.full(n, 2.0))
        _, pullback = sized.f.vjp(np.arange(n, dtype=float))
        np.testing.assert_array_equal(pullback(np.ones(n))[0], np.full(n, 2.0))
    np.testing.assert_array_equal(sized.f(np.ones(7, np.float32)), np.full(7, 2.0))
    with pytest.raises(dsl.ArgumentError, match=r"f\(\) was compiled for f\(f32\[:\]\), "
                                                r"f\(f64\[3\]\), f\(f64\[4\]\); this call is "
                                                r"f\(f64\[5\]\)"):
        sized.f(np.ones(5))


def test_check_of_a_directory_reports_a_broken_file_and_checks_the_others(tmp_path, capsys):
    # the first file that did not load ended the run: nothing else was checked
    (tmp_path / "a_broken.grad").write_text("def f(x):\n    return y\n")
    (tmp_path / "b.grad").write_text("def g(x):\n    return x * x\n")
    assert main(["check", str(tmp_path), "--order", "1"]) == 1
    captured = capsys.readouterr()
    assert re.search(r"^\s+g\s+f64\s+1\s+x\s.*\sok", captured.out, re.M), captured.out
    assert f"{tmp_path / 'a_broken.grad'}:2:12: error: name 'y'" in captured.err


@pytest.mark.parametrize("argv,status,text", [
    # both printed nothing and exited 0
    (["--emit", "ast", "--fn", "nope"], 2, "no function 'nope'"),
    (["--emit", "ir", "--fn", "log1pexp", "--sig", "other(f64[:])"], 2,
     "no --sig is of --fn log1pexp"),
])
def test_show_of_nothing_is_an_error(argv, status, text, tmp_path, capsys):
    source = tmp_path / "two.grad"
    source.write_text((EXAMPLES / "log1pexp.grad").read_text()
                      + "\ndef other(x):\n    return x\n")
    assert main(["show", str(source), *argv]) == status
    captured = capsys.readouterr()
    assert text in captured.err and not captured.out


def test_arguments_after_wrt_are_a_usage_error_saying_where_they_go(capsys):
    # --wrt takes every word after it: the arguments went to it, and the
    # error was "bar() is missing argument 'x'"
    assert main(["run", str(EXAMPLES / "bar.grad"), "bar", "--wrt", "0", "2.0", "3.0"]) == 2
    captured = capsys.readouterr()
    assert captured.err == ("gradc: error: --wrt takes names and positions of parameters, got "
                            "'2.0'; give the arguments before --wrt\n") and not captured.out
