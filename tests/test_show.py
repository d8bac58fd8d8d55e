"""`gradc show --emit STAGE [--target T]`: one choice per pipeline stage,
each printing what that stage (and no later one) made."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dsl.cli import main
from gradlang.compiler import pipeline

ROOT = Path(__file__).resolve().parent.parent
LOG1PEXP = str(ROOT / "examples" / "log1pexp.grad")
DENSE = str(ROOT / "examples" / "dense.grad")
LOSS_SIG = "loss(f64[b, 3], f64[3, 2], f64[2], f64[b, 2])"


def show(capsys, *argv: str) -> str:
    assert main(["show", *argv]) == 0
    return capsys.readouterr().out


def test_emit_choices_are_the_pipeline_stages():
    """Every `--emit` name stops after a stage of `STAGES`, every stage
    after check can be stopped after, and the old names still work."""
    names = [s.name for s in pipeline.STAGES]
    assert names == ["parse", "check", "lower", "autodiff", "inline", "simplify", "cse",
                     "dce", "fuse", "codegen", "load"]
    reached = {pipeline.stage_of(e) for e in pipeline.EMITS}
    assert {stage for stage, _ in reached} == set(names) - {"parse"}
    assert ("autodiff", "grad") in reached and ("autodiff", None) not in reached
    assert {"ast", "ir", "grad-ir", "kernels", "grad-kernels", "llvm"} <= set(pipeline.EMITS)
    assert pipeline.stage_of("grad-ir") == ("dce", "grad")
    assert pipeline.stage_of("jvp-loops") == ("fuse", "jvp")
    parser_choices = next(a.choices for a in _show_parser()._actions if a.dest == "emit")
    assert tuple(parser_choices) == pipeline.EMITS


def _show_parser():
    from dsl.cli import build_parser
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices["show"]


def test_lower_keeps_the_grad_block_as_custom_vjp_until_inline(capsys):
    lowered = show(capsys, LOG1PEXP, "--emit", "lower")
    assert "custom_vjp %x0" in lowered
    assert "func @log1pexp_bwd1(" in lowered and "func @log1pexp_fwd0(" in lowered
    inlined = show(capsys, LOG1PEXP, "--emit", "inline")
    assert "custom_vjp" not in inlined and "bwd" not in inlined
    assert "%e1 = exp %x0" in inlined


def test_jvp_stages_show_the_transposed_block_as_one_loop(capsys):
    loops = show(capsys, LOG1PEXP, "--emit", "jvp-loops")
    assert loops.count("loop ") == 1
    assert "reads %x0, %t_x1 writes %4, %7" in loops
    assert "%7 = mul %t_x1, %6" in loops  # the block, dy * (1 - 1 / (1 + e)), transposed


def test_each_ir_pass_on_the_gradient_shows_its_own_work(capsys):
    """log1pexp's derived gradient: autodiff seeds a ones array and
    recomputes 1 + e; simplify drops the multiply by ones, cse the second
    1 + e, dce the unused ones array."""
    out = {s: show(capsys, LOG1PEXP, "--emit", "grad-" + s)
           for s in ("autodiff", "simplify", "cse", "dce")}
    assert "= full" in out["autodiff"] and "= mul" in out["autodiff"]
    # one call gives the value and the residual e (inlined by simplify)
    assert "%2, %3 = custom_vjp %x0 {n_block = 1, n_out = 2" in out["autodiff"]
    # its bwd for a further differentiation is built only by that (built
    # for every call, it differentiated every body below, first order too)
    assert "bwd_exposed" not in out["autodiff"] and "log1pexp_bwd1" in out["autodiff"]
    assert "%15 = add 1.0:f64, %3" in out["autodiff"]  # the block recomputes 1 + e
    assert "= mul" not in out["simplify"]
    assert out["simplify"].count("add 1.0:f64, %e2") == 2
    assert out["cse"].count("add 1.0:f64, %e2") == 1 and "= full" in out["cse"]
    assert "= full" not in out["dce"]
    assert out["dce"] == show(capsys, LOG1PEXP, "--emit", "grad-ir")


def test_loops_show_each_fused_loop_over_its_shape(capsys):
    out = show(capsys, DENSE, "--fn", "loss", "--emit", "loops", "--sig", LOSS_SIG)
    lines = out.splitlines()
    assert lines[0].startswith("func @loss(")
    # x @ w + b, softplus, err, err * err and its row sum: one loop over
    # the (batch, out) shape, reading the matmul, b and target
    (loop0,) = [l for l in lines if l.strip().startswith("loop 0 ")]
    assert loop0.startswith("  loop 0 over [b, 2] reads %")
    assert "(summed in the loop)" in loop0
    body = lines[lines.index(loop0) + 1:lines.index("  }", lines.index(loop0))]
    ops = [l.split(" = ")[1].split()[0] for l in body]
    assert ops[0] == "add" and "log1p" in ops and ops[-2:] == ["mul", "reduce_sum"]
    assert any(l.strip().startswith("%") and "= matmul" in l for l in lines[:lines.index(loop0)])
    grad = show(capsys, DENSE, "--fn", "loss", "--emit", "grad-loops", "--sig", LOSS_SIG)
    assert grad.startswith("func @loss_value_and_grad(")
    assert grad.count("  loop ") > out.count("  loop ")


def test_target_changes_loops_and_kernels(capsys):
    """CUDA loops do not end in a sum; its kernels are grid-stride loops."""
    argv = [DENSE, "--fn", "loss", "--sig", LOSS_SIG]
    cpu = show(capsys, *argv, "--emit", "kernels", "--target", "cpu")
    assert "prange(" in cpu and "cuda" not in cpu
    cuda = show(capsys, *argv, "--emit", "kernels", "--target", "cuda")
    assert "@cuda.jit" in cuda and "cuda.gridsize(1)" in cuda and "prange" not in cuda
    assert "R.blocks(" in cuda  # the driver launches on a grid
    loops = show(capsys, *argv, "--emit", "loops", "--target", "cuda")
    assert "summed in the loop" not in loops
    assert "= reduce_sum" in loops


def test_unknown_target_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["show", LOG1PEXP, "--emit", "kernels", "--target", "tpu"])
    assert info.value.code == 2
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="a GPU has LLVM IR to show")
def test_llvm_on_the_cuda_simulator_says_why_not(capsys):
    # a target that cannot do what is asked here is a usage error
    assert main(["show", LOG1PEXP, "--emit", "llvm", "--target", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gradc: error: ") and "simulator" in err and "Traceback" not in err


def test_llvm_is_printed_when_numba_cache_is_warm(tmp_path):
    """Numba keeps only machine code in its cache: a kernel loaded from it
    has no LLVM IR, which `show --emit llvm` used to print as nothing."""
    env = {**os.environ, "GRADC_CACHE_DIR": str(tmp_path)}

    def gradc(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dsl.cli", *argv], capture_output=True,
                              text=True, cwd=ROOT, env=env)

    warm = gradc("run", LOG1PEXP, "log1pexp", "[1.0, 2.0]")
    assert warm.returncode == 0, warm.stderr
    assert list((tmp_path / "kernels" / "__pycache__").glob("*.nbi")), "the cache is warm"
    result = gradc("show", LOG1PEXP, "--emit", "llvm")  # the kernel `run` compiled
    assert result.returncode == 0, result.stderr
    kernel = re.search(r"^; kernel (k_[0-9a-f]{16}) \(int64, float64\[::1\], float64\[::1\]\)$",
                       result.stdout, re.M)
    assert kernel and "define " in result.stdout and f"{kernel[1]}_serial" in result.stdout
    assert "Inspection disabled" not in result.stderr


def test_llvm_shows_each_kernel_for_the_loop_it_runs(tmp_path, capsys):
    """A sum feeding an elementwise loop: the scalar step between them runs
    in the driver, so pairing kernels with every fused loop in order gave a
    kernel another loop's argument types (and Numba a traceback)."""
    source = tmp_path / "s.grad"
    source.write_text("def f(x):\n    s = sum(x * x)\n    return x * (s / 2.0)\n")
    assert main(["show", str(source), "--emit", "llvm"]) == 0
    out = capsys.readouterr().out
    headers = re.findall(r"^; kernel (k_[0-9a-f]{16}) \((.*)\)$", out, re.M)
    # the sum reads x; the product reads x and the scalar, and writes one array
    assert sorted(sig.count("[::1]") for _, sig in headers) == [2, 3]
    assert all(f"{name}_serial" in out for name, _ in headers)


