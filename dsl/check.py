"""Checking gradients against finite differences, and f32 against f64.

Contract: `check_gradients(f, *args, order=2)` evaluates, in f64 at the
given point, every gradient `f` defines or implies, up to `order`, and
compares each with central differences of the order below:

- order 1: the VJP J^T u (the first grad block, or reverse mode) at a
  random cotangent u, one per float output, against differences of
  sum(u * f) along random directions (and per element for small inputs);
  and grad(f, wrt=x), the gradient of sum(f), against J^T 1 (a block wrong
  only off the all-ones cotangent is caught: softmax's, whose sum is
  constant, or one with two outputs' cotangents swapped);
- order k >= 2: the directional derivative of order k of <J^T u, v> (the
  k-th grad block when written, seeing the upstream u, else reverse mode
  through the last block and its residuals) against differences of order
  k-1 along the same direction; for a function with a second grad block
  and several float arguments, order 2 also compares the derivative along
  x of every argument's cotangent, <d/dx <J^T u, w>, v> (the block's mixed
  partials), with differences of <J^T u, w>.

Directions along which the function is not smooth at the point (one-sided
differences disagree: a kink, a jump) are not compared.  Whatever the
differences say, a NaN in a gradient where the value of `f` is finite is a
failure (the automatic gradient of sqrt(x * x) at 0 is 0 * inf).

Forward mode, along each argument: the jvp (through grad blocks, their
transposition), weighted by u and summed over the outputs, against the
differences of sum(u * f) along the same random directions (rows `jvp:x`,
f64), and the
dot-product test <J t, u> = <t, J^T u> between forward and reverse mode,
in f64 and f32, and for a function with a second grad block the same one
order up in f64 (forward over reverse against reverse over reverse, both
through the second block) (rows `jvp/vjp:x`; `GradCheck.against` is
"reverse").  An argument an annotation fixes to f32 is checked so, in f32
(with a step and tolerances f32 can honour, and the differences' f32
rounding noise added to the tolerance: see `_central`), and its rows say
f32.

Then, unless `f32=False`, the same point in f32 (arguments an annotation
fixes keep their dtype; a float return annotation fixes the dtype of the
arguments no parameter annotation fixes, as the only one it can be made
from): the order-1 gradients, one program for all of them,
against the f64 gradients as the reference (`GradCheck.against` is
"f64").  A gradient that is NaN where
the f64 one is finite, or NaN where the f32 value is finite, fails (the
automatic gradient of log(1 + exp(x)) is inf / inf at x = 100 in f32), and
so does one infinite where the f64 one is finite, unless that is beyond
f32's range (the gradient of exp at 100, or of 1 / x^4 at 1e-8, is inf in
f32: right, rounded);
the difference from f64 is reported, not judged (f32 rounding is not a
bug).  A value that overflows in f32 where f64 is finite is a warning, not
a failure.

It returns a `CheckResult`: the list of `GradCheck` rows, one per (order,
argument, dtype), each with its errors, whether a NaN/Inf failed it, which
gradient was tested (a block and its line, or "automatic"), how many
directions were compared, and `ok`; plus `warnings`.  The result is truthy
when no row failed, so an empty result (nothing differentiable) is truthy;
`raise_on_failure=True` raises `GradientCheckError` naming the failing rows.

`order` is an integer from 1 to `MAX_ORDER`: each order's program is
reverse mode of the one below, about three times its size, so Numba's
compile time triples per order (order 8 of log1pexp takes about 35 s).

`check_function(f)` runs that at random and stress points and summarizes a
row per (order, argument, dtype) for `gradc check`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from dsl.function import (Compiled, Directional, Select, backward_function, derived,
                          flag_option, grad_function, jvp_function, require_function)
from gradlang.compiler import ast
from gradlang.compiler.namespace import call_targets, calls_in, nodes_in, param_reads
from gradlang.runtime.args import NUMPY, number_dtype
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError, GradError, called, shown

MAX_ORDER = 8


@dataclass(frozen=True)
class GradCheck:
    """One gradient at one point: `nonfinite` when a NaN/Inf failed it;
    `compared` counts the directions compared with differences (f64), or 1
    for an f32 gradient compared with its f64 reference."""

    function: str
    order: int
    wrt: str
    source: str  # "grad block 1 (line 7)" or "automatic ..."
    max_abs: float
    max_rel: float
    nonfinite: bool
    compared: int
    ok: bool
    dtype: str = "f64"
    # what it was compared with: "differences" (finite), "reverse" (forward
    # mode's dot-product test, in either dtype), or "f64" (the f64 gradient)
    against: str = "differences"

    def __str__(self) -> str:
        verdict = "ok" if self.ok and self.compared else "not compared" if self.ok else "FAIL"
        against = {"reverse": "reverse mode", "f64": "the f64 gradient"}.get(
            self.against, "finite differences")
        nan = ", NaN/Inf in gradient" if self.nonfinite else ""
        return (f"{self.function}: order {self.order} w.r.t. {self.wrt} [{self.source}] in "
                f"{self.dtype} vs {against}: max abs err {self.max_abs:.3g}, max rel err "
                f"{self.max_rel:.3g}{nan}: {verdict}")


class GradientCheckError(AssertionError):
    """A gradient check failed; the message names every failing row."""


class CheckResult(list):
    """The rows of a check (a list) and its `warnings`.  Truthy when no row
    failed: an empty result (nothing differentiable) is truthy, as nothing
    failed; `len()` tells whether anything was checked, and `unchecked` why
    not (no differentiable arguments, or no point where f is finite)."""

    def __init__(self, rows=(), warnings=()) -> None:
        super().__init__(rows)
        self.warnings: list[str] = list(warnings)
        self.unchecked = "no differentiable arguments"

    def __bool__(self) -> bool:
        return all(row.ok for row in self)

    def __str__(self) -> str:
        """A line per row, as `GradCheck` says it, then the warnings (a
        list's repr is every field of every row on one line)."""
        return "\n".join([*map(str, self), *(f"warning: {w}" for w in self.warnings)])

    def __repr__(self) -> str:
        if not len(self):  # (it said "0 checks, none failed", as if all passed)
            return f"<CheckResult: nothing checked: {self.unchecked}>\n{self}".rstrip()
        failed = len(self.failures)
        verdict = f"{failed} failed" if failed else "none failed"
        return f"<CheckResult: {len(self)} checks, {verdict}>\n{self}".rstrip()

    @property
    def failures(self) -> list:
        return [row for row in self if not row.ok]

    def raise_on_failure(self) -> "CheckResult":
        if self.failures:
            listed = "\n".join(f"  {row}" for row in self.failures)
            raise GradientCheckError(f"{len(self.failures)} of {len(self)} gradient checks "
                                     f"failed:\n{listed}")
        return self


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
    with np.errstate(all="ignore"):  # (compiled for the value of an integer used as a size)
        return list(f.retrying_by_value(bound, lambda: f.program(bound)(*bound.values())))


def _finite(arrays) -> bool:
    return all(bool(np.all(np.isfinite(a))) for a in arrays)


def _has_nan(arrays) -> bool:
    return any(bool(np.any(np.isnan(a))) for a in arrays)


def _compare(pairs: list[tuple], rtol: float, atol: float):
    """Whether each pair (analytic, numeric[, noise]) agrees within
    atol + rtol * |numeric|, plus the numeric side's rounding noise where
    given (a `Difference`'s, unpacked into the pair)."""
    max_abs = max_rel = 0.0
    nonfinite, ok = False, True
    for analytic, numeric, *noise in pairs:
        slack = noise[0] if noise else 0.0
        analytic, numeric = np.asarray(analytic, float), np.asarray(numeric, float)
        if np.any(~np.isfinite(analytic) & np.isfinite(numeric)):
            nonfinite, ok = True, False
        with np.errstate(all="ignore"):
            err = np.where(np.isfinite(numeric), np.abs(analytic - numeric), 0.0)
        max_abs = max(max_abs, float(np.max(err, initial=0.0)))
        max_rel = max(max_rel, float(np.max(err / np.maximum(np.abs(numeric), 1.0),
                                            initial=0.0)))
        ok = ok and bool(np.all(err <= atol + slack + rtol * np.abs(np.nan_to_num(numeric))))
    return max_abs, max_rel, nonfinite, len(pairs), ok


def _row(f: Compiled, order: int, wrt: str, compared: tuple, nan: bool,
         x: np.ndarray) -> GradCheck:
    """A row from `_compare`'s verdict on a gradient w.r.t. `x`, failed also
    by a NaN where the value is finite (`nan`), whether or not differences
    could be compared."""
    max_abs, max_rel, nonfinite, count, ok = compared
    return GradCheck(f.name, order, wrt, source_of(f, order), max_abs, max_rel,
                     nonfinite or nan, count, ok and not nan, _dtype_name(x))


def _in_f32(bound: dict[str, np.ndarray]) -> bool:
    """Whether a pass over these arguments rounds to f32 somewhere."""
    return any(a.dtype == np.float32 for a in bound.values())


def _dtype_name(x: np.ndarray) -> str:
    return "f32" if x.dtype == np.float32 else "f64"


def _check_options(eps: Any, rtol: Any, atol: Any, seed: Any,
                   flags: dict[str, Any]) -> tuple[float, float, float]:
    """eps, rtol and atol as floats; `ArgumentError` for a step or
    tolerance that is no real number, a step that is not finite and
    positive (0 or inf compared nothing, each row 'not compared', and the
    result passed; NaN raised a KeyError), a negative or NaN tolerance, a
    seed NumPy's generator refuses, or a flag other than True or False
    (raise_on_failure="no" raised)."""
    def real(value: Any) -> Optional[float]:
        if not isinstance(value, (int, float, np.integer, np.floating)) \
                or isinstance(value, (bool, np.bool_)):
            return None
        try:
            return float(value)
        except OverflowError:  # (an int beyond f64, 10**400, compared as a finite
            return np.inf if value > 0 else -np.inf  # eps, and then raised this here)
    step = real(eps)
    if step is None or not 0 < step < np.inf:
        raise ArgumentError(f"check_gradients() takes a finite positive eps, got {shown(eps)}")
    tolerances = []
    for name, value in (("rtol", rtol), ("atol", atol)):
        tolerance = real(value)
        if tolerance is None or not tolerance >= 0:
            raise ArgumentError(f"check_gradients() takes a non-negative {name}, got "
                                f"{shown(value)}")
        tolerances.append(tolerance)
    if seed is not None and (not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)
                             or seed < 0):
        raise ArgumentError(f"check_gradients() takes a seed that is a non-negative integer "
                            f"or None, got {shown(seed)}")
    for name, value in flags.items():
        flag_option(value, "check_gradients", name)
    return (step, *tolerances)


