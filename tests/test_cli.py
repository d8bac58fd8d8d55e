"""`gradc run` and `gradc show`: output, exit codes, no tracebacks."""

import json
import re
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


def test_run_takes_arguments_by_keyword(capsys):
    # (gamma=0 was "not a number, list or .npy file"): the focal loss at
    # gamma 0 is the mean cross-entropy, mean(log(1 + exp(-s z)))
    focal = str(ROOT / "examples" / "focal_loss.grad")
    z, y = np.array([0.5, -1.0]), np.array([1.0, 0.0])
    assert main(["run", focal, "focal_loss", "[0.5, -1.0]", "y=[1, 0]", "gamma=0"]) == 0
    value, gradient = capsys.readouterr().out.splitlines()
    s = 2 * y - 1
    assert float(value.split(" = ")[1]) == pytest.approx(np.mean(np.logaddexp(0, -s * z)),
                                                         abs=5e-9)  # (printed to 8 digits)
    np.testing.assert_allclose(json.loads(gradient.split(" = ")[1]),
                               -s / (1 + np.exp(s * z)) / 2, rtol=1e-7)
    for argv, text in [(["z=[0.5]", "[1]"], "positional argument '[1]' follows a NAME=VALUE"),
                       (["[0.5]", "y=[1]", "y=[0]"], "argument 'y' is given twice"),
                       (["[0.5]", "q=[1]"], "'q' is not a parameter of the function: it takes "
                                            "z, y, gamma")]:
        assert main(["run", focal, "focal_loss", *argv]) == 2
        assert text in capsys.readouterr().err


def test_a_keyword_argument_may_be_none(tmp_path, capsys):
    # as a positional one may (it was "cannot read argument 'axis' 'None'")
    path = tmp_path / "axis.grad"
    path.write_text("def f(x, axis: const = 0):\n    return sum(x, axis)\n")
    assert main(["run", str(path), "f", "[[1, 2], [3, 4]]", "axis=None"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "f = 10.0"


@pytest.mark.parametrize("argv,text", [
    (["run", str(ROOT / "examples" / "bar.grad"), "bar", "[1, 2]", "[1, 2, 3]"],
     "do not broadcast"),
    # not a position: '\u00b2' passes str.isdigit() but is no number int() reads
    (["run", LOG1PEXP, "log1pexp", "1.0", "--wrt", "\u00b2"], "no parameter '\u00b2'"),
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
    kernel = re.search(r"^def (k_[0-9a-f]{16})\(n, in0, out0\):$", outputs[0], re.M)
    assert kernel and f"K.{kernel[1]}_serial)(" in outputs[0]  # the driver runs it


def test_a_reader_that_goes_away_gets_no_traceback():
    # `gradc show ... | head` printed a BrokenPipeError's traceback
    process = subprocess.Popen([sys.executable, "-m", "dsl.cli", "show", LOG1PEXP, "--emit",
                                "kernels"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=ROOT)
    process.stdout.close()  # before gradc writes: its first write finds no reader
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1
    assert err == ""


def test_console_script_runs_without_traceback():
    result = subprocess.run([sys.executable, "-m", "dsl.cli", "run", LOG1PEXP, "log1pexp",
                             "0"], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["log1pexp = 0.69314718", "d/dx = 0.5"]


EXAMPLE_FILES = sorted((ROOT / "examples").glob("*.grad"))
# what an example's table says besides passing
CHECK_SAYS = {"stylegan_r1": "grad block 2 (line 14)",  # the second block was compared
              "straight_through": "skipped: quantize() is @pass_through"}


# One test per file (the whole directory took a sixth of a cold run on one
# worker): the workers share the examples' compiles.  A directory is
# checked in test_adversarial_integration.
@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda path: path.stem)
def test_check_passes_on_every_example(example, capsys):
    assert set(CHECK_SAYS) <= {path.stem for path in EXAMPLE_FILES}
    assert main(["check", str(example)]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out
    assert CHECK_SAYS.get(example.stem, "") in out


def test_check_compiles_each_transform_once(monkeypatch):
    # `check` evaluates every transform at many points: each program is
    # lowered and compiled once, not once per point.
    import dsl
    import dsl.function
    from dsl.check import check_gradients
    builds = []
    real = dsl.function.build_stored
    monkeypatch.setattr(dsl.function, "build_stored",
                        lambda key, *a: builds.append(key) or real(key, *a))
    f = dsl.load(LOG1PEXP).log1pexp
    for point in (0.5, -2.0):
        check_gradients(f, np.array([point, 1.0]))
        if point == 0.5:
            first = len(builds)
    assert first > 0 and len(builds) == first


def test_check_names_the_wrong_block(tmp_path, capsys):
    tf_doc = (ROOT / "examples" / "linear_poly.grad").read_text().replace(
        "stack([sum(dpoly), sum(dpoly * x)])", "stack([sum(dpoly * x), sum(dpoly)])")
    (tmp_path / "tf.grad").write_text(tf_doc)
    assert main(["check", str(tmp_path / "tf.grad")]) == 1
    err = capsys.readouterr().err
    assert "linear_poly(): the order-1 gradient w.r.t. weights from grad block 1 (line 7)" in err

    leaky = (ROOT / "examples" / "leaky_relu.grad").read_text().replace("dy * alpha)", "dy * 0.3)")
    (tmp_path / "leaky.grad").write_text(leaky)
    assert main(["check", str(tmp_path / "leaky.grad"), "--order", "1"]) == 1
    assert "grad block 1 (line 5)" in capsys.readouterr().err


def test_compile_writes_a_module_that_needs_no_compiler(tmp_path):
    out = tmp_path / "out"
    assert main(["compile", str(LOG1PEXP), "-o", str(out), "--sig", "log1pexp(f64[:])"]) == 0
    script = f"""
import sys
sys.path.insert(0, {str(out)!r})
from numba.core import event
compiles = []
class Listener(event.Listener):
    def on_start(self, ev): compiles.append(ev)
    def on_end(self, ev): pass
event.register("numba:compile", Listener())
import numpy as np, log1pexp
x = np.linspace(-5, 1000, 9)
v, g = log1pexp.log1pexp.value_and_grad(x)
import json
print(json.dumps([v.tolist(), g.tolist(), log1pexp.log1pexp(x).tolist()]))
print("lark" in sys.modules, any(m.split(".")[0] == "compiler" for m in sys.modules), len(compiles))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    import json
    import dsl
    data, flags = result.stdout.splitlines()
    values, grads, plain = json.loads(data)
    m = dsl.load(LOG1PEXP)
    x = np.linspace(-5, 1000, 9)
    v, g = dsl.value_and_grad(m.log1pexp)(x)
    assert values == v.tolist() and grads == g.tolist() and plain == v.tolist()
    assert flags == "False False 0"
