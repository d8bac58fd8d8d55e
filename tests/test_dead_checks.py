"""An index out of range is an error wherever it is written: a gather or
scatter-add whose result nothing reads (dead code, or a gradient that needs
none of it, as one w.r.t. a scatter-add's base) still checks its index
(`compiler.passes.dce` leaves a `check_index` in its place), so a call and
every transform of it raise the same error at the same inputs, and where
the indices are in range the values are the same as before."""
import numpy as np
import pytest

import dsl
from gradlang.compiler.ir import TensorType
from gradlang.compiler.pipeline import generate, optimize
from gradlang.compiler.shapes import Sym
from gradlang.runtime.target import get as get_target
from gradlang.runtime.target import TARGETS
from helpers import central_difference

SOURCE = """
def sa(base, idx, v):
    return scatter_add(base, idx, v, axis=0)

def unused(x, i: i64):
    y = x[i]
    return x * 2.0

def two(x, w, i, j):
    return sum(take(x, i, axis=0)) + sum(take(w, j, axis=0) * 3.0)

def two_max(x, y):
    return sum(x * 2.0) + max(y)

def two_loop(x, y, s: i64):
    t = 0.0
    for i in range(0, 3, s):
        t = t + sum(y)
    return sum(x * 2.0) + t

def acc(x, idx, n: i64):
    t = 0.0
    for k in range(n):
        t = t + x[idx[k]] * 3.0
    return t

def rows(x, w, j):
    return sum(x * 2.0) + sum(take(w, j, axis=0) * 3.0)
"""


def _error(f, *args) -> str:
    with pytest.raises(dsl.ArgumentError) as info:
        f(*args)
    return str(info.value)


@pytest.mark.parametrize("target", list(TARGETS))
def test_a_gradient_wrt_a_scatter_adds_base_checks_its_index(target):
    # d sum(base + scatter) / d base reads nothing of the scatter: it
    # returned ones for an index the call refuses
    m = dsl.loads(SOURCE, "dead.grad", target=target)
    host = (lambda a: a.copy_to_host()) if target == "cuda" else np.asarray
    base, v = np.arange(6.0).reshape(3, 2), np.ones((2, 2))
    message = _error(m.sa, base, np.array([1, 7]), v)
    assert message.startswith("dead.grad:3:12: error: index 7 in 'idx' is out of range for "
                              "an axis of size 3 (valid: -3 to 2)")
    assert _error(dsl.grad(m.sa), base, np.array([1, 7]), v) == message
    good = np.array([1, -1])
    np.testing.assert_allclose(host(dsl.grad(m.sa)(base, good, v)),
                               central_difference(lambda *a: host(m.sa(*a)),
                                                  (base, good, v), 0), rtol=1e-7)


def test_a_gather_nothing_reads_checks_its_index():
    m = dsl.loads(SOURCE, "dead.grad")
    x = np.array([1.0, -2.0, 4.0])
    message = _error(m.unused, x, 7)
    assert message.startswith("dead.grad:6:9: error: index 7 in 'i' is out of range for an "
                              "axis of size 3 (valid: -3 to 2)")
    assert _error(dsl.grad(m.unused), x, -4) == message.replace("index 7", "index -4")
    np.testing.assert_array_equal(m.unused(x, -3), 2 * x)
    np.testing.assert_allclose(dsl.grad(m.unused)(x, -3),
                               central_difference(m.unused, (x, -3), 0), rtol=1e-7)


def test_dead_gathers_of_a_gradient_raise_the_calls_first_error():
    # both gathers are dead in the gradient (it is linear in each), whose
    # scatter-adds run in reverse order: j's was the error reported
    m = dsl.loads(SOURCE, "dead.grad")
    x, w = np.array([1.0, -2.0, 4.0]), np.array([0.5, 3.0])
    i, j = np.array([0, 5]), np.array([9, 1])
    message = _error(m.two, x, w, i, j)
    assert message.startswith("dead.grad:10:16: error: index 5 in 'i' is out of range")
    assert _error(dsl.grad(m.two, wrt=(0, 1)), x, w, i, j) == message
    i, j = np.array([0, 2, 0]), np.array([1, -1])
    for got, k in zip(dsl.grad(m.two, wrt=(0, 1))(x, w, i, j), (0, 1), strict=True):
        np.testing.assert_allclose(got, central_difference(m.two, (x, w, i, j), k), rtol=1e-7)
    # cheapest: i's check runs first, alone; j's is its scatter-add's own
    types = {"x": TensorType("f64", (3,)), "w": TensorType("f64", (2,)),
             "i": TensorType("i64", (2,)), "j": TensorType("i64", (2,))}
    ops = [e.op for e in optimize(dsl.grad(m.two, wrt=(0, 1)).lower(types)).eqns]
    assert ops.count("check_index") == 1 and ops[0] == "check_index"


CHECKED_ALONE = [
    # d/dx reads neither max(y) nor the loop: an empty y, a step of 0
    ("two_max", (np.zeros(0),), (np.array([0.5, 3.0]),), -2.0 + 3.0,
     "dead.grad:13:27: error: max/min over an empty axis (shape [0], axes [0])"),
    ("two_loop", (np.ones(2), 0), (np.array([0.5, 3.0]), 2), -2.0 + 2 * 3.5,
     "dead.grad:17:5: error: range() step must not be zero"),
]


