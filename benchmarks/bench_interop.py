"""The bridges' costs: `dsl.to_torch` over a direct call, and the logistic
loss with its gradient on Dask arrays.

    python benchmarks/bench_interop.py [--rows 2000000] [--blocks 8] [--rounds 5]

torch: log1pexp at n=16 and 1e6, forward only and forward + backward,
through `to_torch` against the dsl called on NumPy arrays (`m.log1pexp`,
and `dsl.vjp` + its pullback).  Dask: `value_and_grad(loss, wrt=2)` of
examples/logistic.grad over rows x 8 f64 in `blocks` row blocks, in memory
vs on Dask arrays with the threaded scheduler and on a dask.distributed
LocalCluster of 2 worker processes (1 thread each), and vs the same loss
and gradient written with dask.array operations by hand (threaded).  Every
variant is checked
against the in-memory result first, then timed in interleaved rounds
(`timing.compare`); report the load average printed with the figures.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import dsl  # noqa: E402
import timing  # noqa: E402


def bench_torch(rounds: int) -> None:
    import torch
    m = dsl.load(ROOT / "examples" / "log1pexp.grad")
    f, tf = m.log1pexp, dsl.to_torch(m.log1pexp)
    for n in (16, 1_000_000):
        x = np.random.default_rng(0).uniform(-20, 20, n)
        xt = torch.from_numpy(x.copy()).requires_grad_()
        ones = np.ones(n)
        ones_t = torch.ones(n, dtype=torch.float64)

        def dsl_both():
            y, pullback = dsl.vjp(f, x)
            return pullback(ones)

        def torch_both():
            xt.grad = None
            tf(xt).backward(ones_t)
            return xt.grad

        np.testing.assert_array_equal(tf(torch.from_numpy(x)).numpy(), f(x))
        np.testing.assert_array_equal(torch_both().numpy(), dsl_both()[0])
        impls = {"dsl forward": lambda: f(x), "to_torch forward": lambda: tf(xt.detach()),
                 "dsl vjp+pullback": dsl_both, "to_torch fwd+bwd": torch_both}
        t = timing.compare(impls, rounds)
        print(f"\nlog1pexp n={n}, load {timing.load_average()}")
        for name, r in t.items():
            print(f"  {name:<18}{r.median * 1e6:>12.1f} us")
        forward = t["to_torch forward"].median / t["dsl forward"].median
        both = t["to_torch fwd+bwd"].median / t["dsl vjp+pullback"].median
        print(f"  to_torch / dsl: forward {forward:.2f}, with backward {both:.2f}")


def bench_dask(rows: int, blocks: int, rounds: int) -> None:
    import dask
    import dask.array as da
    m = dsl.load(ROOT / "examples" / "logistic.grad")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8))
    y = np.sign(rng.normal(size=rows))
    w = rng.normal(size=8) / 3
    chunk = -(-rows // blocks)
    xs, ys = da.from_array(x, chunks=(chunk, 8)), da.from_array(y, chunks=chunk)
    vg = dsl.value_and_grad(m.loss, wrt=2)

    def by_hand():
        z = -ys * (xs @ w)
        value = da.mean(da.logaddexp(0, z))
        grad = xs.T @ (-ys / (1 + da.exp(-z))) / rows
        return dask.compute(value, grad)

    def on_dask():
        return dask.compute(*vg(xs, ys, w))

    expected = vg(x, y, w)
    for got in (on_dask(), by_hand()):
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-12)
        np.testing.assert_allclose(got[1], expected[1], rtol=1e-10)
    from dask.distributed import Client, LocalCluster
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None)
    with Client(cluster, set_as_default=False) as client:
        # the rows live on the workers, as data loaded there would: only the
        # block tasks, w and the partials move per call
        on_cluster = client.persist([xs, ys])

        def on_workers():
            return client.compute(vg(*on_cluster, w), sync=True)

        got = on_workers()
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-12)
        np.testing.assert_allclose(got[1], expected[1], rtol=1e-12)
        with dask.config.set(scheduler="threads"):
            t = timing.compare({"in memory": lambda: vg(x, y, w), "dsl on dask": on_dask,
                                "dsl, 2 worker processes": on_workers,
                                "dask.array by hand": by_hand}, rounds, sample_s=0.0)
    print(f"\nlogistic value_and_grad, {rows} x 8 f64 in {blocks} blocks, threaded "
          f"scheduler unless named, load {timing.load_average()}")
    for name, r in t.items():
        print(f"  {name:<26}{r.median * 1e3:>10.1f} ms  (min {r.low * 1e3:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    bench_torch(max(opts.rounds, 11))
    bench_dask(opts.rows, opts.blocks, opts.rounds)


if __name__ == "__main__":
    main()
