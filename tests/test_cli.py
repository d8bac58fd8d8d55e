"""`gradc run` and `gradc show`: output, exit codes, no tracebacks."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsl.cli import main

ROOT = Path(__file__).resolve().parent.parent
LOG1PEXP = str(ROOT / "examples" / "log1pexp.grad")


def test_run_prints_value_and_gradient(capsys):
    assert main(["run", LOG1PEXP, "log1pexp", "100"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["log1pexp = 100.0", "d/dx = 1.0"]


def test_run_with_lists_npy_and_wrt(tmp_path, capsys):
    np.save(tmp_path / "y.npy", np.array([4.0, 5.0]))
    bar = str(ROOT / "examples" / "bar.grad")
    assert main(["run", bar, "bar", "[1, 2]", str(tmp_path / "y.npy"), "--wrt", "y"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "bar = [ 4., 10.]"
    assert out[1] == "d/dy = [1., 2.]"


@pytest.mark.parametrize("argv,text", [
    (["run", LOG1PEXP, "nope", "1"], "no function 'nope'"),
    (["run", "/nonexistent.grad", "f", "1"], "no such file"),
    (["run", str(ROOT / "examples" / "bar.grad"), "bar", "[1, 2]", "[1, 2, 3]"],
     "do not broadcast"),
])
def test_user_errors_exit_1(argv, text, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert text in err
    assert "Traceback" not in err


def test_syntax_error_prints_caret(tmp_path, capsys):
    bad = tmp_path / "bad.grad"
    bad.write_text("def f(x):\n    return x +* 2\n")
    assert main(["run", str(bad), "f", "1"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{bad}:2:15: error: syntax error")
    assert err[1].strip() == "return x +* 2"
    assert err[2].index("^") == err[1].index("*")


def test_usage_errors_exit_2(capsys):
    assert main(["run", LOG1PEXP, "log1pexp", "not-a-number"]) == 2
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def test_show_ir_and_kernels_are_deterministic(capsys):
    outputs = []
    for _ in range(2):
        assert main(["show", LOG1PEXP, "--emit", "grad-ir"]) == 0
        assert main(["show", LOG1PEXP, "--emit", "kernels"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert "func @log1pexp_value_and_grad" in outputs[0]
    assert "def k_log1pexp_0(n, in0, out0):" in outputs[0]


def test_console_script_runs_without_traceback():
    result = subprocess.run([sys.executable, "-m", "dsl.cli", "run", LOG1PEXP, "log1pexp",
                             "0"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["log1pexp = 0.6931471805599453", "d/dx = 0.5"]
