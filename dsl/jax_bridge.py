"""`dsl.to_jax(f)`: a compiled function as a JAX function with a custom VJP.

Contract: `to_jax(f)(*args, **kwargs)` takes f's arguments as JAX arrays
(NumPy arrays are made JAX arrays, as `jnp` functions do; Python numbers
are constants, so const arguments such as an axis stay static) and the
module params f reads as keyword arrays (a param left out takes the
module's value and gets no gradient), and returns JAX arrays shaped as
f's results.  It is a `jax.custom_vjp` function whose forward runs f's
compiled kernels on the host through `jax.pure_callback`, and whose
backward is again such a function, made from f's backward pass as a
compiled function (`dsl.function.VjpFunction`), so `jax.grad` of it to
any order differentiates our compiled gradients (grad blocks included).
One such function is kept per signature and constants' values, so that
JAX's caches hold: an eager call compiles its callback once.

It works under `jit` (the shapes of the results come from f's IR at trace
time), `grad` and `vmap`.  Under `vmap` the callback runs once per batch
element (`vmap_method="sequential"`): a `.grad` function is written for
one example, and its reductions would sum over a batch axis it was handed
(`"expand_dims"`, which passes the batch at once, would make `sum(x)` of
a batch one number).  Arguments are checked (dtype, rank, dimensions,
against f's signature) at trace time: `ArgumentError`; one found only from
the values (an index out of range) is raised as itself by a call outside
`jit`, and inside it as JAX wraps a callback's errors (`JaxRuntimeError`).
Floats are f32 or f64; without `jax_enable_x64` JAX makes every float f32,
and so a result the program makes f64 (from a Python float, an f64 param)
comes back f32, and an array for a parameter annotated f64 (or i64) is
an `ArgumentError` saying to enable it.  jax is imported when `to_jax` is first called, never by
`import dsl`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dsl.bridge import Bridged, bind_foreign, bridged
from dsl.dask_bridge import placeholder
from dsl.function import Compiled, backward_function, result_types
from gradlang.compiler.shapes import NeedsValue
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError, GradError


def to_jax(f: Compiled) -> "JaxFunction":
    """f as a JAX function differentiable to any order by `jax.grad`."""
    return JaxFunction(bridged(f, "to_jax"))


class JaxFunction(Bridged):
    library = "jax"

    @user_facing
    def __call__(self, *args, **kwargs):
        import jax
        import jax.numpy as jnp
        f = self.f

        def stand_in(value, where: str):
            if isinstance(value, np.ndarray):
                value = jnp.asarray(value)
            if not isinstance(value, jax.Array):  # tracers are jax.Arrays too
                return value, None
            return placeholder(value.shape, value.dtype), value

        if not jax.config.jax_enable_x64:
            _refuse_64_bit_annotations(f, args, kwargs)
        bound, by_name = bind_foreign(f, self.__name__, args, kwargs, stand_in)
        return f.format(apply(f, bound, by_name))


def _refuse_64_bit_annotations(f: Compiled, args, kwargs) -> None:
    """Without jax_enable_x64 JAX holds no 64-bit array, so an array for a
    parameter annotated f64 or i64 (a NumPy one too, which JAX makes 32-bit)
    cannot be taken: an `ArgumentError` saying so."""
    import jax
    given = {**dict(zip((s.name for s in f.specs), args)), **kwargs}
    for spec in f.specs:
        value = given.get(spec.name)
        kinds, what, narrow = _64_BIT.get(spec.dtype, ("", "", ""))
        if isinstance(value, (np.ndarray, jax.Array)) and np.dtype(value.dtype).kind in kinds:
            raise ArgumentError(f"argument {spec.name!r} of {f.name}() is annotated "
                                f"{spec.dtype}, and without jax_enable_x64 JAX makes every "
                                f"{what} array {narrow}; enable it (jax.config.update("
                                f"'jax_enable_x64', True)) or annotate {narrow}", f.span)


# a 64-bit annotation -> the dtype kinds JAX narrows, what they are, to what
_64_BIT = {"f64": ("f", "float", "f32"), "i64": ("iu", "integer", "i32")}


def apply(f: Compiled, bound: dict[str, Any], traced: dict[str, Any]) -> tuple:
    """f on arguments `bound` (validated; placeholders for the traced
    ones) where `traced` (name -> JAX value) are the inputs JAX sees."""
    names = tuple(traced)
    traced_statics = f.static_names(bound) & set(names)
    if traced_statics:
        _by_value_error(f, min(traced_statics))
    # one JAX function per signature and constants' values: JAX caches what
    # it compiles for a call (the callback's XLA program) on the function
    key = (names, tuple((n, a.dtype.str, a.shape,
                         None if n in traced else np.ascontiguousarray(a).tobytes())
                        for n, a in bound.items()))
    calls = f.__dict__.setdefault("_jax_calls", {})
    entry = calls.get(key)
    if entry is None:
        if len(calls) >= _CALLS_KEPT:
            calls.clear()
        entry = calls[key] = _jax_function(f, bound, names)
    call, failed = entry
    failed.clear()
    try:
        return call(*(traced[n] for n in names))
    except Exception:
        if failed:  # a call outside jit ran the callback now: its own error, not JAX's
            raise failed[0] from None
        raise


_CALLS_KEPT = 64  # per function


def _jax_function(f: Compiled, bound: dict[str, Any], names: tuple[str, ...]):
    """f as a `jax.custom_vjp` function of the arguments `names` (the
    others are `bound`'s values), and the list where its callback puts
    the error it raised (which JAX wraps in one of its own)."""
    import jax
    try:
        outs = result_types(f, bound)
    except NeedsValue as need:
        if need.name in names:
            _by_value_error(f, need.name)
        f.by_value(need, bound)
        outs = result_types(f, bound)

    # Without jax_enable_x64 JAX holds no 64-bit array: a result the program
    # makes f64 (from a Python float, an f64 param) reaches JAX as f32, and a
    # cotangent for it comes back f32, cast to what the program was bound with.
    jax_dtypes = [jax.dtypes.canonicalize_dtype(dtype) for _, dtype in outs]

    failed: list[GradError] = []  # what the callback raised, which JAX wraps

    def run(*arrays):  # on the host, with the values of `names` (JAX arrays there)
        values = {n: np.asarray(a, bound[n].dtype) for n, a in zip(names, arrays)}
        try:
            results = f.call_bound({n: values.get(n, a) for n, a in bound.items()})
        except GradError as err:  # an index out of range, known only from the values
            failed.append(err)
            raise
        return tuple(np.asarray(f.target.to_host(r), dtype) for r, dtype in
                     zip(results, jax_dtypes))

    @jax.custom_vjp
    def call(*values):
        shapes = tuple(jax.ShapeDtypeStruct(shape, dtype)
                       for (shape, _), dtype in zip(outs, jax_dtypes))
        return jax.pure_callback(run, shapes, *values, vmap_method="sequential")

    def forward(*values):
        return call(*values), values

    def backward(values, cts):
        vjp = backward_function(f, len(outs))
        vjp_bound, vjp_traced = dict(bound), dict(zip(names, values))
        for name, ct, (shape, dtype) in zip(vjp.ct_names, cts, outs):
            if dtype.kind == "f":
                vjp_bound[name] = placeholder(shape, dtype)
                vjp_traced[name] = ct
            else:  # an integer result's cotangent (JAX's float0) is zero
                vjp_bound[name] = np.zeros(shape, dtype)
        grads = dict(zip(f.differentiable_names(bound), apply(vjp, vjp_bound, vjp_traced)))
        return tuple(grads.get(n) for n in names)  # None: no gradient (a const, an integer)

    call.defvjp(forward, backward)
    return call, failed


def _by_value_error(f: Compiled, name: str):
    raise ArgumentError(f"argument {name!r} of {f.name}() picks the program by its value (a "
                        "const integer, or one used as a size): pass a Python int, not a "
                        "JAX array, whose value is not known while JAX traces", f.span)

