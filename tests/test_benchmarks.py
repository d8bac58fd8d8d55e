"""The benchmark suite computes the same thing in every implementation: each
workload at a tiny size, every implementation (the dsl; JAX and PyTorch
when importable) checked against NumPy by hand.  No timing is asserted."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import timing  # noqa: E402
from helpers import central_difference  # noqa: E402
import workloads  # noqa: E402

# Each workload at a tiny size, built when its test runs (building imports
# torch and compiles kernels: at collection, every worker paid for all)
WORKLOADS = {
    "log1pexp": lambda: workloads.log1pexp_cases([7], [np.float32, np.float64]),
    "params": lambda: workloads.params_call_cases(5, 3, 2),
    "r1": lambda: workloads.r1_cases([9]),
    "per_example": lambda: workloads.per_example_cases(7, 3),
    "dense": lambda: workloads.dense_cases(6, 4, 3),
    "attention": lambda: workloads.attention_cases(2, 2, 5, 3),
    "conv": lambda: workloads.conv_cases(2, 3, 5, 4, 3),
    "pool": lambda: workloads.pool_cases(2, 3, 7),
    "norm": lambda: workloads.norm_cases(2, 3, 4),
    "broadcast": lambda: workloads.broadcast_cases(scale=16),
    "fused_sum": lambda: workloads.fused_sum_cases([11]),
    "sincos_pow": lambda: workloads.sincos_pow_cases([9], [np.float32, np.float64]),
    "out": lambda: workloads.out_cases([7], [np.float32, np.float64]),
    "loop": lambda: workloads.loop_cases(7, 5),
    "fit": lambda: workloads.fit_cases(4),
    "rnn": lambda: workloads.rnn_cases(4, [3]),
    "language model": lambda: workloads.language_model_cases(5, 4, [3]),
    "forward": lambda: workloads.forward_cases([20], jacobian_size=5),
    "indexing": lambda: workloads.indexing_cases(10, 3, 12, 30, 4),
    "to_torch": lambda: workloads.torch_bridge_cases([5]),
    "to_jax": lambda: workloads.jax_bridge_cases([5]),
    "dask": lambda: workloads.dask_cases(40, 4, workers=0),  # a LocalCluster takes seconds
}


@pytest.fixture(autouse=True, scope="module")
def jax_x64_for_the_workloads():
    """The workloads run JAX with its process-wide x64 flag on; the tests
    that run before or after these on the same process expect JAX's own
    setting.  (JAX is imported here, not at collection, which every
    worker runs.)"""
    try:
        import jax
    except ImportError:
        yield
        return
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_implementation_agrees_with_numpy(workload):
    cases = WORKLOADS[workload]()
    assert cases
    for case in cases:  # (check names the case in its messages)
        assert {"numpy", "dsl"} <= set(case.impls), case.label
        workloads.check(case)


def test_notes_give_kernel_counts_and_recompute_savings():
    loop = workloads.loop_cases(7, 16)[0].notes
    # the loop runs inside its forward and backward kernels (and the sum's),
    # not as a loop in the driver launching a kernel per trip
    launches, driver_loops = map(int, re.findall(r"driver: (\d+) \(loops in the driver: (\d+)",
                                                 loop[0])[0])
    assert launches <= 3 and driver_loops == 0
    plain, saved = (int(s.replace(",", "")) for s in
                    re.findall(r"plain ([\d,]+), @recompute ([\d,]+)", loop[1])[0])
    assert saved < plain
    assert workloads.forward_cases([20], jacobian_size=5)[0].notes == ["kernels in the jvp: 1"]


def test_loop_and_hvp_references_match_finite_differences():
    rng = np.random.default_rng(1)
    u, kappa, h = rng.uniform(0.1, 0.9, 4), 0.3, 1e-6
    value, du, dkappa = workloads.numpy_loop(u, kappa, 10)
    e = np.eye(4)[2] * h
    fd_u = (workloads.numpy_loop(u + e, kappa, 10)[0]
            - workloads.numpy_loop(u - e, kappa, 10)[0]) / (2 * h)
    fd_kappa = (workloads.numpy_loop(u, kappa + h, 10)[0]
                - workloads.numpy_loop(u, kappa - h, 10)[0]) / (2 * h)
    assert du[2] == pytest.approx(fd_u, rel=1e-6)
    assert dkappa == pytest.approx(fd_kappa, rel=1e-6)
    args = (np.array([1.0, -0.5]), 4.0, 0.3, 0.05, rng.normal(size=(6, 2)))
    _, *grads = workloads.numpy_fit(*args)  # the adjoint by hand, w.r.t. y0, k and c
    for index, g in enumerate(grads):
        np.testing.assert_allclose(g, central_difference(
            lambda *a: workloads.numpy_fit(*a)[0], args, index), rtol=1e-6)
    x, v = rng.normal(size=3), rng.normal(size=3)
    fd_hvp = (workloads.numpy_log1pexp(x + h * v)[1]
              - workloads.numpy_log1pexp(x - h * v)[1]) / (2 * h)
    np.testing.assert_allclose(workloads.numpy_log1pexp_hvp(x, v), fd_hvp, rtol=1e-6)


def test_the_batch_norm_reference_gradients_match_finite_differences():
    rng = np.random.default_rng(7)
    args = [rng.normal(size=(2, 3, 2, 2)), rng.normal(size=3), rng.normal(size=3)]
    _, *grads = workloads.numpy_norm_loss(*args)
    for k, grad in enumerate(grads):
        fd = np.zeros_like(args[k])
        for i in np.ndindex(fd.shape):
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[k][i] += 1e-6
            minus[k][i] -= 1e-6
            value = workloads.numpy_norm_loss
            fd[i] = (value(*plus)[0] - value(*minus)[0]) / 2e-6
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_the_masked_softmax_reference_gradient_matches_finite_differences():
    rng = np.random.default_rng(8)
    s, mask = rng.normal(size=(2, 1, 3, 4)), rng.random(size=(2, 1, 1, 4)) < 0.6
    mask[..., 0] = True
    _, grad = workloads.numpy_masked_softmax(s, mask)
    fd = np.zeros_like(s)
    for i in np.ndindex(s.shape):
        plus, minus = s.copy(), s.copy()
        plus[i] += 1e-6
        minus[i] -= 1e-6
        value = workloads.numpy_masked_softmax
        fd[i] = (value(plus, mask)[0] - value(minus, mask)[0]) / 2e-6
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)


def test_numpy_references_match_independent_values():
    # log1pexp at 0: log 2 and 1/2.  R1 at x = w = [1, -1] (slopes 1, 1):
    # sum(w^2) = 2, 2 w.  At x = [1], w = [-2] (slope 0.2): 0.04 * 4, 2 * 0.04 * w.
    v, g = workloads.numpy_log1pexp(np.zeros(1))
    assert v[0] == pytest.approx(np.log(2)) and g[0] == pytest.approx(0.5)
    assert workloads.numpy_r1(np.array([1.0, -1.0]), np.array([1.0, -1.0]))[0] == 2.0
    r1, gw = workloads.numpy_r1(np.array([1.0]), np.array([-2.0]))
    assert r1 == pytest.approx(0.16) and gw[0] == pytest.approx(-0.16)
    # dense with w = 0, b = 0: softplus(0) = log 2 per entry, sigmoid(0) = 1/2.
    x = np.ones((2, 3), np.float32)
    value, (gw, gb) = workloads.numpy_dense(x, np.zeros((3, 4), np.float32),
                                            np.zeros(4, np.float32))
    assert value == pytest.approx(8 * np.log(2), rel=1e-6)
    np.testing.assert_allclose(gw, np.full((3, 4), 1.0))
    np.testing.assert_allclose(gb, np.full(4, 1.0))
    # per-example logistic gradients at w = 0: -y_i sigmoid(0) x_i = -y_i x_i / 2
    x, y = np.array([[1.0, 2.0], [3.0, -4.0]]), np.array([1.0, -1.0])
    (g,) = workloads.numpy_per_example(x, y, np.zeros(2))
    np.testing.assert_array_equal(g, [[-0.5, -1.0], [1.5, -2.0]])


def test_check_rejects_a_wrong_implementation():
    x = np.linspace(-3.0, 3.0, 5)
    wrong = workloads.Case("wrong", {"numpy": lambda: workloads.numpy_log1pexp(x),
                                     "dsl": lambda: (np.log1p(np.exp(x)), np.exp(x))},
                           workloads.numpy_log1pexp(x))
    with pytest.raises(AssertionError, match="dsl's result 1"):
        workloads.check(wrong)
    f32 = workloads.Case("dtype", {"dsl": lambda: x.astype(np.float32)}, (x,))
    with pytest.raises(AssertionError, match="float32"):
        workloads.check(f32)


def test_ratio_is_dsl_time_over_the_others():
    t = {"dsl": timing.Timing(1.0, 1.0, 1.0, 1), "numpy": timing.Timing(4.0, 4.0, 4.0, 1)}
    assert timing.ratio_cells(t, "dsl", ["numpy", "jax"]) == ["0.25x", "-"]


def test_rounds_interleave_and_rotate_who_goes_first():
    calls = []
    impls = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    result = timing.compare(impls, rounds=3, sample_s=0.0)
    assert set(result) == {"a", "b", "c"}
    assert all(r.calls_per_sample == 1 for r in result.values())
    # After the warm-up call and calibration (two calls each): one call per
    # round, the first one rotating.
    assert calls[-9:] == list("abcbcacab")


def test_paired_ratio_is_the_median_of_rounds_timed_back_to_back(monkeypatch):
    def ours():
        pass

    def other():
        pass

    timed = []
    # ours takes 3 s a call and other 1 s, except in one round where load
    # doubles both: the paired ratio stays 3
    seconds = iter([3.0, 1.0] + [3.0, 1.0, 1.0, 3.0, 6.0, 2.0, 1.0, 3.0, 3.0, 1.0])

    def fake_per_call(fn, number):
        timed.append(fn)
        return next(seconds)

    monkeypatch.setattr(timing, "per_call", fake_per_call)
    result = timing.paired_ratio(ours, other, rounds=5, sample_s=0.0)
    assert (result.median, result.lower_quartile, result.upper_quartile) == (3.0, 3.0, 3.0)
    # after calibration, each round times both, who goes first alternating
    assert timed == [ours, other] + [ours, other, other, ours] * 2 + [ours, other]
