"""Bugs found by adversarial testing, each pinned by a test."""
from pathlib import Path

import numpy as np
import pytest

import dsl
from dsl.cli import main
from helpers import central_difference

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("expr,n", [("x[-9::-2]", 5), ("x[-2::-1]", 1), ("x[-3::-1]", 2),
                                    ("x[-4:0:-1]", 3), ("x[::-1]", 4), ("x[-1:-4:-2]", 5)])
def test_negative_step_slices_match_numpy(expr, n):
    m = dsl.loads(f"def f(x):\n    return {expr}\ndef g(x):\n    return sum({expr} * {expr})\n")
    x = np.arange(1.0, n + 1)
    np.testing.assert_array_equal(m.f(x), eval(expr))
    np.testing.assert_allclose(dsl.grad(m.g)(x), central_difference(
        lambda v: np.sum(eval(expr.replace("x", "v")) ** 2), [x], 0), atol=1e-6)


def test_returning_one_value_twice_gives_two_arrays_and_right_tape_gradients():
    m = dsl.loads("def same(x):\n    y = x * 2\n    return y, y\n"
                  "def g(a, b):\n    return sum(a * b)\n")
    x = np.array([1.0, 2.0])
    a, b = m.same(x)
    assert a is not b
    with dsl.Tape() as tape:
        tape.watch(x)
        a, b = m.same(x)
        z = m.g(a, np.ones(2))
    np.testing.assert_array_equal(tape.gradient(z, x), [2.0, 2.0])


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_max_of_an_empty_axis_is_an_error_at_the_max(target):
    # it had no place in the source ("error: max/min over an empty axis ...")
    m = dsl.loads("def f(x):\n    return max(x)\ndef g(x):\n    y = exp(x)\n"
                  "    return sum(min(y, axis=1, keepdims=True) * y)\n", "m.grad", target=target)
    for f, x, line, col in [(m.f, np.zeros(0), 2, 12), (m.g, np.zeros((2, 0)), 5, 16),
                            (dsl.grad(m.g), np.zeros((2, 0)), 5, 16)]:
        with pytest.raises(dsl.ArgumentError, match="empty axis") as info:
            f(x)
        assert (info.value.file, info.value.line, info.value.col) == ("m.grad", line, col)


def test_check_catches_a_wrong_upstream_cotangent_in_block_two():
    wrong = dsl.loads("def c(x):\n    return x * x * x\ngrad(dy):\n    return dy * 3 * x * x\n"
                      "grad(ddx):\n    return dy=ddx * 5 * x * x, x=ddx * dy * 6 * x\n")
    bad = [c for c in dsl.check_gradients(wrong.c, np.array([0.3, -0.7, 1.1])) if not c.ok]
    assert [(c.order, c.wrt) for c in bad] == [(2, "dy (of d/dx)")]
    assert bad[0].source == "grad block 2 (line 5)"


def test_f32_functions_can_be_checked(tmp_path, capsys):
    (tmp_path / "f.grad").write_text("def f(x: f32[n]):\n    return sum(x * x)\n")
    assert main(["check", str(tmp_path / "f.grad")]) == 0
    assert "FAIL" not in capsys.readouterr().out


def test_show_and_compile_find_a_signature_for_every_example(tmp_path, capsys):
    for example in sorted(EXAMPLES.glob("*.grad")):
        assert main(["show", str(example), "--emit", "ir"]) == 0
    assert main(["compile", str(EXAMPLES / "bar.grad"), "-o", str(tmp_path)]) == 0
    assert main(["compile", str(EXAMPLES / "bar.grad"), "-o", "/proc/no/such"]) == 2  # usage
    assert "cannot create the output directory" in capsys.readouterr().err


