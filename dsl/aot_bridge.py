"""`dsl.to_torch` and `dsl.to_jax` of a function of a gradc-compiled
module (`runtime.aot.AotFunction`) or of its gradient (`AotGradient`):
first order, from the programs the module holds.

Contract: `AotBridged` is what both bridges share; `flat` and `arranged`
flatten a call's (nested) results and put them back.
`dsl.torch_bridge.AotTorch(f)(*args, **kwargs)` (there, beside the torch
helpers it shares) takes f's arguments as torch
tensors (numbers and NumPy arrays are constants) and the module params f
reads as keyword tensors, as `to_torch` of a loaded function does, shares
their memory with the kernels, and returns tensors over the results.
Where autograd records (grad enabled, an input requiring grad) the call is
one `torch.autograd.Function` whose backward runs the pullback program
compiled for the call's signature: `loss.backward()` and
`torch.autograd.grad` work, as a training loop needs.  Of an `AotGradient`
(`to_torch(dsl.value_and_grad(f))`) it runs the compiled gradient program.
What needs f's IR is an `ArgumentError` saying to load the `.grad` file
with `dsl.load` (`dsl.function.needs_ir`): a second derivative (a backward
through the gradients a backward under create_graph=True gave, or
through an `AotGradient`'s results, which are recorded for that), torch.func
transforms, and torch's tracers (jit.trace, export, make_fx, FakeTensorMode,
which would keep the results as constants).  Under torch.compile a call is
a graph break: it runs eagerly.

`AotJax(f)(*args, **kwargs)` takes JAX arrays likewise (a float16 or
bfloat16 one for a parameter taking float32 cast to it, as both bridges
of a loaded function cast them) and is a
`jax.custom_vjp` whose forward and backward are `jax.pure_callback`s of the
call and pullback programs, so `jax.grad`, `jax.value_and_grad` and
`jax.vjp` work, under `jax.jit` too (the results' shapes from the output
types the module records for each program: `dsl.aot.out_types`).  Of an
`AotGradient` it is the gradient program's callback, not differentiable.
A second derivative (differentiating the backward) is the `ArgumentError`
above when JAX traces it; forward mode (jax.jvp, jacfwd) is JAX's own
error, which a `custom_vjp` function gets.  Both pickle as their function.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dsl.bridge import (Bridged, as_varying, bind_foreign, jax_halves_widened, known_shape,
                         numbers_as_bound, refuse_extended_dtypes, vary_together)
from dsl.dask_bridge import placeholder
from dsl.function import needs_ir
from gradlang.runtime.aot import AotFunction, AotGradient
from gradlang.runtime.args import SUPPORTED, plain
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError


class AotBridged(Bridged):
    """What both bridges share: the function (or gradient) and the
    function whose programs run."""

    def __init__(self, f: "AotFunction | AotGradient"):
        super().__init__(f)
        self.function = f.f if isinstance(f, AotGradient) else f

    def error_sources(self) -> tuple:
        return ()  # (the module runs without its source)

    @property
    def binding(self) -> "AotFunction":
        return self.function

    def _run(self, arrays: dict[str, Any]) -> tuple:
        """The call's results, flat, and how to arrange them."""
        if isinstance(self.f, AotGradient):
            result = self.f.call_bound(arrays)
            return flat(result), result
        outs, _ = self.function._run("call", arrays)
        return tuple(outs), outs[0] if len(outs) == 1 else tuple(outs)

    @property
    def kind(self) -> str:
        """The kind of the programs a call runs."""
        return self.f.kind if isinstance(self.f, AotGradient) else "call"

    def _check_compiled(self, arrays: dict[str, Any]) -> None:
        """ArgumentError (saying what was compiled) unless a program was
        compiled for the call, before anything records it."""
        f = self.function
        f._program(self.kind, f._signature(arrays), arrays)


def flat(result: Any) -> tuple:
    if isinstance(result, tuple):
        return tuple(a for r in result for a in flat(r))
    return (result,)


def arranged(like: Any, values: list) -> Any:
    """`values` (taken from its front) in the structure of `like`."""
    if isinstance(like, tuple):
        return tuple(arranged(item, values) for item in like)
    return values.pop(0)