@pytest.mark.parametrize("name, bad, good, value, expected", CHECKED_ALONE, ids=["max", "loop"])
def test_a_max_or_loop_a_gradient_does_not_read_keeps_its_check(name, bad, good, value,
                                                                  expected):
    f = getattr(dsl.loads(SOURCE, "dead.grad"), name)
    x = np.array([1.0, -2.0])
    message = _error(f, x, *bad)
    assert message.startswith(expected)
    assert _error(dsl.grad(f), x, *bad) == message
    assert f(x, *good) == value
    np.testing.assert_allclose(dsl.grad(f)(x, *good), central_difference(f, (x, *good), 0),
                               rtol=1e-7)


def test_a_loops_dead_gathers_are_checked_in_the_calls_order():
    # the forward loop of the gradient computes nothing it reads: it runs
    # for its checks, in the trips' order, where the backward loop's
    # scatter-adds met index 9 first
    m = dsl.loads(SOURCE, "dead.grad")
    x = np.array([1.0, -2.0, 4.0, 0.5])
    bad = np.array([0, 7, 9, 1])
    message = _error(m.acc, x, bad, 4)
    assert "index 7 is out of range for an axis of size 4" in message
    assert _error(dsl.grad(m.acc), x, bad, 4) == message
    idx = np.array([0, 3, -1, 1, 3])
    np.testing.assert_allclose(dsl.grad(m.acc)(x, idx, 5),
                               central_difference(m.acc, (x, idx, 5), 0), rtol=1e-7)
    np.testing.assert_allclose(dsl.grad(m.acc)(x, idx, 0), np.zeros(4))
    # both loops have a compiled form (the check's size, x's, passed to it)
    n, k = Sym.named("n"), Sym.named("k")
    types = {"x": TensorType("f64", (n,)), "idx": TensorType("i64", (k,)),
             "n": TensorType("i64", ())}
    ir = optimize(dsl.grad(m.acc).lower(types))
    forward = next(e for e in ir.eqns if e.op == "loop")
    assert [e.op for e in forward.p["body"].eqns] == ["take", "check_index"]
    driver = generate(ir, get_target("cpu")).driver_source
    assert driver.count("R.run_compiled(") == 2


def test_dask_blocks_run_the_checks_of_what_nothing_reads():
    # the gradient's take is dead: its check of an index every block has
    # runs in the blocks (a Dask run of row results alone runs no combine,
    # where the call's live take raised NumPy's IndexError before)
    da = pytest.importorskip("dask.array")
    m = dsl.loads(SOURCE, "dead.grad")
    xs = da.from_array(np.arange(6.0).reshape(3, 2), chunks=(2, 2))
    w, bad = np.array([0.5, 3.0]), np.array([1, 7])
    message = _error(lambda *a: m.rows(*a).compute(), xs, w, bad)
    assert message.startswith("dead.grad:28:31: error: index 7 in 'j' is out of range")
    grad = dsl.grad(m.rows, wrt=0)
    assert _error(lambda *a: grad(*a).compute(), xs, w, bad) == message
    x, j = np.arange(6.0).reshape(3, 2), np.array([1, 0])
    np.testing.assert_allclose(grad(xs, w, j).compute(),
                               central_difference(m.rows, (x, w, j), 0), rtol=1e-7)


def test_a_loop_that_carries_nothing_runs_its_checks():
    # a loop whose every assignment is its own (nothing outlives it) was
    # dropped when lowered, checks and all: x[i] past the end and a step
    # of 0 returned sum(x), in the call and its transforms
    m = dsl.loads("def f(x, n: i64, s: i64):\n    for i in range(0, n, s):\n        y = x[i]\n"
                  "    return sum(x * x)\n", "local.grad")
    x = np.array([1.0, -2.0, 3.0])
    for bad, expected in (((5, 1), "local.grad:3:13: error: index 3 in 'i' is out of range"),
                          ((3, 0), "local.grad:2:5: error: range() step must not be zero")):
        for call in (m.f, dsl.grad(m.f), lambda *a: dsl.jvp(m.f, a, (x, None, None))):
            assert _error(call, x, *bad).startswith(expected)
    assert m.f(x, 3, 1) == 14.0
    np.testing.assert_array_equal(dsl.grad(m.f)(x, 3, 1), 2 * x)


def test_a_loop_whose_body_only_checks_still_stacks_what_a_later_loop_reads():
    # grad of grad of n * sum(sin(v[ids])): the first backward loop kept only
    # the stack of a cotangent it carries unchanged, its body the dead
    # gather's check, and was dropped as a loop for checks alone that the
    # next loop covers: that loop then read the stack undefined (KeyError;
    # an IRVerificationError under GRADC_VERIFY), in hvp and grad of grad
    m = dsl.loads("def f(v, ids, n: i64):\n    s = 0.0\n    for i in range(n):\n"
                  "        s = s + sum(sin(v[ids]))\n    return s\n", "stack.grad")
    v, ids = np.array([0.5, -1.0, 2.0]), np.array([0, 2, 2])
    counts = np.array([1.0, 0.0, 2.0])
    np.testing.assert_allclose(dsl.grad(dsl.grad(m.f))(v, ids, 3), -3 * counts * np.sin(v),
                               rtol=1e-14)
    np.testing.assert_allclose(dsl.hvp(m.f)(v, ids, 3, np.ones(3)), -3 * counts * np.sin(v),
                               rtol=1e-14)
