"""Forward mode (issue 11): `jvp` through grad blocks by transposition,
`jacfwd`, `jacrev`, `hessian`, against closed forms, central differences
and each other."""
import functools
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from dsl import forward
from dsl.forward import jvp_function
from dsl.function import Stacked, derived_if_made
from gradlang.compiler.modules import STDLIB
from gradlang.runtime.target import is_device_array
from helpers import central_difference
from test_interpreter_oracle import PROGRAMS as ORACLE_PROGRAMS

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RNG = np.random.default_rng(11)


def load(name):
    return dsl.load(EXAMPLES / f"{name}.grad")


def test_bar_tangent_is_the_closed_form():
    y, ty = dsl.jvp(load("bar").bar, (2.0, 3.0), (1.0, 0.0))
    assert (y, ty) == (6.0, 3.0)
    assert dsl.jvp(load("bar").bar, (2.0, 3.0), [None, 1.0]) == (6.0, 2.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_log1pexp_tangent_at_100_is_exact_through_the_block(dtype):
    m = load("log1pexp")
    t = np.array([0.5, -3.0], dtype)
    _, ty = dsl.jvp(m.log1pexp, (np.array([100.0, 100.0], dtype),), (t,))
    assert ty.dtype == dtype
    np.testing.assert_array_equal(ty, t)  # t * 1.0, where exp(100) overflows f32


def test_log1pexp_tangent_is_finite_from_minus_100_to_1000():
    x = np.linspace(-100.0, 1000.0, 221)
    _, ty = dsl.jvp(load("log1pexp").log1pexp, (x,), (np.ones_like(x),))
    assert np.all(np.isfinite(ty))
    with np.errstate(over="ignore"):
        block = 1 - 1 / (1 + np.exp(x))  # the block's formula, which the jvp follows
    np.testing.assert_allclose(ty, block, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(ty, 0.5 * (1 + np.tanh(x / 2)), atol=1e-15)


def test_jvp_follows_the_block_not_the_body():
    # the block is deliberately not the derivative of x * x
    m = dsl.loads("def f(x, y):\n    return x * x + y\ngrad(dz):\n    return dz * 3, dz * 5\n")
    x = np.array([1.0, 2.0])
    _, ty = dsl.jvp(m.f, (x, x), (np.array([1.0, 10.0]), np.array([2.0, 0.0])))
    np.testing.assert_array_equal(ty, [3 + 10, 30])


def test_jvp_of_an_elementwise_chain_is_one_kernel_writing_value_and_tangent():
    m = load("log1pexp")
    x = np.array([0.5, 1.0])
    value, tangent = dsl.jvp(m.log1pexp, (x,), (x,))
    # what that kernel writes: log(1 + e^x), and sigmoid(x) times the tangent x
    np.testing.assert_allclose(value, np.logaddexp(0, x), rtol=1e-14)
    np.testing.assert_allclose(tangent, x / (1 + np.exp(-x)), rtol=1e-14)
    jf = jvp_function(m.log1pexp, ["x"])
    program = jf.program(jf.on_target({"x": x, jf.tangent_names[0]: x}))
    assert len(program.generated.kernel_names) == 1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-700, 700), min_size=1, max_size=5))
def test_softplus_tangent_is_sigmoid_times_t(xs):
    m = dsl.load(STDLIB / "std.grad")
    x = np.array(xs)
    t = np.linspace(-1, 1, x.size)
    y, ty = dsl.jvp(m.softplus, (x,), (t,))
    e = np.exp(-np.abs(x))
    sigmoid = np.where(x >= 0, 1 / (1 + e), e / (1 + e))
    np.testing.assert_allclose(ty, t * sigmoid, rtol=1e-12, atol=1e-300)


# ------------------------------------------------ every example and stdlib function
# (function, arguments, positions of the differentiable float arguments)

def _cases():
    v = np.array([-1.27, 0.41, 2.13])  # (x * 255 is not near a rounding edge)
    w = np.array([0.7, -1.1, 1.6])
    mat = RNG.normal(size=(2, 2)) * 0.5
    cases = {
        "bar.bar": (load("bar").bar, (1.5, -2.0)),
        "log1pexp": (load("log1pexp").log1pexp, (v,)),
        "dense.softplus": (load("dense").softplus, (v,)),
        "dense.dense": (load("dense").dense, (mat, mat.T, w[:2])),
        "dense.loss": (load("dense").loss, (mat, mat.T, w[:2], mat * 2)),
        "leaky_relu": (load("leaky_relu").leaky_relu, (v,)),
        "stylegan.leaky_relu": (load("stylegan_r1").leaky_relu, (v,)),
        "stylegan.discriminator": (load("stylegan_r1").discriminator, (v, w)),
        "stylegan.r1_penalty": (load("stylegan_r1").r1_penalty, (v, w)),
        "checkpoint.checkpointed": (load("checkpoint").checkpointed, (mat, mat.T)),
        "checkpoint.plain": (load("checkpoint").plain, (mat, mat.T)),
        "straight_through.quantized_loss": (load("straight_through").quantized_loss,
                                            (v, w)),
    }
    lp = load("linear_poly")
    lp.params["weights"] = np.array([0.5, -1.5])
    cases["linear_poly"] = (lp.linear_poly, (v,))
    std = dsl.load(STDLIB / "std.grad")
    second = {"logaddexp": w, "sigmoid_cross_entropy": np.array([0.0, 0.3, 1.0])}
    for name in sorted(std.functions):  # every one, the two-argument ones along x
        cases[f"std.{name}"] = (getattr(std, name), (v,) + ((second[name],) if name in second
                                                              else ()))
    return cases


CASES = _cases()


@pytest.mark.parametrize("name", list(CASES))
def test_jacfwd_equals_jacrev_and_jvp_equals_the_jacobian_times_t(name):
    f, args = CASES[name]
    jf, jr = dsl.jacfwd(f, wrt=0)(*args), dsl.jacrev(f, wrt=0)(*args)
    np.testing.assert_allclose(jf, jr, rtol=1e-12, atol=1e-12)
    x = np.asarray(args[0], np.float64)
    t = np.linspace(0.5, -1.0, x.size).reshape(x.shape)
    _, ty = dsl.jvp(f, args, (t,) + (None,) * (len(args) - 1))
    jt = np.tensordot(jf, t, axes=x.ndim) if x.ndim else jf * t
    np.testing.assert_allclose(ty, jt, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["log1pexp", "dense.loss", "stylegan.discriminator",
                                  "checkpoint.checkpointed", "std.logsumexp", "std.gelu",
                                  "linear_poly", "bar.bar"])
def test_jvp_matches_central_differences(name):
    f, args = CASES[name]
    x = np.asarray(args[0], np.float64)
    t = np.linspace(0.5, -1.0, x.size).reshape(x.shape)
    _, ty = dsl.jvp(f, args, (t,) + (None,) * (len(args) - 1))
    eps = 1e-6
    plus = f(*((x + eps * t,) + tuple(args[1:])))
    minus = f(*((x - eps * t,) + tuple(args[1:])))
    np.testing.assert_allclose(ty, (plus - minus) / (2 * eps), rtol=1e-6, atol=1e-7)


# a straight-through gradient is not the derivative of the values, so
# differences of it are not its derivative (test_straight_through_...)
@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("straight_through")])
def test_hessian_matches_central_differences_of_the_gradient(name):
    f, args = CASES[name]
    h = dsl.hessian(f, wrt=0)(*args)
    x = np.asarray(args[0], np.float64)
    assert h.shape == x.shape + x.shape
    g = dsl.grad(f, wrt=0)
    for i in np.ndindex(x.shape):
        column = central_difference(lambda *a: np.asarray(g(*a))[i], list(args), 0)
        np.testing.assert_allclose(h[i], column, rtol=1e-6, atol=1e-6)