@user_facing
def check_gradients(f: Compiled, *args, order: int = 2, eps: float = 1e-6,
                    rtol: float = 1e-4, atol: float = 1e-6, seed: int = 0,
                    upstream: bool = True, f32: bool = True, raise_on_failure: bool = False,
                    **kwargs) -> CheckResult:
    f = require_function(f, "check_gradients", aot_ok=False)
    if type(order) is not int or not 1 <= order <= MAX_ORDER:
        raise ArgumentError(f"check_gradients() takes an order from 1 to {MAX_ORDER}, "
                            f"got {shown(order)}")
    eps, rtol, atol = _check_options(eps, rtol, atol, seed, {
        "upstream": upstream, "f32": f32, "raise_on_failure": raise_on_failure})
    rng = np.random.default_rng(seed)
    # Differences in f64, unless an annotation insists on f32: then in f32,
    # with a step and tolerances f32 can honour.
    fixed = _fixed_dtypes(f)
    bound = {n: a.astype(np.float64) if a.dtype.kind == "f" and fixed.get(n) != "f32" else a
             for n, a in f.bind(args, kwargs).items()}
    if _in_f32(bound):
        eps, rtol, atol = max(eps, 1e-3), max(rtol, 1e-2), max(atol, 1e-3)
    unit = _unit(bound)
    value = _run(f, bound)
    results = CheckResult()
    reference: dict[str, np.ndarray] = {}
    floats = f.differentiable_names(bound)
    vjp = backward_function(f, len(value))
    # A random cotangent per float output, not ones: with ones a block wrong
    # only off the all-ones cotangent passes (softmax's, whose sum is
    # constant; one output's cotangent taken for another's; a second block
    # dropping its dy); an integer or bool output has none (zero).
    us = dict(zip(vjp.ct_names, _cotangents(value, rng)))
    ones = dict(zip(vjp.ct_names, _cotangents(value, None)))
    # a second block's mixed partials, d/dy of the x cotangent, which the
    # order-2 rows' derivatives of J^T u along one argument never reach;
    # automatic ones are the derivative of a first block checked as a
    # function of every argument
    fdef = getattr(f, "fdef", None)
    crossed = fdef is not None and len(fdef.grads) >= 2 and len(floats) >= 2
    point = _Point(f, bound, value, vjp, us, ones, _run(vjp, {**bound, **us}),
                   _run(vjp, {**bound, **ones}), rtol, atol, unit)
    for name in floats:
        x = bound[name]
        step = _step(eps, x)
        directions = [_direction(rng, x.shape) for _ in range(3)]
        if x.size <= 4:
            directions += [np.eye(x.size)[i].reshape(x.shape) for i in range(x.size)]
        row, numerics = _first_order(point, name, directions, step, reference)
        results.append(row)
        results.extend(_higher_orders(point, name, directions[:3], numerics, step, order,
                                      crossed, rng))
        if order >= 2 and upstream and any(o.dtype.kind == "f" for o in value):
            results.append(_check_upstream(f, bound, value, name, rng, step, rtol * 10,
                                           atol * 10))
        results.extend(_check_forward(f, bound, value, name, directions[:3], numerics[:3],
                                      list(us.values()), rtol, atol, rng, dot=upstream,
                                      order=order))
    if f32 and reference:
        value32 = None
        try:
            narrowed, value32 = _check_f32(f, bound, fixed, value, reference)
        except GradError as err:
            if isinstance(err, ArgumentError):
                raise
            # a program that type-checks only in f64 (an f64 argument meeting
            # a loop's carried value, which then changes dtype in f32): f32
            # has nothing to compare, and f64 has checked what the user wrote
            narrowed = CheckResult(warnings=[
                f"not checked in f32: it does not compile there "
                f"(line {err.line}: {err.message})"])
        results.extend(narrowed)
        results.warnings.extend(narrowed.warnings)
        narrow = _narrow(bound, fixed)
        if upstream and value32 is not None:
            for name in reference:
                directions = [_direction(rng, narrow[name].shape) for _ in range(3)]
                results.extend(_check_forward(f, narrow, value32, name, directions, None, None,
                                              rtol, atol, rng, dot=True, order=order))
    if raise_on_failure:
        results.raise_on_failure()
    return results


