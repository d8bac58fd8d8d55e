"""`out=`: a callable writes its results into the caller's buffers and
returns them (the same objects, in the structure of its result), with
NumPy's values; every bad buffer raises `ArgumentError` naming it before
any kernel runs (the other buffers keep their contents)."""
import re

import numpy as np
import pytest

import dsl
from helpers import central_difference

M = dsl.loads("""
param w: f64[n]

def log1pexp(x):
    return log(1 + exp(x))

def stats(x, y):
    z = x * y
    return sum(z * z), z, x, z

def layer(x, v):
    return tanh(x @ v)

def scaled(x):
    return w * x

def constant_and_twice(x):
    return 2.0, x * 2.0

def times(x: f64[n], k: const i64):
    return x * k

def cube(x):
    return sum(x * x * x)

def doubled_and_gathered(x, ids):
    return x * 2.0, x[ids] * 3.0
""")


def log1pexp(x):
    return np.log(1 + np.exp(x))  # as the module computes it


def stats(x, y):
    z = x * y
    return np.sum(z * z), z, x, z


def test_value_and_grad_into_buffers():
    f = dsl.value_and_grad(M.log1pexp)
    v, g = np.empty(7), np.empty(7)
    for x in (np.linspace(-3.0, 3.0, 7), np.linspace(-5.0, 1.0, 7)):  # the same buffers
        got = f(x, out=(v, g))
        assert got[0] is v and got[1] is g
        np.testing.assert_allclose(v, log1pexp(x), rtol=1e-12)
        np.testing.assert_allclose(g, 1 / (1 + np.exp(-x)), rtol=1e-12)
        np.testing.assert_allclose(g, central_difference(log1pexp, [x], 0), rtol=1e-6)


def test_a_function_into_its_buffer():
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    buf = np.empty((2, 3))
    assert M.log1pexp(x, out=buf) is buf
    np.testing.assert_allclose(buf, log1pexp(x), rtol=1e-12)
    plain = M.log1pexp(x)  # and without out=, a fresh array again
    assert plain is not buf
    np.testing.assert_allclose(plain, buf, rtol=0)



@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")  # np.matrix
def test_buffers_of_ndarray_subclasses_are_written_whole(tmp_path):
    """An `np.matrix` reshapes to 2-D, so a kernel writing it as the flat
    view a driver makes wrote past its end (a crash, or every element
    equal to the first); a memmap is a subclass as well."""
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    mapped = np.memmap(tmp_path / "out.f64", dtype=np.float64, mode="w+", shape=(2, 3))
    for buf in (np.matrix(np.zeros((2, 3))), mapped):
        for _ in range(2):  # the second call is a fast one
            buf[...] = 0.0
            assert M.log1pexp(x, out=buf) is buf
            np.testing.assert_allclose(np.asarray(buf), log1pexp(x), rtol=1e-12)
    v, g = np.matrix(np.zeros((2, 3))), np.matrix(np.zeros((2, 3)))
    got = dsl.value_and_grad(M.log1pexp)(x, out=(v, g))
    assert got[0] is v and got[1] is g
    np.testing.assert_allclose(np.asarray(g), 1 / (1 + np.exp(-x)), rtol=1e-12)

