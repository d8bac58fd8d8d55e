"""`dsl.vmap(f, in_axes, out_axes)`: f over a batch of examples, as `jax.vmap`.

Contract: `vmap(f, in_axes, out_axes)(*args, **kwargs)` maps f over an
axis of the positional arguments `in_axes` marks (an integer: that axis,
negative from the end; None: the same value for every example): one
entry per parameter (trailing defaulted ones may be left out: None), or
one for those that are neither `const` nor defaulted.  Keyword
arguments and module params are not mapped.  Every mapped argument must
have the same length k on its axis, and each example (`arg[i]` along
it) must be what f takes (its annotations are checked on the examples).
The results are f's, each with an axis of size k at `out_axes` (one for
all, or one per result nested as the results are, an integer standing
for each result of its part; 0 by default): result[i] along it is f on
example i.  f's reductions stay per example (`sum(x)` of a mapped x is k
sums).  The program moves the examples' axes to the front and back
(transposes), so that its transforms see the caller's layout.

One program runs every example at once (`compiler.vectorize`, the rules
`dsl.jacfwd` stacks columns with), so `vmap(grad(f, wrt=w), in_axes=(0,
None))` gives per-example gradients in one pass.  Where f has an op with no
rule for stacked values (a mapped index array, a loop whose trip count
is mapped, a mapped integer used as a size, a mapped `const` integer or
bool, whose value picks the program), the examples run one at a time,
with the same results (an `ArgumentError` where their shapes differ).  A `VmapFunction` is a compiled function like the others:
`grad`, `jvp`, `jacfwd` and `to_torch` take it, as long as its program
stacks (otherwise they raise `ArgumentError`); `vmap` takes it always
(running it once per example where it does not stack).  `vmap` also
takes a Jacobian (`jacfwd`, `jacrev`, `hessian`: `MappedJacobian`), giving
each example's.
"""
from __future__ import annotations

import inspect
import itertools
import numbers
from dataclasses import replace
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from dsl.forward import Jacobian, refuse_out, require_float
from dsl.function import (AsFunction, Compiled, NotStacked, Stacked, bind_at_defaults, derived,
                          describe_layout, eagerly, holding_nothing, results_like,
                          torch_compiling)
from gradlang.compiler.builder import MAX_RANK, Builder, inline
from gradlang.compiler.ir import Function, TensorType, Var
from gradlang.compiler.vectorize import NotVectorizable
from gradlang.runtime.args import SUPPORTED, cast, convert
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError, called, shown
from gradlang.runtime.recording import recording_tapes
from gradlang.runtime.signatures import SignatureAttribute, positional_only

InAxes = Union[int, None, Sequence[Optional[int]]]
OutAxes = Union[int, Sequence[int]]

# How deep out_axes may nest: as the results of f do, which no chain of
# transforms takes near this.  A deeper one is refused before anything
# hashes it (the vmap's key): hashing a tuple nested 10**6 deep overflows
# C's stack, and checking one 10**5 deep overflowed Python's.
MOST_NESTING = 64


def vmap(f: "Compiled | Jacobian | MappedJacobian", in_axes: InAxes = 0,
         out_axes: OutAxes = 0) -> "VmapFunction | MappedJacobian":
    """f mapped over the axes `in_axes` gives of the positional arguments
    it marks, the examples along `out_axes` of the results; one per
    (function, axes); a Jacobian's per example."""
    if isinstance(f, (Jacobian, MappedJacobian)):
        mapped, axes = _mapped_positions(f.f, in_axes)
        outs = _out_axes(f.f, out_axes)
        key = ("vmap", mapped) if _at_front(axes, outs) else ("vmap", mapped, axes, outs)
        return derived(f, key, lambda: MappedJacobian(f, mapped, axes, outs))
    return _mapped(f, *_mapped_positions(f, in_axes), _out_axes(f, out_axes))


def _mapped(f: Compiled, positions: tuple[int, ...], axes: Optional[tuple[int, ...]] = None,
            out_axes: OutAxes = 0, name: Optional[str] = None) -> "VmapFunction":
    """f mapped over `axes` (default 0) of its arguments at `positions`,
    the examples along `out_axes` of its results; named `name` in its
    errors where the caller wrote another (`MappedJacobian`), else
    vmap(f)."""
    axes = axes or (0,) * len(positions)
    named = (name,) if name else ()
    if _at_front(axes, out_axes):
        return derived(f, ("vmap", positions, *named),
                       lambda: VmapFunction(f, positions, name=name))
    return derived(f, ("vmap", positions, axes, out_axes, *named),
                   lambda: VmapFunction(f, positions, axes, out_axes, name))


