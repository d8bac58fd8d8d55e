"""The per-call fast path (`dsl.function.FastPath`) never runs a program on
a call it does not fit: each test changes one thing between calls of the
same callable (dtype, size pattern, layout, const value, param, tape) and
checks every result against NumPy, and that bad arguments still raise
`ArgumentError` after the fast path has remembered good ones."""
import re

import numpy as np
import pytest

import dsl
from dsl.function import _NO_KEY, fast_key

M = dsl.loads("""
param w: f64[m]

def mul_add(x, y):
    return x * y + x

def log1pexp(x):
    return log(1 + exp(x))

def typed(x: f64[n]):
    return x * 2.0

def times(x: f64[n], k: const i64):
    return x * k

def weighted(x):
    return sum(w) * x
""")


def mul_add(x, y):
    return x * y + x


def test_remembers_plain_calls():
    # (its own module: tests on one worker share M's transforms, and other
    # shapes would be remembered beside this one)
    f = dsl.value_and_grad(dsl.loads("def log1pexp(x):\n    return log(1 + exp(x))\n").log1pexp)
    x = np.linspace(-2.0, 2.0, 5)
    for _ in range(3):
        v, g = f(x)
        np.testing.assert_allclose(v, np.log1p(np.exp(x)), rtol=1e-12)
        np.testing.assert_allclose(g, 1 / (1 + np.exp(-x)), rtol=1e-12)
    assert len(f._fast.entries) == 1  # the calls after the first took the fast path


def test_dtype_changes_between_calls():
    x = np.linspace(-1.0, 1.0, 4)
    for dtype in (np.float64, np.float32, np.float64, np.int64, np.float32):
        a = x.astype(dtype) if dtype != np.int64 else np.arange(4)
        out = M.mul_add(a, a)
        assert out.dtype == a.dtype
        np.testing.assert_allclose(out, mul_add(a, a), rtol=1e-6)


@pytest.mark.parametrize("shapes", [
    [((3,), (3,)), ((3,), (1,)), ((3,), (3,)), ((1,), (3,)), ((2, 3), (3,)), ((3,), (3,))],
    [((4,), (4,)), ((4,), (5,)), ((5,), (5,)), ((2, 3), (2, 3)), ((2, 3), (3, 2))],
    [((), ()), ((), (3,)), ((3,), ()), ((1,), (1,)), ((), ())],
])
def test_size_pattern_changes_between_calls(shapes):
    """Equal sizes share a symbol, size 1 broadcasts, mismatches raise."""
    rng = np.random.default_rng(0)
    for xs, ys in shapes:
        x, y = rng.normal(size=xs), rng.normal(size=ys)
        try:
            want = mul_add(x, y)
        except ValueError:  # NumPy cannot broadcast them either
            message = f"shapes {list(xs)} and {list(ys)} do not broadcast"
            with pytest.raises(dsl.GradError, match=re.escape(message)) as info:
                M.mul_add(x, y)
            assert (info.value.line, info.value.col) == (5, 12), str(info.value)
            continue
        np.testing.assert_allclose(M.mul_add(x, y), want, rtol=1e-12)


def layouts():
    base = np.arange(24.0).reshape(4, 6) / 7
    return [base, np.asfortranarray(base), base[:, ::2].copy(), base[::-1],
            base[:, ::-1], np.asfortranarray(base)[::-1, ::2], base[:, ::2], base.T.copy().T,
            base, np.array(1.5), base.reshape(-1)[::-3], base.reshape(-1)[::3]]


def test_layout_changes_between_calls():
    f = dsl.grad(M.log1pexp)
    for x in layouts() + layouts()[::-1]:
        np.testing.assert_allclose(M.log1pexp(x), np.log1p(np.exp(x)), rtol=1e-12)
        np.testing.assert_allclose(f(x), 1 / (1 + np.exp(-x)), rtol=1e-12)
        y = x[..., ::-1] if x.ndim else x
        np.testing.assert_allclose(M.mul_add(x, y), mul_add(x, y), rtol=1e-12)


def test_const_value_changes_between_calls():
    x = np.array([1.0, -2.0, 3.0])
    for k in (2, 3, 2, -1, 3):
        np.testing.assert_array_equal(M.times(x, np.array(k)), x * k)
        np.testing.assert_array_equal(M.times(x, k), x * k)


