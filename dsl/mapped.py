"""`dsl.vmap(f, in_axes)`: f over a batch of examples, as `jax.vmap`.

Contract: `vmap(f, in_axes)(*args, **kwargs)` maps f over axis 0 of the
positional arguments `in_axes` marks (0: mapped, None: the same value for
every example): one entry per parameter (trailing defaulted ones may be
left out: None), or one for those that are neither `const` nor
defaulted.  Keyword arguments and module params are
not mapped.  Every mapped argument must
have the same length k on axis 0, and each example (`arg[i]`) must be what
f takes (its annotations are checked on the examples).  The results are
f's, each with a leading axis of size k: result[i] is f on example i.
f's reductions stay per example (`sum(x)` of a mapped x is k sums).

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
import numbers
from dataclasses import replace
from typing import Any, Optional, Sequence, Union

import numpy as np

from dsl.forward import Jacobian, refuse_out
from dsl.function import AsFunction, Compiled, NotStacked, Stacked, derived
from gradlang.compiler.ir import Function, TensorType
from gradlang.compiler.vectorize import NotVectorizable
from gradlang.runtime.args import SUPPORTED, cast, convert
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError, called
from gradlang.runtime.recording import recording_tapes
from gradlang.runtime.signatures import SignatureAttribute, positional_only

InAxes = Union[int, None, Sequence[Optional[int]]]


def vmap(f: "Compiled | Jacobian | MappedJacobian", in_axes: InAxes = 0
         ) -> "VmapFunction | MappedJacobian":
    """f mapped over axis 0 of the positional arguments `in_axes` marks,
    one per (function, mapped positions); a Jacobian's per example."""
    if isinstance(f, (Jacobian, MappedJacobian)):
        mapped = _mapped_positions(f.f, in_axes)
        return derived(f, ("vmap", mapped), lambda: MappedJacobian(f, mapped))
    return _mapped(f, _mapped_positions(f, in_axes))


def _mapped(f: Compiled, positions: tuple[int, ...]) -> "VmapFunction":
    """f mapped over axis 0 of its arguments at `positions`."""
    return derived(f, ("vmap", positions), lambda: VmapFunction(f, positions))


def _mapped_positions(f: Compiled, in_axes: InAxes) -> tuple[int, ...]:
    """The positions of the parameters in_axes maps (checked)."""
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
                                "(0 or None), or one for all", f.span)
        axes = list(in_axes) + [None] * (len(f.specs) - len(in_axes))
    else:  # one for all: those that can be mapped and must be passed
        axes = [None if s.const or s.has_default else in_axes for s in f.specs]
    for spec, axis in zip(f.specs, axes):
        integer = isinstance(axis, numbers.Integral) and not isinstance(axis, (bool, np.bool_))
        if axis is not None and not (integer and axis == 0):
            hint = "; move the axis to the front first (np.moveaxis)" if integer else ""
            raise ArgumentError(f"in_axes entries are 0 (map axis 0) or None (not mapped), got "
                                f"{axis!r} for argument {f.label(spec.name)}{hint}", f.span)
    mapped = tuple(i for i, axis in enumerate(axes) if axis is not None)
    if not mapped:
        raise ArgumentError(f"in_axes maps none of the arguments of {called(f.name)}", f.span)
    return mapped


