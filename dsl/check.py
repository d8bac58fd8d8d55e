"""Checking gradients against finite differences.

Contract: `check_gradients(f, *args, order=2)` evaluates, in f64 at the
given point, every gradient `f` defines or implies, up to `order`, and
compares each with central differences of the order below:

- order 1: grad(f, wrt=x) (the first grad block, or reverse mode) against
  differences of sum(f) along random directions (and per element for small
  inputs);
- order 2: hvp(f, wrt=x)(v) (the second grad block when written, else
  reverse mode through the first block and its residuals) against
  differences of grad(f, wrt=x) along v.

It returns one `GradCheck` per (order, argument) with the max absolute and
relative error, whether a NaN/Inf appeared where the function is finite,
which gradient was tested (a block and its line, or "automatic"), and the
verdict.  `gradc check` prints these; tests assert on them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsl.function import Compiled, GradFn, GradFunction, HvpFunction


@dataclass(frozen=True)
class GradCheck:
    function: str
    order: int
    wrt: str
    source: str  # "grad block 1 (line 7)" or "automatic"
    max_abs: float
    max_rel: float
    nonfinite: bool
    ok: bool

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        nan = " NaN/Inf in gradient" if self.nonfinite else ""
        return (f"{self.function}: order {self.order} w.r.t. {self.wrt} [{self.source}]: "
                f"max abs err {self.max_abs:.3g}, max rel err {self.max_rel:.3g}{nan}: "
                f"{verdict}")


def _source(f: Compiled, order: int) -> str:
    fdef = getattr(f, "fdef", None)
    if fdef is None or not fdef.grads:
        return "automatic"
    if order <= len(fdef.grads):
        return f"grad block {order} (line {fdef.grads[order - 1].span.line})"
    last = len(fdef.grads)
    return f"automatic through grad block {last} (line {fdef.grads[last - 1].span.line})"


def _as_f64(bound: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {n: a.astype(np.float64) if a.dtype.kind == "f" else a for n, a in bound.items()}


def _run(f: Compiled, bound: dict[str, np.ndarray]) -> list[np.ndarray]:
    return list(f.program(bound)(*bound.values()))


def _compare(analytic: np.ndarray, numeric: np.ndarray, rtol: float, atol: float):
    analytic, numeric = np.asarray(analytic, float), np.asarray(numeric, float)
    nonfinite = bool(np.any(~np.isfinite(analytic)) and np.all(np.isfinite(numeric)))
    with np.errstate(all="ignore"):
        err = np.abs(analytic - numeric)
        max_abs = float(np.nanmax(err)) if err.size else 0.0
        scale = np.maximum(np.abs(numeric), 1.0)
        max_rel = float(np.nanmax(err / scale)) if err.size else 0.0
    ok = (not nonfinite and np.all(np.isfinite(err)) and
          bool(np.all(err <= atol + rtol * np.abs(numeric))))
    if not np.all(np.isfinite(numeric)):
        ok = ok and bool(np.array_equal(np.isfinite(analytic), np.isfinite(numeric)))
    return max_abs, (max_rel if np.isfinite(max_rel) else float("inf")), nonfinite, bool(ok)


def check_gradients(f: Compiled, *args, order: int = 2, eps: float = 1e-6,
                    rtol: float = 1e-4, atol: float = 1e-6, seed: int = 0,
                    **kwargs) -> list[GradCheck]:
    rng = np.random.default_rng(seed)
    bound = _as_f64(f.bind(args, kwargs))
    results: list[GradCheck] = []
    for name in f.differentiable_names(bound):
        x = bound[name]
        grad_fn = GradFunction(f, name, with_value=False)

        def total(point: np.ndarray) -> float:
            return float(sum(np.sum(o) for o in _run(f, {**bound, name: point})))

        g = _run(grad_fn, bound)[-1]
        directions = [rng.normal(size=x.shape) for _ in range(3)]
        if x.size <= 16:
            directions += [np.eye(x.size)[i].reshape(x.shape) for i in range(x.size)]
        analytic = np.array([np.sum(g * v) for v in directions])
        numeric = np.array([(total(x + eps * v) - total(x - eps * v)) / (2 * eps)
                            for v in directions])
        results.append(GradCheck(f.name, 1, name, _source(f, 1),
                                 *_compare(analytic, numeric, rtol, atol)))
        if order < 2:
            continue
        hvp_fn = HvpFunction(f, name)
        step = eps * 100  # differences of a gradient need a larger step
        for v in directions[:3]:
            h = _run(hvp_fn, {**bound, "$v": v})[0]
            gp = _run(grad_fn, {**bound, name: x + step * v})[-1]
            gm = _run(grad_fn, {**bound, name: x - step * v})[-1]
            numeric2 = (gp - gm) / (2 * step)
            check = GradCheck(f.name, 2, name, _source(f, 2),
                              *_compare(h, numeric2, rtol * 10, atol * 10))
            if not check.ok or v is directions[2]:
                results.append(check)
                break
    return results