def _step(eps: float, x: np.ndarray) -> float:
    """The differences' step along x: eps relative to x's largest element
    (absolute below 1), rounded to a power of two (see `_direction`)."""
    return float(2.0 ** np.round(np.log2(eps * max(1.0, float(np.max(np.abs(x), initial=0.0))))))


def _direction(rng, shape) -> np.ndarray:
    """A random direction to difference along: normal, rounded to
    multiples of 1/16.  A power-of-two step times it has five significant
    bits, so f adds it exactly to an intermediate of magnitude up to
    2**48 steps: a bias of -1000 added to logits of -1.2e10 (an MLP at
    the stress points), which rounded a step of 1e-3 to 524 units of
    2**-19, the differences 5e-4 off, failing a right gradient."""
    v = np.round(rng.normal(size=shape) * 16) / 16
    return np.where(v == 0, 1 / 16, v)


@dataclass(frozen=True)
class _Point:
    """What every row at one point of `check_gradients` reads: f, its
    arguments (`bound`) and value there, its backward pass, the random
    cotangents `us` and the all-ones ones (by the pass's cotangent names),
    the backward pass's results at each, the tolerances and the pass's
    machine epsilon (`unit`)."""

    f: Compiled
    bound: dict
    value: list
    vjp: Compiled
    us: dict
    ones: dict
    jtu: list  # the backward pass at us and at ones: a cotangent per float argument
    jt1: list
    rtol: float
    atol: float
    unit: float

    @property
    def value_finite(self) -> bool:
        return _finite(self.value)


def _first_order(point: _Point, name: str, directions: list, step: float,
                 reference: dict) -> tuple[GradCheck, list]:
    """The order-1 row along `name`: J^T u (the backward pass, the
    dot-product test's program) against differences of sum(u * f) along
    each direction, and grad(f, wrt=name), the program users call, against
    J^T 1; and the differences, per direction (None where not compared),
    which the forward-mode rows and f32's order-2 rule reuse.  Records
    grad(f)'s gradient in `reference` (the f32 rows' reference)."""
    f, bound, x = point.f, point.bound, point.bound[name]
    rtol, atol = point.rtol, point.atol

    def total(at: np.ndarray) -> float:
        outs = _run(f, {**bound, name: at})
        return float(sum(np.sum(o * u) for o, u in zip(outs, point.us.values())))

    index = f.differentiable_names(bound).index(name)
    g, g_ones = point.jtu[index], point.jt1[index]
    g_sum = reference[name] = _run(grad_function(f, name, with_value=False), bound)[-1]
    pairs, numerics = [], []
    for v in directions:
        numeric = _central(lambda t: total((x + t * v).astype(x.dtype)), step, rtol, atol,
                           point.unit)
        numerics.append(numeric)
        if numeric is not None:
            pairs.append((np.sum(g * v), *numeric))
    nan = point.value_finite and _has_nan([g, g_sum])
    compared = _agreeing(_compare(pairs, rtol, atol), g_sum, g_ones, rtol, atol)
    return _row(f, 1, name, compared, nan, x), numerics


def _higher_orders(point: _Point, name: str, directions: list, numerics: list, step: float,
                   order: int, crossed: bool, rng) -> list[GradCheck]:
    """The rows of orders 2 to `order` along `name`: d/dx <D^{k-1}, v>
    along v against differences of D^{k-1}, where D^1 is J^T u (name's
    place among the cotangents keys it, as in `_check_upstream`), so a
    later block sees an upstream other than 1; with `crossed`, order 2
    also compares the mixed partials (`_cross_pairs`)."""
    f, bound, x, value = point.f, point.bound, point.bound[name], point.value
    rtol, atol, vjp = point.rtol * 10, point.atol * 10, point.vjp
    index = f.differentiable_names(bound).index(name)
    previous = _vjp_along(f, len(value), index)
    rows = []
    for k in range(2, order + 1):
        current = derived(f, ("vjp directional", len(value), index, name, k),
                          lambda: Directional(previous, name, f"$v{k}"))
        pairs, nan = [], False
        for v, first in zip(directions, numerics):
            base = {**bound, **point.us, **{f"$v{j}": v for j in range(2, k)}}
            analytic = _run(current, {**base, f"$v{k}": v})[0]
            nan = nan or (point.value_finite and _has_nan([analytic]))
            if first is None and point.unit > EPS64:
                # An f32 gradient's rounding is not bounded by its own
                # size, as `_central` assumes (it cancels the value's
                # terms: attention's at q = k = 1000, whose f32 scores
                # round to a one-hot softmax): where the value's own
                # differences along v were swamped, so are its.
                continue
            numeric = _central(
                lambda t: _run(previous, {**base, name: (x + t * v).astype(x.dtype)})[-1],
                step * 8, rtol, atol, point.unit)
            if numeric is not None:
                pairs.append((analytic, *numeric))
        if k == 2 and crossed:
            cross, nan2 = _cross_pairs(f, bound, vjp, point.us, name, directions, rng,
                                       step * 8, rtol, atol, point.unit)
            pairs, nan = pairs + cross, nan or (point.value_finite and nan2)
        rows.append(_row(f, k, name, _compare(pairs, rtol, atol), nan, x))
        previous = current
    return rows


def _vjp_along(f: Compiled, outputs: int, index: int) -> Compiled:
    """The cotangent of f's float argument `index` (its place among them:
    it, not the name, keys the transform) from f's backward pass of
    `outputs` cotangents: J^T u along one argument, shared by the rows."""
    vjp = backward_function(f, outputs)
    return derived(f, ("vjp", outputs, index), lambda: Select(vjp, index))


