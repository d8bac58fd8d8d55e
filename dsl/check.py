"""Checking gradients against finite differences.

Contract: `check_gradients(f, *args, order=2)` evaluates, in f64 at the
given point, every gradient `f` defines or implies, up to `order`, and
compares each with central differences of the order below:

- order 1: grad(f, wrt=x) (the first grad block, or reverse mode) against
  differences of sum(f) along random directions (and per element for small
  inputs);
- order k >= 2: the directional derivative of order k (the k-th grad block
  when written, else reverse mode through the last block and its
  residuals) against differences of order k-1 along the same direction.

Directions along which the function is not smooth at the point (one-sided
differences disagree: a kink, a jump) are skipped.  It returns one
`GradCheck` per (order, argument): max absolute and relative error, whether
a NaN/Inf appeared where the differences are finite, which gradient was
tested (a block and its line, or "automatic"), how many directions were
compared, and the verdict.  `gradc check` and the tests use it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsl.function import Compiled, Directional, GradFunction


@dataclass(frozen=True)
class GradCheck:
    function: str
    order: int
    wrt: str
    source: str  # "grad block 1 (line 7)" or "automatic ..."
    max_abs: float
    max_rel: float
    nonfinite: bool
    compared: int
    ok: bool

    def __str__(self) -> str:
        verdict = "ok" if self.ok else "MISMATCH"
        nan = ", NaN/Inf in gradient" if self.nonfinite else ""
        return (f"{self.function}: order {self.order} w.r.t. {self.wrt} [{self.source}]: "
                f"max abs err {self.max_abs:.3g}, max rel err {self.max_rel:.3g}{nan}: "
                f"{verdict}")


def source_of(f: Compiled, order: int) -> str:
    fdef = getattr(f, "fdef", None)
    decorators = {d.name for d in fdef.decorators} if fdef is not None else set()
    if "pass_through" in decorators:
        return "pass-through (identity)"
    if fdef is None or not fdef.grads:
        return "automatic"
    if order <= len(fdef.grads):
        return f"grad block {order} (line {fdef.grads[order - 1].span.line})"
    last = len(fdef.grads)
    return f"automatic through grad block {last} (line {fdef.grads[last - 1].span.line})"


def _run(f: Compiled, bound: dict[str, np.ndarray]) -> list[np.ndarray]:
    with np.errstate(all="ignore"):
        return list(f.program(bound)(*bound.values()))


def _compare(pairs: list[tuple[np.ndarray, np.ndarray]], rtol: float, atol: float):
    max_abs = max_rel = 0.0
    nonfinite, ok = False, True
    for analytic, numeric in pairs:
        analytic, numeric = np.asarray(analytic, float), np.asarray(numeric, float)
        if np.any(~np.isfinite(analytic) & np.isfinite(numeric)):
            nonfinite, ok = True, False
        with np.errstate(all="ignore"):
            err = np.where(np.isfinite(numeric), np.abs(analytic - numeric), 0.0)
        max_abs = max(max_abs, float(np.max(err, initial=0.0)))
        max_rel = max(max_rel, float(np.max(err / np.maximum(np.abs(numeric), 1.0),
                                            initial=0.0)))
        ok = ok and bool(np.all(err <= atol + rtol * np.abs(np.nan_to_num(numeric))))
    return max_abs, max_rel, nonfinite, len(pairs), ok


def check_gradients(f: Compiled, *args, order: int = 2, eps: float = 1e-6,
                    rtol: float = 1e-4, atol: float = 1e-6, seed: int = 0,
                    **kwargs) -> list[GradCheck]:
    rng = np.random.default_rng(seed)
    bound = {n: a.astype(np.float64) if a.dtype.kind == "f" else a
             for n, a in f.bind(args, kwargs).items()}
    results: list[GradCheck] = []
    for name in f.differentiable_names(bound):
        x = bound[name]
        step = eps * max(1.0, float(np.max(np.abs(x), initial=0.0)))
        directions = [rng.normal(size=x.shape) for _ in range(3)]
        if x.size <= 16:
            directions += [np.eye(x.size)[i].reshape(x.shape) for i in range(x.size)]

        def total(point: np.ndarray) -> float:
            return float(sum(np.sum(o) for o in _run(f, {**bound, name: point})))

        gradient = GradFunction(f, name, with_value=False)
        g = _run(gradient, bound)[-1]
        pairs = []
        f0 = total(x)
        for v in directions:
            plus, minus = total(x + step * v), total(x - step * v)
            if _smooth((plus - f0) / step, (f0 - minus) / step, atol, rtol):
                pairs.append((np.sum(g * v), (plus - minus) / (2 * step)))
        results.append(GradCheck(f.name, 1, name, source_of(f, 1), *_compare(pairs, rtol, atol)))

        # order k: d/dx <D^{k-1}, v> along v, against differences of D^{k-1}
        previous = gradient
        for k in range(2, order + 1):
            h = step * 100 ** (1 / 2)  # differences of a derivative want a larger step
            current = Directional(previous, name, f"$v{k}")
            pairs = []
            for v in directions[:3]:
                extra = {f"$v{j}": v for j in range(2, k + 1)}
                analytic = _run(current, {**bound, **extra})[0]
                base = {**bound, **{f"$v{j}": v for j in range(2, k)}}
                p = _run(previous, {**base, name: x + h * v})[-1]
                m = _run(previous, {**base, name: x - h * v})[-1]
                c = _run(previous, base)[-1]
                if _smooth((p - c) / h, (c - m) / h, atol * 10, rtol * 10):
                    pairs.append((analytic, (p - m) / (2 * h)))
            results.append(GradCheck(f.name, k, name, source_of(f, k),
                                     *_compare(pairs, rtol * 10, atol * 10)))
            previous = current
    return results


def _smooth(forward, backward, atol: float, rtol: float) -> bool:
    """One-sided differences agree: no kink or jump along this direction."""
    forward, backward = np.asarray(forward, float), np.asarray(backward, float)
    with np.errstate(all="ignore"):
        gap = np.abs(forward - backward)
        scale = np.maximum(np.abs(forward), np.abs(backward))
    return bool(np.all(np.isfinite(gap)) and np.all(gap <= 1e-2 * (1 + scale)))