class VmapFunction(Stacked):
    """`inner` over axis 0 of its arguments `stacked` (`vmap`): a `Stacked`
    program of every output, shaped for the caller as inner's results,
    or one example at a time where inner does not stack."""

    def __init__(self, inner: Compiled, mapped: tuple[int, ...]):
        super().__init__(inner, [inner.specs[i].name for i in mapped], "all")
        self.mapped = mapped
        self.name = f"vmap({inner.name})"

    def recipe(self) -> tuple:
        return _mapped, (self.inner, self.mapped)

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
        for i in self.mapped:
            spec = self.specs[i]
            where = f"argument {self.label(spec.name)} of {called(self.name)}"
            if i not in examples:
                raise ArgumentError(f"in_axes maps {where}, which must then be passed by "
                                    "position", self.span)
            whole = convert(self.name, replace(spec, dims=None), examples[i], self.span)
            if len(whole.shape) == 0:
                raise ArgumentError(f"{where} is a scalar, but in_axes maps its axis 0", self.span)
            if k is None:
                k, first = whole.shape[0], self.label(spec.name)
            elif whole.shape[0] != k:
                raise ArgumentError(f"{where} has {whole.shape[0]} examples on axis 0, but "
                                    f"{first} has {k}: mapped arguments must have as many",
                                    self.span)
            stacks[spec.name] = whole
            examples[i] = whole[0] if k else np.zeros(whole.shape[1:], whole.dtype)
        try:
            bound = self.inner.bind(tuple(examples[i] for i in sorted(examples)), kwargs, params)
        except ArgumentError as err:  # said of an example: say so
            raise ArgumentError(f"{called(self.name)} maps axis 0, and for each example: "
                                f"{err.message}", err.span, err.source, err.note) from None
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
        k = next(iter(bound[n] for n in self.stacked)).shape[0]
        each = [self.inner.call_bound({n: a[i] if n in self.stacked else a
                                       for n, a in bound.items()}) for i in range(k)]
        if not each:  # no example: empty results of the shapes one would have
            each_shape = self.inner.call_bound(example)
            return tuple(self._stack([], r) for r in each_shape)
        return tuple(self._stack([e[j] for e in each], each[0][j]) for j in range(len(each[0])))

    def _stack(self, results: list, like: Any) -> Any:
        """The examples' results as one array of the target's."""
        stacked = self.host_stack(results, like)
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
        return array[0] if array.shape[0] else np.zeros(array.shape[1:], array.dtype)

    def lower(self, types: dict[str, TensorType]) -> Function:
        try:
            return super().lower(types)
        except NotStacked:  # said already (a vmap inside, a mapped size)
            raise
        except NotVectorizable as err:
            raise NotStacked(f"{called(self.name)} runs one example at a time here (its "
                            f"op {err} has no rule for stacked values), so it has no "
                            "program of its own for a transform to take", self.span) from None

    def identity(self) -> tuple:
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

    def __init__(self, jacobian: "Jacobian | MappedJacobian", mapped: tuple[int, ...]):
        self.jacobian, self.mapped, self.f = jacobian, mapped, _mapped(jacobian.f, mapped)
        self.wrt, self.single, self.mode = jacobian.wrt, jacobian.single, jacobian.mode
        self.name = f"vmap({jacobian.name})"
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
        return MappedJacobian, (self.jacobian, self.mapped)

    __signature__ = SignatureAttribute()

    def call_signature(self) -> Optional[inspect.Signature]:
        return self.f.call_signature()  # (it binds as f, the vmap, binds; out=None: refuse_out)

    @user_facing
    def __call__(self, /, *args, **kwargs):
        refuse_out(self.name, kwargs, self.f.span)
        bound = self.f.bind(args, kwargs)
        if recording_tapes(bound.values()):  # (one program, as `Jacobian.__call__` says)
            return self.as_function()(*args, **kwargs)
        return self.call_bound(bound)

    def as_function(self) -> "VmapFunction":
        """These Jacobians as a function of their own, for a transform to
        take: the vmap of the Jacobian's (`Jacobian.as_function`)."""
        return _mapped(self.jacobian.as_function(), self.mapped)

    def call_bound(self, bound: dict[str, Any]) -> Any:
        """The Jacobians for arguments bound by `f` (the vmap of the
        Jacobian's function)."""
        stacked = self.f.stacked
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
            like = self.jacobian.call_bound({n: self.f._example(n, a) for n, a in bound.items()})
            return self._stacked_like([], like)
        return self._stacked_like(each, each[0])

    def _placed(self, jacobian: np.ndarray) -> Any:
        return self.jacobian._placed(jacobian)

    def _stacked_like(self, each: list, like: Any) -> Any:
        """The examples' Jacobians, structured as one of them (`like`: an
        array or nested tuples of them), stacked leaf by leaf, placed as
        the Jacobian places its own."""
        if isinstance(like, tuple):
            return tuple(self._stacked_like([e[j] for e in each], part)
                         for j, part in enumerate(like))
        return self._placed(self.f.host_stack(each, like))