def _cross_pairs(f: Compiled, bound, vjp, us: dict, name: str, directions: list, rng,
                 step: float, rtol: float, atol: float, unit: float) -> tuple[list, bool]:
    """The order-2 comparisons along `name` of every argument's cotangent:
    <d/dx_name <J^T u, w>, v> by reverse mode of the backward pass (the
    second block's), against differences of <J^T u, w> along v, at a
    random w per argument; and whether the analytic side had a NaN."""
    floats = f.differentiable_names(bound)
    at = {**bound, **us}
    second = backward_function(vjp, len(floats))
    index = vjp.differentiable_names(at).index(name)
    x = bound[name]
    pairs, nan = [], False
    for v in directions:
        ws = _cotangents([bound[n] for n in floats], rng)  # (of the size of 1, as u)
        d = _run(second, {**at, **dict(zip(second.ct_names, ws))})[index]
        nan = nan or _has_nan([d])

        def along(t: float, v=v, ws=ws) -> float:
            gs = _run(vjp, {**at, name: (x + t * v).astype(x.dtype)})
            return float(sum(np.sum(g * w) for g, w in zip(gs, ws)))

        numeric = _central(along, step, rtol, atol, unit)
        if numeric is not None:
            pairs.append((float(np.sum(d * v)), *numeric))
    return pairs, nan


def _agreeing(compared: tuple, analytic: np.ndarray, other: np.ndarray, rtol: float,
              atol: float) -> tuple:
    """`_compare`'s verdict, failed also where two programs for one
    gradient disagree (their error counted, not as a direction compared),
    beyond rounding at the scale of the whole gradient (an element that
    cancels to about 0 is summed in another order by each)."""
    max_abs, max_rel, nonfinite, count, ok = compared
    with np.errstate(all="ignore"):
        scale = float(np.max(np.abs(np.nan_to_num(np.asarray(other, float), posinf=0.0,
                                                  neginf=0.0)), initial=0.0))
    abs2, rel2, nonfinite2, _, ok2 = _compare([(analytic, other)], rtol, atol + rtol * scale)
    return (max(max_abs, abs2), max(max_rel, rel2), nonfinite or nonfinite2, count,
            ok and ok2)


def _cotangents(value: list[np.ndarray], rng) -> list[np.ndarray]:
    """A cotangent per output: random (ones without `rng`) for a float
    output, in its dtype; zeros for an integer or bool one, which has none
    to vary.  Random elements are +-[0.5, 1.5]: of the size of 1, as the
    differences' rounding test holds sum(u * f) to an absolute tolerance
    (a u of 0.1 scales f's rounding noise down below it, and lets it in)."""
    def random(shape) -> np.ndarray:
        return rng.choice([-1.0, 1.0], size=shape) * rng.uniform(0.5, 1.5, size=shape)
    return [np.asarray(random(o.shape) if rng is not None else np.ones(o.shape)
                       ).astype(o.dtype) if o.dtype.kind == "f" else np.zeros(o.shape, o.dtype)
            for o in value]


def _check_upstream(f: Compiled, bound, value: list[np.ndarray], name: str, rng, step: float,
                    rtol: float, atol: float) -> GradCheck:
    """Order 2 through the upstream cotangent: the VJP u -> J^T u of f at
    the point, differentiated w.r.t. u (which a second grad block answers
    with its cotangent for the first block's upstream), against finite
    differences in u, by the dot-product test <d/du <J^T u, v>, w> =
    <d/dt J^T (u + t w), v>."""
    # name's place among the cotangents depends on which arguments are floats
    # in this call: it, not the name, keys the transforms made from it
    index = f.differentiable_names(bound).index(name)
    vjp = backward_function(f, len(value))
    vjp_x = _vjp_along(f, len(value), index)
    # an integer or bool output has no cotangent to vary: it is held at zero
    us = dict(zip(vjp.ct_names, _cotangents(value, rng)))
    floats = [c for c, u in us.items() if u.dtype.kind == "f"]
    fdef = getattr(f, "fdef", None)
    upstream = fdef.grads[0].upstream[0] if fdef is not None and fdef.grads else "upstream"
    pairs, nan = [], False
    for _ in range(3):
        v = rng.normal(size=bound[name].shape)
        w = {c: _direction(rng, us[c].shape) for c in floats}
        analytic = 0.0
        for c in floats:
            d = derived(f, ("vjp", len(value), index, c), lambda: Directional(vjp_x, c, "$w"))
            analytic += float(np.sum(_run(d, {**bound, **us, "$w": v})[0] * w[c]))
        nan = nan or (_finite(value) and bool(np.isnan(analytic)))
        numeric = _central(lambda t: float(np.sum(_run(vjp_x, {**bound, **us, **{
            c: (us[c] + t * w[c]).astype(us[c].dtype) for c in floats}})[0] * v)),
            step, rtol, atol, _unit(bound))
        if numeric is not None:
            pairs.append((analytic, *numeric))
    return _row(f, 2, f"{upstream} (of d/d{name})", _compare(pairs, rtol, atol), nan,
                bound[name])