def test_results_no_kernel_writes_are_copied_in():
    """A sum (0-d), an argument handed back, one value returned twice."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(3, 3)), rng.normal(size=(3, 3))
    bufs = (np.empty(()), np.empty((3, 3)), np.empty((3, 3)), np.empty((3, 3)))
    got = M.stats(x, y, out=bufs)
    assert all(a is b for a, b in zip(got, bufs))
    for a, b in zip(got, stats(x, y)):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    some = M.stats(x, y, out=(None, None, None, bufs[3]))  # None: allocate that one
    assert some[3] is bufs[3] and some[1] is not bufs[1]
    np.testing.assert_allclose(some[1], x * y, rtol=1e-12)


def test_matmul_result_and_grads_with_respect_to_two_arguments():
    rng = np.random.default_rng(1)
    x, v = rng.normal(size=(4, 3)), rng.normal(size=(3, 2))
    f = dsl.value_and_grad(M.layer, wrt=(0, 1))
    out = (np.empty((4, 2)), (np.empty((4, 3)), np.empty((3, 2))))
    value, (gx, gv) = f(x, v, out=out)
    assert value is out[0] and gx is out[1][0] and gv is out[1][1]
    layer = lambda x, v: np.tanh(x @ v)  # noqa: E731
    np.testing.assert_allclose(value, layer(x, v), rtol=1e-12)
    np.testing.assert_allclose(gx, central_difference(layer, [x, v], 0), rtol=1e-6)
    np.testing.assert_allclose(gv, central_difference(layer, [x, v], 1), rtol=1e-6)
    g = dsl.grad(M.layer, wrt=1)
    buf = np.empty((3, 2))
    assert g(x, v, out=buf) is buf
    np.testing.assert_allclose(buf, gv, rtol=1e-12)


def test_f32_and_module_params():
    x = np.linspace(-2.0, 2.0, 5, dtype=np.float32)
    v, g = np.empty(5, np.float32), np.empty(5, np.float32)
    dsl.value_and_grad(M.log1pexp)(x, out=[v, g])
    np.testing.assert_allclose(v, log1pexp(x.astype(np.float64)), rtol=1e-6)
    M.params["w"] = np.arange(5.0)
    buf = np.empty(5)
    assert M.scaled(x.astype(np.float64), out=buf) is buf
    np.testing.assert_allclose(buf, np.arange(5.0) * x, rtol=1e-6)


def readonly(shape):
    a = np.zeros(shape)
    a.flags.writeable = False
    return a


@pytest.mark.parametrize("make_out, message", [
    (lambda x, v, g: v, r"structure of its result, \(array, array\); out is ndarray"),
    (lambda x, v, g: (v,), r"out is a tuple of 1"),
    (lambda x, v, g: (v, (g,)), r"out\[1\] of value_and_grad\(log1pexp\) must be a NumPy"),
    (lambda x, v, g: (v, g.tolist()), r"out\[1\] .* must be a NumPy array"),
    (lambda x, v, g: (v, g.astype(np.float32)), r"out\[1\] .* has dtype float32, but"),
    (lambda x, v, g: (v, g.astype(">f8")), r"out\[1\] .* has dtype >f8, but that result is "
                                           r"float64 in native byte order, as kernels write it"),
    (lambda x, v, g: (v, g[:3]), r"out\[1\] .* has shape \[3\], but that result has shape \[6\]"),
    (lambda x, v, g: (v, g.reshape(2, 3)), r"has shape \[2, 3\]"),
    (lambda x, v, g: (v, np.zeros(12)[::2]), r"out\[1\] .* must be C-contiguous and writeable"),
    (lambda x, v, g: (v, readonly(6)), r"must be C-contiguous and writeable"),
    (lambda x, v, g: (v, x), r"out\[1\] .* overlaps argument 'x'"),
    (lambda x, v, g: (v, v), r"out\[1\] .* overlaps out\[0\]"),
])
def test_bad_buffers_raise_before_any_kernel_runs(make_out, message):
    f = dsl.value_and_grad(M.log1pexp)
    x = np.linspace(-1.0, 1.0, 6)
    v, g = np.full(6, 7.0), np.full(6, 7.0)
    with pytest.raises(dsl.ArgumentError, match=message):
        f(x, out=make_out(x, v, g))
    assert (v == 7.0).all() and (g == 7.0).all()
    np.testing.assert_array_equal(x, np.linspace(-1.0, 1.0, 6))


def test_a_buffer_overlapping_hvps_v_or_a_module_param_names_it_as_the_caller_knows_it():
    # said "overlaps argument '$v'" (hvp's own name for v) and "overlaps
    # argument 'w'" of a module param, an argument the caller never passed
    x, v = np.linspace(0.0, 1.0, 4), np.array([1.0, -1.0, 2.0, 0.5])
    with pytest.raises(dsl.ArgumentError, match=r"error: out of hvp\(cube\) overlaps argument "
                                                r"v: results are written"):
        dsl.hvp(M.cube, 0)(x, v, out=v)
    w = M.params["w"] = np.arange(4.0)
    with pytest.raises(dsl.ArgumentError, match=r"error: out of scaled\(\) overlaps param 'w', "
                                                r"which it reads: results are written"):
        M.scaled(x, out=M.params["w"])
    np.testing.assert_array_equal(v, [1.0, -1.0, 2.0, 0.5])
    np.testing.assert_array_equal(M.params["w"], w)


def test_no_buffers_while_a_tape_records():
    x = np.linspace(-1.0, 1.0, 3)
    buf = np.full(3, 7.0)
    M.log1pexp(x, out=np.empty(3))  # known to the fast path: the tape must still stop it
    with dsl.Tape() as tape:
        tape.watch(x)
        with pytest.raises(dsl.ArgumentError, match="no out= while a Tape records"):
            M.log1pexp(x, out=buf)
        y = M.log1pexp(x)
        with pytest.raises(dsl.ArgumentError, match="must be a NumPy array"):
            M.log1pexp(np.asarray(x) + 1, out=y)  # a tape's array as a buffer
    assert (buf == 7.0).all()


def test_a_constant_result_a_const_argument_and_hvp():
    x = np.linspace(0.0, 1.0, 4)
    c, y = np.empty(()), np.empty(4)
    got = M.constant_and_twice(x, out=(c, y))
    assert got[0] is c and got[1] is y and c == 2.0
    np.testing.assert_array_equal(y, 2 * x)
    buf = np.empty(4)
    assert M.times(x, 3, out=buf) is buf
    np.testing.assert_array_equal(buf, 3 * x)
    hvp = dsl.hvp(M.cube, 0)
    v = np.array([1.0, -1.0, 2.0, 0.5])
    assert hvp(x, v, out=buf) is buf
    np.testing.assert_allclose(buf, 6 * x * v, rtol=1e-12)  # the Hessian is diag(6x)


def test_out_calls_the_fast_path_knows_still_check_every_buffer():
    f = dsl.value_and_grad(M.log1pexp)
    x4, x3 = np.linspace(-1.0, 1.0, 4), np.linspace(0.0, 2.0, 3)
    v4, g4, v3, g3 = np.empty(4), np.empty(4), np.empty(3), np.empty(3)
    for x, v, g in [(x4, v4, g4), (x3, v3, g3), (x4, v4, g4), (x4, None, g4), (x3, v3, g3)]:
        got = f(x, out=(v, g))
        assert got[1] is g and (v is None or got[0] is v)
        np.testing.assert_allclose(got[0], log1pexp(x), rtol=1e-12)
        np.testing.assert_allclose(g, 1 / (1 + np.exp(-x)), rtol=1e-12)
        fresh = f(x)
        assert fresh[0] is not got[0] and fresh[1] is not g
    assert (x4.dtype, x4.shape, x4.strides) in f._fast.programs  # later calls were fast
    g4[:] = 7.0
    for bad, message in [((v4, g3), r"out\[1\] .* has shape \[3\], but that result has "
                                    r"shape \[4\]"),
                         ((v4, x4), r"out\[1\] .* overlaps argument 'x'"),
                         ((g4, g4), r"out\[1\] .* overlaps out\[0\]"),
                         ((v4, g4.astype(np.float32)), r"has dtype float32"),
                         ((v4, readonly(4)), r"must be C-contiguous and writeable"),
                         ((v4,), r"out is a tuple of 1")]:
        with pytest.raises(dsl.ArgumentError, match=message):
            f(x4, out=bad)
    assert (g4 == 7.0).all()


@pytest.mark.parametrize("make", [dsl.jacfwd, dsl.jacrev, dsl.hessian,
                                  lambda f: dsl.vmap(dsl.jacrev(f))])
def test_jacobians_refuse_buffers_and_take_none(make):
    # Said "cube() has no parameter 'out'" (out= was bound as f's argument).
    jacobian = make(M.cube)
    x = np.array([1.0, -2.0])
    if jacobian.name.startswith("vmap"):
        x = x[None]
    with pytest.raises(dsl.ArgumentError, match=rf"error: {re.escape(jacobian.name)} takes "
                       "no out= buffers: its Jacobians are assembled on the host"):
        jacobian(x, out=np.empty((2, 2)))
    np.testing.assert_array_equal(jacobian(x, out=None), jacobian(x))


def test_an_error_found_as_the_kernels_run_says_the_buffers_may_be_written():
    # an index out of range shows only as the gather runs, after the first
    # result's kernel wrote into out[0]: the error said nothing of it, and a
    # caller took out[0] for its old contents
    x, first = np.arange(4.0), np.empty(4)
    for good_call_before in (False, True):  # (after one, the fast path runs it)
        if good_call_before:
            M.doubled_and_gathered(x, np.array([0, 3]), out=(first, None))
        first[:] = -7.0
        with pytest.raises(dsl.ArgumentError, match=r"index 99 in 'ids' is out of range") as err:
            M.doubled_and_gathered(x, np.array([0, 99]), out=(first, None))
        assert str(err.value).endswith("note: the call stopped as its kernels ran: out[0] may "
                                       "hold results written before the error; keep a copy "
                                       "where a failed call must leave them as they were")
        np.testing.assert_array_equal(first, x * 2.0)  # (what the note warns of)