def test_param_value_and_shape_change_between_calls():
    x = np.array([1.0, 2.0])
    for w in (np.ones(2), np.array([1.0, 4.0]), np.ones(3), np.array([0.5]), np.ones(2)):
        M.params["w"] = w
        np.testing.assert_allclose(M.weighted(x), w.sum() * x)
        np.testing.assert_allclose(dsl.grad(M.weighted)(x), np.full(2, w.sum()))


def test_calls_reading_params_take_the_fast_path_and_read_them_anew():
    # catches: a call reading module params never remembered (binding adds
    # them: every call bound and checked again, several times a small
    # program's run); once remembered, an entry that kept the params of
    # the call it remembered (a training step's new weights unread), or ran
    # a param of another layout or shape as the remembered one's
    m = dsl.loads("param w: f64[n, k]\nparam b: f64[k]\n"
                  "def affine(x):\n    return x @ w + b\n")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4))
    f = m.affine
    runs = []
    for step in range(4):
        if step == 1:  # rebound to a new array
            m.params["w"], m.params["b"] = rng.normal(size=(4, 2)), rng.normal(size=2)
        elif step == 2:  # changed in place
            m.params["b"] += 1.0
        elif step == 3:  # another layout: the slow path, the same values
            m.params["w"] = np.asfortranarray(m.params["w"])
        if step == 0:
            m.params["w"], m.params["b"] = rng.normal(size=(4, 2)), np.zeros(2)
        for _ in range(2):
            np.testing.assert_allclose(f(x), x @ m.params["w"] + m.params["b"], rtol=1e-14)
        runs.append(len(f._fast.entries))
    assert runs[0] == 1  # the second call of the first step took the fast path
    m.params["w"] = np.ones((5, 2))  # another shape: refused, as by the slow path
    with pytest.raises(dsl.GradError, match="do not match"):
        f(x)
    del m.params["b"]
    with pytest.raises(dsl.ArgumentError, match="reads param 'b', which is not set"):
        f(x)


def test_a_bridges_bound_call_leaves_plain_calls_as_they_were():
    # gradlang::call runs a call bound once (module params included) by
    # its values (`call_known`): remembered as a plain call of as many
    # arguments, f(x, w) then ran with the caller's w for the param
    # instead of raising, and reused the program for out=
    m = dsl.loads("param w: f64[m]\ndef weighted(x):\n    return sum(w) * x\n")
    m.params["w"] = np.array([1.0, 2.0])
    x = np.array([1.0, -2.0])
    bound = m.weighted.bind((x,), {})
    for _ in range(2):  # (the second run is the remembered one)
        np.testing.assert_array_equal(m.weighted.call_known(bound)[0], 3.0 * x)
    for out in (None, np.empty(2)):
        with pytest.raises(dsl.ArgumentError, match="takes 1 argument"):
            m.weighted(x, np.array([10.0, 20.0]), **({} if out is None else {"out": out}))
    np.testing.assert_array_equal(m.weighted(x), 3.0 * x)


def test_tape_state_changes_between_calls():
    x = np.array([0.5, -1.0, 2.0])
    want = 1 / (1 + np.exp(-x))
    f = M.log1pexp
    for _ in range(2):
        np.testing.assert_allclose(f(x), np.log1p(np.exp(x)), rtol=1e-12)
        with dsl.Tape() as tape:
            tape.watch(x)
            y = f(x)  # the same array and key as the remembered call: must be recorded
            z = f(y)  # a tape's array (an ndarray subclass) as an argument
        np.testing.assert_allclose(tape.gradient(z, x), want / (1 + np.exp(-y)), rtol=1e-12)
        with dsl.Tape():  # a tape that watches nothing: plain results
            np.testing.assert_allclose(f(x), np.log1p(np.exp(x)), rtol=1e-12)