def _check_forward(f: Compiled, bound: dict[str, np.ndarray], value: list[np.ndarray],
                   name: str, directions: list[np.ndarray], numerics: Optional[list],
                   weights: Optional[list], rtol: float, atol: float, rng, dot: bool,
                   order: int) -> list[GradCheck]:
    """Forward mode along `name`: the jvp (through grad blocks, their
    transposition) along each direction t, weighted by `weights` (a
    cotangent per output) and summed, against `numerics`, the central
    differences of that weighted sum of f along t that the reverse rows
    took (None where f is not smooth; no row when `numerics` is None, in
    f32), and, with `dot`, the dot-product test
    <J t, u> = <t, J^T u> against reverse mode at a random cotangent u;
    from order 2 in f64, for a function with a second grad block, the same
    test one order up: <d/dx (grad f) t, u> from forward over reverse,
    <t, d/dx <grad f, u>> from reverse over reverse (both through the
    second block).  A NaN or Inf
    tangent where the value is finite fails a row."""
    x = bound[name]
    # the pass's precision, not x's: an f64 param beside f32 arguments
    # meets f32 rounding all the same
    dtype = "f32" if _in_f32(bound) else "f64"
    floats = f.differentiable_names(bound)
    tangents = [_jvp(f, bound, floats, name, v.astype(x.dtype))[len(value):]
                for v in directions]
    nan = _finite(value) and _has_nan([t for ts in tangents for t in ts])
    if nan and len(floats) > 1:
        # the shared program's zero tangents of the other arguments meet
        # their own partials, 0 * inf = NaN where one is infinite (sqrt(w)'s
        # slope at w = 0) though the jvp along `name` is finite: the jvp
        # along `name` alone, as dsl.jvp of that tangent computes it
        tangents = [_jvp(f, bound, [name], name, v.astype(x.dtype))[len(value):]
                    for v in directions]
        nan = _has_nan([t for ts in tangents for t in ts])
    rows = []
    if numerics is not None:
        pairs = [(sum(float(np.sum(t * w)) for t, w in zip(tangent, weights)), *numeric)
                 for tangent, numeric in zip(tangents, numerics) if numeric is not None]
        rows.append(_forward_row(f, 1, f"jvp:{name}", "forward", _compare(pairs, rtol, atol),
                                 nan, dtype, "differences"))
    if not dot:
        return rows
    # rounding only: both sides are exact algebra
    tol = 1e-4 if dtype == "f32" else 1e-9
    if dtype == "f64":
        vjp = backward_function(f, len(value))
        us = [rng.normal(size=o.shape).astype(o.dtype) for o in value]
        jtu = _run(vjp, {**bound, **dict(zip(vjp.ct_names, us))})[floats.index(name)]
    else:  # u = 1: J^T u from the program the f32 gradients ran, no compile of its own
        us = [np.ones_like(o) for o in value]
        both = grad_function(f, tuple(floats), with_value=True)
        jtu = _run(both, bound)[len(value) + floats.index(name)]
    pairs = [_dot_pair(tangent, us, v, jtu) for v, tangent in zip(directions, tangents)]
    rows.append(_forward_row(f, 1, f"jvp/vjp:{name}", "forward vs reverse",
                             _compare(pairs, tol, tol), nan, dtype, "reverse"))
    fdef = getattr(f, "fdef", None)
    if order >= 2 and dtype == "f64" and fdef is not None and len(fdef.grads) >= 2:
        # A second block is transposed only here; elsewhere this compares
        # compiler-derived programs only, worth less than their compile time.
        # One forward-over-reverse program serves every argument.
        # the Hessian of sum(f) from the order-2 row's program, at cotangent 1
        gradients = grad_function(f, tuple(floats), with_value=False)
        index = floats.index(name)
        vjp = backward_function(f, len(value))
        gradient = _vjp_along(f, len(value), index)
        hessian = derived(f, ("vjp directional", len(value), index, name, 2),
                          lambda: Directional(gradient, name, "$v2"))
        ones = dict(zip(vjp.ct_names, _cotangents(value, None)))
        u = rng.normal(size=x.shape).astype(x.dtype)
        hu = _run(hessian, {**bound, **ones, "$v2": u})[0]
        pairs, nan2 = [], False
        for v in directions:
            hv = _jvp(gradients, bound, floats, name, v.astype(x.dtype))[
                len(floats) + floats.index(name)]
            nan2 = nan2 or (_finite(value) and _has_nan([hv]))
            pairs.append(_dot_pair([hv], [u], v, hu))
        rows.append(_forward_row(f, 2, f"jvp/vjp:{name}", "forward over reverse vs reverse",
                                 _compare(pairs, tol * 10, tol * 10), nan2, dtype, "reverse"))
    return rows


def _jvp(f: Compiled, bound: dict[str, np.ndarray], active: list[str], name: str,
         v: np.ndarray) -> list:
    """f's outputs, then their tangents along `v` for argument `name`: one
    program, with tangents for every argument in `active` (zero but for
    `name`'s), serves every argument."""
    jf = jvp_function(f, active)
    tangents = {t: v if n == name else np.zeros_like(bound[n])
                for n, t in zip(active, jf.tangent_names)}
    return _run(jf, {**bound, **tangents})


def _dot_pair(tangents, us, v, jtu) -> tuple[float, float]:
    """(<J v, u>, <v, J^T u>), scaled by the size of their terms."""
    left = [np.asarray(t, np.float64) * np.asarray(u, np.float64) for t, u in zip(tangents, us)]
    right = np.asarray(v, np.float64) * np.asarray(jtu, np.float64)
    scale = max(1.0, sum(float(np.sum(np.abs(a))) for a in left),
                float(np.sum(np.abs(right))))
    return sum(float(np.sum(a)) for a in left) / scale, float(np.sum(right)) / scale


def _forward_row(f: Compiled, order: int, wrt: str, what: str, compared: tuple, nan: bool,
                 dtype: str, against: str) -> GradCheck:
    max_abs, max_rel, nonfinite, count, ok = compared
    return GradCheck(f.name, order, wrt, f"{what} ({source_of(f, order)})", max_abs, max_rel,
                     nonfinite or nan, count, ok and not nan, dtype, against)


def _fixed_dtypes(f: Compiled) -> dict[str, Optional[str]]:
    """The dtype each argument must have (None: any float): its annotation's
    (an `int` kind's i64; a `float` one fixes none, and is run in f64 and
    f32 as an unannotated argument is), or, for a function whose return
    annotation names a float dtype, that one (`def f(x) -> f32:` is checked
    at f32 arguments; `-> f64` has no f32 run, which its annotation would
    refuse)."""
    fdef = getattr(f, "fdef", None)
    result = fdef.ret.dtype if fdef is not None and fdef.ret is not None else None
    declared = result if result in ("f32", "f64") else None
    return {s.name: (None if s.dtype == "float" else s.dtype and number_dtype(s.dtype))
            or declared for s in f.specs + f.param_specs}


def _narrow(bound: dict[str, np.ndarray], fixed: dict) -> dict[str, np.ndarray]:
    """The arguments in f32, but for those an annotation fixes as f64."""
    return {n: a.astype(np.float32) if a.dtype == np.float64 and fixed.get(n) != "f64" else a
            for n, a in bound.items()}


def _check_f32(f: Compiled, bound: dict[str, np.ndarray], fixed: dict, value: list[np.ndarray],
               reference: dict[str, np.ndarray]) -> tuple[CheckResult, Optional[list]]:
    """The order-1 gradients in f32 (arguments an annotation fixes keep
    their dtype) against the f64 ones, `reference`: one program for the
    value and every gradient, so f32 adds one compile per function and rank.
    Failed by a gradient that is not finite where the reference is, or NaN
    where the f32 value is finite; f32 rounding errors are reported only.
    Also the f32 value, from that program (the forward-mode rows in f32
    take it rather than compile f for it), or None where every argument
    is fixed (there is no f32 run)."""
    narrow = _narrow(bound, fixed)
    if all(narrow[n] is bound[n] for n in bound):
        return CheckResult(), None  # every argument is fixed: f32 is the check already done
    names = tuple(reference)
    both = grad_function(f, names, with_value=True)
    outs = _run(both, narrow)
    value32, grads = outs[:-len(names)], outs[-len(names):]
    value_finite = _finite(value32)
    result = CheckResult()
    if _finite(value) and not value_finite:
        what = "overflows" if not _has_nan(value32) else "is NaN"
        result.warnings.append(f"the value {what} in f32 where it is finite in f64")
    for name, g in zip(names, grads):
        g, g64 = np.asarray(g, np.float64), reference[name]
        # an infinite gradient where f64's is beyond f32's range is rounded
        # right (exp(100) in f32); a NaN one is a bug wherever f64's is finite
        lost = np.isnan(g) | (np.isinf(g) & ~(np.abs(g64) > np.finfo(np.float32).max))
        failed = bool(np.any(lost & np.isfinite(g64))) or (value_finite and _has_nan([g]))
        with np.errstate(all="ignore"):
            err = np.where(np.isfinite(g) & np.isfinite(g64), np.abs(g - g64), 0.0)
        max_rel = float(np.max(err / np.maximum(np.abs(g64), 1.0), initial=0.0))
        result.append(GradCheck(f.name, 1, name, source_of(f, 1), float(np.max(err, initial=0.0)),
                                max_rel, failed, 1, not failed, "f32", "f64"))
    return result, value32