def test_tuple_wrt_gives_tuples_shaped_as_jax():
    d = load("dense")
    x, w, b = RNG.normal(size=(3, 2)), RNG.normal(size=(2, 4)), RNG.normal(size=4)
    jx, jw = dsl.jacfwd(d.dense, wrt=(0, 1))(x, w, b)
    assert jx.shape == (3, 4, 3, 2) and jw.shape == (3, 4, 2, 4)
    rx, rw = dsl.jacrev(d.dense, wrt=(0, 1))(x, w, b)
    np.testing.assert_allclose(jw, rw, rtol=1e-12, atol=1e-12)
    (hxx, hxy), (hyx, hyy) = dsl.hessian(load("bar").bar, wrt=(0, 1))(2.0, 3.0)
    assert (hxx, hxy, hyx, hyy) == (0.0, 1.0, 1.0, 0.0)


# ---------------------------------------------------- transforms of a Jacobian
# (each was a TypeError: "grad() takes a function of a loaded .grad module,
# got Jacobian"; JAX composes jacfwd(jacrev(f)) and grad of a Jacobian)


def _jacobian_difference(jacobian, args, index, t, eps=1e-6):
    """d J(args) / d args[index] along t, by central differences of the
    Jacobian called directly (assembled on the host, column by column)."""
    plus, minus = list(args), list(args)
    plus[index], minus[index] = args[index] + eps * t, args[index] - eps * t
    return [(np.asarray(p) - np.asarray(m)) / (2 * eps)
            for p, m in zip(_leaves(jacobian(*plus)), _leaves(jacobian(*minus)))]


def _leaves(result) -> list:
    if not isinstance(result, tuple):
        return [result]
    return [leaf for r in result for leaf in _leaves(r)]


# (dense's Jacobians are taken apart in the next test)
@pytest.mark.parametrize("kind,name", [("jacfwd", "checkpoint.checkpointed"),
                                       ("hessian", "bar.bar"), ("jacrev", "linear_poly")])
def test_jvp_and_grad_of_a_jacobian_match_central_differences(kind, name):
    f, args = CASES[name]
    jacobian = getattr(dsl, kind)(f, wrt=0)
    x = np.asarray(args[0], np.float64)
    t = np.linspace(0.5, -1.0, x.size).reshape(x.shape)
    value, tangent = dsl.jvp(jacobian, args, (t,) + (None,) * (len(args) - 1))
    np.testing.assert_allclose(value, jacobian(*args), rtol=1e-13, atol=1e-15)
    (want,) = _jacobian_difference(jacobian, list(args), 0, t)
    np.testing.assert_allclose(tangent, want, rtol=1e-6, atol=1e-7)
    # reverse mode: the gradient of the Jacobian's sum, along t
    along = np.sum(np.asarray(dsl.grad(jacobian, wrt=0)(*args)) * t)
    np.testing.assert_allclose(along, np.sum(want), rtol=1e-6, atol=1e-7)


def test_a_transform_of_a_jacobian_refuses_arguments_as_the_jacobian_does():
    # a transform of jacrev(f) named it jacfwd(f) (made first, for the same
    # f and wrt), and gave dtypes as NumPy's (int64) where the call says i64
    m = dsl.loads("def f(x):\n    return sin(x)\n")
    ints = np.array([1, 2])
    for jacobian in (dsl.jacfwd(m.f), dsl.jacrev(m.f)):
        with pytest.raises(dsl.ArgumentError) as direct:
            jacobian(ints)
        assert direct.value.message.startswith(f"{jacobian.name}: ")
        for transform in (dsl.grad(jacobian), dsl.jacfwd(jacobian),
                          lambda x: dsl.jvp(jacobian, (x,), (np.ones(2),))):
            with pytest.raises(dsl.ArgumentError) as err:
                transform(ints)
            assert err.value.message == direct.value.message


def test_a_module_is_no_jacobian_even_with_a_function_named_as_function():
    m = dsl.loads("def as_function(x):\n    return x\n")
    with pytest.raises(TypeError, match="grad\\(\\) takes a function of a loaded .grad module"):
        dsl.grad(m)


def test_a_jacobian_is_made_once_per_function_wrt_and_mode_and_bad_wrt_always_raises():
    """`dsl.jacfwd(f)(x)` in a loop finds the Jacobian it made (kept on f,
    as grad's are), where a new one was made and checked at each call;
    a wrt that is refused is refused every time, never found."""
    m = dsl.loads("def f(x, y):\n    return x * y\n"
                  "def params(x):\n    return x\n", "jac_once.grad")
    assert m.f is m.functions["f"] and type(m.params).__name__ == "ParamStore"
    for transform in (dsl.jacfwd, dsl.jacrev):
        assert transform(m.f) is transform(m.f, 0)
        assert transform(m.f, (0, 1)) is transform(m.f, [0, 1])
        assert transform(m.f, np.int64(1)) is transform(m.f, np.int64(1))
        assert transform(m.f, (1,)) is transform(m.f, ["y"]) is not transform(m.f, 1)
        assert transform(m.f, 0) is not transform(m.f, 1)
        for bad, message in ((True, "wrt entries are parameter positions or names, got True"),
                             (2, "wrt=2 is out of range: f() has 2 parameter(s)"),
                             ("z", "f() has no parameter 'z' and reads no param 'z'")):
            for _ in range(2):
                with pytest.raises(dsl.ArgumentError, match=re.escape(message)):
                    transform(m.f, bad)
    assert dsl.jacfwd(m.f) is not dsl.jacrev(m.f)


