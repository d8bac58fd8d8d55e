"""Adversarial uses of the transforms (jvp, hvp, the Jacobians, vmap) that
once gave wrong values or misleading errors: under a `dsl.Tape`, and with
device arrays on the CUDA target.  Values are checked against closed forms."""
import numpy as np
import pytest

import dsl

# f(x) = sum(x^3): grad 3x^2, Hessian diag(6x); g(a, b) = a * b * b
M = dsl.loads("def f(x):\n    return sum(x * x * x)\n\n"
              "def g(a, b):\n    return a * b * b\n", "<transforms>")
X = np.array([0.5, -1.0, 2.0])
Y = np.array([1.0, 2.0, 3.0])


def test_a_tangent_or_v_from_a_recorded_call_is_recorded_with_it():
    # jvp's tangents and hvp's v were bound as plain copies: a tape's result
    # among them dropped out of the gradient (zero, or the primal's half)
    with dsl.Tape(persistent=True) as tape:
        tape.watch(X)
        z = M.f(X)                                  # sum(x^3), a 0-d result
        _, t_only = dsl.jvp(M.g, (2.0, 2.0), (z, None))      # 4 z
        _, t_both = dsl.jvp(M.g, (2.0, z), (None, z))        # 2 a b tb = 4 z^2
        hv = dsl.hvp(M.f)(Y, M.g(X, 1.0))          # 6 y x
    np.testing.assert_allclose(tape.gradient(t_only, X), 12 * X ** 2, rtol=1e-14)
    np.testing.assert_allclose(tape.gradient(t_both, X), 8 * M.f(X) * 3 * X ** 2, rtol=1e-14)
    np.testing.assert_allclose(tape.gradient(hv, X), 6 * Y, rtol=1e-14)


def test_a_vjp_of_watched_arrays_and_its_pullback_are_recorded():
    # dsl.vjp ran unrecorded: its outputs and its pullback's cotangents were
    # plain arrays the tape took for constants, and the gradient through
    # them silently missed f's derivative (x^3 below for 3x^3, 2y for 4y)
    with dsl.Tape(persistent=True) as tape:
        tape.watch(X, Y)
        y, pullback = dsl.vjp(M.g, X, 1.0)          # x
        through_value = M.g(y, X)                    # x^3
        gx, _ = pullback(Y)                          # y
        through_cotangent = M.g(gx, Y)               # y^3
        # (None is refused as off the tape, not taken as an array it tracks)
        with pytest.raises(dsl.ArgumentError, match="cotangent 0 .* is None, where an array or a "
                                                           "number goes"):
            pullback(None)
    np.testing.assert_allclose(tape.gradient(through_value, X), 3 * X ** 2, rtol=1e-14)
    np.testing.assert_allclose(tape.gradient(through_cotangent, Y), 3 * Y ** 2, rtol=1e-14)
    np.testing.assert_array_equal(tape.gradient(through_cotangent, X), 0.0)  # (b^2 dy)


@pytest.mark.parametrize("transform", ["jvp", "hvp"])
def test_a_tangent_or_v_numpy_computed_from_a_recorded_call_is_a_tape_error(transform):
    # it was a silent constant: the tape's gradient missed that path
    with dsl.Tape() as tape:
        tape.watch(X)
        derived = M.g(X, 1.0) * 2
        with pytest.raises(dsl.GradError, match="computed with NumPy from arrays this tape"):
            if transform == "jvp":
                dsl.jvp(M.f, (Y,), (derived,))
            else:
                dsl.hvp(M.f)(Y, derived)