def test_keyword_calls_take_the_fast_path_and_bind_as_by_position():
    f = dsl.value_and_grad(dsl.loads("def sub(x, y):\n    return x - 2.0 * y\n").sub, wrt=(0, 1))
    x, y = np.linspace(-1.0, 1.0, 4), np.arange(4.0)
    runs = []
    for call in [lambda: f(x, y=y), lambda: f(y=y, x=x), lambda: f(x=x, y=y), lambda: f(x, y)]:
        v, (gx, gy) = call()
        np.testing.assert_array_equal(v, x - 2.0 * y)
        np.testing.assert_array_equal(gx, np.ones(4))
        np.testing.assert_array_equal(gy, np.full(4, -2.0))
        runs.append(len(f._fast.entries))
    assert runs == [1, 1, 1, 1]  # a keyword call is remembered, and later ones hit it
    for bad, message in [(dict(y=y, z=x), "has no parameter 'z'"), (dict(x=x), "got two values"),
                         (dict(y=x[:3]), "do not broadcast")]:
        with pytest.raises(dsl.GradError, match=message):
            f(x, **bad)


def test_bad_arguments_still_raise_after_good_calls():
    x = np.linspace(0.0, 1.0, 3)
    np.testing.assert_allclose(M.typed(x), 2 * x)
    entries = M.typed._fast.entries
    runs = []  # count the remembered driver's runs: a bad call must never reach it
    for key, run in entries.items():
        entries[key] = lambda *a, run=run: runs.append(1) or run(*a)
    # (the last hit, which a call tries first, may be x's key from another
    # test's calls in this process, holding the run unwrapped)
    M.typed._fast.latest = (_NO_KEY, None)
    np.testing.assert_allclose(M.typed(x), 2 * x)
    assert runs == [1]
    for bad, message in [(x.astype(np.float32), "has dtype f32, but its annotation"),
                         (x.reshape(3, 1), "has rank 2"),
                         (np.array(1.0), "has rank 0"),
                         (x.astype(np.complex128), "unsupported dtype"),
                         (np.ma.masked_array(x, [0, 1, 0]), "masked array")]:
        with pytest.raises(dsl.ArgumentError, match=message):
            M.typed(bad)
        np.testing.assert_allclose(M.typed(x), 2 * x)
    with pytest.raises(dsl.ArgumentError, match="takes 1 argument"):
        M.typed(x, x)
    with pytest.raises(dsl.ArgumentError, match="no parameter 'y'"):
        M.typed(x, y=x)
    assert len(runs) == 1 + 5  # the good call after each bad one


def test_python_floats_take_the_fast_path_as_binding_takes_them():
    """A Python float beside arrays is weakly typed (f32 beside f32 arrays,
    else f64, rounded so) on the fast path as in binding, which it skips;
    a finite float beyond f32 is still refused there."""
    f = M.mul_add
    x32, x64 = np.linspace(-1.0, 1.0, 3, dtype=np.float32), np.linspace(-1.0, 1.0, 3)
    for x in (x32, x64, x32, x64):
        for y in (0.1, -2.5, np.inf):
            got = f(x, y)
            assert got.dtype == x.dtype
            with np.errstate(invalid="ignore"):  # inf * 0, as the kernels compute it
                np.testing.assert_array_equal(got, x * x.dtype.type(y) + x)
                np.testing.assert_array_equal(f(y, x), x.dtype.type(y) * x + x.dtype.type(y))
    runs = []  # the remembered entries' runs
    for key, run in f._fast.entries.items():
        f._fast.entries[key] = lambda *a, run=run: runs.append(1) or run(*a)
    f._fast.latest = (_NO_KEY, None)
    np.testing.assert_array_equal(f(x32, 0.3), x32 * np.float32(0.3) + x32)
    assert runs == [1]
    with pytest.raises(dsl.ArgumentError, match="out of range for f32"):
        f(x32, 1e39)
    np.testing.assert_array_equal(f(x64, 1e39), x64 * 1e39 + x64)


def test_a_float_that_underflows_f32_is_taken_whatever_numpys_error_state():
    """1e-46 as f32 is 0 and 1e-40 a subnormal: the fast path rounds them so,
    and binding (the slow path) did too only where NumPy ignores underflow;
    under np.errstate(all="raise") it raised a FloatingPointError instead."""
    f, x = M.mul_add, np.linspace(-1.0, 1.0, 3, dtype=np.float32)
    for y in (1e-46, 1e-40, -1e-40):
        want = x * np.array(y, np.float32) + x
        for remembered in (False, True):
            f._fast.entries.clear()
            f._fast.latest = (_NO_KEY, None)
            if remembered:
                f(x, 0.5)
            with np.errstate(all="raise"):
                got = f(x, y)
            assert got.dtype == np.float32
            np.testing.assert_array_equal(got, want)