@pytest.mark.parametrize("expr", ["-" * 400 + "x", "x" + " + x" * 400])
def test_the_ast_of_a_deep_expression_that_loads_is_shown(tmp_path, capsys, expr):
    # print(fdef) recursed once per level of the tree: RecursionError.
    path = tmp_path / "deep.grad"
    path.write_text(f"def f(x):\n    return {expr}\n")
    text = show(capsys, str(path), "--emit", "ast")
    assert text.startswith("FuncDef(name='f', ") and "\n    Param(name='x', ann=None" in text
    assert text.count("UnaryOp(op='-'" if expr[0] == "-" else "BinOp(op='+'") == 400


def test_the_ast_printer_writes_what_repr_writes():
    from gradlang.compiler import ast
    from gradlang.compiler.parser import parse
    module = parse((ROOT / "examples" / "leaky_relu.grad").read_text()
                   + "def g(x, k: const i64 = 2):\n    return (x,)[0] * k\n", "t.grad")
    assert ast.dump(module) == repr(module)


def test_grad_stages_show_a_function_without_float_arguments_as_its_value(tmp_path, capsys):
    # `value_and_grad(f, wrt=0)` of it: every grad- stage of a file with
    # one such function failed with "cannot differentiate ints() with
    # respect to 'k'", though `gradc run` and `check` take it
    path = tmp_path / "ints.grad"
    path.write_text("def ints(k: i64, n: i64[m]):\n    return k * sum(n)\n\n"
                    "def sq(x):\n    return x * x\n")
    out = show(capsys, str(path), "--emit", "grad-ir")
    ints, sq = out.split("func @")[1:]
    assert ints.startswith("ints(%k0: i64, %n1: i64[m]) -> (i64) {")
    assert sq.startswith("sq_value_and_grad(")