class Difference(NamedTuple):
    """A central-difference estimate and the bound on its rounding noise
    (0 in f64, whose rounding `_central` rejects rather than tolerates)."""

    value: np.ndarray
    noise: float


EPS64 = float(np.finfo(np.float64).eps)


def _unit(bound: dict[str, np.ndarray]) -> float:
    """The machine epsilon of a pass over these arguments: f32's where it
    rounds to f32 somewhere."""
    return float(np.finfo(np.float32).eps) if _in_f32(bound) else EPS64


def _central(along, step: float, rtol: float, atol: float,
             unit: float = EPS64) -> Optional[Difference]:
    """The derivative of t -> along(t) at 0 by central differences, or None
    where the function is not smooth there, or where rounding swamps the
    differences.  Three tests: estimates at step and step/2 must agree (a
    kink inside the step moves them apart); one-sided differences must
    agree up to O(step) curvature (a kink at 0 itself makes them differ by
    the jump in slope, whatever the step); and the rounding of the values
    must not swamp the estimate.

    `unit` is the pass's machine epsilon.  Each value may be off by about
    2 * unit * |value| (its rounding, and some of a sum's), so the estimate
    by up to noise = 4 * unit * max|value| / step.  In f64 that noise must
    be within the tolerance of the estimate, or the direction is not
    compared (a value of 1e8 with a slope of 0.01 along this direction
    cannot be differenced: an iterated map far from its fixed points).  In
    f32 (an argument an annotation fixes to f32) it rarely is: a loss
    summed to 1e3 over a step of 1e-3 has noise 0.5, beyond any tolerance
    f32's gradients need, and holding it to the tolerance rejected every
    direction.  There the noise is tolerated instead: the smoothness tests
    allow it, `_compare` adds it to the tolerance (`Difference.noise`), and
    a direction is rejected only where it exceeds half the estimate, so the
    tolerance stays below the estimate: a gradient of 0 or of the wrong
    sign fails wherever compared, one 10% off where the noise is small (at
    moderate values: `gradc check`'s random points).  f32's larger step
    also widens the one-sided test's curvature allowance past a kink at 0,
    so f32 adds a fourth test: the one-sided gap at step/2 must be about
    half that at step (a smooth function's), not the same (a kink's)."""
    at = {t: np.asarray(along(t), float) for t in (-step, -step / 2, 0.0, step / 2, step)}
    with np.errstate(all="ignore"):  # inf - inf where f overflows: rejected below
        coarse = (at[step] - at[-step]) / (2 * step)
        fine = (at[step / 2] - at[-step / 2]) / step
        ahead, behind = (at[step] - at[0.0]) / step, (at[0.0] - at[-step]) / step
        gap = np.abs(coarse - fine)
        one_sided = np.abs(ahead - behind)
        scale = np.maximum(np.abs(ahead), np.abs(behind))
        if not (np.all(np.isfinite(gap)) and np.all(np.isfinite(one_sided))):
            return None
        rounding = 4 * unit * max(np.max(np.abs(a), initial=0.0) for a in at.values())
        tolerated = unit > EPS64
        # fine's noise; coarse's is half of it, a second difference's double
        noise = rounding / step if tolerated else 0.0
        if np.any(gap > atol + rtol * np.abs(fine) + 1.5 * noise):
            return None
        if np.any(one_sided > 1e-2 * scale + 10 * step * (1 + scale) + 2 * noise):
            return None
        if tolerated:
            # f32's step (1 at |x| = 1000) makes the curvature allowance above
            # too wide to see a kink at 0 (a max pool's tied window at its
            # stress points): a smooth function's one-sided gap halves with
            # the step, a kink's (the jump in slope) stays; half's noise is 4x
            half = np.abs(at[step / 2] - 2 * at[0.0] + at[-step / 2]) / (step / 2)
            if np.any(half > 0.75 * one_sided + 1e-2 * scale + 4 * noise):
                return None
        largest = np.max(np.abs(fine), initial=0.0)
        if tolerated and noise > atol + largest / 2:
            return None
        if not tolerated and rounding / step > atol + rtol * largest:
            return None
    return Difference(fine, noise)


# ------------------------------------------------------------ whole functions

STRESS = (0.0, 1e-8, -1e-8, 10.0, -10.0, 100.0, -100.0, 1000.0, -1000.0)


@dataclass(frozen=True)
class Summary:
    """One row of `gradc check`: a (function, order, argument, dtype) over
    every point tried.  `skipped` says why nothing was compared (then the
    row passes unless a NaN/Inf failed it)."""

    function: str
    order: int
    wrt: str
    source: str
    points: int
    max_abs: float
    max_rel: float
    nonfinite: bool
    ok: bool
    dtype: str = "f64"
    skipped: str = ""
    against: str = "differences"  # as `GradCheck.against`
    # where it failed ("at every point tried", "at x = w = -1000"): a failure
    # at one stress point alone reads otherwise than one everywhere
    failed_at: str = ""

    @property
    def verdict(self) -> str:
        if not self.ok:
            return "FAIL"
        return f"skipped: {self.skipped}" if self.skipped else "ok"


# The least size of a sampled axis (an axis of unknown size has it).
MIN_SIZE = 3


def _sample_args(f: Compiled, rng, rank: int, fill, const: int = MIN_SIZE,
                 indices: bool = False, distinct: bool = True) -> list:
    """Arguments for f: unannotated ones of rank `rank`, differentiable
    floats from `fill`, a const integer scalar `const`; with `indices`,
    unannotated const ones are i64 indices (`labels: const`); each size
    an annotation names of its own (from MIN_SIZE up) if `distinct`, else
    all MIN_SIZE."""
    sizes: dict[str, int] = {}
    args = []
    fixed = _fixed_dtypes(f)
    for spec in f.specs:
        if spec.has_default:
            break
        dtype = fixed[spec.name] or ("i64" if indices and spec.const else "f64")
        # (one compiled by value, an axis or a count, is held as a const one:
        # a random index for it was out of range as an axis)
        held = spec.const or spec.name in getattr(f, "_by_value", ())
        if held and fixed[spec.name] in ("i32", "i64") and not spec.dims:
            args.append(np.asarray(const, dtype=NUMPY[dtype]))
            continue  # a size or a count (every sampled size is at least 3), or an axis
        if spec.dims is None:
            shape = (MIN_SIZE,) * rank
        else:
            shape = tuple(d if isinstance(d, int) else
                          sizes.setdefault(d, MIN_SIZE + len(sizes) * distinct)
                          for d in spec.dims)
        args.append(_sample(dtype, shape, rng, fill if spec.differentiable else None))
    return args