class AotJax(AotBridged):
    library = "jax"

    @user_facing
    def __call__(self, /, *args, **kwargs):
        import jax
        import jax.numpy as jnp
        f = self.function
        if f.target.name != "cpu":  # (the callbacks get host arrays)
            raise ArgumentError(f"{self.__name__} runs only a module compiled for the cpu "
                                f"target; this one was compiled for {f.target.name!r}")

        # (without x64) id of a weakly typed number -> the dtype a Python number is bound in
        weak: dict[int, np.dtype] = {}

        def stand_in(value, where: str):
            if isinstance(value, np.ndarray) and value.dtype in SUPPORTED:
                # (made a JAX array, as jnp functions do; a masked array refused
                # first: JAX's ValueError, not ours, said so)
                value = jnp.asarray(plain(where, value))
            if not isinstance(value, (jax.Array, jax.core.Tracer)):
                return value, None
            dtype = np.dtype(value.dtype)
            if dtype not in SUPPORTED:
                raise ArgumentError(f"{where} is a JAX array of dtype {dtype}; gradlang takes "
                                    "float32 and float64 (and int32, int64, bool constants)")
            # (`arrays` converts the value JAX holds to the dtype bound)
            return placeholder(known_shape(value, where, f), weak.get(id(value), dtype)), value

        refuse_extended_dtypes(f, self.__name__, args, kwargs)
        # (refused as "dtype bfloat16", where to_jax of the loaded function and
        # to_torch of this one cast it)
        args, kwargs = jax_halves_widened(f, args, kwargs)
        args, kwargs, dtypes = numbers_as_bound(f, args, kwargs)
        weak.update(dtypes)
        bound, inputs = bind_foreign(f, self.__name__, args, kwargs, stand_in)
        names = tuple(inputs)
        kind, sig = self.kind, f._signature(bound)
        outs = [jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype))
                for dtype, shape in f.out_types(kind, bound)]
        layout = self.f.arrange(outs, sig) if isinstance(self.f, AotGradient) else (
            outs[0] if len(outs) == 1 else tuple(outs))
        shapes = flat(layout)

        def arrays(values) -> dict[str, Any]:
            given = dict(zip(names, values))
            return f._on_target({n: np.asarray(given[n]).astype(a.dtype, copy=False)
                                 if n in given else a for n, a in bound.items()})

        def run(*values):
            results, _ = self._run(arrays(values))
            return tuple(np.asarray(o, s.dtype) for o, s in zip(results, shapes))

        # inside shard_map every input varies over the manual axes any does, and
        # so do the results and cotangents (a callback's are typed replicated)
        values, axes = vary_together(inputs.values())

        @jax.custom_jvp
        def call(*values):
            return [as_varying(r, tuple(axes)) for r in jax.pure_callback(
                run, shapes, *values, vmap_method="sequential")]

        @call.defjvp
        def _(primals, tangents):  # (the gradient's, or forward mode over reverse)
            raise needs_ir(f"a second derivative (or forward mode) of {self.__name__}", f)

        if isinstance(self.f, AotGradient) or not names:
            return arranged(layout, list(call(*values)))
        differentiable = set(f.differentiable_names(bound))
        wrt = [n for n in f.wrt.get(sig, ()) if n in names]  # (the pullback's results)
        grad_shapes = tuple(jax.ShapeDtypeStruct(bound[n].shape, jax.dtypes.canonicalize_dtype(
            bound[n].dtype)) for n in wrt)

        def pullback(*values):
            primals, cts = values[:len(names)], values[len(names):]
            given = arrays(primals)
            _, back = f._vjp_bound(given, read_in_place=given)  # (called at once)
            grads = dict(zip(bound, back(*(np.asarray(ct) for ct in cts))))
            return tuple(np.asarray(grads[n], s.dtype) for n, s in zip(wrt, grad_shapes))

        @jax.custom_jvp
        def backward(*values):
            return [as_varying(g, tuple(axes)) for g in jax.pure_callback(
                pullback, grad_shapes, *values, vmap_method="sequential")]

        @backward.defjvp
        def _(primals, tangents):
            raise needs_ir(f"a second derivative of {self.__name__}", f)

        @jax.custom_vjp
        def operation(*values):
            return call(*values)

        def forward(*values):
            return call(*values), values

        def backward_rule(values, cts):
            cts = [jnp.zeros(s.shape, s.dtype) if ct.dtype == jax.dtypes.float0 else ct
                   for ct, s in zip(cts, shapes)]
            grads = dict(zip(wrt, backward(*values, *cts)))
            return tuple(grads.get(n) if n in differentiable else None for n in names)

        operation.defvjp(forward, backward_rule)
        return arranged(layout, list(operation(*values)))
