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

from dsl.function import Compiled, Directional, GradFunction, Select, VjpFunction
from gradlang.compiler import ast
from gradlang.compiler.namespace import calls_in


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
                    upstream: bool = True, **kwargs) -> list[GradCheck]:
    rng = np.random.default_rng(seed)
    # Differences in f64, unless an annotation insists on f32: then in f32,
    # with a step and tolerances f32 can honour.
    fixed = {s.name: s.dtype for s in f.specs + f.param_specs}
    bound = {n: a.astype(np.float64) if a.dtype.kind == "f" and fixed.get(n) != "f32" else a
             for n, a in f.bind(args, kwargs).items()}
    if any(a.dtype == np.float32 for a in bound.values()):
        eps, rtol, atol = max(eps, 1e-3), max(rtol, 1e-2), max(atol, 1e-3)
    results: list[GradCheck] = []
    for name in f.differentiable_names(bound):
        x = bound[name]
        step = eps * max(1.0, float(np.max(np.abs(x), initial=0.0)))
        directions = [rng.normal(size=x.shape) for _ in range(3)]
        if x.size <= 4:
            directions += [np.eye(x.size)[i].reshape(x.shape) for i in range(x.size)]

        def total(point: np.ndarray) -> float:
            return float(sum(np.sum(o) for o in _run(f, {**bound, name: point})))

        gradient = GradFunction(f, name, with_value=False)
        g = _run(gradient, bound)[-1]
        pairs = []
        for v in directions:
            numeric = _central(lambda t: total((x + t * v).astype(x.dtype)), step, rtol, atol)
            if numeric is not None:
                pairs.append((np.sum(g * v), numeric))
        results.append(GradCheck(f.name, 1, name, source_of(f, 1), *_compare(pairs, rtol, atol)))

        # order k: d/dx <D^{k-1}, v> along v, against differences of D^{k-1}
        previous = gradient
        for k in range(2, order + 1):
            current = Directional(previous, name, f"$v{k}")
            pairs = []
            for v in directions[:3]:
                base = {**bound, **{f"$v{j}": v for j in range(2, k)}}
                analytic = _run(current, {**base, f"$v{k}": v})[0]
                numeric = _central(lambda t: _run(previous, {**base, name: (x + t * v).astype(x.dtype)})[-1],
                                   step * 10, rtol * 10, atol * 10)
                if numeric is not None:
                    pairs.append((analytic, numeric))
            results.append(GradCheck(f.name, k, name, source_of(f, k),
                                     *_compare(pairs, rtol * 10, atol * 10)))
            previous = current
        if order >= 2 and upstream:
            results.append(_check_upstream(f, bound, name, rng, step, rtol * 10, atol * 10))
    return results


def _check_upstream(f: Compiled, bound, name: str, rng, step: float, rtol: float,
                    atol: float) -> GradCheck:
    """Order 2 through the upstream cotangent: the VJP u -> J^T u of f at
    the point, differentiated w.r.t. u (which a second grad block answers
    with its cotangent for the first block's upstream), against finite
    differences in u, by the dot-product test <d/du <J^T u, v>, w> =
    <d/dt J^T (u + t w), v>."""
    outs = _run(f, bound)
    floats = f.differentiable_names(bound)
    vjp_x = Select(VjpFunction(f, len(outs)), floats.index(name))
    us = {f"$ct{i}": rng.normal(size=o.shape).astype(o.dtype) for i, o in enumerate(outs)}
    fdef = getattr(f, "fdef", None)
    upstream = fdef.grads[0].upstream[0] if fdef is not None and fdef.grads else "upstream"
    pairs = []
    for _ in range(3):
        v = rng.normal(size=bound[name].shape)
        w = {c: rng.normal(size=u.shape) for c, u in us.items()}
        analytic = 0.0
        for c in us:
            d = Directional(vjp_x, c, "$w")
            analytic += float(np.sum(_run(d, {**bound, **us, "$w": v})[0] * w[c]))
        numeric = _central(lambda t: float(np.sum(_run(vjp_x, {**bound, **{
            c: (u + t * w[c]).astype(u.dtype) for c, u in us.items()}})[0] * v)), step, rtol, atol)
        if numeric is not None:
            pairs.append((analytic, numeric))
    return GradCheck(f.name, 2, f"{upstream} (of d/d{name})", source_of(f, 2),
                     *_compare(pairs, rtol, atol))


def _central(along, step: float, rtol: float, atol: float):
    """The derivative of t -> along(t) at 0 by central differences, or None
    where the function is not smooth there.  Two tests: estimates at step
    and step/2 must agree (a kink inside the step moves them apart), and
    one-sided differences must agree up to O(step) curvature (a kink at 0
    itself makes them differ by the jump in slope, whatever the step)."""
    at = {t: np.asarray(along(t), float) for t in (-step, -step / 2, 0.0, step / 2, step)}
    coarse = (at[step] - at[-step]) / (2 * step)
    fine = (at[step / 2] - at[-step / 2]) / step
    ahead, behind = (at[step] - at[0.0]) / step, (at[0.0] - at[-step]) / step
    with np.errstate(all="ignore"):
        gap = np.abs(coarse - fine)
        one_sided = np.abs(ahead - behind)
        scale = np.maximum(np.abs(ahead), np.abs(behind))
        if not (np.all(np.isfinite(gap)) and np.all(np.isfinite(one_sided))):
            return None
        if np.any(gap > atol + rtol * np.abs(fine)):
            return None
        if np.any(one_sided > 1e-2 * scale + 10 * step * (1 + scale)):
            return None
    return fine