def test_jacobians_under_a_tape_are_recorded_as_one_call():
    # assembled on the host from blocks of columns, they were NumPy's work on
    # the tape's results: the gradient was a TapeError blaming the caller
    xs = np.stack([X, Y])
    with dsl.Tape(persistent=True) as tape:
        tape.watch(X, xs)
        jf = dsl.jacfwd(M.f)(X)                     # 3x^2
        jr = dsl.jacrev(M.f)(X)
        h = dsl.hessian(M.f)(X)                     # diag(6x)
        per_example = dsl.vmap(dsl.jacfwd(M.f))(xs)
    np.testing.assert_allclose(jf, 3 * X ** 2, rtol=1e-14)
    np.testing.assert_allclose(tape.gradient(jf, X), 6 * X, rtol=1e-14)
    np.testing.assert_allclose(tape.gradient(jr, X), 6 * X, rtol=1e-14)
    np.testing.assert_allclose(tape.gradient(h, X), np.full(3, 6.0), rtol=1e-14)
    np.testing.assert_allclose(tape.gradient(per_example, xs), 6 * xs, rtol=1e-14)
    # and refused by its size before anything is allocated, as off the tape
    big = np.zeros(10 ** 6)
    with dsl.Tape() as tape:
        tape.watch(big)
        with pytest.raises(dsl.AllocationError, match=r"jacfwd\(g\): the Jacobian of its result "
                                                       r"with respect to 'a' would be f64\[1000000"):
            dsl.jacfwd(M.g)(big, big)


def test_a_device_v_of_hvp_is_taken_only_in_its_arguments_dtype():
    from numba import cuda
    cu = dsl.loads("def f(x):\n    return sum(x * x * x)\n", "<transforms>", target="cuda",
                   host_results=True)
    x32 = cuda.to_device(np.array([1.0, 2.0], np.float32))
    # the kernel converted it unchecked: 1e300 became inf where a host v is refused
    with pytest.raises(dsl.ArgumentError, match=r"hvp\(f\): v is a device array of dtype f64, "
                                                r"but 'x' has dtype f32"):
        dsl.hvp(cu.f)(x32, cuda.to_device(np.array([1e300, 1.0])))
    np.testing.assert_allclose(dsl.hvp(cu.f)(x32, cuda.to_device(np.ones(2, np.float32))),
                               [6.0, 12.0])
    # the error named v by the compiler's own name for it, '$v'
    with pytest.raises(dsl.ArgumentError, match=r"argument v of hvp\(f\) is a device array "
                                                "that is not C-contiguous"):
        dsl.hvp(cu.f)(x32, cuda.to_device(np.ones(4, np.float32))[::2])


class Foreign:
    """Another library's host array, which NumPy reads by `__array__` (as a
    CPU torch tensor; one that requires grad refuses with a RuntimeError)."""

    def __init__(self, values: np.ndarray, readable: bool = True):
        self.values, self.readable = values, readable

    def __array__(self, dtype=None, copy=None):
        if not self.readable:
            raise RuntimeError("Can't call numpy() on Tensor that requires grad")
        return self.values


def test_another_librarys_tangent_keeps_its_dtype():
    # it was converted to the primal's dtype as a Python list is, where a
    # NumPy array of that dtype is refused
    for tangent, dtype in ((np.ones(3, np.float32), "f32"), (np.ones(3, bool), "bool")):
        with pytest.raises(dsl.ArgumentError, match=rf"the tangent for 'x' of f\(\) has dtype "
                                                    rf"{dtype}; its primal has dtype f64"):
            dsl.jvp(M.f, (X,), (Foreign(tangent),))
    _, t = dsl.jvp(M.f, (X,), (Foreign(np.ones(3)),))
    np.testing.assert_allclose(t, np.sum(3 * X ** 2), rtol=1e-14)


def test_another_librarys_unreadable_array_is_an_argument_error_everywhere():
    # a tangent, hvp's v or a cotangent let the library's RuntimeError through
    unreadable = Foreign(np.ones(3), readable=False)
    _, pullback = dsl.vjp(M.g, X, X)
    for call in (lambda: dsl.jvp(M.f, (X,), (unreadable,)), lambda: dsl.hvp(M.f)(X, unreadable),
                 lambda: pullback(unreadable)):
        with pytest.raises(dsl.ArgumentError, match="cannot be read as a NumPy array "
                                                    r"\(Can't call numpy\(\)"):
            call()


def test_in_language_jvp_takes_a_list_or_a_named_tuple_as_wrt():
    # the checker counted the tangents of a tuple literal only: a list, or a
    # name bound to a tuple, was one tangent ("f() takes 2 argument(s)")
    m = dsl.loads("def f(x, y):\n    return sum(x * x * y)\n\n"
                  "def t(x, y, tx, ty):\n    ws = (0, 1)\n"
                  "    v, a = jvp(f, wrt=[0, 1])(x, y, tx, ty)\n"
                  "    w, b = jvp(f, wrt=ws)(x, y, tx, ty)\n    return a, b\n", "<t>")
    tx, ty = np.array([0.5, 1.0, -1.0]), np.array([2.0, 0.0, 1.0])
    expected = np.sum(2 * X * Y * tx + X * X * ty)
    np.testing.assert_allclose(m.t(X, Y, tx, ty), (expected, expected), rtol=1e-14)