def _at_front(axes: tuple[int, ...], out_axes: OutAxes) -> bool:
    """Whether every mapped axis and every result's examples are axis 0
    (given as one 0: a tuple, even of zeros, has its count checked)."""
    return not any(axes) and not isinstance(out_axes, tuple) and out_axes == 0


def _is_axis(axis: Any) -> bool:
    return isinstance(axis, numbers.Integral) and not isinstance(axis, (bool, np.bool_))


def _beyond_every_rank(axis: int) -> bool:
    """Whether `axis` is no axis of any array (of at most `MAX_RANK`), which
    an in_axes or out_axes entry is refused for when vmap is called, not
    first as a program for it is keyed (its repr, an integer's of over
    4300 digits a ValueError) and built."""
    return not -MAX_RANK <= axis < MAX_RANK


def _out_axes(f: Compiled, out_axes: OutAxes) -> OutAxes:
    """out_axes (checked): one integer for every result, or a tuple of one
    per result, nested as the results are (`value_and_grad(f, wrt=(0,
    1))`'s `(0, (1, 0))`), where an integer stands for every result in its
    part (as JAX's tree prefixes); its nesting a call checks
    (`_axes_per_result`).  Lists are taken as tuples."""
    def checked(item: Any, depth: int) -> Any:
        if isinstance(item, (list, tuple)):
            if depth == MOST_NESTING:
                raise ArgumentError(f"out_axes nests more than {MOST_NESTING} deep; give it "
                                    f"nested as the results of {called(f.name)} are", f.span)
            return tuple(checked(i, depth + 1) for i in item)
        if not _is_axis(item):
            raise ArgumentError(f"out_axes is an integer or a tuple of one per result (the axis "
                                f"of the examples in each), got {shown(out_axes)}", f.span)
        if _beyond_every_rank(item):
            raise ArgumentError(f"out_axes puts the examples on axis {shown(item)}, but an array "
                                f"has at most {MAX_RANK} axes", f.span)
        return int(item)
    return checked(out_axes, 0)


def _axes_per_result(out_axes: OutAxes, layout: Any, name: str, span) -> dict[int, int]:
    """The axis out_axes gives each result in `layout` (the results'
    structure, `Compiled.format` of their indices): an integer for every
    result in its part, a tuple one entry per part (a function of one
    result takes a tuple of one, as the count of its results; within a
    tuple, an array takes an integer only, as JAX's)."""
    axes: dict[int, int] = {}

    def place(given: OutAxes, part: Any, top: bool) -> None:
        if isinstance(given, int):
            axes.update((leaf, given) for leaf in _leaves(part))
        elif isinstance(part, tuple) and len(given) == len(part):
            for g, p in zip(given, part):
                place(g, p, False)
        elif top and not isinstance(part, tuple) and len(given) == 1:
            place(given[0], part, False)
        elif top:
            count = len(part) if isinstance(part, tuple) else 1
            raise ArgumentError(f"out_axes has {len(given)} entries, but {called(name)} gives "
                                f"{count} result(s): give one per result, or one for all", span)
        else:
            raise ArgumentError(f"out_axes {shown(out_axes)} does not nest as the results of "
                                f"{called(name)} do, {describe_layout(layout)}: give an axis "
                                "per result, or one for a tuple of them", span)
    place(out_axes, layout, True)
    return axes


def _leaves(tree: Any) -> list:
    """The leaves of nested tuples, in order."""
    if isinstance(tree, tuple):
        return [leaf for part in tree for leaf in _leaves(part)]
    return [tree]