# ------------------------------------------------------------ whole functions

STRESS = (0.0, 1e-8, -1e-8, 10.0, -10.0, 100.0, -100.0, 1000.0, -1000.0)


@dataclass(frozen=True)
class Summary:
    """One row of `gradc check`: a (function, order, argument) over every
    point tried."""

    function: str
    order: int
    wrt: str
    source: str
    points: int
    max_abs: float
    max_rel: float
    nonfinite: bool
    ok: bool


def _sample_args(f: Compiled, rng, rank: int, fill) -> list:
    sizes: dict[str, int] = {}
    args = []
    for spec in f.specs:
        if spec.has_default:
            break
        if spec.dims is None:
            shape = (3,) * rank
        else:
            shape = tuple(d if isinstance(d, int) else sizes.setdefault(d, 3 + len(sizes))
                          for d in spec.dims)
        dtype = spec.dtype or "f64"
        if dtype in ("i32", "i64"):
            args.append(rng.integers(0, 4, size=shape).astype(np.int64 if dtype == "i64"
                                                              else np.int32))
        elif dtype == "bool":
            args.append(rng.random(shape) < 0.5)
        elif spec.differentiable:
            args.append(np.asarray(fill(shape), np.float64).astype(
                np.float32 if dtype == "f32" else np.float64))
        else:
            args.append(rng.normal(size=shape).astype(np.float32 if dtype == "f32"
                                                      else np.float64))
    return args


def check_function(f: Compiled, params=None, order: int = 2, seed: int = 0) -> list[Summary]:
    """Check `f` at random points (of a few domains: any sign, positive,
    inside (-1, 1)) and at stress points (every float argument set to 0,
    +-1e-8, +-10, +-100, +-1000), skipping points where f is not finite."""
    from gradlang.runtime.errors import GradError
    rng = np.random.default_rng(seed)
    if params is not None:
        for w, spec in zip(getattr(f, "reads", ()), f.param_specs):
            if w not in params:
                shape = [d if isinstance(d, int) else 3 for d in (spec.dims or ())]
                params[w] = rng.normal(size=shape)
    fills = [lambda s: rng.normal(size=s) * 2, lambda s: np.abs(rng.normal(size=s)) * 2 + 0.1,
             lambda s: rng.uniform(-0.9, 0.9, s)]
    fills += [lambda s, v=v: np.full(s, v) for v in STRESS]
    rank = None
    for candidate in (1, 2, 0):  # the first rank the unannotated arguments accept
        try:
            f(*_sample_args(f, rng, candidate, fills[0]))
            rank = candidate
            break
        except GradError:
            continue
    if rank is None:
        f(*_sample_args(f, rng, 1, fills[0]))  # raises the error for rank 1
    reason = intentional_mismatch(f)
    rows: dict[tuple, list[GradCheck]] = {}
    for index, fill in enumerate(fills):
        args = _sample_args(f, rng, rank, fill)
        with np.errstate(all="ignore"):
            outs = f(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if not all(np.all(np.isfinite(o)) for o in outs):
            continue  # outside the function's domain
        # the upstream-cotangent check at the random points only: it is linear
        # in the cotangent, so stress values add nothing but compile time
        for check in check_gradients(f, *args, order=order, seed=seed,
                                     upstream=index < 3):
            rows.setdefault((check.order, check.wrt), []).append(check)
    out = []
    for (k, wrt), checks in sorted(rows.items(), key=lambda item: (item[0][1], item[0][0])):
        compared = [c for c in checks if c.compared]
        if reason:
            out.append(Summary(f.name, k, wrt, f"not compared: {reason}", 0, 0.0, 0.0,
                               any(c.nonfinite for c in checks), True))
            continue
        out.append(Summary(f.name, k, wrt, checks[0].source, len(compared),
                           max((c.max_abs for c in compared), default=0.0),
                           max((c.max_rel for c in compared), default=0.0),
                           any(c.nonfinite for c in checks), all(c.ok for c in checks)))
    return out


def intentional_mismatch(f: Compiled) -> str:
    """Why f's gradient is by design not the derivative of its forward
    (a straight-through estimator or stop_gradient, here or in a callee),
    or "" when it should match."""
    fdef, namespace = getattr(f, "fdef", None), getattr(f, "_namespace", None)
    if fdef is None:
        return ""
    seen: set[int] = set()

    def visit(fd, ns) -> str:
        if id(fd) in seen:
            return ""
        seen.add(id(fd))
        if any(d.name == "pass_through" for d in fd.decorators):
            return f"{fd.name}() is @pass_through"
        for call in calls_in([fd.body] + [g.body for g in fd.grads]):
            if isinstance(call.func, ast.Name) and call.func.id == "stop_gradient":
                return f"{fd.name}() uses stop_gradient"
            target = ns.resolve(call.func)
            if target is not None and (why := visit(*target)):
                return why
        return ""

    return visit(fdef, namespace.functions[fdef.name][1])