def _sample(dtype: str, shape, rng, fill=None) -> np.ndarray:
    """Values of `dtype` (a .grad dtype name) and `shape`: integers that are
    valid indices into any sampled axis (negatives, both ends and repeats
    included), random bools, floats from `fill(shape)` or else normal."""
    if dtype in ("i32", "i64"):
        return rng.integers(-MIN_SIZE, MIN_SIZE, size=shape).astype(NUMPY[dtype])
    if dtype == "bool":
        return rng.random(shape) < 0.5
    return np.asarray(fill(shape) if fill else rng.normal(size=shape)).astype(NUMPY[dtype])


def _probe(f: Compiled, sample: Callable[[], list]) -> None:
    """f called on `sample()`, and again on a fresh sample where the call
    found an integer argument f compiles by value (an axis, a count):
    `_sample_args` holds it at the layout's const value from then on, so
    the first call's random index proved nothing about the points checked."""
    known = set(getattr(f, "_by_value", ()))
    f(*sample())
    if set(getattr(f, "_by_value", ())) != known:
        f(*sample())


def _with_sampling_note(err, f: Compiled):
    """err, from f compiled for the sampled arguments at no rank, noting
    what the checker made up: the error is at f's code, but its cause may
    be the sampling (a scalar parameter sampled as a vector)."""
    guessed = [s.name for s in f.specs if s.dims is None and not s.has_default]
    if guessed:
        note = (f"gradc check sampled the unannotated parameters of {f.name}() "
                f"({', '.join(guessed)}) as f64 arrays of size {MIN_SIZE}, all of rank 1, "
                f"2 or 0, and none compiled: annotate them (`k: f64` for a scalar, "
                f"`y: f64[2]`) to check it at the shapes it takes")
        err.add_note(note)
    return err


def check_function(f: Compiled, params=None, order: int = 2, seed: int = 0) -> CheckResult:
    """Check `f` at random points (of a few domains: any sign, positive,
    inside (-1, 1)) and at stress points (every differentiable float argument
    set to 0, +-1e-8, +-10, +-100, +-1000: where exp overflows, in f32 from
    89 and in f64 from 710), skipping points where f64 f is not finite.
    Returns a `Summary` per (order, argument, dtype), and one warning per
    kind of f32 trouble naming the points."""
    from gradlang.compiler.values import ReturnsSequence
    from gradlang.runtime.errors import GradError
    rng = np.random.default_rng(seed)
    if params is not None:
        for w, spec in zip(getattr(f, "reads", ()), f.param_specs):
            if w not in params:
                shape = [d if isinstance(d, int) else 3 for d in (spec.dims or ())]
                params[w] = _sample(spec.dtype or "f64", shape, rng)
    varied = " = ".join(s.name for s in f.specs if s.differentiable and not s.has_default
                        and s.dtype not in ("i32", "i64", "bool")) or "the float arguments"
    fills = [("a random point", lambda s: rng.normal(size=s) * 2),
             ("a random positive point", lambda s: np.abs(rng.normal(size=s)) * 2 + 0.1),
             ("a random point in (-1, 1)", lambda s: rng.uniform(-0.9, 0.9, s))]
    fills += [(f"{varied} = {v:g}", lambda s, v=v: np.full(s, v)) for v in STRESS]
    # the first rank the unannotated arguments accept, and const integer a
    # function accepts: a size or count (MIN_SIZE), else an axis or index;
    # unannotated const arguments as floats, else as indices; named sizes
    # distinct (an axis mixed up shows), else all MIN_SIZE (a conv2d's
    # kernel sized 8 x 9 was larger than its padded 5 x 6 image)
    layouts = [(rank, const, indices, distinct) for distinct in (True, False)
               for indices in (False, True) for rank in (1, 2, 0) for const in (MIN_SIZE, 1, 0)]
    for rank, const, indices, distinct in layouts:
        try:
            _probe(f, lambda: _sample_args(f, rng, rank, fills[0][1], const, indices, distinct))
            break
        except ReturnsSequence:
            raise  # (at every rank: a shape helper, not a sampling's fault)
        except GradError:
            continue
    else:
        try:
            f(*_sample_args(f, rng, 1, fills[0][1]))  # raises the error for rank 1
        except GradError as err:
            raise _with_sampling_note(err, f) from None
    reasons = {k: intentional_mismatch(f, k) for k in range(1, order + 1)}
    reasons = {k: (why, reaching_mismatch(f, k) if why else set()) for k, why in reasons.items()}
    rows: dict[tuple, list[GradCheck]] = {}
    failed_at: dict[tuple, list[str]] = {}
    warned: dict[str, list[str]] = {}
    finite = False
    for index, (label, fill) in enumerate(fills):
        args = _sample_args(f, rng, rank, fill, const, indices, distinct)
        with np.errstate(all="ignore"):
            outs = f(*args)
        outs = outs if isinstance(outs, tuple) else (outs,)
        if not _finite(outs):
            continue  # outside the function's domain
        finite = True
        # the upstream-cotangent check at the random points only: it is linear
        # in the cotangent, so stress values add nothing but compile time
        checks = check_gradients(f, *args, order=order, seed=seed, upstream=index < 3)
        for check in checks:
            rows.setdefault((check.order, check.wrt, check.dtype), []).append(check)
            if not check.ok:
                failed_at.setdefault((check.order, check.wrt, check.dtype), []).append(label)
        for warning in checks.warnings:
            warned.setdefault(warning, []).append(label)
    out = CheckResult(warnings=[f"{called(f.name)}: {w}, at {', '.join(labels)}"
                                for w, labels in warned.items()])
    if not finite:  # (an integer held at 0 by value, which it divides by: not "no arguments")
        out.unchecked = "not finite at any point tried"
    order_of = _row_order(f)
    for (k, wrt, dtype), checks in sorted(rows.items(), key=lambda item: order_of(*item[0])):
        compared = [c for c in checks if c.compared]
        nonfinite = any(c.nonfinite for c in checks)
        # differences along an argument whose value reaches no mismatch can
        # judge it (not through the upstream cotangent: a block's
        # stop_gradient(dy) makes its derivative in dy 0 by design)
        why, reaching = reasons[k]
        kind, along = _row_kind(wrt)
        reason = why if kind == 1 or along in reaching else ""
        if reason and checks[0].against == "differences":
            # differences cannot judge it, but a NaN/Inf is wrong by any design
            out.append(Summary(f.name, k, wrt, checks[0].source, 0, 0.0, 0.0, nonfinite,
                               not nonfinite, dtype, reason))
            continue
        out.append(Summary(f.name, k, wrt, checks[0].source, len(compared),
                           max((c.max_abs for c in compared), default=0.0),
                           max((c.max_rel for c in compared), default=0.0),
                           nonfinite, all(c.ok for c in checks), dtype,
                           "" if compared else "not smooth at any point tried",
                           checks[0].against, _where_failed(failed_at.get((k, wrt, dtype), []),
                                                            len(checks))))
    return out


def _where_failed(labels: list[str], tried: int) -> str:
    """Where a row's checks failed, of the `tried` points: every one, or
    the points' labels (the first three, and how many more)."""
    if not labels:
        return ""
    if len(labels) == tried > 1:
        return f"at every point tried ({tried})"
    more = f" and {len(labels) - 3} more" if len(labels) > 3 else ""
    return f"at {', '.join(labels[:3])}{more}"