def test_jacobians_of_jacobians_are_shaped_and_valued_as_jax():
    # jax.jacfwd(jax.jacrev(f)) is out.shape + x.shape + x.shape; a tuple
    # wrt gives tuples of tuples
    d = load("dense")
    x, w, b = RNG.normal(size=(3, 2)), RNG.normal(size=(2, 2)), RNG.normal(size=2)
    second = dsl.jacfwd(dsl.jacrev(d.dense))(x, w, b)
    assert second.shape == (3, 2, 3, 2, 3, 2)
    for i in np.ndindex(x.shape):
        t = np.zeros_like(x)
        t[i] = 1.0
        (column,) = _jacobian_difference(dsl.jacrev(d.dense), [x, w, b], 0, t)
        np.testing.assert_allclose(second[(...,) + i], column, rtol=1e-6, atol=1e-7)
    (jxx, jxw), (jwx, jww) = dsl.jacrev(dsl.jacfwd(d.dense, wrt=(0, 1)), wrt=(0, 1))(x, w, b)
    assert jxw.shape == (3, 2, 3, 2, 2, 2) and jwx.shape == (3, 2, 2, 2, 3, 2)
    np.testing.assert_allclose(jxw, dsl.jacfwd(dsl.jacfwd(d.dense, wrt=0), wrt=1)(x, w, b),
                               rtol=1e-12, atol=1e-15)
    # each example's Jacobians (vmap), differentiated again
    xs = RNG.normal(size=(4, 3, 2))
    per_example = dsl.vmap(dsl.jacrev(d.dense), in_axes=(0, None, None))
    t = RNG.normal(size=w.shape)
    (difference,) = _jacobian_difference(per_example, [xs, w, b], 1, t)
    np.testing.assert_allclose(dsl.jvp(per_example, (xs, w, b), (None, t, None))[1], difference,
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(np.sum(dsl.grad(per_example, wrt=1)(xs, w, b) * t),
                               np.sum(difference), rtol=1e-6)
    # an integer output's Jacobian is zero, so is its derivative; a param's
    m = dsl.loads("param v: f64[2]\n\ndef f(x):\n    return sin(x * v), x > 0\n")
    m.params["v"] = np.array([1.0, 2.0])
    x = np.array([0.5, 0.3])
    dv, dmask = dsl.jacfwd(dsl.jacfwd(m.f, wrt="v"), wrt=0)(x)
    assert dmask.shape == (2, 2, 2) and not dmask.any() and dmask.dtype == x.dtype
    # d/dx_k of diag(x cos(x v)): cos(x v) - x v sin(x v) at i = j = k
    np.testing.assert_allclose(dv, np.einsum("i,ij,ik->ijk", np.cos(x * [1, 2]) - x * [1, 2] *
                                             np.sin(x * [1, 2]), np.eye(2), np.eye(2)),
                               rtol=1e-14, atol=1e-300)


# ---------------------------------------------------- semantics and composition


def test_an_integer_or_bool_output_has_a_zero_jacobian_of_the_argument_dtype_in_both_modes():
    # jacfwd gave the output's own dtype (i64 zeros, bool False), jacrev x's
    m = dsl.loads("def f(x, k: i64):\n    return x * k, k * 2, x > 0\n")
    for x in (np.array([0.5, -1.0]), np.array([0.5, -1.0], np.float32), np.zeros(0)):
        fwd, rev = dsl.jacfwd(m.f)(x, 3), dsl.jacrev(m.f)(x, 3)
        np.testing.assert_array_equal(fwd[0], 3 * np.eye(x.size))
        for j in (fwd, rev):
            assert [a.dtype for a in j] == [x.dtype] * 3
            assert j[1].shape == x.shape and j[2].shape == 2 * x.shape
            assert not j[1].any() and not j[2].any()


def test_jacrev_compiles_for_the_value_of_an_integer_used_as_a_size():
    # jacrev first (nothing had compiled segv for n's value): NeedsValue escaped
    m = dsl.loads("def segv(v, ids, n: i64):\n    return segment_sum(v * v, ids, n)\n")
    v, ids = np.array([0.5, -1.0, 2.0]), np.array([1, 1, 0])
    expected = np.array([[0.0, 0.0, 4.0], [1.0, -2.0, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(dsl.jacrev(m.segv)(v, ids, 3), expected)
    np.testing.assert_array_equal(dsl.jacfwd(m.segv)(v, ids, 3), expected)
    np.testing.assert_array_equal(dsl.jacrev(m.segv)(v, ids, 2), expected[:2])


def test_params_take_tangents_by_name():
    lp = load("linear_poly")
    lp.params["weights"] = np.array([0.5, 2.0])
    x = np.array([1.0, 2.0, 3.0])
    tw = np.array([0.25, -1.0])
    y, ty = dsl.jvp(lp.linear_poly, (x,), {"weights": tw, "x": np.ones(3)})
    np.testing.assert_array_equal(ty, tw[1] * x + tw[0] + 2.0)
    jw = dsl.jacrev(lp.linear_poly, wrt="weights")(x)
    np.testing.assert_allclose(dsl.jvp(lp.linear_poly, (x,), {"weights": tw})[1], jw @ tw,
                               rtol=1e-12)


def test_pass_through_tangent_is_the_identity_and_stop_gradient_zero():
    q = load("straight_through").quantize
    assert dsl.jvp(q, (np.array([0.3]),), (np.array([2.0]),))[1] == 2.0
    m = dsl.loads("def f(x):\n    return stop_gradient(x) * x + stop_gradient(x)\n")
    assert dsl.jvp(m.f, (np.array([3.0]),), (np.array([1.0]),))[1] == 3.0


def test_straight_through_second_order_is_the_identity_at_every_use():
    # d/dx ste(x) is 1 wherever ste(x) appears, the gradient program
    # included: the gradient of ste(x) * y is (y, ste(x)), whose own
    # derivatives are 1 both ways (it was 0 along x: an asymmetric Hessian)
    m = dsl.loads("@pass_through\ndef ste(x):\n    return round(x)\n"
                  "def f(x, y):\n    return ste(x) * y + ste(x) * ste(x)\n")
    x, y = np.array([0.3, 1.4]), np.array([2.0, -1.0])
    h = dsl.hessian(m.f, wrt=(0, 1))(x, y)
    np.testing.assert_array_equal(h[0][0], 2 * np.eye(2))
    np.testing.assert_array_equal(h[0][1], np.eye(2))
    np.testing.assert_array_equal(h[1][0], np.eye(2))
    v = np.array([1.0, -3.0])
    np.testing.assert_array_equal(dsl.hvp(m.f)(x, y, v), 2 * v)
    np.testing.assert_array_equal(dsl.jvp(dsl.grad(m.f, wrt=1), (x, y), (v, None))[1], v)
    q = load("straight_through")  # sum((quantize(x) - t)^2): 2 on the diagonal
    w = np.array([0.7, -1.1])
    np.testing.assert_array_equal(dsl.hessian(q.quantized_loss)(x, w), 2 * np.eye(2))


def test_forward_over_reverse_equals_hvp():
    m = load("log1pexp")
    x, v = np.array([0.5, -1.0, 3.0]), np.array([1.0, -2.0, 0.5])
    _, hv = dsl.jvp(dsl.grad(m.log1pexp), (x,), (v,))
    s = 1 / (1 + np.exp(-x))  # log1pexp'' = s (1 - s), its Hessian diagonal
    np.testing.assert_allclose(hv, s * (1 - s) * v, rtol=1e-12)
    np.testing.assert_allclose(hv, dsl.hvp(m.log1pexp)(x, v), rtol=1e-12)


def test_jvp_on_cuda_matches_the_cpu():
    x = np.array([-3.0, 0.0, 100.0])
    t = np.array([1.0, 2.0, 3.0])
    cpu = dsl.jvp(load("log1pexp").log1pexp, (x,), (t,))
    cu = dsl.load(EXAMPLES / "log1pexp.grad", target="cuda", host_results=True)
    y, ty = dsl.jvp(cu.log1pexp, (x,), (t,))
    np.testing.assert_allclose(y, cpu[0], rtol=1e-12)
    np.testing.assert_allclose(ty, cpu[1], rtol=1e-12)
    # Jacobians come back where the module's other results do: NumPy's here
    bar = dsl.load(EXAMPLES / "bar.grad", target="cuda", host_results=True).bar
    for jacobian in (dsl.jacfwd(bar, wrt=(0, 1)), dsl.jacrev(bar, wrt=(0, 1))):
        assert all(type(j) is np.ndarray for j in jacobian(2.0, 3.0))
        assert jacobian(2.0, 3.0) == (3.0, 2.0)
    hessian = dsl.hessian(bar, wrt=(0, 1))(2.0, 3.0)
    assert all(type(h) is np.ndarray for row in hessian for h in row)
    assert hessian == ((0.0, 1.0), (1.0, 0.0))


def test_jacobians_on_cuda_are_device_arrays_as_its_other_results_are():
    # they were NumPy's even without host_results, where grad, jvp and the
    # call itself give device arrays
    m = dsl.load(EXAMPLES / "log1pexp.grad", target="cuda")
    x = np.array([-3.0, 0.0, 100.0])
    assert is_device_array(m.log1pexp(x)) and is_device_array(dsl.grad(m.log1pexp)(x))
    sigmoid = 1 / (1 + np.exp(-x))
    for transform, expected in ((dsl.jacfwd, np.diag(sigmoid)), (dsl.jacrev, np.diag(sigmoid)),
                                (dsl.hessian, np.diag(sigmoid * (1 - sigmoid)))):
        jacobian = transform(m.log1pexp)(x)  # a column per element, each run on the device
        assert is_device_array(jacobian), transform.__name__
        np.testing.assert_allclose(jacobian.copy_to_host(), expected, rtol=1e-12, atol=1e-15)
    bar = dsl.load(EXAMPLES / "bar.grad", target="cuda").bar
    jacobians = dsl.jacrev(bar, wrt=(0, 1))(2.0, 3.0)
    assert all(map(is_device_array, jacobians))
    assert [j.copy_to_host() for j in jacobians] == [3.0, 2.0]


# ---------------------------------------------------------------- bad tangents


@pytest.mark.parametrize("tangents,text", [
    ((1.0,), "1 tangent(s) for 2 primal(s)"),
    ((np.ones(2), None), "has shape [2]; its primal has shape []"),
    ((np.float32(1.0), None), "has dtype f32; its primal has dtype f64"),
    ({"z": 1.0}, "tangent for 'z'"),
    ("ab", "as a tuple"),
])
def test_bad_tangents_are_argument_errors_before_any_kernel(tangents, text):
    m = dsl.loads("def f(x, y):\n    return x * y\n")
    with pytest.raises(dsl.ArgumentError) as info:
        dsl.jvp(m.f, (2.0, 3.0), tangents)
    assert text in info.value.message
    assert not any(j._programs for j in m.f.__dict__.get("_derived", {}).values())


def test_a_tangent_moved_among_the_primals_is_refused_after_a_call_like_it():
    # the fast path joined primals and tangents into one key: after
    # jvp(f, (x, y), (tx, ty)), jvp(f, (x, y, tx), (ty,)) had the same key
    # and returned the first call's tangent instead of refusing the count
    m = dsl.loads("def f(x, y):\n    return x * y\n")
    x, y, tx, ty = (np.arange(3.0) + k for k in range(4))
    assert dsl.jvp(m.f, (x, y), (tx, ty))[1].tolist() == [2.0, 10.0, 22.0]
    for primals, tangents in (((x, y, tx), (ty,)), ((x,), (y, tx, ty))):
        with pytest.raises(dsl.ArgumentError, match=f"got {len(tangents)} tangent\\(s\\) for "
                                                    f"{len(primals)} primal"):
            dsl.jvp(m.f, primals, tangents)


def test_a_jacobian_taken_as_a_function_with_an_argument_twice_in_wrt_gives_it_each_time():
    # its one program ran f's jvp along x twice, which took one of the two
    # tangents: one Jacobian was zero (under a tape, and for grad or jvp of it)
    m = dsl.loads("def f(x, y):\n    return sin(x) * y\n")
    x, y = np.array([0.5, -1.0]), np.array([2.0, 3.0])
    jacobians, tangents = dsl.jvp(dsl.jacfwd(m.f, wrt=(0, "x")), (x, y), (np.ones(2), None))
    for jacobian, tangent in zip(jacobians, tangents):
        np.testing.assert_allclose(jacobian, np.diag(np.cos(x) * y), rtol=1e-15)
        np.testing.assert_allclose(tangent, np.diag(-np.sin(x) * y), rtol=1e-15)


def test_a_derived_function_is_named_once_in_a_message():
    # "of grad(f)() has shape": `f()` of a name already a call
    m = dsl.loads("def f(x, y):\n    return sum(x * y)\n")
    with pytest.raises(dsl.ArgumentError) as info:
        dsl.jvp(dsl.grad(m.f), (np.ones(3), np.ones(3)), (np.ones(2), None))
    assert info.value.message == ("the tangent for 'x' of grad(f) has shape [2]; its primal "
                                  "has shape [3]")
    _, pullback = dsl.vjp(dsl.grad(m.f), np.ones(3), np.ones(3))
    with pytest.raises(dsl.ArgumentError, match=r"pullback of grad\(f\) takes 1 "):
        pullback(np.ones(3), np.ones(3))


def test_a_tangent_for_a_defaulted_argument_not_passed_says_to_pass_it():
    # 'a' is f's argument: "f() neither takes it as an argument" misled
    m = dsl.loads("def f(x, a: f64 = 1.5):\n    return x * a\n")
    with pytest.raises(dsl.ArgumentError, match="tangent for 'a', an argument of f\\(\\) that "
                                                "was not passed: pass its value among the "
                                                "primals"):
        dsl.jvp(m.f, (np.ones(2),), {"a": 1.0})
    assert dsl.jvp(m.f, (np.ones(2), 1.5), {"a": 2.0})[1].tolist() == [2.0, 2.0]


def test_a_const_or_integer_tangent_must_be_none_or_zero():
    m = dsl.loads("def f(x, k: const, n: i64):\n    return x * k + n\n")
    y, ty = dsl.jvp(m.f, (2.0, 3.0, 4), (1.0, 0.0, 0))
    assert (y, ty) == (10.0, 3.0)
    for tangents in ((1.0, 1.0, None), (1.0, None, 2)):
        with pytest.raises(dsl.ArgumentError, match="must be None or zero"):
            dsl.jvp(m.f, (2.0, 3.0, 4), tangents)
    # zero, but not of the primal's shape: as wrong as for a float argument
    for tangents in ((1.0, np.zeros(5), None), (1.0, None, np.zeros((2, 1), np.int64))):
        with pytest.raises(dsl.ArgumentError, match=r"has shape \[\d+(, 1)?\]; its primal "
                                                    r"has shape \[\]"):
            dsl.jvp(m.f, (2.0, 3.0, 4), tangents)


def test_jax_s_float0_tangent_of_an_integer_is_taken_as_none():
    # jax.jvp takes (only) float0 tangents for integer and bool primals; here
    # one was "not numeric: got ndarray"
    float0 = np.dtype([("float0", "V")])  # jax.dtypes.float0
    m = dsl.loads("def f(x, n: i64):\n    return x * n\n")
    y, ty = dsl.jvp(m.f, (2.0, 3), (1.5, np.zeros((), float0)))
    assert (y, ty) == (6.0, 4.5)
    for tangents, text in (((np.zeros((), float0), None), r"'x' of f\(\) has dtype float0 "),
                           ((1.0, np.zeros(2, float0)), r"'n' of f\(\) has shape \[2\]")):
        with pytest.raises(dsl.ArgumentError, match=text):
            dsl.jvp(m.f, (2.0, 3), tangents)


def test_hvp_along_an_integer_argument_names_it_not_v():
    # v was converted to x's i64 first: "v of hvp(f) must hold i64 values"
    m = dsl.loads("def f(x):\n    return sum(x * x)\n")
    for x in (np.arange(3), np.array([True, False, True])):
        with pytest.raises(dsl.ArgumentError) as info:
            dsl.hvp(m.f)(x, np.array([0.5, 1.0, 2.0]))
        assert info.value.message == (f"cannot differentiate f() with respect to 'x': it has "
                                      f"dtype {'i64' if x.dtype.kind == 'i' else 'bool'}, and "
                                      "only floats carry gradients")
    assert dsl.hvp(m.f)(np.arange(3.0), np.array([0.5, 1.0, 2.0])).tolist() == [1.0, 2.0, 4.0]


def test_the_branch_not_taken_contributes_no_nan_to_the_tangent():
    # sqrt's tangent t / (2 sqrt(x)) is t / 0 = inf at x = 0, in the branch not taken
    m = dsl.loads("def f(x):\n    return where(x > 0, sqrt(x), 2 * x)\n")
    x = np.array([0.0, -1.0, 4.0])
    _, ty = dsl.jvp(m.f, (x,), (np.ones(3),))
    np.testing.assert_array_equal(ty, [2.0, 2.0, 0.25])


def test_a_nan_safe_block_stays_nan_safe_transposed():
    # the block selects away 0.5 / sqrt(x) at x <= 0 after a loop applying
    # it: the transpose takes where(x > 0, t, 0) through the loop, whose
    # quotient gave 0 / sqrt(x) = NaN there (reverse mode, which re-selects
    # by the where-mask, gives 0; so does the transpose now, in a loop too)
    m = dsl.loads("def g(x, n: i64):\n    return where(x > 0, sqrt(x), 0.0)\ngrad(d):\n"
                  "    acc = d\n    for i in range(n):\n        acc = acc * 0.5 / sqrt(x)\n"
                  "    return where(x > 0, acc, 0.0)\n")
    x, t = np.array([-1.0, 0.0, 4.0]), np.array([1.0, 2.0, 3.0])
    np.testing.assert_array_equal(dsl.jvp(m.g, (x, 1), (t, None))[1], [0.0, 0.0, 0.75])


def test_a_calls_tangent_keeps_the_where_mask_of_its_block():
    # r's block selects by x > 0, as where(x > 0, x, 0) itself would: sqrt of
    # it had tangent 0 * inf = NaN at x <= 0 through the block (0 without it,
    # and in reverse mode); r2's too, whose second block makes its tangent a
    # call of its own
    m = dsl.loads("def r(x):\n    return where(x > 0, x, 0.0)\ngrad(d):\n"
                  "    return where(x > 0, d, 0.0)\ndef f(x):\n    return sqrt(r(x))\n"
                  "def r2(x):\n    return where(x > 0, x, 0.0)\ngrad(d):\n"
                  "    return where(x > 0, d, 0.0)\ngrad(dd):\n"
                  "    return x=dd * 0.0, d=where(x > 0, dd, 0.0)\n"
                  "def f2(x):\n    return sqrt(r2(x))\n")
    x, t = np.array([-1.0, 0.0, 4.0]), np.array([1.0, 2.0, 3.0])
    for f in (m.f, m.f2):
        np.testing.assert_array_equal(dsl.jvp(f, (x,), (t,))[1], [0.0, 0.0, 0.75])
    # and an input's where-mask through a block with a block after it (s2,
    # sqrt's own: d * 0.5 / sqrt(x) at 0 is 0 * inf), as through s, one block
    m = dsl.loads("def s(x):\n    return sqrt(x)\ngrad(d):\n    return d * 0.5 / sqrt(x)\n"
                  "def s2(x):\n    return sqrt(x)\ngrad(d):\n    return d * 0.5 / sqrt(x)\n"
                  "grad(dd):\n    return x=dd * d * -0.25 / (x * sqrt(x)), d=dd * 0.5 / sqrt(x)\n"
                  "def g(x):\n    return s(where(x > 0, x, 0.0))\n"
                  "def g2(x):\n    return s2(where(x > 0, x, 0.0))\n")
    for f in (m.g, m.g2):
        np.testing.assert_array_equal(dsl.jvp(f, (x,), (t,))[1], [0.0, 0.0, 0.75])


IN_LANGUAGE = """
def log1pexp(x):
    e = exp(x)
    return log(1 + e)
grad(dy):
    return dy * (1 - 1 / (1 + e))

def f(x, w):
    return sin(x * w) * x

def squared_tangent(x, w, v):
    y, t = jvp(f, wrt=0)(x, w, v)
    return sum(t * t)

def block_tangent(x):
    y, t = jvp(log1pexp)(x, 1.0)
    return t
"""


def test_jvp_in_the_language_runs_through_blocks_and_differentiates_again():
    m = dsl.loads(IN_LANGUAGE)
    x, w, v = np.array([0.3, -1.2]), np.array([0.7, 2.0]), np.array([1.0, 0.5])
    t = v * (w * np.cos(x * w) * x + np.sin(x * w))  # d/dx (sin(x w) x) along v
    np.testing.assert_allclose(m.squared_tangent(x, w, v), np.sum(t * t), rtol=1e-12)
    gx, gw = dsl.grad(m.squared_tangent, wrt=(0, 1))(x, w, v)  # reverse over forward
    args = [x, w, v]
    np.testing.assert_allclose(gx, central_difference(m.squared_tangent, args, 0), rtol=1e-6)
    np.testing.assert_allclose(gw, central_difference(m.squared_tangent, args, 1), rtol=1e-6)
    # the tangent (1.0, spread to x's shape) through log1pexp's block: finite at 100
    np.testing.assert_array_equal(m.block_tangent(np.array([100.0, 0.0])), [1.0, 0.5])


def test_jvp_in_the_language_needs_a_tangent_per_wrt():
    with pytest.raises(dsl.GradError, match=r"then 2 tangent\(s\), one per wrt"):
        dsl.loads("def f(x, y):\n    return x * y\ndef g(x):\n"
                  "    return jvp(f, wrt=(0, 1))(x)\n")
    with pytest.raises(dsl.GradError, match="missing argument"):
        dsl.loads("def f(x, y):\n    return x * y\ndef g(x):\n    return jvp(f)(x, x)[1]\n")


def test_jvp_through_gathers_and_scatters():
    m = dsl.loads("def g(x, i):\n"
                  "    return sum(take(x, i) * x[0]) + scatter_add(x, i, x * 0 + 1)\n")
    x, i = np.array([1.0, 2.0, 3.0]), np.array([2, 0, 2])
    jf, jr = dsl.jacfwd(m.g, wrt=0)(x, i), dsl.jacrev(m.g, wrt=0)(x, i)
    np.testing.assert_allclose(jf, jr, rtol=1e-12)
    np.testing.assert_allclose(dsl.jvp(m.g, (x, i), (np.ones(3), None))[1], jf @ np.ones(3),
                               rtol=1e-12)


# ------------------------------------------- jacfwd's columns in one program

STACKED_SOURCE = """
param w: f64[3, 2]
def layers(x: f64[4, 3], i: i64[2], labels: i64[4]):
    h = tanh(x @ w)                                 # matmul, stacked on the left
    g = transpose(w) @ transpose(x)                 # and on the right
    s = sum(h, axis=1, keepdims=True) * max(x, axis=0)[0:1]
    r = reshape(concatenate([h, transpose(g)], axis=1), [4, 2, 2])
    picked = take_along_axis(x, labels % 3, axis=1) + take(x, i, axis=0)[0, 1]
    back = scatter_add(zeros_like(x), i, x[0:2, :] * 2.0) + segment_sum(x, labels % 2, 4)
    both = where(x > 0.0, broadcast_to(s, [4, 3]), x * x)
    return sum(r, axis=2) @ ones_like(h[0]) + picked + sum(back + both, axis=1)
@recompute
def again(x: f64[4, 3], i: i64[2], labels: i64[4]):
    return layers(x, i, labels) * 2.0
def looped(x: f64[4, 3], i: i64[2], labels: i64[4]):
    u = x
    for k in range(2):
        u = sin(u) + 0.5 * u
    return u @ w
"""


def _stacked_module():
    m = dsl.loads(STACKED_SOURCE)
    m.params["w"] = np.array([[0.3, -0.7], [1.1, 0.2], [-0.4, 0.9]])
    x = np.array([[0.5, -1.2, 2.0], [0.1, 0.7, -0.3], [-1.5, 0.4, 0.9], [1.3, -0.6, 0.2]])
    return m, (x, np.array([2, -1]), np.array([1, 0, 2, 5]))


def _stacks(f, key) -> bool:
    """Whether the stacked transform of f under `key` (made by a Jacobian)
    took stacked values for every signature it was asked about."""
    plans = [elements for _, elements in derived_if_made(f, key)._plans.values()]
    assert plans
    return all(p is not None for p in plans)


def _one_at_a_time(monkeypatch):
    """Jacobians from here on take the path of one jvp or pullback per
    element, as for a function whose ops cannot take stacked values."""
    monkeypatch.setattr(Stacked, "per_slice", lambda self, bound: None)


@pytest.mark.parametrize("fn,stacks", [("layers", True), ("again", True), ("looped", True)])
def test_jacobians_run_every_column_or_row_in_one_program_where_they_can(fn, stacks,
                                                                          monkeypatch):
    m, args = _stacked_module()
    f = getattr(m, fn)
    jf, jr = dsl.jacfwd(f, wrt=(0, "w"))(*args), dsl.jacrev(f, wrt=(0, "w"))(*args)
    # a loop stacks too (its body vectorized: it ran one jvp per element of
    # x and one pullback per element of the output); each against the path
    # of one at a time
    assert _stacks(f, ("stacked jvp", "x")) == stacks and _stacks(f, ("stacked jvp", "w"))
    assert _stacks(f, ("stacked vjp", 1, 0)) == stacks
    _one_at_a_time(monkeypatch)
    for stacked, one_by_one in zip(jf + jr, dsl.jacfwd(f, wrt=(0, "w"))(*args)
                                   + dsl.jacrev(f, wrt=(0, "w"))(*args)):
        assert stacked.shape == one_by_one.shape
        np.testing.assert_allclose(stacked, one_by_one, rtol=1e-12, atol=1e-12)
    if stacks:  # central differences, for one column
        t = np.zeros_like(args[0])
        t[1, 2] = 1.0
        eps = 1e-6
        plus, minus = f(args[0] + eps * t, *args[1:]), f(args[0] - eps * t, *args[1:])
        np.testing.assert_allclose(jf[0][..., 1, 2], (plus - minus) / (2 * eps), rtol=1e-6,
                                   atol=1e-7)


def test_jacobians_in_blocks_of_columns_or_rows_equal_them_in_one(monkeypatch):
    from dsl import forward
    m, args = _stacked_module()
    whole, rows = dsl.jacfwd(m.layers)(*args), dsl.jacrev(m.layers)(*args)
    monkeypatch.setattr(forward, "STACKED_ELEMENTS", 5 * sum(np.size(a) for a in args))
    np.testing.assert_array_equal(dsl.jacfwd(m.layers)(*args), whole)
    np.testing.assert_array_equal(dsl.jacrev(m.layers)(*args), rows)
    hessian = dsl.hessian(load("log1pexp").log1pexp)(np.linspace(-3.0, 3.0, 7))
    s = 1 / (1 + np.exp(-np.linspace(-3.0, 3.0, 7)))
    np.testing.assert_allclose(hessian, np.diag(s * (1 - s)), rtol=1e-12, atol=1e-15)


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 2**31))
def test_stacked_jacobians_agree_at_random_points(seed):
    # one shape: each compiles its programs (slices need concrete sizes)
    m = _oracle_module(ORACLE_PROGRAMS)
    rng = np.random.default_rng(seed)
    b, k = 3, 2
    x = rng.normal(size=(b, k))
    # slices with steps, a transposed view, stack, clip, where and powers
    # (the other ops are in the test above)
    cases = ((m.slices, (rng.normal(size=(b + 1, k)),)), (m.mixed, (x[0],)))
    for f, args in cases:
        forward, reverse = dsl.jacfwd(f)(*args), dsl.jacrev(f)(*args)
        np.testing.assert_allclose(forward, reverse, rtol=1e-12, atol=1e-12, err_msg=f.name)
        assert _stacks(f, ("stacked jvp", f.specs[0].name)) and _stacks(f, ("stacked vjp", 1, 0))
        # both stacked: central differences of the summed outputs check them
        out_axes = tuple(range(forward.ndim - np.ndim(args[0])))
        np.testing.assert_allclose(forward.sum(axis=out_axes), central_difference(f, args, 0),
                                   rtol=1e-6, atol=1e-6, err_msg=f.name)


@functools.lru_cache(maxsize=None)
def _oracle_module(source: str):
    return dsl.loads(source, "programs.grad")


def test_stacked_blocks_are_sized_by_the_values_the_program_stacks(monkeypatch):
    # an output of n*n elements from an argument of 2: each row's stacked
    # values hold the output's n*n (the one-hot cotangent, the broadcast),
    # so rows run in blocks; counting the arguments alone ran all n**2 rows
    # at once, n**4 elements (766 MB at n = 100)
    from dsl import forward
    m = dsl.loads("def f(x, n: const i64):\n    return broadcast_to(x[0] * x[1], [n, n])\n")
    x, n = np.array([1.5, -2.0]), 6
    run = forward._run
    stacked_rows = []
    monkeypatch.setattr(forward, "_run", lambda f, bound, **kw: (
        stacked_rows.append(bound[f.stacked[0]].shape[0]) if isinstance(f, Stacked) else None)
        or run(f, bound, **kw))
    monkeypatch.setattr(forward, "STACKED_ELEMENTS", 4 * n * n)
    jr = dsl.jacrev(m.f)(x, n)
    assert max(stacked_rows) * n * n <= 4 * n * n and sum(stacked_rows) == n * n
    np.testing.assert_array_equal(jr, np.broadcast_to([x[1], x[0]], (n, n, 2)))


def test_a_float_outputs_jacobian_has_its_dtype_in_both_modes():
    m = dsl.loads("def f(x: f32[3], y: f64[3]):\n    return x * y, (x * y)[0:0]\n")
    x, y = np.arange(3, dtype=np.float32), np.array([0.5, 2.0, -1.0])
    for mode in (dsl.jacfwd, dsl.jacrev):
        full, empty = mode(m.f, wrt=0)(x, y)
        assert (full.dtype, empty.dtype) == (np.float64, np.float64), mode
        np.testing.assert_array_equal(full, np.diag(y))


def test_jvp_tangents_are_placed_as_the_primals_are():
    # hvp's v comes after f's arguments, a defaulted one left out: the
    # tangents, one per primal, were zipped with the parameters ("got a
    # tangent for 'c', an argument of hvp(f) that was not passed"); hvp is
    # linear in v, so its tangent along v is the Hessian's diagonal times it
    f = dsl.loads("def f(x, w, c: f64 = 1.0):\n    return sum(sin(x * w) * c)\n").f
    x, w, v = np.array([0.5, -1.0, 2.0]), np.array([1.5, 0.3, -0.7]), np.ones(3)
    t = np.array([2.0, -1.0, 0.5])
    _, along_v = dsl.jvp(dsl.hvp(f, wrt=1), (x, w, v), (None, None, t))
    np.testing.assert_allclose(along_v, -x ** 2 * np.sin(x * w) * t, rtol=1e-13)


JACOBIAN_CALLS = """
param scale: f64
def two(x, y):
    return x * y, sin(x) + y * y
def ident(x):
    return x
def scaled(x):
    return x * scale
"""


def jacobian_by_differences(f, args, index):
    """Each output's Jacobian with respect to args[index] (out.shape +
    arg.shape), by central differences of its elements."""
    outs = f(*args)
    outs = outs if isinstance(outs, tuple) else (outs,)
    jacobians = []
    for k, out in enumerate(outs):
        rows = [central_difference(lambda *a, k=k, i=i: np.ravel(
            (f(*a) if isinstance(f(*a), tuple) else (f(*a),))[k])[i], args, index)
            for i in range(out.size)]
        jacobians.append(np.array(rows).reshape(out.shape + np.shape(args[index])))
    return jacobians


@pytest.mark.parametrize("transform", [dsl.jacfwd, dsl.jacrev])
def test_a_repeated_jacobian_call_runs_what_the_first_remembered(transform, monkeypatch):
    m = dsl.loads(JACOBIAN_CALLS)
    x, y = RNG.uniform(-1, 1, 3), RNG.uniform(-1, 1, (2, 3))
    first = transform(m.two, (0, 1))(x, y)  # (two outputs) x (two arguments)
    for k, expected in enumerate(jacobian_by_differences(m.two, (x, y), 0)):
        np.testing.assert_allclose(first[k][0], expected, atol=1e-8)
    for k, expected in enumerate(jacobian_by_differences(m.two, (x, y), 1)):
        np.testing.assert_allclose(first[k][1], expected, atol=1e-8)
    # a later call (a new Jacobian object, as `dsl.jacfwd(f)(x)` in a loop
    # makes) neither binds nor runs in blocks: the same bits
    monkeypatch.setattr(forward.Jacobian, "call_bound", None)
    monkeypatch.setattr(type(m.two), "bind", None)
    again = transform(m.two, (0, 1))(x, y)
    for k, w in np.ndindex(2, 2):
        assert np.array_equal(again[k][w], first[k][w])
    again[0][0][...] = 7.0  # results of their own: the next call's are untouched
    assert np.array_equal(transform(m.two, (0, 1))(x, y)[0][0], first[0][0])


def test_remembered_jacobians_never_view_what_they_keep():
    m = dsl.loads(JACOBIAN_CALLS)
    x = RNG.uniform(-1, 1, 4)
    for transform in (dsl.jacfwd, dsl.jacrev):
        results = [transform(m.ident)(x) for _ in range(3)]
        results[1][...] = -1.0
        np.testing.assert_array_equal(results[2], np.eye(4))
        np.testing.assert_array_equal(transform(m.ident)(x), np.eye(4))


def test_a_jacobian_reading_a_param_reads_its_value_at_each_call():
    m = dsl.loads(JACOBIAN_CALLS)
    x = RNG.uniform(-1, 1, 3)
    for scale in (2.0, 5.0, -1.0):
        m.params["scale"] = np.float64(scale)
        for transform in (dsl.jacfwd, dsl.jacrev):
            np.testing.assert_array_equal(transform(m.scaled)(x), scale * np.eye(3))


def test_a_jacobian_whose_integer_argument_gives_a_size_runs_for_its_value():
    # num_segments picks the jvp's program by its value (`by_value`, found
    # by the stacked jvp, not by f): a remembered jacfwd gave n = 3 the
    # (2, 3) Jacobian compiled for n = 2
    m = dsl.loads("def pooled(v, ids, n):\n    return segment_sum(v * v, ids, n)\n")
    v, ids = np.array([1.0, 2.0, 3.0]), np.array([0, 1, 1])
    for transform in (dsl.jacfwd, dsl.jacrev):
        for n in (2, 3, 2):
            expected = np.zeros((n, 3))
            expected[ids, np.arange(3)] = 2 * v
            np.testing.assert_array_equal(transform(m.pooled)(v, ids, np.array(n)), expected)


def test_a_loop_s_jvp_takes_no_tangent_for_an_invariant_that_has_none(monkeypatch):
    # Kept in the body (as work on an invariant is where it cannot move;
    # hoisting off here), log(w) took a zero tangent made for w, which has
    # none: 0 * inf = NaN at w = 0, where the straight-line function's
    # tangent along x is 2 log(w) t = -inf; and every trip did that work.
    from gradlang.compiler import hoisting
    monkeypatch.setattr(hoisting, "ENABLED", False)
    m = dsl.loads("def looped(x, w):\n    s = x * 0.0\n    for i in range(2):\n"
                  "        s = s + log(w) * x\n    return s\n\n"
                  "def straight(x, w):\n    return log(w) * x + log(w) * x\n", "inv.grad")
    x, t = np.array([1.0, 2.0, -1.5]), np.array([1.0, 0.5, 2.0])
    for w in (np.array([0.0, 1.0, 0.25]), np.array([0.5, 2.0, 3.0])):
        expected = 2 * np.log(w) * t
        for f in (m.looped, m.straight):
            value, tangent = dsl.jvp(f, (x, w), (t, None))
            np.testing.assert_allclose(value, 2 * np.log(w) * x, rtol=1e-15)
            np.testing.assert_allclose(tangent, expected, rtol=1e-15)
    # along w too, at a regular point, against central differences
    tw = np.array([0.3, -1.0, 2.0])
    _, tangent = dsl.jvp(m.looped, (x, w), (t, tw))
    eps = 1e-6
    differences = (m.looped(x + eps * t, w + eps * tw) - m.looped(x - eps * t, w - eps * tw)) / (2 * eps)
    np.testing.assert_allclose(tangent, differences, rtol=1e-7)


def test_a_loop_s_jvp_takes_no_tangent_for_a_carried_value_no_trip_makes_active():
    # w is carried (halved each trip) but never depends on x: a zero
    # tangent made for it was 0 * inf = NaN through sqrt(w) at w = 0, in
    # the body and after the loop (even for no trips), where the straight-
    # line tangent along x is (sqrt(w) + sqrt(w / 2)) t = 0.  b becomes
    # active only on the trip after a does, and must still take its tangent.
    m = dsl.loads("def looped(x, w, n: i64):\n    s = x * 0.0\n    a = w\n    b = w * 0.0\n"
                  "    for i in range(n):\n        s = s + sqrt(w) * x + b\n        b = a * w\n"
                  "        a = a + x\n        w = w * 0.5\n    return s + sqrt(w)\n",
                  "carried.grad")
    x, t = np.array([1.0, 2.0, -1.5]), np.array([1.0, 0.5, 2.0])
    for w in (np.array([0.0, 1.0, 0.25]), np.array([0.5, 2.0, 3.0])):
        value, tangent = dsl.jvp(m.looped, (x, w, np.array(2)), (t, None, None))
        straight = np.sqrt(w) * x + np.sqrt(w * 0.5) * x + w * w + np.sqrt(w * 0.25)
        np.testing.assert_allclose(value, straight, rtol=1e-15)
        np.testing.assert_allclose(tangent, (np.sqrt(w) + np.sqrt(w / 2)) * t, rtol=1e-15)
        value, tangent = dsl.jvp(m.looped, (x, w, np.array(0)), (t, None, None))
        np.testing.assert_array_equal(tangent, np.zeros(3))
    # b's tangent reaches s on the third trip: against central differences
    eps, n = 1e-6, np.array(3)
    _, tangent = dsl.jvp(m.looped, (x, w, n), (t, None, None))
    differences = (m.looped(x + eps * t, w, n) - m.looped(x - eps * t, w, n)) / (2 * eps)
    np.testing.assert_allclose(tangent, differences, rtol=1e-7)


SQRT_OF_HALVED = """\
def plain(x, w, n: i64):
    a = w
    for i in range(n):
        w = w * 0.5
        a = sin(a) * x + sqrt(w) * a
    return sum(a * a)

@recompute(every=2)
def checkpointed(x, w, n: i64):
    a = w
    for i in range(n):
        w = w * 0.5
        a = sin(a) * x + sqrt(w) * a
    return sum(a * a)
"""


@pytest.mark.parametrize("name", ["plain", "checkpointed"])
def test_forward_over_reverse_of_a_loop_gives_no_tangent_to_states_it_stacks_without_one(name):
    # The loop's forward pass stacks w for the backward loop (plain: per
    # trip; checkpointed: per segment, the segment's inner loop passing it
    # along); w never depends on x, so its stack takes no tangent.  A stack
    # of zero tangents, or w's in the segments counted active, was read
    # through sqrt(w)'s slope at w = 0 in the backward loop: 0 * inf = NaN,
    # where the Hessian-vector product along x is 0 (a stays 0).
    f = getattr(dsl.loads(SQRT_OF_HALVED, "halved.grad"), name)
    x, t, n = np.array([0.3, -0.7, 1.1]), np.array([1.0, 0.5, 2.0]), np.array(3)
    gradient = dsl.grad(f, wrt=0)
    for w in (np.array([0.0, 1.0, 0.25]), np.array([0.5, 2.0, 3.0])):
        _, tangent = dsl.jvp(gradient, (x, w, n), (t, None, None))
        eps = 1e-6
        differences = (gradient(x + eps * t, w, n) - gradient(x - eps * t, w, n)) / (2 * eps)
        assert tangent[0] == 0 or w[0] != 0
        np.testing.assert_allclose(tangent, differences, rtol=1e-7, atol=1e-9)


def test_a_where_mask_enters_a_loop_that_keeps_it():
    # y = where(x > 0, x, 0) is carried: the tangent of sqrt(y) in the body
    # (and after the loop, even for no trips) was 0 * inf = NaN at x <= 0,
    # where the straight-line jvp and reverse mode give 0.  In `kept`, a
    # where in the body narrows the mask (still within the first).
    m = dsl.loads("def halved(x, n: i64):\n    y = where(x > 0, x, 0.0)\n    s = x * 0.0\n"
                  "    for i in range(n):\n        y = y * 0.5\n        s = s + sqrt(y)\n"
                  "    return s + sqrt(y)\n\n"
                  "def kept(x, n: i64):\n    y = where(x > 0, x, 0.0)\n    s = x * 0.0\n"
                  "    for i in range(n):\n        y = where(y > 0.5, y * 0.5, y)\n"
                  "        s = s + sqrt(y)\n    return s\n", "masked.grad")
    x, t = np.array([-1.0, 0.0, 2.0, 0.7]), np.array([1.0, 0.5, -2.0, 0.3])
    # halved: sqrt(x / 2) + 2 sqrt(x / 4); kept: at 2, sqrt(x / 2) + sqrt(x / 4);
    # at 0.7, 2 sqrt(x / 2)
    root = np.sqrt(np.maximum(x, 1e-300))
    expected = {("halved", 2): (1 / np.sqrt(2) + 1) / (2 * root), ("halved", 0): 1 / (2 * root),
                ("kept", 2): np.array([0.0, 0.0, 1 / 4 + 1 / (8 * np.sqrt(0.5)), 1 / np.sqrt(1.4)])}
    for (name, n), slope in expected.items():
        _, tangent = dsl.jvp(getattr(m, name), (x, np.array(n)), (t, None))
        np.testing.assert_allclose(tangent, np.where(x > 0, slope, 0) * t, rtol=1e-14)


def test_a_where_mask_moves_through_indexing_layout_and_sums():
    # The mask of where(x > 0, x, 0)'s tangent was dropped by every op but
    # an elementwise one: sqrt of a row, a transposed slice or a
    # column sum of it was 0 * inf = NaN at x <= 0, where reverse mode
    # (which moves the mask back through them) gives 0; in a loop too (an
    # index by the loop's counter reads y inside it).
    m = dsl.loads("def f(x):\n    y = where(x > 0, x, 0.0)\n"
                  "    return sqrt(y[0]) + sum(sqrt(transpose(y[:, 1:]))) + sum(sqrt(sum(y, axis=0)))\n\n"
                  "def looped(x, n: i64):\n    y = where(x > 0, x, 0.0)\n    s = x[0] * 0.0\n"
                  "    for i in range(n):\n        s = s + sqrt(y[i])\n    return s\n", "moved.grad")
    x = np.array([[-1.0, 2.0, 0.0], [0.5, 0.0, -3.0]])
    t = np.array([[1.0, -0.5, 2.0], [0.25, 1.5, -1.0]])
    _, tangent = dsl.jvp(m.f, (x,), (t,))
    s = np.sqrt(np.where(x > 0, x, 0.0).sum(axis=0))
    # by hand: sqrt's slope 1 / (2 sqrt(y)) where y > 0, nothing elsewhere
    by_hand = (np.where(x[0] > 0, t[0] / (2 * np.sqrt(np.abs(x[0]))), 0.0)
               + np.sum(np.where(x[:, 1:] > 0, t[:, 1:] / (2 * np.sqrt(np.abs(x[:, 1:]))), 0.0))
               + np.sum(np.where(s > 0, np.sum(np.where(x > 0, t, 0.0), axis=0)
                                 / (2 * np.where(s > 0, s, 1.0)), 0.0)))
    np.testing.assert_allclose(tangent, by_hand, rtol=1e-14)
    _, tangent = dsl.jvp(m.looped, (x, np.array(2)), (t, None))
    np.testing.assert_allclose(tangent, np.where(x > 0, t / (2 * np.sqrt(np.abs(x))), 0.0).sum(axis=0),
                               rtol=1e-14)


SECOND_BLOCK = """
def lpe(x):
    e = exp(x)
    return log(1 + e)
grad(dy):
    return dy * (1 - 1 / (1 + e))
grad(ddx):
    s = 1 / (1 + exp(-x))
    return dy=ddx * (1 - 1 / (1 + e)), x=ddx * dy * s * (1 - s)

def tangent_sum(x, t):
    y, ty = jvp(lpe)(x, t)
    return sum(ty)
"""


def test_reverse_over_forward_differentiates_by_the_second_block():
    # The second block is finite at x = 800, where the first block's
    # derivative through its residual e = exp(x) is inf / inf: reverse over
    # forward (a Jacobian of a Jacobian, dsl.grad of an in-language jvp)
    # must use it, as reverse over reverse (dsl.hessian) does, not NaN.
    m = dsl.loads(SECOND_BLOCK)
    x = np.array([800.0, 0.5])
    s = 1 / (1 + np.exp(-x))
    want = s * (1 - s)
    assert np.allclose(np.einsum("iii->i", dsl.jacfwd(dsl.jacrev(m.lpe))(x)), want)
    assert np.allclose(dsl.grad(m.tangent_sum)(x, np.ones(2)), want)


NESTED_CALLS = """
def twice(x):
    return sin(x)
grad(dy):
    return dy * 2 * cos(x)

def two(x):
    return sin(x)
grad(dy):
    return dy * 2 * cos(x)
grad(ddx):
    return dy=ddx * 2 * cos(x), x=-5 * ddx * dy * sin(x)

def scaled(x):
    return x * 1.0
grad(dy):
    return dy * twice(x)

@recompute
def rerun(x):
    return two(x) * x

def looped(x, n: i64):
    return x * 1.0
grad(dy):
    s = dy * 0.0
    for i in range(n):
        s = s + dy * twice(x)
    return s

def tangent_sum(x, t, n: i64):
    a, ta = jvp(scaled)(x, t)
    b, tb = jvp(rerun)(x, t)
    c, tc = jvp(looped, wrt=0)(x, n, t)
    return sum(ta + tb + tc)
"""


def test_reverse_over_forward_keeps_the_blocks_of_calls_in_a_block():
    # Reverse over forward differentiated the transpose of a call's block,
    # which inlines the calls that block makes: a block calling a function
    # with a block (scaled's `dy * twice(x)`) and a @recompute body's rerun
    # (rerun's `two`, two blocks) were differentiated by their bodies (cos,
    # not twice's 2 cos; two's first block automatically, not its second),
    # in a loop of the block too (looped's). The blocks here deliberately
    # differ from sin's derivatives, so that only following them gives
    # these values (by hand, from the blocks): d/dx t * twice(x) =
    # 2 cos(x) t, n times for looped; d/dx t * (2 cos(x) x + two(x)), the
    # second block's x-cotangent -5 x sin(x) plus 2 cos(x) twice.
    m = dsl.loads(NESTED_CALLS)
    x = np.array([0.3, -1.1, 2.0])
    t = np.array([1.5, -0.5, 0.25])
    want = t * (2 * np.cos(x) + 4 * np.cos(x) - 5 * x * np.sin(x) + 3 * 2 * np.cos(x))
    np.testing.assert_allclose(dsl.grad(m.tangent_sum)(x, t, 3), want, rtol=1e-13)



def test_a_jvp_of_a_tangent_call_drops_reverse_modes_value_masks():
    # A jvp of an in-language jvp (forward over forward, as jacfwd(jacrev(f))
    # is) of a @recompute function whose rerun calls ex, whose block reads
    # a residual: reverse mode masks a residual's cotangent where it is
    # nonzero (`autodiff.materialized`), so the tangent call's VJP read masks
    # computed from its cotangents, and transposing it read them undefined
    # (a KeyError in fusion). By hand: d/dx (2 e^x v) along s.
    m = dsl.loads("def ex(x):\n    e = exp(x)\n    return e\ngrad(dy):\n    return dy * e\n\n"
                  "@recompute\ndef rx(x):\n    return ex(x) * 2.0\n\n"
                  "def tangent(x, v):\n    y, t = jvp(rx)(x, v)\n    return t\n")
    x, v, s = np.array([1.0, -2.0, 0.5]), np.array([0.5, -1.0, 2.0]), np.array([1.5, 0.25, -1.0])
    _, tangent = dsl.jvp(m.tangent, (x, v), (s, None))
    np.testing.assert_allclose(tangent, 2 * np.exp(x) * v * s, rtol=1e-13)