def _mapped_positions(f: Compiled, in_axes: InAxes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The positions of the parameters in_axes maps, and the axis of each
    (checked: an integer, negative from the end of the argument's axes)."""
    if isinstance(in_axes, (list, tuple)):
        # (as JAX's: one per argument passed, so trailing defaulted ones may
        # be left out; not one before a required one, as an hvp's v follows
        # f's defaulted parameters)
        required = len(f.specs)
        while required and f.specs[required - 1].has_default:
            required -= 1
        if not required <= len(in_axes) <= len(f.specs):
            takes = f"{required} to {len(f.specs)}" if required < len(f.specs) else required
            raise ArgumentError(f"in_axes has {len(in_axes)} entries, but {called(f.name)} takes "
                                f"{takes} positional argument(s): give one per argument "
                                "(an axis or None), or one for all", f.span)
        axes = list(in_axes) + [None] * (len(f.specs) - len(in_axes))
    else:  # one for all: those that can be mapped and must be passed
        axes = [None if s.const or s.has_default else in_axes for s in f.specs]
    for spec, axis in zip(f.specs, axes):
        if axis is not None and not _is_axis(axis):
            raise ArgumentError(f"in_axes entries are integers (the axis to map) or None (not "
                                f"mapped), got {shown(axis)} for argument {f.label(spec.name)}",
                                f.span)
        if axis is not None and _beyond_every_rank(axis):
            raise ArgumentError(f"in_axes maps axis {shown(axis)} of argument "
                                f"{f.label(spec.name)}, but an array has at most {MAX_RANK} axes",
                                f.span)
    mapped = tuple(i for i, axis in enumerate(axes) if axis is not None)
    if not mapped:
        raise ArgumentError(f"in_axes maps none of the arguments of {called(f.name)}", f.span)
    return mapped, tuple(int(axes[i]) for i in mapped)


def no_example(array: Any, axis: int = 0) -> np.ndarray:
    """The example of a mapped argument `array` that has none (size 0 on
    its mapped `axis`), whose dtype and shape binding and lowering read:
    zeros of one example's shape, as a view of one zero that holds no
    memory (np.zeros of that shape made a batch of no examples of shape
    (0, 2**40) an AllocationError of 8 TiB, where f of it is empty)."""
    return holding_nothing(array.shape[:axis] + array.shape[axis + 1:], array.dtype)


class VmapFunction(Stacked):
    """`inner` over an axis of each of its arguments `stacked` (`vmap`):
    a `Stacked` program of every output, shaped for the caller as inner's
    results, or one example at a time where inner does not stack.  The
    examples lie along axis `axes[name]` of an argument (negative: from
    its end) and `out_axes` of the results; the program's IR moves them
    from and to axis 0 (transposes), so that a transform of it (`grad`)
    takes and gives arrays as the caller lays them out."""

    def __init__(self, inner: Compiled, mapped: tuple[int, ...],
                 axes: Optional[tuple[int, ...]] = None, out_axes: OutAxes = 0,
                 name: Optional[str] = None):
        super().__init__(inner, [inner.specs[i].name for i in mapped], "all")
        self.mapped = mapped
        self.axes = dict(zip(self.stacked, axes or (0,) * len(mapped)))
        self.out_axes = out_axes
        self.moved = not _at_front(tuple(self.axes.values()), out_axes)
        self._own_name = name
        self.name = name or f"vmap({inner.name})"

    def recipe(self) -> tuple:
        return _mapped, (self.inner, self.mapped, tuple(self.axes.values()), self.out_axes,
                         self._own_name)

    def axis(self, name: str, rank: int) -> int:
        """The axis of the examples in the mapped argument `name` of this
        rank (checked by `bind`)."""
        return self.axes[name] % rank if rank else 0

    def item(self, name: str, array: Any, i: int) -> Any:
        """Example i of the mapped argument `name` (a view: for its shape
        and dtype; a call takes `to_front`'s)."""
        return array[(slice(None),) * self.axis(name, array.ndim) + (i,)]

    def to_front(self, name: str, array: Any) -> Any:
        """The mapped argument `name` with its examples along axis 0, each
        (`[i]`) an argument its function's target takes: NumPy's as a
        view; a device array moved on the host and copied back, since a
        view of it along another axis is not C-contiguous, which a device
        target refuses rather than copy (naming the caller's argument)."""
        axis = self.axis(name, array.ndim)
        if not axis or isinstance(array, np.ndarray):
            return np.moveaxis(array, axis, 0) if axis else array
        moved = np.ascontiguousarray(np.moveaxis(self._on_host(array), axis, 0))
        return self.accepted(moved, self.what_is(name))

    def out_axis(self, j: int, count: int, rank: int) -> int:
        """The axis of the examples in result j of `count`, of this rank
        (counting the examples' axis)."""
        axis = self.out_axes
        if isinstance(axis, tuple):
            layout = self.inner.format(tuple(range(count)))
            axis = _axes_per_result(axis, layout, self.name, self.span)[j]
        if not -rank <= axis < rank:
            raise ArgumentError(f"out_axes puts the examples of result {j} of "
                                f"{called(self.name)} on axis {axis}, but it has {rank} axes",
                                self.span)
        return axis % rank

    def call_signature(self, out: bool = True) -> Optional[inspect.Signature]:
        """inner's, its parameters up to the last mapped one positional-only:
        a mapped argument is passed by position (`bind`), and so is each
        before it."""
        return positional_only(self.inner.call_signature(out), max(self.mapped) + 1)

    def bind(self, args, kwargs, params=None) -> dict[str, np.ndarray]:
        """The mapped arguments whole, each converted as f converts one,
        the examples' (their first, or an empty one) validated by f's own
        binding, with the rest of the arguments and the params."""
        examples, stacks, k = self.inner.by_position(args), {}, None
        by_keyword = {self.named(key) for key in kwargs}
        for i in self.mapped:
            spec = self.specs[i]
            where = f"argument {self.label(spec.name)} of {called(self.name)}"
            # (checked first: an hvp's v given by keyword left its last positional
            # argument taken as v, and the error was about that one)
            if spec.name in by_keyword:
                raise ArgumentError(f"in_axes maps {where}, given by keyword: a mapped argument "
                                    "is passed by position", self.span)
            if i not in examples:
                # (vmap(hvp(f))(x) said "which must then be passed by position":
                # x was, and taken as hvp's v, which comes last)
                raise ArgumentError(f"in_axes maps {where}, which was not passed (a mapped "
                                    "argument is passed by position)", self.span,
                                    note=getattr(self.inner, "arguments_note", None))
            whole = convert(self.name, replace(spec, dims=None), examples[i], self.span)
            given = self.axes[spec.name]
            if len(whole.shape) == 0:
                raise ArgumentError(f"{where} is a scalar, but in_axes maps its axis {given}",
                                    self.span)
            if not -whole.ndim <= given < whole.ndim:
                raise ArgumentError(f"in_axes maps axis {given} of {where}, which has "
                                    f"{whole.ndim} axes", self.span)
            axis = self.axis(spec.name, whole.ndim)
            if k is None:
                k, first = whole.shape[axis], self.label(spec.name)
            elif whole.shape[axis] != k:
                raise ArgumentError(f"{where} has {whole.shape[axis]} examples on axis {axis}, "
                                    f"but {first} has {k}: mapped arguments must have as many",
                                    self.span)
            stacks[spec.name] = whole
            examples[i] = self._example(spec.name, whole)
        try:
            bound = self.inner.bind(tuple(examples[i] for i in sorted(examples)), kwargs, params)
        except ArgumentError as err:  # said of an example: say so
            raise ArgumentError(f"{called(self.name)} maps {self._mapped_axes()}, and for each "
                                f"example: {err.message}", err.span, err.source,
                                err.note) from None
        # an example f converted to another dtype (an hvp's v, as its x's): all of them
        return {n: cast(f"argument {self.label(n)} of {called(self.name)}", stacks[n],
                        SUPPORTED[np.dtype(a.dtype)], self.span) if n in stacks else a
                for n, a in bound.items()}

    def by_position(self, args: Sequence[Any]) -> dict[int, Any]:
        return self.inner.by_position(args)  # (`bind` places them so)

    def label(self, name: str) -> str:
        return self.inner.label(name)

    def named(self, label: str) -> str:
        return self.inner.named(label)

    def call_bound(self, bound: dict[str, np.ndarray], args: Sequence[Any] = (),
                   out: Any = None, known: bool = False) -> tuple[np.ndarray, ...]:
        example = {n: self._example(n, a) for n, a in bound.items()}
        if self.stacks(example):
            return super().call_bound(bound, args, out, known)
        if out is not None or recording_tapes(bound.values()):
            what = "takes no out=" if out is not None else "cannot be recorded by a dsl.Tape"
            picking = sorted(self.static_names(example) & set(self.stacked))
            why = (f"argument {self.label(picking[0])} is a const scalar for each example, "
                   "whose value picks the program" if picking else
                   "an op of its function does not stack, or a mapped argument gives a size")
            raise ArgumentError(f"{called(self.name)} {what} where it runs one example at a "
                                f"time ({why})", self.span)
        fronts = {n: self.to_front(n, bound[n]) for n in self.stacked}
        k = fronts[self.stacked[0]].shape[0]
        each = [self.inner.call_bound({n: fronts[n][i] if n in fronts else a
                                       for n, a in bound.items()}) for i in range(k)]
        # (no example: empty results of the shapes one would have, run for none)
        like = each[0] if each else _results_like(self.inner, example)
        return tuple(self._stack([e[j] for e in each], like[j], j, len(like))
                     for j in range(len(like)))

    def results_like(self, bound: dict[str, Any]) -> tuple[np.ndarray, ...]:
        """Its results for arguments like `bound` (bound by `bind`), as
        arrays of their shapes and dtypes that hold no memory, running
        nothing: the stacked program's (from its IR), or, where it runs one
        example at a time, one example's with the examples' axis put in."""
        example = {n: self._example(n, a) for n, a in bound.items()}
        if self.stacks(example):
            return results_like(self, bound)
        first = bound[self.stacked[0]]
        k = first.shape[self.axis(self.stacked[0], first.ndim)]
        like = _results_like(self.inner, example)
        shapes = [r.shape for r in like]
        placed = [self.out_axis(j, len(like), len(shape) + 1) for j, shape in enumerate(shapes)]
        return tuple(holding_nothing(shape[:axis] + (k,) + shape[axis:], r.dtype)
                     for r, shape, axis in zip(like, shapes, placed))

    def _stack(self, results: list, like: Any, j: int, count: int) -> Any:
        """The examples' results (result j of `count`) as one array of the
        target's, the examples along its `out_axis`."""
        stacked = self.host_stack(results, like)
        stacked = np.moveaxis(stacked, 0, self.out_axis(j, count, stacked.ndim))
        return stacked if self.target.is_array(stacked) else \
            self.target.accept(stacked, f"a result of {called(self.name)}")

    def host_stack(self, results: list, like: Any) -> np.ndarray:
        """The examples' results (the target's arrays or NumPy's) as one
        NumPy array (refused where a mapped size gave them shapes of their
        own)."""
        host = [self._on_host(r) for r in results]
        like = self._on_host(like)
        for i, r in enumerate(host):
            if r.shape != like.shape:
                raise ArgumentError(f"{called(self.name)} gives results of different shapes: "
                                    f"{list(like.shape)} for example 0, {list(r.shape)} for "
                                    f"example {i} (a mapped argument gives a size); results "
                                    "must stack", self.span)
        return np.stack(host) if host else np.zeros((0, *like.shape), like.dtype)

    def _on_host(self, array: Any) -> np.ndarray:
        return array if isinstance(array, np.ndarray) else np.asarray(self.target.to_host(array))

    def _example(self, name: str, array: Any) -> Any:
        """One example of a mapped argument (its first, or an empty one)."""
        if name not in self.stacked:
            return array
        axis = self.axis(name, array.ndim)
        if array.shape[axis]:
            return self.item(name, array, 0)
        return no_example(array, axis)

    def _mapped_axes(self) -> str:
        """The axes it maps, for a message: "axis 0", or each argument's."""
        if not any(self.axes.values()):
            return "axis 0"
        return ", ".join(f"axis {axis} of {self.label(n)}" for n, axis in self.axes.items())

    def lower(self, types: dict[str, TensorType]) -> Function:
        try:
            if not self.moved:
                return super().lower(types)
            return self._moving_axes(types)
        except NotStacked:  # said already (a vmap inside, a mapped size)
            raise
        except NotVectorizable as err:
            raise NotStacked(f"{called(self.name)} runs one example at a time here (its "
                            f"op {err} has no rule for stacked values), so it has no "
                            "program of its own for a transform to take", self.span) from None

    def _moving_axes(self, types: dict[str, TensorType]) -> Function:
        """The stacked program for arguments of `types` whose examples lie
        along their `axes`: each moved to the front (a transpose), the
        program over axis 0, and each result's moved to its `out_axis`."""
        def to_front(t: TensorType, axis: int) -> tuple[int, ...]:
            return (axis,) + tuple(a for a in range(t.rank) if a != axis)
        perms = {n: to_front(t, self.axis(n, t.rank)) for n, t in types.items()
                 if n in self.stacked}
        fn = super().lower({n: TensorType(t.dtype, tuple(t.shape[a] for a in perms[n]))
                            if n in perms else t for n, t in types.items()})
        b = Builder()
        params = [Var(t, v.hint) for v, t in zip(fn.params, types.values())]
        inputs = [b.bind("transpose", v, perm=perms[n]) if n in perms and perms[n] != tuple(
            range(len(perms[n]))) else v for v, n in zip(params, types)]
        outputs = []
        for j, out in enumerate(inline(b, fn, inputs)):
            axis = self.out_axis(j, len(fn.outputs), out.type.rank)
            if axis:  # (its inverse: the front axis to `axis`)
                perm = to_front(out.type, axis)
                out = b.bind("transpose", out, perm=tuple(perm.index(a) for a in range(len(perm))))
            outputs.append(out)
        return b.function(fn.name, params, outputs)

    def identity(self) -> tuple:
        if self.moved:
            return ("vmap", self.inner.identity(), self.stacked, tuple(self.axes.values()),
                    self.out_axes)
        return ("vmap", self.inner.identity(), self.stacked)

    def format(self, outs):
        return self.inner.format(outs)


class MappedJacobian(AsFunction):
    """`vmap(jacobian, in_axes)` of a `jacfwd`, `jacrev` or `hessian`: each
    example's Jacobians, stacked, of shape (k,) + out example shape + arg
    example shape, as `jax.vmap(jax.jacrev(f))` gives.  Where every
    argument the Jacobian is taken with respect to is positional, one
    `Jacobian` of f's vmap does every example at once (a `batched` one:
    its one-hot tangents or cotangents the same for every example), with
    those arguments mapped too (an unmapped one repeated for each
    example, so that each has its own cotangent); otherwise (a module
    param, or where f does not stack) the Jacobian runs once per example,
    as a `MappedJacobian` mapped again (`vmap(vmap(jacrev(f)))`) runs the
    inner one per outer example."""

    def __init__(self, jacobian: "Jacobian | MappedJacobian", mapped: tuple[int, ...],
                 axes: Optional[tuple[int, ...]] = None, out_axes: OutAxes = 0):
        if any(_leaves(out_axes)):  # ((0,): as 0)
            raise ArgumentError(f"vmap of {jacobian.name} takes out_axes=0 only (its Jacobians' "
                                f"first axis is the examples'; np.moveaxis moves it), got "
                                f"{shown(out_axes)}", jacobian.f.span)
        # f binds a call (its arguments as the caller lays them out); `front`
        # runs it, the examples moved to axis 0
        self.jacobian, self.mapped, self.axes, self.out_axes = jacobian, mapped, axes, out_axes
        self.name = f"vmap({jacobian.name})"
        # (named as the caller wrote it: binding the call is f's, the vmap of
        # the Jacobian's function, whose errors said vmap(grad(f)) for a
        # vmap(hessian(f)), vmap(f) for a vmap(jacrev(f)))
        self.f = _mapped(jacobian.f, mapped, axes, name=self.name)
        self.front = _mapped(jacobian.f, mapped, name=self.name)
        self.wrt, self.single, self.mode = jacobian.wrt, jacobian.single, jacobian.mode
        positions = {spec.name: i for i, spec in enumerate(jacobian.f.specs)}
        self.batched: Optional[Jacobian] = None
        if isinstance(jacobian, Jacobian) and all(n in positions for n in jacobian.wrt):
            every = tuple(sorted({*mapped, *(positions[n] for n in jacobian.wrt)}))
            wrt = jacobian.wrt[0] if jacobian.single else jacobian.wrt
            self.batched = Jacobian(_mapped(jacobian.f, every), wrt, jacobian.mode, batched=True)
            # its errors are this call's: named as written, not jacfwd(vmap(f)), which
            # is another Jacobian (across the examples)
            self.batched.name = self.name

    def error_sources(self) -> tuple[tuple[str, str], ...]:
        return self.f.error_sources()

    def __reduce__(self) -> tuple:
        return MappedJacobian, (self.jacobian, self.mapped, self.axes, self.out_axes)

    __signature__ = SignatureAttribute()

    def call_signature(self) -> Optional[inspect.Signature]:
        return self.f.call_signature()  # (it binds as f, the vmap, binds; out=None: refuse_out)

    @user_facing
    def __call__(self, /, *args, **kwargs):
        if torch_compiling():  # (see there)
            return eagerly(type(self).__call__, self, *args, **kwargs)
        refuse_out(self.name, kwargs, self.f.span)
        bound = bind_at_defaults(self.f, args, kwargs, None, self.wrt)
        if recording_tapes(bound.values()):  # (one program, as `Jacobian.__call__` says)
            return self.as_function()(*args, **kwargs)
        return self.call_bound(bound)

    def as_function(self) -> "VmapFunction":
        """These Jacobians as a function of their own, for a transform to
        take: the vmap of the Jacobian's (`Jacobian.as_function`)."""
        return _mapped(self.jacobian.as_function(), self.mapped, self.axes, self.out_axes)

    def call_bound(self, bound: dict[str, Any]) -> Any:
        """The Jacobians for arguments bound by `f` (the vmap of the
        Jacobian's function), refused where a tuple out_axes (of zeros)
        does not nest as they do: `(0, 0, 0)` for two Jacobians was taken
        as 0; checked on their structure (`results_like`) before any is
        worked out."""
        for name in self.wrt:  # (said of this call: lowering f's vmap said `grad(f)`'s)
            if name in bound:
                require_float(self.name, name, bound[name], self.jacobian.f.span)
        if isinstance(self.out_axes, tuple):
            count = itertools.count()
            _axes_per_result(self.out_axes,
                             _each_leaf(self.results_like(bound), lambda _: next(count)),
                             self.name, self.jacobian.f.span)
        return self._jacobians(bound)

    def _jacobians(self, bound: dict[str, Any]) -> Any:
        """`call_bound`'s Jacobians, out_axes checked."""
        stacked = self.front.stacked
        bound = {n: self.f.to_front(n, a) if n in stacked else a for n, a in bound.items()}
        k = bound[stacked[0]].shape[0]
        if self.batched is not None and all(n in bound for n in self.wrt):
            vf = self.batched.f
            whole = {n: np.repeat(vf._on_host(a)[None], k, axis=0)
                     if n in vf.stacked and n not in stacked else a for n, a in bound.items()}
            if vf.stacks({n: vf._example(n, a) for n, a in whole.items()}):
                return self.batched.call_bound(whole)
        each = [self.jacobian.call_bound({n: a[i] if n in stacked else a
                                          for n, a in bound.items()}) for i in range(k)]
        if not each:  # no example: empty Jacobians of the shapes one would have
            return self._stacked_like([], self.jacobian.results_like(
                {n: self.front._example(n, a) for n, a in bound.items()}))
        return self._stacked_like(each, each[0])

    def results_like(self, bound: dict[str, Any]) -> Any:
        """The Jacobians for arguments like `bound` as `Jacobian.results_like`
        gives them: each example's, the examples' axis first."""
        bound = {n: self.f.to_front(n, a) if n in self.front.stacked else a
                 for n, a in bound.items()}
        k = bound[self.front.stacked[0]].shape[0]
        like = self.jacobian.results_like({n: self.front._example(n, a)
                                           for n, a in bound.items()})
        return _each_leaf(like, lambda a: holding_nothing((k, *a.shape), a.dtype))

    def _placed(self, jacobian: np.ndarray) -> Any:
        return self.jacobian._placed(jacobian)

    def _stacked_like(self, each: list, like: Any) -> Any:
        """The examples' Jacobians, structured as one of them (`like`: an
        array or nested tuples of them), stacked leaf by leaf, placed as
        the Jacobian places its own."""
        if isinstance(like, tuple):
            return tuple(self._stacked_like([e[j] for e in each], part)
                         for j, part in enumerate(like))
        return self._placed(self.front.host_stack(each, like))


def _results_like(f: Compiled, bound: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """f's results for arguments like `bound`, running nothing
    (`dsl.function.results_like`; a vmap that runs one example at a time
    has no program of its own to read them from: its own)."""
    if isinstance(f, VmapFunction):
        return f.results_like(bound)
    return results_like(f, bound)


def _each_leaf(tree: Any, change: Callable[[np.ndarray], Any]) -> Any:
    """Nested tuples of arrays (`tree`) with `change` applied to each."""
    if isinstance(tree, tuple):
        return tuple(_each_leaf(part, change) for part in tree)
    return change(tree)
