"""`dsl.to_jax(f)`: a compiled function as a JAX function that JAX
differentiates with gradlang's own derivatives, in both modes.

Contract: `to_jax(f)(*args, **kwargs)` takes f's arguments as JAX arrays
(NumPy arrays are made JAX arrays, as `jnp` functions do; Python numbers
are constants, so const arguments such as an axis stay static) and the
module params f reads as keyword arrays (a param left out takes the
module's value when JAX traces the call, and gets no gradient: a jitted
function keeps the value it was traced with, as it keeps any NumPy array
it closes over), and returns JAX arrays shaped as f's results.  A call
is one operation of the JAX primitive `gradlang_call` (`_primitive`),
which runs f's compiled kernels on the host (under `jit` on the CPU: from
an XLA FFI handler, with no Python, where f's program is a straight
sequence of kernels, `dsl.jax_ffi`, else through
`jax.experimental.buffer_callback`, the kernels writing into XLA's result
buffers; `jax.pure_callback` where that is missing or on another
platform).  Its jvp rule is gradlang's forward mode
(`dsl.function.JvpFunction`: through grad blocks, their transposition),
as such an operation linear in the tangents, whose transpose rule is f's
backward pass (`dsl.function.VjpFunction`) as another one.  So
`jax.jvp`, `jax.grad`, `jacfwd`, `jacrev`, `hessian` and their
compositions, to any order, differentiate our compiled derivatives (grad
blocks included), and reverse mode runs exactly f and its backward pass,
as a `jax.custom_vjp` would.  One operation is kept per signature and
constants' values (`Call`), so that JAX's caches hold; an eager call
runs the kernels directly, with nothing for XLA to compile.

It works under `jit` (the shapes of the results come from f's IR at trace
time), the autodiff transforms and `vmap`, and inside `shard_map`, where
a call's results vary over the manual mesh axes its inputs vary over, as
JAX's own operations' do (`dsl.bridge.vary_together`: a replicated
weight's cotangent is summed over the devices).  Under `vmap` a `.grad`
function, written for one example, runs for every example at once in the
program `dsl.vmap` runs (`Call.stacked`: its reductions stay per example;
f's backward pass too, so `vmap` of `grad` is one program, and so are
`grad` and `jvp` of the `vmap`, that program's own), or, where
that program does not stack, once per example (`jax.lax.map`; eagerly a
Python loop, which compiles nothing).  Where the batch is of tangents or
cotangents alone (`jacfwd`, `jacrev`, `hessian`), one stacked program
computes them all within `STACKED_ELEMENTS`, as `dsl.jacfwd` does; a
batch of primals with their tangents or with a tangent shared (`vmap` of
`jvp`) is the stacked jvp program, and a batch of Jacobians (`vmap` of
`jacfwd`, `jacrev`, `hessian`) that program stacked again.  A backward
pass computes the cotangents JAX asks for alone (`jax.grad` with respect
to the weights computes none for the data).
Forward mode runs f's jvp program, which computes f's value too, beside f
itself (JAX asks for the value and the tangents separately); a tangent
that may be other than zero for an argument without a gradient (a const
float JAX differentiates) is an `ArgumentError`.  Arguments
are checked (dtype, rank, dimensions, against f's signature) at trace
time: `ArgumentError` (a symbolic shape of jax.export's too); one found
only from the values (an index out of range) is raised as itself by a call outside `jit`, and inside it as JAX
wraps a callback's errors (`JaxRuntimeError`).
A weakly typed number (a Python float or int that `jit` or `grad` made a
tracer, `jnp.asarray(0.5)`) is taken as a Python number is: f32 beside
f32 arrays (with `jax_enable_x64` it is an f64 tracer, which JAX's own
operations take so too), in its parameter's annotated dtype, f64 or i64
too without `jax_enable_x64` (`jax.jit(f)(x, 2)` as `f(x, 2)`).
Floats are f32 or f64; without `jax_enable_x64` JAX makes every float f32,
and so a result the program makes f64 (from a Python float, an f64 param)
comes back f32, and an array for a parameter annotated f64 (or i64) is
an `ArgumentError` saying to enable it.  jax is imported when `to_jax` is
first called, never by `import dsl`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import numpy as np

from dsl.aot_bridge import AotJax
from dsl.bridge import (Bridged, bind_foreign, bridged, jax_halves_widened, known_shape,
                         manual_axes, numbers_as_bound, refuse_extended_dtypes, vary_together)
from dsl.dask_bridge import placeholder
from dsl.forward import STACKED_ELEMENTS
from dsl.function import (Compiled, JvpFunction, Stacked, VjpFunction, backward_function,
                          batched_function, jvp_function, result_types, stacked_jvp_function,
                          stacked_vjp_function)
from dsl.jax_ffi import Plan, ffi_target
from gradlang.compiler.pipeline import Program
from gradlang.runtime.aot import AotFunction, AotGradient
from gradlang.runtime.args import SUPPORTED, plain
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.common import require_host_room
from gradlang.runtime.errors import ArgumentError, GradError, called
from gradlang.runtime.forking import cached_attribute


def to_jax(f: Compiled) -> "JaxFunction":
    """f as a JAX function that JAX differentiates, in both modes and to any
    order, with gradlang's derivatives (of a gradc-compiled module's
    function, first order: `dsl.aot_bridge`)."""
    if isinstance(f, (AotFunction, AotGradient)):
        return AotJax(f)
    return JaxFunction(bridged(f, "to_jax"))


class JaxFunction(Bridged):
    library = "jax"

    @user_facing
    def __call__(self, /, *args, **kwargs):
        import jax
        import jax.numpy as jnp
        f = self.f
        # (without x64) id of a weakly typed number -> the dtype a Python number is bound in
        weak: dict[int, np.dtype] = {}

        def stand_in(value, where: str):
            if isinstance(value, np.ndarray) and value.dtype in SUPPORTED:
                # (a masked array refused first: JAX's ValueError, not ours, said so;
                # another dtype: binding's error names it)
                value = jnp.asarray(plain(where, value, f.span))
            if not isinstance(value, jax.Array):  # tracers are jax.Arrays too
                return value, None
            # (a run converts the value JAX holds to the dtype bound: `Call._bound_to`)
            return placeholder(known_shape(value, where, f),
                               weak.get(id(value), value.dtype)), value

        refuse_extended_dtypes(f, self.__name__, args, kwargs)
        args, kwargs = jax_halves_widened(f, args, kwargs)
        args, kwargs, dtypes = numbers_as_bound(f, args, kwargs)
        weak.update(dtypes)
        bound, by_name = bind_foreign(f, self.__name__, args, kwargs, stand_in)
        return f.format(apply(f, bound, by_name))


def apply(f: Compiled, bound: dict[str, Any], traced: dict[str, Any]) -> tuple:
    """f on arguments `bound` (validated; placeholders for the traced
    ones) where `traced` (name -> JAX value) are the inputs JAX sees."""
    import jax
    names = tuple(traced)
    call = _call(f, bound, names)
    if any(isinstance(v, jax.core.Tracer) for v in traced.values()):
        # under jit XLA makes the results before any driver runs (an eager
        # call's driver refuses them itself, at the expression making them)
        for shape, dtype in call.outs:
            require_host_room(shape, dtype, "its result" if len(call.outs) == 1
                              else "one of its results", f.span)
    call.failed.clear()
    try:
        return tuple(_bind([traced[n] for n in names], call))
    except Exception:
        if call.failed:  # a call outside jit ran the callback now: its own error, not JAX's
            raise call.failed[0] from None
        raise


def _call(f: Compiled, bound: dict[str, Any], names: tuple[str, ...],
          keep: Optional[tuple[int, ...]] = None) -> "Call":
    """The `Call` of f on `bound` with `names` traced, giving its results
    `keep` (None: all), made once per signature, constants' values and
    `jax_enable_x64` (which sets the results' dtypes): JAX caches what it
    traces and compiles under the operation's `call`, which holds a copy
    of each constant array (the values it is found by)."""
    import jax
    traced_statics = f.static_names(bound) & set(names)
    if traced_statics:
        _by_value_error(f, min(traced_statics))
    key = (jax.config.jax_enable_x64, names, keep,
           tuple((n, a.dtype.str, a.shape,
                  None if n in names else np.ascontiguousarray(a).tobytes())
                 for n, a in bound.items()))
    calls = f.__dict__.setdefault("_jax_calls", {})
    call = calls.get(key)
    if call is None:
        if len(calls) >= _CALLS_KEPT:
            calls.clear()
        # (the constants as keyed: a module param's array, modified in place
        # later and set again to these values, found this call reading the
        # modified one)
        call = calls[key] = Call(f, {n: a.copy() if n not in names and isinstance(a, np.ndarray)
                                     else a for n, a in bound.items()}, names, keep)
    return call


_CALLS_KEPT = 64  # per function


class Call:
    """One operation JAX sees (`_primitive()`'s parameter): f on `bound`,
    whose values for `names` (placeholders there) are the operation's
    inputs, giving f's results `keep`.  `run` computes them on the host.

    Where f is a `JvpFunction` and `keep` are output tangents, the
    operation is linear in f's tangents (`linear`): JAX transposes it
    (reverse mode) to the backward pass of the function f differentiates.
    A call made by `stacked` for a Jacobian computes its `base` call for
    each of several one-hot values of one input at once; its derivatives
    are JAX's vmap of the base call's.  One made for a `vmap` is a call of
    f's `Stacked` function like any other: differentiated as one (so `grad`
    of a `vmap` runs one backward pass, not one per example)."""

    def __init__(self, f: Compiled, bound: dict[str, Any], names: tuple[str, ...],
                 keep: Optional[tuple[int, ...]]):
        import jax
        self.f, self.bound, self.names = f, bound, names
        def refuse(name: str) -> None:  # a JAX array's value is unknown while traced
            if name in names:
                _by_value_error(f, name)
        outs = f.retrying_by_value(bound, lambda: result_types(f, bound), refuse)
        self.all_outs = outs
        self.keep = tuple(range(len(outs))) if keep is None else keep
        # Without jax_enable_x64 JAX holds no 64-bit array: a result the program
        # makes f64 (from a Python float, an f64 param) reaches JAX as f32, and a
        # tangent or cotangent for it comes back f32, cast to what f was bound with.
        self.outs = [(outs[k][0], jax.dtypes.canonicalize_dtype(outs[k][1]))
                     for k in self.keep]
        self.failed: list[GradError] = []  # what `run` raised, which JAX wraps
        self.linear = (isinstance(f, JvpFunction)
                       and all(k >= len(outs) // 2 for k in self.keep))
        self.base: Optional[tuple[Call, tuple[int, ...]]] = None  # (the call, its stacked inputs)

    def run(self, *arrays) -> tuple[np.ndarray, ...]:
        """The results on the host, from the values of `names`."""
        try:
            results = self.f.call_bound(self._bound_to(arrays))
        except GradError as err:  # an index out of range, known only from the values
            self.failed.append(err)
            raise
        return tuple(np.asarray(self.f.target.to_host(results[k]), dtype)
                     for k, (_, dtype) in zip(self.keep, self.outs))

    def _bound_to(self, arrays: Sequence[Any]) -> dict[str, np.ndarray]:
        """f's arguments with the values `arrays` for `names` (NumPy arrays,
        or XLA's buffers, which take no dtype in `np.asarray`)."""
        values = {n: np.asarray(np.asarray(a), self.bound[n].dtype)
                  for n, a in zip(self.names, arrays)}
        return {n: values.get(n, a) for n, a in self.bound.items()}

    def run_into(self, buffers: Sequence[Any], *arrays) -> None:
        """`run` into XLA's result `buffers` (under `jit` on the CPU): the
        kernels write a result straight into its buffer where they make
        one of its dtype on the host (`InPlace`); any other result is
        copied in."""
        try:
            if self._in_place is not None:
                self._in_place(buffers, arrays)
                return
            results = self.f.call_bound(self._bound_to(arrays))
        except GradError as err:
            self.failed.append(err)
            raise
        for k, buffer in zip(self.keep, buffers):
            np.copyto(np.asarray(buffer), self.f.target.to_host(results[k]), casting="unsafe")

    @cached_attribute
    def _in_place(self) -> Optional["InPlace"]:
        """The program of this call's signature as an `InPlace`, found once
        (a `Call` is one signature; what varies is the traced values).
        None on a target whose arrays are not the host's."""
        if not self.f.target.is_array(np.empty(0)):
            return None

        def find() -> Program:
            return self.f.program(self.f.on_target(self.bound))
        return InPlace(self, self.f.retrying_by_value(self.bound, find))

    @cached_attribute
    def ffi_plan(self) -> Optional[Plan]:
        """The XLA FFI target that runs this call's kernels on XLA's
        buffers with no Python, and what it passes it (`dsl.jax_ffi`),
        found once, where the call keeps every result of its program in
        its dtype and the program is a straight sequence of kernels; else
        None (the callback runs it)."""
        try:
            in_place = self._in_place
        except GradError:  # raised again where the callback runs the call
            return None
        if in_place is None or in_place.cast or self.keep != tuple(range(len(self.all_outs))):
            return None
        return ffi_target(in_place.program, self.bound, self.names, self.outs)

    def tangents(self, primals: Sequence[Any], tangents: Sequence[Any]) -> list:
        """The output tangents (JAX's jvp rule): a linear `Call` of f's
        `JvpFunction` along the float inputs whose tangents are not zero
        (None or JAX's symbolic zero)."""
        from jax.interpreters import ad
        if self.base is not None:
            indices = self.base[1]
            return self._per_value(lambda base, values: base.tangents(
                values[:len(primals)], values[len(primals):]), [*primals, *tangents],
                [i in indices for i in range(len(primals))] * 2)
        floats = set(self.f.differentiable_names(self.bound))
        active = [(n, t) for n, t in zip(self.names, tangents)
                  if n in floats and t is not None and type(t) is not ad.Zero]
        refused = [n for n, t in zip(self.names, tangents) if n not in floats and _nonzero(t)]
        if refused:
            # (JAX would take its derivative as zero: silently wrong)
            raise ArgumentError(f"JAX differentiates {called(self.f.name)} with respect to "
                                f"{refused[0]!r}, which has no gradient (it is const); pass "
                                "it as a Python number, or through jax.lax.stop_gradient",
                                self.f.span)
        float_outs = [k for k, (_, dtype) in zip(self.keep, self.outs) if dtype.kind == "f"]
        found = []
        if active and float_outs:
            jf = jvp_function(self.f, [n for n, _ in active])
            jf_bound = dict(self.bound)
            for tangent_name, (name, _) in zip(jf.tangent_names, active):
                jf_bound[tangent_name] = placeholder(self.bound[name].shape,
                                                     self.bound[name].dtype)
            n_out = len(self.all_outs)
            lin = _call(jf, jf_bound, self.names + jf.tangent_names,
                        tuple(n_out + k for k in float_outs))
            found = _bind([*primals, *(t for _, t in active)], lin)
        by_output = dict(zip(float_outs, found))
        return [by_output[k] if k in by_output else _zero_tangent(shape, dtype)
                for k, (shape, dtype) in zip(self.keep, self.outs)]

    def transpose(self, cts: Sequence[Any], args: Sequence[Any]) -> list:
        """The cotangents of a linear call's tangents (JAX's transpose
        rule): a `Call` of the backward pass (`VjpFunction`) of the
        function whose jvp this is, at its primals, on the cotangents."""
        import jax
        from jax.interpreters import ad
        if all(type(ct) is ad.Zero for ct in cts):
            return [None] * len(args)
        if self.base is not None and self.base[0].linear_call is not None:
            return self._transposed_per_value(cts, args)
        jf = self.f
        n_primal = len(self.names) - len(jf.tangent_names) if self.linear else 0
        if not self.linear or any(map(ad.is_undefined_primal, args[:n_primal])):
            raise NotImplementedError(f"JAX transposed {called(jf.name)}, which is not linear in "
                                      "those inputs (jax.linear_transpose of a function that "
                                      "is not linear?)")
        f, n_out = jf.inner, len(self.all_outs) // 2
        bound = {n: a for n, a in self.bound.items() if n not in jf.tangent_names}
        # the backward pass of the arguments with tangents alone (jax.grad
        # with respect to the weights computes no gradient of the data)
        floats = f.differentiable_names(bound)
        wanted = tuple(n for n in floats if n in jf.active)
        # (every float: the backward pass the other transforms run, compiled once)
        vf = backward_function(f, n_out, None if len(wanted) == len(floats) else wanted)
        vf_bound, ct_values = dict(bound), []
        given = {k - n_out: ct for k, ct in zip(self.keep, cts) if type(ct) is not ad.Zero}
        for j, (name, (shape, dtype)) in enumerate(zip(vf.ct_names, self.all_outs)):
            if j in given:
                vf_bound[name] = placeholder(shape, dtype)
                ct_values.append(given[j])
            else:
                vf_bound[name] = np.zeros(shape, dtype)
        backward = _call(vf, vf_bound, self.names[:n_primal] + tuple(
            vf.ct_names[j] for j in sorted(given)), tuple(wanted.index(n) for n in jf.active))
        grads = _bind([*args[:n_primal], *ct_values], backward)
        # a tangent's cotangent in its dtype: a param is bound in its declared
        # one (an f64 array for an f32 param computes in f32), JAX's is the array's
        return [None] * n_primal + [jax.lax.convert_element_type(g, t.aval.dtype)
                                    for g, t in zip(grads, args[n_primal:])]

    @property
    def linear_call(self) -> Optional["Call"]:
        """The linear call this one is, or stacks (a linear call stacked,
        then stacked again: `vmap` of `vmap` of `jvp`), whose inputs it
        takes; else None."""
        if self.linear:
            return self
        return None if self.base is None else self.base[0].linear_call

    def _transposed_per_value(self, cts: Sequence[Any], args: Sequence[Any]) -> list:
        """A stacked linear call's transpose rule: JAX's vmap of its base's
        over the cotangents and the stacked primals (the tangents being
        transposed are not values: they reach the base by closure).  A
        tangent given once for the whole batch gets the sum of the
        examples' cotangents."""
        base, indices = self.base
        n_primal = len(base.names) - len(base.linear_call.f.tangent_names)
        primals = list(args[:n_primal])
        per_example = self._per_value(
            lambda base, values: base.transpose(
                values[:len(cts)], [*values[len(cts):], *args[n_primal:]])[n_primal:],
            [*cts, *primals], [True] * len(cts) + [i in indices for i in range(n_primal)])
        return [None] * n_primal + [
            ct if ct is None or n_primal + j in indices else ct.sum(axis=0)
            for j, ct in enumerate(per_example)]

    def stacked(self, mapped: Sequence[bool], size: int) -> Optional["Call"]:
        """This call for `size` values of its `mapped` inputs at once
        (`dsl.function.Stacked`: one program, one run), where the one mapped
        input is the tangent of a jvp along one argument (`jacfwd`) or a
        cotangent of a backward pass (`jacrev`) and the stacked values fit
        in `STACKED_ELEMENTS`, or where this call is not linear (f itself,
        or its backward pass: `vmap`, `vmap` of `grad`), is linear with a
        tangent or one of f's own arguments among its mapped inputs (`vmap`
        of `jvp`, the tangent per example or shared), its mapped inputs
        are not constants and the program stacks (as `dsl.vmap`'s, with no
        bound on its size: the batch is the caller's), or is itself a
        stacked call (`vmap` of a Jacobian) whose stacked program stacks
        again within `STACKED_ELEMENTS` (every example's one-hot values);
        else None."""
        if not size:
            return None
        indices = tuple(i for i, m in enumerate(mapped) if m)
        names, f = [self.names[i] for i in indices], self.f
        stacked: Optional[Stacked] = None
        if len(names) == 1 and self.linear and f.tangent_names == (names[0],):
            stacked = stacked_jvp_function(f.inner, f.active[0])
        elif (len(names) == 1 and isinstance(f, VjpFunction) and names[0] in f.ct_names
              and self.base is None):
            stacked = stacked_vjp_function(f.inner, f.n_outputs, f.ct_names.index(names[0]),
                                           f.wrt)
        one_hot = stacked is not None
        if one_hot:  # a Jacobian's one-hot vectors, within the bound
            per_slice = stacked.per_slice(self.bound)
            if per_slice is None or per_slice * size > STACKED_ELEMENTS:
                return None
        elif (not f.static_names(self.bound) & set(names)
              and not (self.linear and set(names) <= _derivative_inputs(f.inner))):
            # a linear call mapped along its primals alone, where those are the
            # tangents or cotangents of the derivative it differentiates (a
            # Jacobian's one-hot values, in a Hessian or a jacfwd of a jacrev),
            # is left to run per example: JAX's next vmap maps its tangent,
            # which then stacks as a Jacobian's one-hot vectors (stacking both
            # ran a jacfwd of a jacrev of 60 outputs 10 times slower).  Mapped
            # along f's own arguments (vmap of jvp, the tangent shared) it stacks.
            stacked = batched_function(f, names)
            if not stacked.stacks(self.bound):
                return None
            if self.base is not None:  # each example's one-hot values: within the bound too
                per_slice = stacked.per_slice(self.bound)
                if per_slice is None or per_slice * size > STACKED_ELEMENTS:
                    return None
        else:
            return None
        call = _call(stacked, {**self.bound, **{
            n: placeholder((size, *self.bound[n].shape), self.bound[n].dtype) for n in names}},
            self.names, self.keep)
        if one_hot or self.linear or self.base is not None:
            call.base = (self, indices)  # its derivatives: JAX's vmap of this call's
        return call

    def _per_value(self, rule: Callable, values: list, stacked: list[bool]) -> list:
        """A stacked call's rule: JAX's vmap of `rule(base call, values)`
        over the `stacked` values (the stacked input, its tangent, the
        cotangents), zeros (None or symbolic) passing through unbatched."""
        import jax
        from jax.interpreters import ad
        base = self.base[0]
        values = list(values)
        batched = [i for i, v in enumerate(values)
                   if stacked[i] and v is not None and type(v) is not ad.Zero]

        def one(*slices):
            for i, v in zip(batched, slices):
                values[i] = v
            return rule(base, values)

        return jax.vmap(one)(*(values[i] for i in batched))


class InPlace:
    """A `Call`'s program run on XLA's buffers under `jit` on the CPU,
    with what a call checks and works out done once, when JAX compiles
    it: XLA hands buffers of the shapes and dtypes the call declared,
    C-contiguous (row-major: the lowering's default), each result its own
    memory and none an input's, so the driver for C-contiguous arguments
    (`Program.run_contiguous`, where the call's constants are too) takes
    them as they are, with none of `OutSpec.buffers`' checks of a
    caller's `out=`.  A result JAX narrows (f64 without `jax_enable_x64`)
    is made by the kernels and cast into its buffer.  It holds nothing a
    call changes, so threads run it at once.  Runs record on no
    `dsl.Tape` (JAX differentiates them)."""

    def __init__(self, call: Call, program: Program):
        names = list(call.bound)
        # each traced input: its slot among the driver's arguments, the dtype f is bound in
        self.inputs = [(names.index(n), call.bound[n].dtype) for n in call.names]
        self.arguments = list(call.bound.values())  # (the traced ones replaced each run)
        self.n_results = len(call.all_outs)
        self.written, self.cast = [], []  # (buffer index, result index)
        for i, (k, (_, dtype)) in enumerate(zip(call.keep, call.outs)):
            (self.written if dtype == call.all_outs[k][1] else self.cast).append((i, k))
        contiguous = all(a.flags.c_contiguous for n, a in call.bound.items()
                         if n not in call.names)
        self.program = program
        self.run = program.run_contiguous if contiguous else program.run

    def __call__(self, buffers: Sequence[Any], arrays: Sequence[Any]) -> None:
        """Run into `buffers` (XLA's results) on `arrays` (its inputs'
        buffers, which take no dtype in `np.asarray`)."""
        arguments = list(self.arguments)
        for (slot, dtype), array in zip(self.inputs, arrays):
            array = np.asarray(array)
            arguments[slot] = array if array.dtype == dtype else array.astype(dtype)
        out: list[Optional[np.ndarray]] = [None] * self.n_results
        for i, k in self.written:
            out[k] = np.asarray(buffers[i])
        results = self.run(*arguments, out=tuple(out))
        for i, k in self.cast:
            np.copyto(np.asarray(buffers[i]), results[k], casting="unsafe")


def _derivative_inputs(f: Compiled) -> set[str]:
    """The tangents (of a `JvpFunction`) or cotangents (of a `VjpFunction`)
    that f takes besides its function's arguments; none for another f."""
    if isinstance(f, JvpFunction):
        return set(f.tangent_names)
    if isinstance(f, VjpFunction):
        return set(f.ct_names)
    return set()


def _nonzero(tangent: Any) -> bool:
    """Whether a tangent JAX gives may be other than zero: it is not None,
    JAX's symbolic zero, an integer's (float0), or a known array of zeros
    (`jax.jvp`'s, outside jit)."""
    import jax
    from jax.interpreters import ad
    if tangent is None or type(tangent) is ad.Zero \
            or jax.dtypes.result_type(tangent) == jax.dtypes.float0:
        return False
    return isinstance(tangent, jax.core.Tracer) or bool(np.any(np.asarray(tangent)))


def _zero_tangent(shape: tuple, dtype: np.dtype):
    """The tangent of a result that its inputs' tangents leave zero
    (JAX's float0 for an integer one)."""
    import jax
    import jax.numpy as jnp
    if dtype.kind == "f":
        return jnp.zeros(shape, dtype)
    return np.zeros(shape, jax.dtypes.float0)


@functools.cache
def _primitive():
    """The JAX primitive `gradlang_call`, whose `call` parameter (a `Call`)
    says what it computes: its value on the host (eagerly, and under jit
    through a callback), shapes from f's IR, a jvp rule (gradlang's
    forward mode), a transpose rule for linear calls (gradlang's reverse
    mode), and under vmap a stacked call (`Call.stacked`), or one call per
    example (`jax.lax.map`, or eagerly a Python loop): a `.grad` function
    is written for one example, and its reductions would sum over a batch
    axis it was handed."""
    import jax
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    p = Primitive("gradlang_call")
    p.multiple_results = True

    def impl(*arrays, call: Call):
        return [jax.device_put(r) for r in call.run(*arrays)]

    def abstract(*avals, call: Call):
        axes = frozenset().union(*map(manual_axes, avals))
        if not axes:
            return [jax.core.ShapedArray(shape, dtype) for shape, dtype in call.outs]
        # inside shard_map, the results vary over every manual axis an input
        # varies over (`_bind` made every input vary over all of them), as a
        # result of JAX's own operations does: typed as replicated, a local
        # value was taken for every device's (out_specs=P()), and a
        # replicated weight's cotangent was not summed over the devices
        like = next((a for a in avals if manual_axes(a) == axes), None)
        if like is None:  # (bound other than by `_bind`: as JAX's standard_vma_rule says)
            raise ValueError(f"gradlang_call requires varying manual axes to match, but got "
                             f"{[sorted(manual_axes(a)) for a in avals]}")
        replicated = jax.sharding.NamedSharding(like.sharding.mesh, jax.sharding.PartitionSpec())
        return [like.update(shape=shape, dtype=dtype, weak_type=False, sharding=replicated)
                for shape, dtype in call.outs]

    def lowered(*values, call: Call):
        shapes = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in call.outs]
        return jax.pure_callback(call.run, shapes, *values)

    def lowered_on_cpu(*values, call: Call):
        # XLA's own result buffers, which the kernels fill: a fifth of a
        # pure_callback's cost for a small call, a quarter at 1e6 elements
        # (no copy of the results; `benchmarks/run.py --only interop`), and
        # with no Python at all where the kernels are all the call runs
        shapes = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in call.outs]
        # (an input JAX holds in another dtype than f is bound in: the callback converts it)
        plan = call.ffi_plan
        if plan is not None and all(
                v.dtype == call.bound[n].dtype for n, v in zip(call.names, values)):
            return jax.ffi.ffi_call(plan.target, shapes)(*values, *plan.constants, plan.numbers)
        return buffer_callback(
            lambda _, outs, *args: call.run_into(outs, *args),
            shapes)(*values)

    def jvp(primals, tangents, *, call: Call):
        return _bind(primals, call), call.tangents(primals, tangents)

    def transpose(cts, *args, call: Call):
        return call.transpose(cts, args)

    def batched(args, dims, *, call: Call):
        mapped = [d is not None for d in dims]  # None: not mapped
        moved = [jax.numpy.moveaxis(a, d, 0) if m else a for a, d, m in zip(args, dims, mapped)]

        def one(slices):
            each = iter(slices)
            return _bind([next(each) if m else a for a, m in zip(moved, mapped)], call)

        size = next(a.shape[0] for a, m in zip(moved, mapped) if m)
        stacked = call.stacked(mapped, size)
        if stacked is not None:
            outs = _bind(moved, stacked)
        elif size and not any(isinstance(a, jax.core.Tracer) for a in moved):
            # eager: the loop in Python (lax.map would compile a new loop each time)
            per_example = [one([a[i] for a, m in zip(moved, mapped) if m]) for i in range(size)]
            outs = [jax.numpy.stack(o) for o in zip(*per_example)]
        else:
            outs = jax.lax.map(one, [a for a, m in zip(moved, mapped) if m])
        return outs, [0] * len(outs)

    p.def_impl(impl)
    p.def_abstract_eval(abstract)
    mlir.register_lowering(p, mlir.lower_fun(lowered, multiple_results=True))
    try:  # experimental in JAX 0.7 to 0.10 at least; other versions take pure_callback
        from jax.experimental.buffer_callback import buffer_callback
    except ImportError:
        pass
    else:
        mlir.register_lowering(p, mlir.lower_fun(lowered_on_cpu, multiple_results=True),
                               platform="cpu")
    ad.primitive_jvps[p] = jvp
    ad.primitive_transposes[p] = transpose
    batching.primitive_batchers[p] = batched
    return p


def _bind(values: Sequence[Any], call: Call) -> list:
    """`_primitive()` bound to `values` for `call`, each made to vary over
    every manual mesh axis (of shard_map) any of them varies over
    (`vary_together`), as JAX's own operations make their operands."""
    return _primitive().bind(*vary_together(values)[0], call=call)


def _by_value_error(f: Compiled, name: str):
    raise ArgumentError(f"argument {name!r} of {called(f.name)} picks the program by its value (a "
                        "const integer, or one used as a size): pass a Python int, not a "
                        "JAX array, whose value is not known while JAX traces", f.span)
