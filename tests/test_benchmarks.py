"""The benchmark suite computes the same thing in every implementation: each
workload at a tiny size, every implementation (the dsl; JAX and PyTorch
when importable) checked against NumPy by hand.  No timing is asserted."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import timing  # noqa: E402
import workloads  # noqa: E402

CASES = (workloads.log1pexp_cases([7], [np.float32, np.float64])
         + workloads.r1_cases([9])
         + workloads.dense_cases(6, 4, 3)
         + workloads.fused_sum_cases([11])
         + workloads.out_cases([7], [np.float32, np.float64]))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_every_implementation_agrees_with_numpy(case):
    assert {"numpy", "dsl"} <= set(case.impls)
    workloads.check(case)


def test_forward_benchmark_checks_its_results_and_kernel_count(capsys):
    import bench_forward
    bench_forward.main(["--n", "20", "--rounds", "1", "--sample-ms", "1"])
    assert "kernels: value_and_grad 1, jvp 1" in capsys.readouterr().out


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