@pytest.mark.parametrize("tangent, dtype", [("x > 0.0", "bool"), ("n", "i64"), ("True", "bool")])
def test_in_language_jvp_refuses_a_tangent_that_is_not_a_float(tangent, dtype):
    # a bool or integer tangent was cast to the primal's dtype (True as a
    # tangent of 1) where dsl.jvp and jax.jvp refuse it
    m = dsl.loads("def f(x, y):\n    return sum(x * x * y)\n\n"
                  f"def t(x, y, n: i64[k]):\n    v, a = jvp(f, wrt=0)(x, y, {tangent})\n"
                  "    return a\n", "<t>")
    with pytest.raises(dsl.GradError, match=f"a tangent for 'x' has dtype {dtype}: a tangent is "
                                            "a float value") as info:
        m.t(X, Y, np.ones(3, np.int64))
    assert (info.value.line, info.value.col) == (5, 12)


@pytest.mark.parametrize("body, message", [
    # the count of tangents was not said: f's arguments seemed missing
    ("jvp(f, wrt=(0, 1))(x, x, x)", r"f\(\) is missing argument\(s\) 'y'\n(.*\n)+note: "
                                    r"jvp\(f\) takes f\(\)'s arguments, then 2 tangent\(s\)"),
    ("jvp(f, wrt=(0, 1))(x)", r"error: jvp\(f\) takes f\(\)'s arguments, then 2 tangent"),
    # "a string can only be einsum()'s subscripts"
    ("grad(f, wrt='y')(x, x)", r"wrt takes parameter positions of f\(\), not names: 'y' is "
                               "position 1"),
    # "a tuple cannot be used as an array here"
    ("grad(f, wrt=())(x, x)", r"wrt must name at least one parameter of f\(\)"),
    # an undefined name: the message did not say which
    ("grad(nope)(x, x)", r"grad\(\) takes the name of a function as its first argument "
                         r"\(no function 'nope' is defined or imported\)"),
    # a builtin: it said no function 'exp' was defined, not what to write
    ("grad(exp)(x)", r"\('exp' is a builtin: define a function that calls it, def g\(x\): "
                     r"return exp\(x\), and take grad\(g\)\)"),
])
def test_in_language_transform_misuse_says_what_the_transform_takes(body, message):
    with pytest.raises(dsl.GradError, match=message):
        dsl.loads(f"def f(x, y):\n    return sum(x * x * y)\n\ndef t(x):\n    return {body}\n",
                  "<t>").t(X)


def test_a_jvp_under_a_tape_on_cuda_with_host_results():
    # the recorded call's results were on the host already, and copying them
    # "to the host" again raised AttributeError: no copy_to_host on a TapeArray
    cu = dsl.loads("def f(x):\n    return sum(x * x * x)\n", "<transforms>", target="cuda",
                   host_results=True)
    with dsl.Tape() as tape:
        tape.watch(X)
        _, t = dsl.jvp(cu.f, (X,), (Y,))              # sum(3 x^2 y)
    np.testing.assert_allclose(t, np.sum(3 * X ** 2 * Y), rtol=1e-14)
    np.testing.assert_allclose(tape.gradient(t, X), 6 * X * Y, rtol=1e-14)


def test_the_pullback_of_a_jacobian_has_a_cotangent_per_argument_passed():
    # its hidden one-hot tangents got one too: a trailing None, and under
    # vmap the gradient along them, as if the caller had passed a second
    # argument
    _, pullback = dsl.vjp(dsl.hessian(M.f), X)          # d sum(diag(6x) * 1) = 6
    np.testing.assert_allclose(pullback(np.ones((3, 3))), (np.full(3, 6.0),), rtol=1e-14)
    xs = np.stack([X, Y])
    _, pullback = dsl.vjp(dsl.vmap(dsl.jacfwd(M.f)), xs)   # d sum(3x^2) = 6x
    (cotangent,) = pullback(np.ones((2, 3)))
    np.testing.assert_allclose(cotangent, 6 * xs, rtol=1e-14)


