"""dsl.vmap: f over axis 0 of its mapped arguments equals f on each example,
in one program where f stacks, one example at a time where it does not;
per-example gradients; composition with grad, jvp and vmap; errors."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import dsl
from dsl.forward import Jacobian
from dsl.function import Compiled
from helpers import central_difference, load_example

SOURCE = """
def norm(x: f64[n]):
    return sqrt(sum(x * x))

def two(x, y):
    return x * y, sum(x)

def looped(x, n: const = 3):
    y = x
    for i in range(n):
        y = sin(y) + y * 0.5
    return sum(y)

def pick(x, idx):
    return sum(x[idx] * 2.0)

def trips(x, n: i64):
    y = x
    for i in range(n):
        y = sin(y) + y * 0.5
    return sum(y)

def weighted(x, w):
    return sum(sin(x * w) * x)

def scaled(x, s: f64 = 2.0):
    return x * s

def labelled(z, y: const):
    return sum(log(1 + exp(-(2 * y - 1) * z)))
"""


@pytest.fixture(scope="module")
def m():
    return dsl.loads(SOURCE)


def per_example(f, mapped, *args):
    """f on each example (mapped: which args are), results stacked."""
    k = args[mapped[0]].shape[0]
    each = [f(*(a[i] if j in mapped else a for j, a in enumerate(args))) for i in range(k)]
    if isinstance(each[0], tuple):
        return tuple(np.stack(r) for r in zip(*each))
    return np.stack(each)


def runs_one_program(monkeypatch, vf) -> list:
    """The calls of f itself that vf makes (none when its program stacks)."""
    calls = []
    inner_call = type(vf.inner).call_bound
    monkeypatch.setattr(type(vf.inner), "call_bound",
                        lambda self, *a, **k: (calls.append(1), inner_call(self, *a, **k))[1])
    return calls


floats = st.floats(-3.0, 3.0, allow_nan=False, width=64)


def _draw(data, *shape) -> np.ndarray:
    """An array of this shape of drawn floats."""
    size = int(np.prod(shape))
    return np.array(data.draw(st.lists(floats, min_size=size, max_size=size))).reshape(shape)


@settings(max_examples=15, deadline=None)
@given(k=st.integers(1, 4), n=st.integers(1, 4), data=st.data())
def test_vmap_equals_f_on_each_example(m, k, n, data):
    x, y = _draw(data, k, n), _draw(data, n)
    np.testing.assert_allclose(dsl.vmap(m.norm)(x), np.linalg.norm(x, axis=1), rtol=1e-14)
    got = dsl.vmap(m.two, in_axes=(0, None))(x, y)
    for g, want in zip(got, per_example(m.two, (0,), x, y)):
        np.testing.assert_allclose(g, want, rtol=1e-14)
    log1pexp = load_example("log1pexp").log1pexp  # through its grad block too
    np.testing.assert_allclose(dsl.vmap(dsl.grad(log1pexp))(x), dsl.grad(log1pexp)(x),
                               rtol=1e-14)


def test_per_example_gradients_of_a_loss_in_one_program(monkeypatch):
    # logistic loss of a minibatch (x: f64[n, k], y: f64[n], w: f64[k]), the
    # gradient of w for each of 5 minibatches: in one stacked program
    loss = load_example("logistic").loss
    rng = np.random.default_rng(0)
    xs, ys, w = rng.normal(size=(5, 3, 2)), rng.integers(0, 2, (5, 3)) * 1.0, rng.normal(size=2)
    per = dsl.vmap(dsl.grad(loss, wrt=2), in_axes=(0, 0, None))
    calls = runs_one_program(monkeypatch, per)
    got = per(xs, ys, w)
    assert calls == [] and got.shape == (5, 2)
    monkeypatch.undo()
    np.testing.assert_allclose(got, per_example(dsl.grad(loss, wrt=2), (0, 1), xs, ys, w),
                               rtol=1e-13)
    np.testing.assert_allclose(got[3], central_difference(loss, (xs[3], ys[3], w), 2),
                               rtol=1e-7)


def test_a_gradient_inside_the_language_maps_too():
    r1 = load_example("stylegan_r1").r1_penalty
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(4, 3)), rng.normal(size=3)
    np.testing.assert_allclose(dsl.vmap(r1, in_axes=(0, None))(x, w),
                               per_example(r1, (0,), x, w), rtol=1e-13)


def test_a_loop_stacks_its_body(monkeypatch):
    # an RNN over a batch of sequences: the loop's body is vectorized, its
    # carried state stacked; the gradient runs the stacked loop backward
    rnn = load_example("rnn").rnn
    rng = np.random.default_rng(3)
    xs, h, w = rng.normal(size=(4, 5, 3)), rng.normal(size=(4, 3)), rng.normal(size=(3, 3)) / 2
    expected = per_example(rnn, (0, 1), xs, h, w)
    expected_w = per_example(dsl.grad(rnn, wrt=2), (0, 1), xs, h, w)
    vf, vg = dsl.vmap(rnn, in_axes=(0, 0, None)), dsl.vmap(dsl.grad(rnn, wrt=2), (0, 0, None))
    calls = runs_one_program(monkeypatch, vf) + runs_one_program(monkeypatch, vg)
    np.testing.assert_allclose(vf(xs, h, w), expected, rtol=1e-14)
    np.testing.assert_allclose(vg(xs, h, w), expected_w, rtol=1e-12)
    assert calls == []
    monkeypatch.undo()
    np.testing.assert_allclose(dsl.grad(vf, wrt=2)(xs, h, w), expected_w.sum(axis=0),
                               rtol=1e-12)
    np.testing.assert_allclose(expected_w[2], central_difference(rnn, (xs[2], h[2], w), 2),
                               rtol=1e-7)


def test_a_loop_of_a_run_time_trip_count_stacks_with_its_gradient(monkeypatch):
    # grow's gradient keeps each trip's state: values whose size is known
    # only when it runs (NeedsConcrete escaped from the stacked plan)
    grow = load_example("grow").grow
    u = np.random.default_rng(4).uniform(0.1, 0.9, size=(3, 6))
    vg = dsl.vmap(dsl.value_and_grad(grow, wrt=(0, 1)), in_axes=(0, None, None))
    expected = [dsl.value_and_grad(grow, wrt=(0, 1))(row, 0.3, 7) for row in u]
    calls = runs_one_program(monkeypatch, vg)
    value, (gu, gk) = vg(u, 0.3, 7)
    assert calls == []
    np.testing.assert_allclose(value, [e[0] for e in expected], rtol=1e-14)
    np.testing.assert_allclose(gu, [e[1][0] for e in expected], rtol=1e-13)
    np.testing.assert_allclose(gk, [e[1][1] for e in expected], rtol=1e-13)


def test_an_op_that_does_not_stack_runs_one_example_at_a_time(m, monkeypatch):
    # a loop whose trip count is mapped: each example runs its own trips
    x, ns = np.linspace(-2.0, 2.0, 12).reshape(4, 3), np.array([0, 2, 1, 3])
    vf = dsl.vmap(m.trips)
    expected = per_example(m.trips, (0, 1), x, ns)
    calls = runs_one_program(monkeypatch, vf)
    np.testing.assert_allclose(vf(x, ns), expected, rtol=1e-15)
    assert len(calls) == 4
    with pytest.raises(dsl.ArgumentError, match=r"vmap\(trips\) runs one example at a time "
                                                r"here \(its op .+ has no rule"):
        dsl.grad(vf)(x, ns)
    with dsl.Tape() as tape:  # it would record the examples, not x
        tape.watch(x)
        with pytest.raises(dsl.ArgumentError, match="cannot be recorded by a dsl.Tape where"):
            vf(x, ns)


MAPPED_INDICES = """
def rows(x, idx):
    return x[idx] * sin(x[idx])

