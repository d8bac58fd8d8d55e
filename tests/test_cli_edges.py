"""`gradc` on unusual input, each case a hole found by an adversarial pass
over the command line: arguments NumPy cannot hold, programs with no
kernels, odd file names, bad options.  In-process (`dsl.cli.main`)."""
from __future__ import annotations

from pathlib import Path

import pytest

from dsl.cli import main

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
    (tmp_path / "scale.grad").write_text("def f(x, n: i64):\n    return x * n\n")
    code, _, err = run(["run", str(tmp_path / "scale.grad"), "f", "1.0", str(2**64)], capsys)
    assert code == 1 and "argument 'n' of f() is out of range: it holds an integer beyond " \
        "64 bits" in err


@pytest.mark.parametrize("emit,name", [("llvm", "pool"), ("grad-llvm", "pool_value_and_grad")])
def test_llvm_of_a_program_with_no_kernels_says_so(emit, name, capsys):
    # printed nothing: every step of segment_pool's programs is a runtime call
    code, out, _ = run(["show", str(ROOT / "examples" / "segment_pool.grad"), "--emit", emit],
                       capsys)
    assert code == 0
    assert out == f"; {name} has no kernels: its driver does every step (--emit kernels " \
        "shows it)\n"