def test_a_jvp_of_hvp_takes_the_tangent_of_v_by_its_name():
    # "jvp() got a tangent for 'v', which hvp(f) neither takes as an argument
    # nor reads as a param": its v had the compiler's name '$v'
    _, t = dsl.jvp(dsl.hvp(M.f), (X, Y), {"v": Y})      # along v: H y = 6 x y
    np.testing.assert_allclose(t, 6 * X * Y, rtol=1e-14)
    _, t = dsl.jvp(dsl.vmap(dsl.hvp(M.f)), (X[None], Y[None]), {"v": Y[None]})
    np.testing.assert_allclose(t, 6 * X * Y[None], rtol=1e-14)


def test_a_transform_of_hvp_takes_v_by_its_name_as_wrt():
    # "hvp(f) has no parameter 'v'": wrt was looked up by the compiler's
    # name '$v', which jvp's tangents and vmap's errors already say as v
    hvp = dsl.hvp(M.f)  # hvp(f)(x, v) = 6 x v
    gx, gv = dsl.grad(hvp, wrt=(0, "v"))(X, Y)
    np.testing.assert_allclose(gx, 6 * Y, rtol=1e-14)
    np.testing.assert_allclose(gv, 6 * X, rtol=1e-14)
    # a negative position counts from the last, as JAX's argnums (it was
    # "wrt=-1 is out of range")
    gx, gv = dsl.grad(hvp, wrt=(0, -1))(X, Y)
    np.testing.assert_allclose(gx, 6 * Y, rtol=1e-14)
    np.testing.assert_allclose(gv, 6 * X, rtol=1e-14)
    with pytest.raises(dsl.ArgumentError, match=r"wrt=-3 is out of range: hvp\(f\) has 2"):
        dsl.grad(hvp, wrt=-3)


def test_in_language_wrt_counts_negative_positions_from_the_last():
    # "wrt must be parameter positions of pw() (0 to 1), got -1" at load
    m = dsl.loads("def pw(x, scale):\n    return sum(x * x) * scale * scale\n\n"
                  "def t(x):\n    dx, dscale = grad(pw, wrt=(-2, -1))(x, 2.0)\n    return dx, dscale\n",
                  "<w>")
    dx, dscale = m.t(np.array([1.0, 2.0]))  # d/dx = 2 x scale^2, d/dscale = 2 scale sum(x^2)
    np.testing.assert_allclose(dx, [8.0, 16.0], rtol=1e-15)
    assert dscale == 20.0
    with pytest.raises(dsl.GradError, match=r"of pw\(\) \(0 to 1, or -2 to -1 from the end\), "
                                            "got -3"):
        dsl.loads("def pw(x, scale):\n    return x * scale\n\n"
                  "def t(x):\n    return grad(pw, wrt=-3)(x, 2.0)\n", "<w>")


def test_in_language_transforms_differentiate_along_a_number_argument():
    # a number given for the parameter wrt names was a compile-time value:
    # "cannot differentiate pw() with respect to 'scale': it is not a float
    # array here" (JAX differentiates along a Python float argument too)
    m = dsl.loads("def pw(x, scale, k: f32 = 1.0):\n    return sum(x * x) * scale * scale * k\n\n"
                  "def t(x):\n    a, b = grad(pw, wrt=(1, 2))(x, 2, 3.0)\n"
                  "    v, c = jvp(pw, wrt=1)(x, 2.0, 1.0)\n    return a, b, c\n", "<t>")
    x = np.array([1.0, 2.0])   # sum(x^2) = 5: d/dscale = 2 scale k 5, d/dk = scale^2 5
    np.testing.assert_allclose(m.t(x), (60.0, 20.0, 20.0), rtol=1e-6)
    # a number is an array as one passed from Python is: f32 beside f32 arrays
    assert [r.dtype for r in m.t(x.astype(np.float32))] == [np.float32] * 3
    assert m.t(x)[0].dtype == np.float64 and m.t(x)[1].dtype == np.float32  # (k: f32)