def _row_order(f: Compiled) -> Callable[[int, str, str], tuple]:
    """A sort key of a summary's (order, wrt, dtype): by argument in f's
    order (then its params'), then reverse mode, through the upstream
    cotangent, forward mode, forward against reverse; then by order, f64
    first."""
    names = [s.name for s in (*f.specs, *f.param_specs)]

    def key(order: int, wrt: str, dtype: str) -> tuple:
        kind, name = _row_kind(wrt)
        position = names.index(name) if name in names else len(names)
        return position, name, kind, order, dtype != "f64"
    return key


def _row_kind(wrt: str) -> tuple[int, str]:
    """A row's kind (0 reverse mode, 1 through the upstream cotangent, 2
    forward mode, 3 forward against reverse) and the argument it is along."""
    upstream = re.fullmatch(r".* \(of d/d(.*)\)", wrt)
    return ((1, upstream.group(1)) if upstream else
            (3, wrt[len("jvp/vjp:"):]) if wrt.startswith("jvp/vjp:") else
            (2, wrt[len("jvp:"):]) if wrt.startswith("jvp:") else (0, wrt))


def intentional_mismatch(f: Compiled, order: Optional[int] = None) -> str:
    """Why f's gradient of `order` (None: any) is by design not the
    derivative of its forward (a straight-through estimator or
    stop_gradient, here or in a callee, `grad(g)`'s g included), or ""
    when it should match.  An order f's grad blocks write (`order` <=
    their count) is the value of block `order`, compared with differences
    of the value of the block (or body) before: stop_gradient changes no
    value, so only the blocks up to it are looked in (the max shift of a
    logsumexp, stop_gradient(max(x)), in the body excused a wrong first
    block)."""
    fdef, namespace = getattr(f, "fdef", None), getattr(f, "_namespace", None)
    if fdef is None:
        return ""
    return _function_mismatch(fdef, namespace.functions[fdef.name][1],
                              _searched(fdef, order))


def _searched(fdef, order: Optional[int]) -> list:
    """Where a mismatch of f's gradient of `order` is looked for: an order
    the blocks write, in the blocks up to it; any other, everywhere."""
    written = order is not None and order <= len(fdef.grads)
    return [g.body for g in fdef.grads[:order]] if written else _bodies(fdef)


def _function_mismatch(fdef, ns, bodies: Optional[list] = None,
                       seen: Optional[set[int]] = None) -> str:
    """`intentional_mismatch`'s reason for a definition, looked for in
    `bodies` (default: all of its own) and the functions they call."""
    seen = set() if seen is None else seen
    if id(fdef) in seen:
        return ""
    seen.add(id(fdef))
    if any(d.name == "pass_through" for d in fdef.decorators):
        return f"{fdef.name}() is @pass_through"
    for call in calls_in(_bodies(fdef) if bodies is None else bodies):
        if isinstance(call.func, ast.Name) and call.func.id == "stop_gradient":
            return f"{fdef.name}() uses stop_gradient"
        for target in _callees(call, ns):
            if why := _function_mismatch(*target, seen=seen):
                return why
    return ""


def _callees(call: ast.Call, ns) -> list:
    """The definitions a call runs: the function it names, and an
    in-language transform's function (`grad(g)`, and so `grad(g)(x)`, runs
    g's body and blocks: a stop_gradient in g is in its values)."""
    return _callees(call.func, ns) if isinstance(call.func, ast.Call) else call_targets(call, ns)


def reaching_mismatch(f: Compiled, order: Optional[int] = None) -> set[str]:
    """The arguments and module params of f whose values reach what makes
    its gradient of `order` not the derivative (`intentional_mismatch`'s
    stop_gradient, or a call of a function that is @pass_through or uses
    either): only differences along those cannot judge it (qloss(x,
    target)'s d/dtarget, where only x goes through the rounding, can).
    Over-approximated, never under: a name's sources are those of every
    assignment to it anywhere (loops and branches without order), a call's
    result depends on all its arguments, and a call that reaches a
    mismatch (`grad(g)(x)` one of g's), through all of them; a call's
    value depends on every param its function reads, too."""
    fdef, namespace = f.fdef, f._namespace
    if any(d.name == "pass_through" for d in fdef.decorators):
        return {s.name for s in (*f.specs, *f.param_specs)}
    lists, searched = _bodies(fdef), _searched(fdef, order)
    ns = namespace.functions[fdef.name][1]
    sources: dict[str, set[str]] = {p.name: {p.name} for p in fdef.params}
    reaching: set[str] = set()

    def of(node, record: bool) -> set[str]:
        """The names node's value depends on (recording those reaching a
        mismatch through a call in it, where `record`)."""
        found: set[str] = set()
        for sub in nodes_in(node):
            if isinstance(sub, ast.Name):
                found |= sources.get(sub.id, {sub.id})  # a module param: itself
            elif isinstance(sub, ast.Call):
                # a call's value depends on the params its function reads
                # too, which this text does not name (g(x) with g = a * w)
                found.update(*(param_reads(*t) for t in _callees(sub, ns)))
                if record and _mismatched_call(sub, ns):
                    reaching.update(of(sub, False))
        return found

    def assign(target: str, value: set[str]) -> bool:
        before = sources.get(target, set())
        sources[target] = before | value
        return not value <= before

    def walk(stmts, record: bool) -> bool:
        """One pass over stmts; whether any name's sources grew."""
        grew = False
        for stmt in stmts:
            if isinstance(stmt, ast.Assign):
                value = of(stmt.value, record)
                grew = any([assign(t, value) for t in stmt.targets]) or grew
            elif isinstance(stmt, ast.AugAssign):
                grew = assign(stmt.target, of(stmt.value, record)) or grew
            elif isinstance(stmt, ast.For):
                grew = assign(stmt.var, of(stmt.args, record)) or grew
                grew = walk(stmt.body, record) or grew
            elif isinstance(stmt, ast.If):
                arms, orelse = ast.elif_chain(stmt)
                for arm in arms:
                    of(arm.cond, record)
                    grew = walk(arm.body, record) or grew
                grew = walk(orelse, record) or grew
            else:
                of(stmt, record)
        return grew

    while any([walk(body, any(body is b for b in searched)) for body in lists]):
        pass  # until no name's sources grow: a loop's later trips
    return reaching & {s.name for s in (*f.specs, *f.param_specs)}


def _mismatched_call(call: ast.Call, ns) -> bool:
    """Whether a call is stop_gradient's, or one of a function whose
    gradient is not its derivative (@pass_through, or using either)."""
    if isinstance(call.func, ast.Name) and call.func.id == "stop_gradient":
        return True
    return any(_function_mismatch(*target) for target in _callees(call, ns))


def _bodies(fdef) -> list:
    """A definition's body and its grad blocks' bodies."""
    return [fdef.body] + [g.body for g in fdef.grads]