def test_big_endian_array_is_not_taken_for_a_native_one():
    """Its bytes read as a native f64 would be other numbers: binding
    converts it, so the fast path never takes it as it is."""
    f = M.mul_add
    x = np.linspace(0.0, 1.0, 3)
    f(x, x)
    f(x, x)
    big = x.astype(">f8")
    for _ in range(2):
        np.testing.assert_allclose(f(big, x), mul_add(x, x), rtol=1e-15)
    assert fast_key((big, x)) not in f._fast.entries


def test_cuda_target_calls_stay_correct():
    pytest.importorskip("numba_cuda")
    from gradlang.runtime import cuda as rcuda
    m = dsl.loads("def f(x, y):\n    return x * y + x\n", target="cuda")
    rng = np.random.default_rng(1)
    for shape in [(5,), (5,), (2, 3), (5,)]:
        x, y = rng.normal(size=shape), rng.normal(size=shape)
        out = m.f(x, y)
        out = out if isinstance(out, np.ndarray) else rcuda.to_host(out)
        np.testing.assert_allclose(out, mul_add(x, y), rtol=1e-12)
    assert not m.f._fast.entries  # host arrays are copied to the device: no fast path


def misaligned(x: np.ndarray) -> np.ndarray:
    """A copy of x at an odd address: same dtype, shape and strides."""
    raw = np.zeros(x.nbytes + 1, np.uint8)
    y = np.frombuffer(raw.data, x.dtype, x.size, offset=1).reshape(x.shape)
    y[...] = x
    assert not y.flags.aligned and y.strides == x.strides
    return y


class Marked(np.ndarray):
    """A user's ndarray subclass: not a plain array, so never fast."""


def test_arguments_the_key_leaves_out_give_the_same_results():
    """Alignment, writeability and byte offset are not in the key: a call
    differing only there reaches the remembered program and must still
    compute on its own values (the kernels' dispatchers type each array)."""
    f = dsl.value_and_grad(M.log1pexp)
    base = np.linspace(-3.0, 3.0, 17)
    x = base[:16].copy()
    readonly = base[1:].copy()
    readonly.flags.writeable = False
    offset = base[1:]  # a view 8 bytes into its base
    for arg in (x, misaligned(base[:16] + 0.5), readonly, offset, x, misaligned(-x)):
        for _ in range(2):  # the second call is a fast one
            v, g = f(arg)
            np.testing.assert_allclose(v, np.log1p(np.exp(arg)), rtol=1e-12)
            np.testing.assert_allclose(g, 1 / (1 + np.exp(-arg)), rtol=1e-12)
            assert v.flags.writeable and g.flags.writeable
    assert (x.dtype, x.shape, x.strides) in f._fast.entries  # all of them share the one key


def test_read_only_and_writeable_arguments_share_their_kernels_compile(monkeypatch, tmp_path):
    """A read-only array (JAX's are) and a writeable one run the same
    compiled kernels: Numba types them apart, and compiled each kernel
    once per kind, to the same machine code (`loader._inputs_read_only`)."""
    from numba.core import event

    class Compiles(event.Listener):
        def on_start(self, event):
            pass

        def on_end(self, event):
            compiled.append(event.data["dispatcher"].py_func.__name__)

    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path))  # (nothing cached: it compiles)
    m = dsl.loads("def f(x, y):\n    return sum(exp(x) * y + x * 3.0625)\n")
    f = dsl.value_and_grad(m.f, wrt=(0, 1))
    x, y = np.linspace(-1.0, 1.0, 5), np.linspace(0.5, 2.5, 5)
    frozen = [a.copy() for a in (x, y)]
    for a in frozen:
        a.flags.writeable = False
    compiled = []
    with event.install_listener("numba:compile", Compiles()):
        first = f(*frozen)
        kernels = len(compiled)
        second = f(x, y)
    assert kernels > 0 and len(compiled) == kernels, compiled
    expected = (np.exp(x).dot(y) + 3.0625 * x.sum(), np.exp(x) * y + 3.0625, np.exp(x))
    for value, (dx, dy) in (first, second):
        for got, want in zip((value, dx, dy), expected):
            np.testing.assert_allclose(got, want, rtol=1e-13)