def cols(x, idx):
    return exp(take(x, idx, axis=1))

def along(x, idx):
    return take_along_axis(x, idx, axis=1) ** 2

def added(x, idx, v):
    return sin(scatter_add(x, idx, v * x[idx]))

def pooled(v, ids):
    return segment_sum(v * v, ids, 3)

def guarded(x, i: i64):
    if x[0] > 0.0:
        y = x[i] * 2.0
    else:
        y = x[0] * x[1]
    return y
"""


@functools.lru_cache(maxsize=None)
def mapped_indices() -> dsl.Module:
    return dsl.loads(MAPPED_INDICES)


TABLES = np.array([[[0.3, 1.0], [0.7, -1.0], [-0.2, 2.0]]] * 2) * [[[1.0]], [[-2.0]]]


@pytest.mark.parametrize("fn,mapped,args", [
    ("rows", (0, 1), (TABLES, np.array([[2, -1, 2], [0, 0, 1]]))),
    ("cols", (1,), (np.array([[0.3, 0.7, -0.2], [1.1, -0.5, 0.4]]), np.array([[2, 2], [-3, 1]]))),
    ("along", (0, 1), (np.array([[[0.3, 0.7, -0.2], [1.1, -0.5, 0.4]]] * 2) * [[[1.0]], [[3.0]]],
                       np.array([[[2, 2], [-3, 1]], [[0, 1], [1, 0]]]))),
    ("added", (1, 2), (np.array([0.3, 0.7, -0.2, 1.1]), np.array([[1, 1, -1], [0, 3, 3]]),
                       np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]]))),
    ("pooled", (0, 1), (TABLES, np.array([[2, 0, 2], [-1, -3, 1]]))),
    ("guarded", (0,), (np.array([[0.3, 0.7, -0.2], [-0.3, 0.7, 0.2]]), 2)),
])
def test_a_mapped_index_stacks(fn, mapped, args, monkeypatch):
    # a gather or scatter-add by a mapped index array, or by an index in the
    # branch of an if on a mapped condition (which reads 0 where the branch
    # is not taken, so is mapped too), ran one example at a time, and
    # grad(vmap(f)) was an ArgumentError
    f = getattr(mapped_indices(), fn)
    in_axes = tuple(0 if j in mapped else None for j in range(len(args)))
    vf = dsl.vmap(f, in_axes=in_axes)
    calls = runs_one_program(monkeypatch, vf)
    got = vf(*args)
    assert calls == []
    monkeypatch.undo()
    np.testing.assert_allclose(got, per_example(f, mapped, *args), rtol=1e-14)
    wrt = mapped[-1] if fn == "added" else 0
    grads = dsl.grad(vf, wrt=wrt)(*args)
    one = [dsl.grad(f, wrt=wrt)(*(a[i] if j in mapped else a for j, a in enumerate(args)))
           for i in range(2)]
    np.testing.assert_allclose(grads, np.sum(one, axis=0) if wrt not in mapped else one,
                               rtol=1e-14)
    if fn != "guarded":  # an index out of range in one example is named by its value
        bad = [np.array(a) for a in args]
        bad[1][1].flat[0] = 7
        with pytest.raises(dsl.ArgumentError, match="index 7 in 'i"):
            vf(*bad)


def test_transforms_of_vmap(m):
    rng = np.random.default_rng(2)
    x, t = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    vnorm = dsl.vmap(m.norm)
    np.testing.assert_allclose(dsl.grad(vnorm)(x), unit, rtol=1e-14)
    y, ty = dsl.jvp(vnorm, (x,), (t,))
    np.testing.assert_allclose(ty, np.sum(unit * t, axis=1), rtol=1e-13)
    nested = dsl.vmap(dsl.vmap(m.norm))(x.reshape(3, 2, 2))
    np.testing.assert_allclose(nested, np.linalg.norm(x.reshape(3, 2, 2), axis=2), rtol=1e-14)
    assert isinstance(vnorm, Compiled) and dsl.vmap(m.norm) is vnorm  # made once
    with dsl.Tape() as tape:
        tape.watch(x)
        z = vnorm(x)
    np.testing.assert_allclose(tape.gradient(z, x), unit, rtol=1e-14)


def jacobian_by_differences(f, args, index, output=None, eps=1e-6):
    """d f(args)[output] / d args[index] by central differences in f64, of
    shape out.shape + arg.shape."""
    def at(x):
        out = f(*args[:index], x, *args[index + 1:])
        return np.asarray(out if output is None else out[output])
    x = np.array(args[index], dtype=np.float64)
    columns = []
    for i in range(x.size):
        step = np.zeros(x.size)
        step[i] = eps
        columns.append((at(x + step.reshape(x.shape)) - at(x - step.reshape(x.shape))) / (2 * eps))
    return np.stack(columns, axis=-1).reshape(columns[0].shape + x.shape)


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_vmap_of_a_jacobian_is_each_examples_jacobian(m, data):
    k, n = 3, 2  # one program for every draw (a size 1, or k == n, would be another)
    # vmap(jacfwd(f)), vmap(jacrev(f)) and vmap(hessian(f)) were TypeErrors
    # ("takes a function of a loaded .grad module, got Jacobian"); as in
    # JAX, each example's Jacobian, (k,) + out.shape + arg.shape, also with
    # respect to an argument that is not mapped; in one stacked program.
    xs, ys, y = _draw(data, k, n), _draw(data, k, n), _draw(data, n)
    calls = []
    each_call = Jacobian.call_bound
    for transform in (dsl.jacfwd, dsl.jacrev):
        jacobian = transform(m.two, wrt=(0, 1))
        for in_axes, args in (((0, None), (xs, y)), ((None, 0), (y, ys)), ((0, 0), (xs, ys))):
            calls.clear()
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(Jacobian, "call_bound", lambda self, bound: (
                    calls.append(self.batched), each_call(self, bound))[1])
                got = dsl.vmap(jacobian, in_axes=in_axes)(*args)
            assert calls == [True]  # the examples at once
            mapped = [i for i, axis in enumerate(in_axes) if axis == 0]
            examples = [[a[i] if j in mapped else a for j, a in enumerate(args)]
                        for i in range(k)]
            each = [jacobian(*example) for example in examples]
            i = data.draw(st.integers(0, k - 1))
            for out in (0, 1):
                for wrt in (0, 1):
                    np.testing.assert_allclose(got[out][wrt], [e[out][wrt] for e in each],
                                               rtol=1e-14)
                    assert got[out][wrt].shape == (k,) + each[0][out][wrt].shape
                    np.testing.assert_allclose(
                        got[out][wrt][i], jacobian_by_differences(m.two, examples[i], wrt, out),
                        rtol=1e-7, atol=1e-8)
    hessian = dsl.vmap(dsl.hessian(m.norm))(xs + 4.0)  # away from norm's kink at 0
    np.testing.assert_allclose(hessian, per_example(dsl.hessian(m.norm), (0,), xs + 4.0),
                               rtol=1e-13)
    np.testing.assert_allclose(hessian[-1], jacobian_by_differences(
        dsl.grad(m.norm), [xs[-1] + 4.0], 0), rtol=1e-6, atol=1e-8)


def test_vmap_of_a_vmap_of_a_jacobian_maps_both_axes(m):
    # a vmap of a Jacobian was not a function vmap takes (TypeError): the
    # outer examples run one at a time, each inner batch at once
    rng = np.random.default_rng(5)
    xs, ys = rng.normal(size=(2, 3, 2)), rng.normal(size=(2, 2))
    jacobian = dsl.jacrev(m.two, wrt=(0, 1))
    got = dsl.vmap(dsl.vmap(jacobian, in_axes=(0, None)))(xs, ys)
    for out in (0, 1):
        for wrt in (0, 1):
            want = [[jacobian(x, y)[out][wrt] for x in row] for row, y in zip(xs, ys)]
            np.testing.assert_allclose(got[out][wrt], want, rtol=1e-14)
            np.testing.assert_allclose(got[out][wrt][1, 2], jacobian_by_differences(
                m.two, [xs[1, 2], ys[1]], wrt, out), rtol=1e-7, atol=1e-8)


def test_vmap_of_a_jacobian_that_does_not_stack_runs_each_example(m):
    # pick gathers by a mapped index array: no stacked program, each
    # example's Jacobian; no example gives an empty one of the right shape
    x, idx = np.linspace(-2.0, 2.0, 12).reshape(4, 3), np.array([[0, 2], [1, 1], [2, 0], [0, 0]])
    for transform in (dsl.jacfwd, dsl.jacrev):
        got = dsl.vmap(transform(m.pick))(x, idx)
        np.testing.assert_allclose(got, per_example(transform(m.pick), (0, 1), x, idx),
                                   rtol=1e-15)
        np.testing.assert_allclose(got[1], jacobian_by_differences(m.pick, [x[1], idx[1]], 0),
                                   rtol=1e-8)
        empty = dsl.vmap(transform(m.pick))(np.zeros((0, 3)), np.zeros((0, 2), np.int64))
        assert empty.shape == (0, 3) and empty.dtype == np.float64


def test_vmap_of_a_jacobian_is_named_as_written_in_its_errors():
    # it said jacfwd(vmap(f)), the Jacobian across the examples (another
    # function), for the user's vmap(jacfwd(f))
    m = dsl.loads("def f(x, y):\n    return x * y\n")
    for transform in (dsl.jacfwd, dsl.jacrev):
        with pytest.raises(dsl.ArgumentError) as info:
            dsl.vmap(transform(m.f, wrt=(0, 1)))(np.ones((2, 3)), np.ones((2, 3), np.int64))
        assert info.value.message == (f"vmap({transform.__name__}(f)): cannot differentiate "
                                      "with respect to 'y': it has dtype i64")
    j = dsl.vmap(dsl.jacfwd(m.f, wrt=(0, 1)))(np.ones((2, 3)), np.full((2, 3), 2.0))
    np.testing.assert_array_equal(j[0], np.broadcast_to(2.0 * np.eye(3), (2, 3, 3)))


@settings(max_examples=4, deadline=None)
@given(data=st.data())
def test_vmap_of_hvp_maps_v_too(m, data):
    k, n = 3, 2  # one program for every draw (a size 1, or k == n, would be another)
    # hvp(f)(args..., v): v, its last argument, was not one of its
    # parameters, so vmap could not map it (a direction per example):
    # in_axes for it was refused, and a mapped v had the wrong shape.
    xs, ws, vs = (_draw(data, k, n) for _ in range(3))
    hvp, slope, eps = dsl.hvp(m.weighted), dsl.grad(m.weighted), 1e-6
    vf = dsl.vmap(hvp, in_axes=(0, None, 0))
    calls = []
    each_call = type(vf.inner).call_bound
    for axes, args in (((0, None, 0), (xs, ws[0], vs)), ((None, 0, 0), (xs[0], ws, vs)),
                       ((0, 0, None), (xs, ws, vs[0])), (0, (xs, ws, vs))):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(type(vf.inner), "call_bound",
                          lambda self, *a, **kw: (calls.append(1), each_call(self, *a, **kw))[1])
            got = dsl.vmap(hvp, in_axes=axes)(*args)
        assert calls == []  # one stacked program
        mapped = [j for j in range(3) if axes == 0 or axes[j] == 0]
        np.testing.assert_allclose(got, per_example(hvp, mapped, *args), rtol=1e-13, atol=1e-15)
        i = data.draw(st.integers(0, k - 1))
        x, w, v = (a[i] if j in mapped else a for j, a in enumerate(args))
        np.testing.assert_allclose(got[i], (slope(x + eps * v, w) - slope(x - eps * v, w))
                                   / (2 * eps), rtol=1e-6, atol=1e-7)
    with pytest.raises(dsl.ArgumentError, match=r"in_axes has 2 entries, but hvp\(weighted\) "
                                                "takes 3"):
        dsl.vmap(hvp, in_axes=(0, None))


def test_errors_about_hvps_v_name_it_v(m):
    # hvp's v is a parameter named "$v" inside (no function's parameter
    # can take that name): vmap's and jvp's messages printed that name
    hvp, x = dsl.hvp(m.weighted), np.ones((2, 3))
    for call, message in (
            (lambda: dsl.vmap(hvp)(x, x, np.ones((3, 3))),
             r"argument v of vmap\(hvp\(weighted\)\) has 3 examples on axis 0, but 'x' has 2"),
            (lambda: dsl.vmap(hvp, (0, None, 1))(x, x[0], x),
             r"argument v of vmap\(hvp\(weighted\)\) has 3 examples on axis 1, but 'x' has 2"),
            (lambda: dsl.vmap(hvp, (None, None, 0))(x[0], x[0], 2.0),
             r"argument v of vmap\(hvp\(weighted\)\) is a scalar"),
            # (a mapped v given by keyword: its last positional argument, w, was
            # taken as v, and the error was about w's examples)
            (lambda: dsl.vmap(hvp, (0, None, 0))(x, x[0], v=x),
             r"in_axes maps argument v of vmap\(hvp\(weighted\)\), given by keyword: a mapped "
             "argument is passed by position"),
            (lambda: dsl.jvp(hvp, (x[0], x[0], x[0]), (None, None, np.ones(4))),
             r"the tangent for v of hvp\(weighted\) has shape \[4\]")):
        with pytest.raises(dsl.ArgumentError, match=message) as caught:
            call()
        assert "$v" not in str(caught.value)


@pytest.mark.parametrize("fn", ["norm", "looped", "pick"])
def test_no_examples_give_empty_results_of_the_right_shape(m, fn):
    args = (np.zeros((0, 3)),) + ((np.zeros((0, 2), np.int64),) if fn == "pick" else ())
    got = dsl.vmap(getattr(m, fn))(*args)
    assert got.shape == (0,) and got.dtype == np.float64


@pytest.mark.parametrize("make,args,message", [
    (lambda m: dsl.vmap(m.two, in_axes=(0,)), (), r"in_axes has 1 entries, but two\(\) takes 2"),
    (lambda m: dsl.vmap(m.two, in_axes=2), (np.ones((3, 2)), np.ones((3, 2))),
     r"in_axes maps axis 2 of argument 'x' of vmap\(two\), which has 2 axes"),
    (lambda m: dsl.vmap(m.two, in_axes=(1, 0)), (np.ones((3, 2)), np.ones((3, 2))),
     r"argument 'y' of vmap\(two\) has 3 examples on axis 0, but 'x' has 2"),
    (lambda m: dsl.vmap(m.two, out_axes=(0,)), (np.ones(3), np.ones(3)),
     r"out_axes has 1 entries, but vmap\(two\) gives 2 result"),
    (lambda m: dsl.vmap(m.two, in_axes=(True, None)), (), "got True"),
    (lambda m: dsl.vmap(m.two, in_axes=(None, None)), (), "maps none of the arguments"),
    (lambda m: dsl.vmap(m.two), (np.ones((3, 2)), np.ones((4, 2))),
     r"argument 'y' of vmap\(two\) has 4 examples on axis 0, but 'x' has 3"),
    (lambda m: dsl.vmap(m.two), (np.ones(3), 2.0), r"'y' of vmap\(two\) is a scalar"),
    (lambda m: dsl.vmap(m.two), (np.ones(3),), r"maps argument 'y' .* passed by position"),
    (lambda m: dsl.vmap(m.norm), (np.ones((2, 3, 4)),),
     r"vmap\(norm\) maps axis 0, and for each example: argument 'x' of norm\(\) has rank 2"),
])
def test_bad_use_is_an_argument_error(m, make, args, message):
    with pytest.raises(dsl.ArgumentError, match=message):
        make(m)(*args)


def test_a_batched_jacobian_at_a_defaulted_argument_left_out(m):
    # (the batched Jacobian looked for the defaulted argument: a ValueError;
    # then "jacrev(scaled): no value was passed for 's'", where the
    # language differentiates at the default: d(x * s)/ds = x per example)
    x = np.arange(6.0).reshape(3, 2)
    np.testing.assert_array_equal(dsl.vmap(dsl.jacrev(m.scaled, wrt=1))(x), x)


def test_in_axes_may_leave_out_trailing_defaulted_parameters(m):
    # as JAX's in_axes has one entry per argument passed (it was "in_axes has
    # 1 entries, but scaled() takes 2")
    x = np.arange(6.0).reshape(2, 3)
    np.testing.assert_array_equal(dsl.vmap(m.scaled, in_axes=(0,))(x), 2 * x)
    np.testing.assert_array_equal(dsl.vmap(m.scaled, in_axes=[0])(x, 3.0), 3 * x)
    with pytest.raises(dsl.ArgumentError, match=r"in_axes has 0 entries, but scaled\(\) takes "
                                                "1 to 2 positional"):
        dsl.vmap(m.scaled, in_axes=())
    # not a defaulted one before a required one: hvp(scaled)'s v follows s
    # (in_axes=(0, 0) mapped s, not v: "'s' ... must then be passed by position")
    with pytest.raises(dsl.ArgumentError, match=r"in_axes has 2 entries, but hvp\(scaled\) "
                                                "takes 3 positional"):
        dsl.vmap(dsl.hvp(m.scaled), in_axes=(0, 0))


def test_const_arguments_map_when_in_axes_says_so(m):
    # every const was refused ("its value picks the program"), per-example
    # labels included, which the bridges' vmaps map
    rng = np.random.default_rng(3)
    z, y = rng.normal(size=(4, 5)), (rng.random((4, 5)) > 0.5).astype(float)
    labelled = dsl.vmap(m.labelled, in_axes=(0, 0))
    np.testing.assert_allclose(labelled(z, y), np.sum(np.log1p(np.exp(-(2 * y - 1) * z)), 1),
                               rtol=1e-13)
    gradient = dsl.vmap(dsl.grad(m.labelled), in_axes=(0, 0))(z, y)
    np.testing.assert_allclose(gradient, -(2 * y - 1) / (1 + np.exp((2 * y - 1) * z)),
                               rtol=1e-13)
    # a const integer (a trip count here) runs one example at a time
    x, n = rng.normal(size=(3, 2)), np.array([0, 1, 4])
    np.testing.assert_allclose(dsl.vmap(m.looped, in_axes=(0, 0))(x, n),
                               per_example(m.looped, (0, 1), x, n), rtol=1e-15)
    with pytest.raises(dsl.ArgumentError, match="'n' of vmap.looped. is a const scalar for "
                                                "each example"):
        dsl.grad(dsl.vmap(m.looped, in_axes=(0, 0)))(x, n)
    with pytest.raises(dsl.ArgumentError, match="cannot be recorded by a dsl.Tape where it runs "
                       "one example at a time .argument 'n' is a const scalar for each example"):
        with dsl.Tape() as tape:  # (it blamed "an op of its function")
            tape.watch(x)
            dsl.vmap(m.looped, in_axes=(0, 0))(x, n)


def test_vmap_takes_only_loaded_functions(tmp_path):
    with pytest.raises(TypeError, match="vmap.. takes a function of a loaded .grad module"):
        dsl.vmap(np.sin)


def test_vmap_on_cuda_matches_the_cpu(m):
    cu = dsl.loads(SOURCE, target="cuda")
    x = np.linspace(-1.0, 2.0, 12).reshape(4, 3)
    idx = np.array([[0, 2], [1, 1], [2, 0], [0, 0]])
    for fn, args in (("norm", (x,)), ("looped", (x,)), ("pick", (x, idx))):
        got = dsl.vmap(getattr(cu, fn))(*args)  # stacked, a loop stacked, one at a time
        assert not isinstance(got, np.ndarray)  # a device array, as its other results
        np.testing.assert_allclose(got.copy_to_host(), dsl.vmap(getattr(m, fn))(*args),
                                   rtol=1e-14)


def test_vmap_of_a_jacobian_on_cuda_matches_the_cpu(m):
    # the batched Jacobian repeated an unmapped argument by copying it to
    # the host as a device array (it was a host one: AttributeError), and
    # one example at a time with host_results, it copied NumPy's Jacobians
    cu = dsl.loads(SOURCE, target="cuda")
    x, y = np.linspace(-1.0, 2.0, 6).reshape(3, 2), np.array([0.5, -1.5])
    idx = np.array([[0, 1], [1, 1], [1, 0]])
    got = dsl.vmap(dsl.jacrev(cu.two, wrt=(0, 1)), in_axes=(0, None))(x, y)
    want = dsl.vmap(dsl.jacrev(m.two, wrt=(0, 1)), in_axes=(0, None))(x, y)
    pairs = [(got[out][wrt], want[out][wrt]) for out in (0, 1) for wrt in (0, 1)]
    pairs.append((dsl.vmap(dsl.jacfwd(cu.pick))(x, idx),  # one example at a time
                  dsl.vmap(dsl.jacfwd(m.pick))(x, idx)))
    for g, w in pairs:
        assert not isinstance(g, np.ndarray)  # a device array, as its other results
        np.testing.assert_allclose(g.copy_to_host(), w, rtol=1e-14)
    on_host = dsl.loads(SOURCE, target="cuda", host_results=True)
    np.testing.assert_allclose(dsl.vmap(dsl.jacfwd(on_host.pick))(x, idx), pairs[-1][1],
                               rtol=1e-14)


def test_device_arrays_mapped_along_another_axis_on_cuda():
    # catches: one example at a time (a mapped trip count) and a vmap of a
    # Jacobian taking device arrays' examples as views along axis 1, which
    # are not C-contiguous: "argument 'x' of trips() is a device array that
    # is not C-contiguous" for the contiguous array the caller passed
    from numba import cuda
    cu = dsl.loads(SOURCE, target="cuda", host_results=True)
    x, n = np.linspace(-1.0, 2.0, 12).reshape(3, 4), np.array([2, 0, 1, 3])
    got = dsl.vmap(cu.trips, in_axes=(1, 0))(cuda.to_device(x), n)
    want = x.copy()
    for i in range(3):  # (trips' loop by hand, for the columns with n > i)
        want[:, n > i] = np.sin(want[:, n > i]) + want[:, n > i] * 0.5
    np.testing.assert_allclose(got, want.sum(axis=0), rtol=1e-14)
    jac = dsl.vmap(dsl.jacrev(cu.norm), in_axes=-1)(cuda.to_device(x))
    np.testing.assert_allclose(jac, (x / np.sqrt(np.sum(x * x, axis=0))).T, rtol=1e-14)


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([(1, 0, 0), (-1, 1, -1), (2, -1, (1, 0)), (0, 1, (2, -1))]),
       st.integers(0, 2**32 - 1))
def test_examples_along_any_axis_in_and_out(m, axes, seed):
    # catches: in_axes other than 0 refused ("move the axis to the front"),
    # or taken along the wrong axis; a result's examples not put along its
    # out_axes; a transform of such a vmap (grad, jvp) given or giving
    # arrays in the program's own layout (examples first) rather than the
    # caller's; the one-example-at-a-time path (a mapped index array)
    # reading examples along axis 0
    x_axis, y_axis, out_axes = axes
    rng = np.random.default_rng(seed)
    xs, ys = rng.normal(size=(3, 4, 2)), rng.normal(size=(3, 4, 2))  # 3 examples
    x, y = np.moveaxis(xs, 0, x_axis), np.moveaxis(ys, 0, y_axis)
    f = dsl.vmap(m.two, in_axes=(x_axis, y_axis), out_axes=out_axes)
    product_axis, sum_axis = out_axes if isinstance(out_axes, tuple) else (out_axes,) * 2
    product, total = f(x, y)
    np.testing.assert_allclose(product, np.moveaxis(xs * ys, 0, product_axis), rtol=1e-15)
    np.testing.assert_allclose(total, xs.sum(axis=(1, 2)), rtol=1e-12, atol=1e-14)
    # the gradient of sum(product) + sum(total) for x, laid out as x is
    want = np.moveaxis(ys + 1.0, 0, x_axis)
    np.testing.assert_allclose(dsl.grad(f, wrt=0)(x, y), want, rtol=1e-15)
    t = rng.normal(size=x.shape)
    _, (tangent, _) = dsl.jvp(f, (x, y), (t, None))  # t laid out as x
    np.testing.assert_allclose(tangent, np.moveaxis(np.moveaxis(t, x_axis, 0) * ys, 0,
                                                    product_axis), rtol=1e-15)
    # one example at a time: a mapped index array, examples along axis 1
    idx = rng.integers(0, 4, size=(2, 3))
    got = dsl.vmap(m.pick, in_axes=(x_axis, 1))(x, idx)
    want = [np.sum(xs[i][idx[:, i]] * 2.0) for i in range(3)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)  # (summed in another order)


def test_out_axes_nest_as_the_results_do(m):
    # catches: value_and_grad(f, wrt=(0, 1))'s (value, (gx, gy)) taking
    # out_axes only flat, (0, 1, 0), where JAX's nest as the results do
    x, y = np.arange(6.0).reshape(2, 3), np.full((2, 3), 2.0)
    vg = dsl.value_and_grad(m.weighted, wrt=(0, 1))
    value, (gx, gw) = dsl.vmap(vg, in_axes=1, out_axes=(0, (1, 0)))(x, y)
    np.testing.assert_allclose(value, np.sum(np.sin(x * y) * x, axis=0), rtol=1e-14)
    np.testing.assert_allclose(gx, np.cos(x * y) * y * x + np.sin(x * y), rtol=1e-14)
    np.testing.assert_allclose(gw, (np.cos(x * y) * x * x).T, rtol=1e-14)
    # an integer for a part stands for each result in it (JAX's tree prefixes);
    # a structure that is not a prefix of the results' is refused (it was
    # flattened: ((0, 1), 0) put the value on axis 0 and the gradients on 1, 0)
    value, (gx, gw) = dsl.vmap(vg, in_axes=1, out_axes=[0, 1])(x, y)
    np.testing.assert_allclose(gx, np.cos(x * y) * y * x + np.sin(x * y), rtol=1e-14)
    np.testing.assert_allclose(gw, np.cos(x * y) * x * x, rtol=1e-14)
    for nested in [((0, 1), 0), (0, (1, 0, 0)), (0, 1, 0), (0, ((1,), 0))]:
        with pytest.raises(dsl.ArgumentError, match=r"does not nest as the results of "
                           r"vmap\(value_and_grad\(weighted\)\) do, \(array, \(array, array\)\)"
                           if nested != (0, 1, 0) else r"out_axes has 3 entries, but "
                           r"vmap\(value_and_grad\(weighted\)\) gives 2 result"):
            dsl.vmap(vg, in_axes=1, out_axes=nested)(x, y)


def test_a_jacobian_mapped_along_another_axis(m):
    # catches: a vmap of a Jacobian reading the examples along axis 0
    x = np.random.default_rng(2).normal(size=(4, 3))
    jac = dsl.vmap(dsl.jacrev(m.norm), in_axes=-1)(x)
    np.testing.assert_allclose(jac, (x / np.sqrt(np.sum(x * x, axis=0))).T, rtol=1e-14)
    with pytest.raises(dsl.ArgumentError, match=r"takes out_axes=0 only"):
        dsl.vmap(dsl.jacrev(m.norm), out_axes=1)
    # a tuple of zeros is checked against the Jacobians too (it was taken as
    # 0 whatever its count or nesting), called or as a function (grad of it)
    np.testing.assert_allclose(dsl.vmap(dsl.jacrev(m.norm), in_axes=-1, out_axes=(0,))(x), jac,
                               rtol=1e-15)
    for transform in (lambda jacobians: jacobians, dsl.grad):
        with pytest.raises(dsl.ArgumentError, match=r"out_axes has 2 entries, but "
                                                    r"vmap\(jacrev\(norm\)\) gives 1 result"):
            transform(dsl.vmap(dsl.jacrev(m.norm), in_axes=-1, out_axes=(0, 0)))(x)