def test_run_converts_arguments_to_their_annotated_dtypes(tmp_path, capsys):
    (tmp_path / "t.grad").write_text("def h(x, k: i64):\n    return x * k\n"
                                     "def b(x, m: bool[n]):\n    return where(m, x, 0)\n")
    assert main(["run", str(tmp_path / "t.grad"), "h", "1.5", "3"]) == 0
    assert capsys.readouterr().out.splitlines() == ["h = 4.5", "d/dx = 3.0"]
    assert main(["run", str(tmp_path / "t.grad"), "b", "[1.0, 2.0]", "[True, False]"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == "d/dx = [1., 0.]"


def test_params_take_their_declared_dtype():
    m = dsl.loads("param w: f32[3]\nparam p: f64\ndef f(x):\n    return w * x + p\n")
    m.params["w"] = np.ones(3)
    m.params["p"] = np.float32(2.0)
    assert m.params["w"].dtype == np.float32 and m.params["p"].dtype == np.float64
    with pytest.raises(dsl.ArgumentError, match="no param 'q'"):
        m.params["q"]
    with pytest.raises(KeyError):
        m.params["q"]


def test_hvp_takes_one_wrt():
    m = dsl.loads("def g(x, y):\n    return x * y\n")
    with pytest.raises(dsl.ArgumentError, match="one parameter"):
        dsl.hvp(m.g, wrt=(0, 1))


def test_const_integer_arguments_are_compile_time_values():
    m = dsl.loads("from std import logsumexp\n"
                  "def sa(x, axis: const = 0):\n    return sum(x, axis=axis)\n"
                  "def pick(x, k: const i64):\n    return x[k] * 2\n")
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_allclose(m.logsumexp(x, 0), np.log(np.exp(x).sum(axis=0)))
    np.testing.assert_allclose(m.logsumexp(x, 1), np.log(np.exp(x).sum(axis=1)))
    np.testing.assert_allclose(m.sa(x, 1), x.sum(axis=1))
    np.testing.assert_allclose(m.sa(x), x.sum(axis=0))
    np.testing.assert_array_equal(dsl.grad(m.pick)(np.arange(3.0), 1), [0.0, 2.0, 0.0])
    np.testing.assert_array_equal(dsl.grad(m.pick)(np.arange(3.0), 2), [0.0, 0.0, 2.0])


def test_a_param_declared_twice_says_so():
    with pytest.raises(dsl.GradError) as info:
        dsl.loads("param p: f64\nparam p: f64\ndef f(x):\n    return x * p\n")
    assert info.value.message == "param 'p' is already declared"


def test_where_selects_broadcast_and_nested_branches():
    m = dsl.loads("def f(x, y):\n    return sum(where(y < 10, x * y, 0))\n"
                  "def n(x):\n    return where(x > -1, where(x > 0, log(x), 0 * x), 0 * x)\n")
    assert dsl.grad(m.f)(2.0, np.array([1.0, np.inf, 3.0])) == 4.0
    np.testing.assert_array_equal(dsl.grad(m.n)(np.array([0.0, 2.0])), [0.0, 0.5])


def test_custom_gradient_of_a_function_returning_its_input_counts_once():
    m = dsl.loads("def ident(x):\n    return x\ngrad(dy):\n    return 2 * dy\n"
                  "def h(x):\n    return ident(x) + x\n")
    assert dsl.grad(m.ident)(1.0) == 2.0
    assert dsl.grad(m.h)(1.0) == 3.0


def test_grad_block_sees_a_rebound_parameter():
    m = dsl.loads("def f(x):\n    x = x * 2\n    return sin(x)\ngrad(dy):\n"
                  "    return dy * 2 * cos(x)\n")
    x = np.array([0.3, 1.0])
    np.testing.assert_allclose(dsl.grad(m.f)(x), 2 * np.cos(2 * x), rtol=1e-14)


def test_compiled_module_checks_fixed_sizes(tmp_path, monkeypatch):
    from dsl.aot import compile_module
    (tmp_path / "fx.grad").write_text("def f(x):\n    return exp(x) * 2\n")
    compile_module(str(tmp_path / "fx.grad"), str(tmp_path / "out"), ["f(f64[4])"])
    monkeypatch.syspath_prepend(str(tmp_path / "out"))
    import importlib
    fx = importlib.import_module("fx")
    np.testing.assert_allclose(fx.f(np.zeros(4)), 2 * np.ones(4))
    # one argument: the message names the sizes compiled and those of the call
    with pytest.raises(dsl.ArgumentError, match=r"compiled for f\(f64\[4\]\); this call is "
                                                r"f\(f64\[2\]\)"):
        fx.f(np.zeros(2))


def test_rounding_ops_keep_huge_and_non_finite_values():
    m = dsl.loads("def f(x):\n    return floor(x) + ceil(x) + round(x)\n")
    x = np.array([np.inf, -np.inf, np.nan, 1e20, 2.5, -2.5])
    np.testing.assert_array_equal(m.f(x), np.floor(x) + np.ceil(x) + np.rint(x))


def test_min_of_bools_and_exact_integer_sums():
    m = dsl.loads("def mn(x):\n    return min(x > 0)\ndef s(x):\n    return sum(x)\n")
    assert m.mn(np.array([1.0, -1.0])) == 0
    assert m.s(np.array([2**53, 1, 1])) == 2**53 + 2


def test_non_finite_literals_and_zero_cotangents():
    m = dsl.loads("def t(x):\n    return x * 2, 1e400\ndef f(x, y):\n    return x * 2\n")
    assert m.t(np.ones(2))[1] == np.inf
    _, pullback = dsl.vjp(m.f, np.ones(1000), np.ones(1000))
    assert pullback.residual_bytes == 0
    dx, dy = pullback(np.ones(1000))
    np.testing.assert_array_equal(dy, np.zeros(1000))


def test_scalars_stay_scalars_on_cuda():
    src = ("def nd(x, a):\n    return x * a.ndim\n"
           "def ann(a: f64, x):\n    return x * a\n"
           "def f(x, a):\n    return sum(x) * a\n")
    cu = dsl.loads(src, target="cuda", host_results=True)
    x = np.array([1.0, 2.0])
    np.testing.assert_array_equal(cu.nd(x, 2.0), [0.0, 0.0])
    np.testing.assert_array_equal(cu.ann(2.0, x), [2.0, 4.0])
    assert cu.f(x, 2.0).shape == () and dsl.grad(cu.f, wrt=1)(x, 2.0).shape == ()


def test_compile_takes_repeated_sigs_and_const_values(tmp_path, monkeypatch):
    (tmp_path / "ax.grad").write_text("def ax(x, axis: const i64):\n"
                                      "    return sum(x * x, axis=axis)\n"
                                      "def sq(x):\n    return x * x\n")
    out = tmp_path / "out"
    assert main(["compile", str(tmp_path / "ax.grad"), "-o", str(out),
                 "--sig", "ax(f64[m, n], 1)", "--sig", "ax(f64[m, n], 0)",
                 "--sig", "sq(f32[:])"]) == 0
    monkeypatch.syspath_prepend(str(out))
    import importlib
    ax = importlib.import_module("ax")
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(ax.ax(x, 1), (x * x).sum(axis=1))
    np.testing.assert_array_equal(ax.ax(x, 0), (x * x).sum(axis=0))
    np.testing.assert_array_equal(ax.ax.grad(x, 1), 2 * x)
    assert ax.sq(np.ones(2, np.float32)).dtype == np.float32
    with pytest.raises(dsl.ArgumentError, match="was compiled for"):
        ax.ax(x, 2)


def test_run_reports_unreadable_npy_files(tmp_path, capsys):
    (tmp_path / "bad.npy").write_text("not numpy")
    assert main(["run", str(EXAMPLES / "log1pexp.grad"), "log1pexp",
                 str(tmp_path / "bad.npy")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_where_mask_does_not_select_through_layout_or_reductions():
    # The mask of a where branch (where its cotangent may be nonzero) was
    # applied to the input cotangent of a transpose or a sum inside it when
    # the shapes happened to fit, at the wrong positions: the gradient of
    # transpose(x) came out zero wherever c.T != c.
    m = dsl.loads("def t(x, c: bool[n, n]):\n    return sum(where(c, transpose(x) * 2.0, 0.0))\n"
                  "def s(x, c: bool[n]):\n    return sum(where(c, sum(x * x, axis=1), 0.0))\n")
    x = np.arange(1.0, 5.0).reshape(2, 2)
    c = np.array([[True, True], [False, False]])
    np.testing.assert_array_equal(dsl.grad(m.t)(x, c), 2.0 * c.T)
    rows = np.array([True, False])
    np.testing.assert_allclose(dsl.grad(m.s)(x, rows),
                               central_difference(lambda x: np.sum(np.where(
                                   rows, np.sum(x * x, axis=1), 0.0)), [x], 0), rtol=1e-6)


def test_assigning_a_param_or_function_as_an_attribute_says_how_to_set_it():
    # `m.w = value` used to be accepted and ignored: the functions kept
    # reading the param's value from `m.params`.
    m = dsl.loads("param w: f64[n]\n\ndef f(x):\n    return sum(w) * x\n")
    m.params["w"] = np.ones(2)
    with pytest.raises(AttributeError, match=r"set it with \.params\['w'\] = value"):
        m.w = np.zeros(2)
    with pytest.raises(AttributeError, match="'f' is a function"):
        m.f = None
    # so was `m.params = {...}`: a dict the functions never read
    with pytest.raises(AttributeError, match=r"params .* cannot be replaced.*\.params\.update"):
        m.params = {"w": np.zeros(2)}
    np.testing.assert_allclose(m.f(np.arange(3.0)), 2.0 * np.arange(3.0))
    m.note = "mine"  # other attributes are the user's
    assert m.note == "mine"


def test_kernels_run_as_python_under_numba_disable_jit(tmp_path):
    # NUMBA_DISABLE_JIT=1 (Numba's debugging switch) runs kernels as Python:
    # a kernel's sum called `accumulate`, which then failed with Numba's
    # "intrinsic is not usable in pure-python"
    import os
    import subprocess
    import sys
    program = """
import numpy as np, dsl
m = dsl.loads('''def sumsq(x):
    return sum(x * x)
def grow(u, n: i64):
    for i in range(n):
        u = u * 0.5 + sin(u)
    return sum(u)
def pick(x, idx):
    return sum(x[idx] * 2.0)
''')
x = np.linspace(-2.0, 2.0, 5000)
assert np.isclose(m.sumsq(x), np.sum(x * x), rtol=1e-12)
assert np.isclose(m.sumsq(x.astype(np.float32)), np.sum(x * x), rtol=1e-5)
np.testing.assert_allclose(dsl.grad(m.sumsq)(x), 2 * x, rtol=1e-12)
u = x[:4]
v = u
for _ in range(3):
    v = v * 0.5 + np.sin(v)
assert np.isclose(m.grow(u, 3), v.sum(), rtol=1e-12)
idx = np.array([0, 3, 3, -1])
assert np.isclose(m.pick(x, idx), 2.0 * x[idx].sum(), rtol=1e-12)
g = np.zeros_like(x)
np.add.at(g, idx, 2.0)
np.testing.assert_allclose(dsl.grad(m.pick)(x, idx), g)
print("ok")
"""
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "GRADC_CACHE_DIR": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_abs_and_sign_of_a_number_take_the_dtype_of_the_arrays_they_meet():
    # (found by tests/test_differential_jax.py) abs and sign of a
    # compile-time number were f64 (or i64) arrays, where every other
    # function of a number is a compile-time number: `abs(-2.0) * x` was
    # f64 for f32 x, `abs(-2) + k` i64 for i32 k, and neither could index
    m = dsl.loads("def f(x, k: i32):\n"
                  "    return x[abs(-1)] * abs(-2.0) + sign(-1.5), abs(-2) + k, sign(-3) * k\n")
    v, s, t = m.f(np.array([5.0, 3.0], np.float32), np.int32(4))
    assert (v.dtype, s.dtype, t.dtype) == (np.float32, np.int32, np.int32)
    assert (v, s, t) == (5.0, 6, -4)


def test_a_choice_between_numbers_and_a_layout_op_of_one_are_weakly_typed():
    # (found by tests/test_differential_jax.py) `broadcast_to(0.5, (2,))`,
    # `reshape`, `stack` of numbers and `where(m, 1.0, 0.0)` were f64 arrays
    # where a number, or the same op of `arange(2) * 0.5`, is weak: each
    # made an f32 model f64, and a loop carrying one changed type
    m = dsl.loads("def f(x):\n"
                  "    c = x\n"
                  "    for i in range(2):\n"
                  "        c = c * 0.5 + broadcast_to(1.5, (2,))\n"
                  "    return c, where(x > 0, 1.0, 0.0) * x + stack([1.0, 2.0]), "
                  "reshape(2.0, (1,)) - x\n")
    x = np.array([1.0, -2.0], np.float32)
    c, s, r = m.f(x)
    assert (c.dtype, s.dtype, r.dtype) == (np.float32,) * 3
    np.testing.assert_array_equal(c, [2.5, 1.75])
    np.testing.assert_array_equal(s, [2.0, 2.0])
    np.testing.assert_array_equal(r, [1.0, 4.0])


def test_take_of_a_weak_value_and_a_no_op_of_a_number_stay_weak():
    # (found by tests/test_differential_jax.py) `take` and
    # `take_along_axis` of `arange(n) * 0.5` were f64 where `x[idx]` of it
    # is weak, and `broadcast_to(0.5, ())` (a no-op) and `sum(2.0)` were
    # f64 arrays
    m = dsl.loads("def f(x):\n"
                  "    a = arange(4) * 0.5\n"
                  "    return take(a, arange(2)) * x, take_along_axis(a, arange(2) + 1, axis=0) "
                  "* x, x[0] + broadcast_to(0.5, ()), reshape(1.5, ()) - x, sum(2.0) + x\n")
    results = m.f(np.array([1.0, 2.0], np.float32))
    assert [r.dtype for r in results] == [np.float32] * 5
    for r, want in zip(results, ([0.0, 1.0], [0.5, 2.0], 1.5, [0.5, -0.5], [3.0, 4.0])):
        np.testing.assert_array_equal(r, want)