def test_scalars_subclasses_and_zero_d_arrays_between_calls():
    f = dsl.grad(M.log1pexp)
    for arg in (np.array(0.5), 0.5, np.float64(0.5), np.array(-1.0), -1.0, np.float32(2.0),
                np.array(2.0, np.float32), np.array([0.5, 1.0]).view(Marked),
                np.array([0.5, 1.0]), np.array([[0.5, 1.0]]).view(Marked)):
        got = f(arg)
        want = 1 / (1 + np.exp(-np.asarray(arg, np.float64)))
        assert type(got) is np.ndarray and got.shape == np.shape(arg)
        assert got.dtype == (np.float32 if np.asarray(arg).dtype == np.float32 else np.float64)
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # (a Python float's key is its type: `plain_call_key`)
    assert all(k[0] in (np.dtype(np.float64), np.dtype(np.float32), float)
               for k in f._fast.entries)


def test_f32_and_f64_arrays_of_one_shape_alternate():
    f = dsl.value_and_grad(M.mul_add, wrt=(0, 1))
    x = np.linspace(-1.0, 1.0, 6).reshape(2, 3)
    for dtype in (np.float64, np.float32, np.float64, np.float32):
        a, b = x.astype(dtype), (x + 2).astype(dtype)
        for _ in range(2):
            v, (ga, gb) = f(a, b)
            assert v.dtype == ga.dtype == gb.dtype == dtype
            np.testing.assert_allclose(v, mul_add(a, b), rtol=1e-6)
            np.testing.assert_allclose(ga, b + 1, rtol=1e-6)
            np.testing.assert_allclose(gb, a, rtol=1e-6)


def test_fast_calls_return_fresh_arrays():
    """A remembered program allocates its results on every call: an
    earlier result never changes under the caller."""
    f = dsl.value_and_grad(M.log1pexp)
    x = np.linspace(-1.0, 1.0, 4)
    v1, g1 = f(x)
    v2, g2 = f(x)
    v3, g3 = f(x + 1)
    assert len({id(a) for a in (v1, g1, v2, g2, v3, g3)}) == 6
    np.testing.assert_allclose(v2, np.log1p(np.exp(x)), rtol=1e-12)
    np.testing.assert_allclose(g2, 1 / (1 + np.exp(-x)), rtol=1e-12)


def test_errors_from_a_callable_show_the_callers_frame():
    x = np.linspace(0.0, 1.0, 3)
    M.typed(x)
    M.typed(x)
    with pytest.raises(dsl.ArgumentError) as info:
        M.typed(x.astype(np.float32))
    frames = [f.name for f in info.traceback]
    assert frames[0] == "test_errors_from_a_callable_show_the_callers_frame"
    assert len(frames) == 2 and info.value.__cause__ is None  # the caller, the boundary