def test_a_function_the_program_holds_in_many_places_is_printed_once(tmp_path, capsys):
    # g_k's body and its block both call g_(k-1), whose stages every call
    # shares: the printer unfolded each place, 8x the text per level (674,028
    # characters at n = 8, 294 MB at n = 14); a function printed already is
    # now referred to by its label
    n = 8
    source = tmp_path / "chain.grad"
    chain = "".join(f"def g{k}(x):\n    return g{k - 1}(x) * 1.01\n"
                    f"grad(dy):\n    return dy * 1.01 * grad(g{k - 1})(x)\n" for k in range(1, n))
    source.write_text("def g0(x):\n    return sin(x)\ngrad(dy):\n    return dy * cos(x)\n"
                      + chain)
    text = show(capsys, str(source), "--fn", f"g{n - 1}", "--emit", "lower")
    assert len(text) < 50_000
    referred = re.findall(r"(?:fwd|bwd): @(\S+) \(printed above\)", text)
    assert referred
    for label in set(referred):  # each refers to one function printed in full
        assert len(re.findall(rf"func @{re.escape(label)}\(", text)) == 1
    # and what is printed in full is every stage of every g_k
    assert {f"g{k}_{half}" for k in range(n) for half in ("fwd0", "bwd1")} <= set(
        re.findall(r"func @(g\d+_(?:fwd0|bwd1))[(#]", text))