def test_threads_calling_with_different_shapes_get_their_own_results():
    """The latest hit is one tuple, read once: a thread never runs the
    program of another thread's key."""
    import threading
    f = dsl.value_and_grad(M.log1pexp)
    inputs = [np.linspace(-1.0, 1.0, n) for n in (3, 4, 5, 6)]
    failures = []

    def work(x):
        want = 1 / (1 + np.exp(-x))
        for _ in range(200):
            v, g = f(x)
            if g.shape != x.shape or not np.allclose(g, want, rtol=1e-12):
                failures.append(x.shape)
    threads = [threading.Thread(target=work, args=(x,)) for x in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def jvp_of_mul_add(x, y, tx, ty):
    """(x y + x, tx y + x ty + tx): the value and tangent of mul_add."""
    return x * y + x, tx * y + x * ty + tx


def test_jvp_remembers_plain_calls_and_still_checks_every_other():
    from dsl.forward import _known_jvp
    x, y = np.linspace(-1.0, 1.0, 4), np.linspace(0.5, 2.0, 4)
    tx, ty = np.linspace(0.1, 0.4, 4), np.full(4, -0.5)
    for _ in range(3):
        value, tangent = dsl.jvp(M.mul_add, (x, y), (tx, ty))
        want = jvp_of_mul_add(x, y, tx, ty)
        np.testing.assert_allclose(value, want[0], rtol=1e-15)
        np.testing.assert_allclose(tangent, want[1], rtol=1e-15)
    entries = _known_jvp(M.mul_add, 2)
    assert len(entries) == 1  # the calls after the first took the fast path
    runs = []
    for key, run in entries.items():
        entries[key] = lambda *a, run=run: runs.append(1) or run(*a)
    # tangents the slow path converts, drops or refuses, and other layouts:
    # never the remembered program
    value, tangent = dsl.jvp(M.mul_add, (x, y), (tx.tolist(), ty))
    np.testing.assert_allclose(tangent, jvp_of_mul_add(x, y, tx, ty)[1], rtol=1e-15)
    value, tangent = dsl.jvp(M.mul_add, (x, y), (tx, None))
    np.testing.assert_allclose(tangent, jvp_of_mul_add(x, y, tx, 0 * ty)[1], rtol=1e-15)
    value, tangent = dsl.jvp(M.mul_add, (x, y), {"y": ty})
    np.testing.assert_allclose(tangent, jvp_of_mul_add(x, y, 0 * tx, ty)[1], rtol=1e-15)
    value, tangent = dsl.jvp(M.mul_add, (x, y[::-1].copy()[::-1]), (tx, ty))
    np.testing.assert_allclose(tangent, jvp_of_mul_add(x, y, tx, ty)[1], rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match="has dtype f32; its primal has dtype f64"):
        dsl.jvp(M.mul_add, (x, y), (tx.astype(np.float32), ty))
    with pytest.raises(dsl.ArgumentError, match="has shape"):
        dsl.jvp(M.mul_add, (x, y), (tx[:3], ty))
    assert runs == []
    with dsl.Tape() as tape:  # a recording tape takes the slow path too
        tape.watch(x)
        dsl.jvp(M.mul_add, (x, y), (tx, ty))
    assert runs == []
    value, tangent = dsl.jvp(M.mul_add, (x, y), (tx, ty))
    np.testing.assert_allclose(tangent, jvp_of_mul_add(x, y, tx, ty)[1], rtol=1e-15)
    assert runs == [1]


def test_jvp_of_a_function_with_a_const_or_param_is_never_remembered():
    from dsl.forward import _known_jvp
    x, t = np.linspace(0.5, 1.5, 3), np.ones(3)
    for k in (2, 3, 2):
        np.testing.assert_allclose(dsl.jvp(M.times, (x, k), (t, None))[1], k * t)
    assert not _known_jvp(M.times, 2)
    for w in (np.ones(3), np.arange(3.0)):
        M.params["w"] = w
        np.testing.assert_allclose(dsl.jvp(M.weighted, (x,), (t,))[1], w.sum() * t)
    assert not _known_jvp(M.weighted, 1)


def test_vjp_remembers_plain_calls_and_still_follows_const_param_and_layout():
    # `vjp_of_bound` keeps a signature's split programs by the arrays' names,
    # dtypes, shapes and strides; a const's value must still pick the program
    # (never remembered), a param's value and shape be read anew each call
    x, y = np.linspace(-1.0, 1.0, 4), np.linspace(0.5, 2.0, 4)
    for a, b in [(x, y), (x, y), (x[::-1], y), (x.astype(np.float32), y.astype(np.float32)),
                 (x, y)]:
        value, pullback = dsl.vjp(M.mul_add, a, b)
        np.testing.assert_allclose(value, mul_add(a, b), rtol=1e-6)
        gx, gy = pullback(np.full(4, 2.0, a.dtype))
        np.testing.assert_allclose(gx, 2 * (b + 1), rtol=1e-6)
        np.testing.assert_allclose(gy, 2 * a, rtol=1e-6)
        assert gx.dtype == a.dtype
    assert len(M.mul_add.__dict__["_vjp_fast"]) == 3  # f64 forward and reversed, f32
    for k in (2, 3, 2, -1):
        value, pullback = dsl.vjp(M.times, x, k)
        np.testing.assert_array_equal(value, x * k)
        np.testing.assert_array_equal(pullback(np.ones(4))[0], np.full(4, float(k)))
    assert not M.times.__dict__["_vjp_fast"]
    for w in (np.ones(2), np.array([1.0, 4.0]), np.ones(3), np.array([0.5])):
        M.params["w"] = w
        value, pullback = dsl.vjp(M.weighted, x)
        np.testing.assert_allclose(value, w.sum() * x)
        np.testing.assert_allclose(pullback(np.ones(4))[0], np.full(4, w.sum()))
