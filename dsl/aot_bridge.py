"""`dsl.to_torch` and `dsl.to_jax` of a function of a gradc-compiled
module (`runtime.aot.AotFunction`) or of its gradient (`AotGradient`):
first order, from the programs the module holds.

Contract: `AotTorch(f)(*args, **kwargs)` takes f's arguments as torch
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

`AotJax(f)(*args, **kwargs)` takes JAX arrays likewise and is a
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

from typing import Any, Sequence

import numpy as np

from dsl.bridge import Bridged, bind_foreign
from dsl.dask_bridge import placeholder
from dsl.function import needs_ir
from gradlang.runtime.aot import AotFunction, AotGradient
from gradlang.runtime.args import SUPPORTED
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError


class _AotBridged(Bridged):
    """What both bridges share: the function (or gradient) and the
    function whose programs run."""

    def __init__(self, f: "AotFunction | AotGradient"):
        super().__init__(f)
        self.function = f.f if isinstance(f, AotGradient) else f

    def error_sources(self) -> tuple:
        return ()  # (the module runs without its source)

    def _run(self, arrays: dict[str, Any]) -> tuple:
        """The call's results, flat, and how to arrange them."""
        if isinstance(self.f, AotGradient):
            result = self.f.call_bound(arrays)
            return _flat(result), result
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


def _flat(result: Any) -> tuple:
    if isinstance(result, tuple):
        return tuple(a for r in result for a in _flat(r))
    return (result,)


def _arranged(like: Any, flat: list) -> Any:
    """`flat`'s values (taken from its front) in the structure of `like`."""
    if isinstance(like, tuple):
        return tuple(_arranged(item, flat) for item in like)
    return flat.pop(0)


class AotTorch(_AotBridged):
    library = "torch"

    def __init__(self, f: "AotFunction | AotGradient"):
        super().__init__(f)
        import torch
        from dsl import torch_bridge
        torch_bridge._fill_dtypes(torch)
        # (torch.compile: a graph break, the call eager; its kernels are not torch's)
        self._call = torch.compiler.disable(self._call)

    @user_facing
    def __call__(self, *args, **kwargs):
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict):
        import torch
        from dsl import torch_bridge as tb
        f = self.function
        tracer = tb._tracer()
        if tracer is not None:
            raise needs_ir(f"{tracer} (tracing {self.__name__})", f)
        if tb._TRANSFORMS_ACTIVE[0]() or tb._FORWARD_AD[0]._current_level >= 0:
            raise needs_ir(f"a torch.func transform or forward-mode AD of {self.__name__}", f)
        args, kwargs = tb._widened(f, args, kwargs)

        def array(value, where: str):
            if not tb._is_tensor(value):
                return value, None
            return tb._array_of(value, f, where), value

        bound, tensors = bind_foreign(f, self.__name__, args, kwargs, array)
        arrays = f._on_target(bound)
        self._check_compiled(arrays)
        recording = torch.is_grad_enabled() and any(t.requires_grad for t in tensors.values())
        if not recording:
            flat, arranged = self._run(arrays)
            return _arranged(arranged, [tb._tensor(o) for o in flat])
        if isinstance(self.f, AotGradient):
            flat, arranged = self._run(arrays)
            outs = _operations()[1].apply(f"differentiating {self.__name__}", f, tuple(flat),
                                          *tensors.values())
            return _arranged(arranged, list(outs))
        differentiable = set(f.differentiable_names(arrays))
        for name, t in tensors.items():
            if t.requires_grad and name not in differentiable:
                raise ArgumentError(f"{self.__name__}: {name!r} has no gradient (it is const "
                                    "or not a float), but its tensor requires grad; pass it "
                                    "detached")
        outs = _operations()[0].apply(self, arrays, tuple(tensors), *tensors.values())
        return outs[0] if len(outs) == 1 else tuple(outs)


_OPERATIONS: tuple = ()


def _operations() -> tuple:
    """The `torch.autograd.Function`s (torch is imported lazily): a
    function's call, whose backward runs its pullback program, and a
    gradient's, whose backward (second order) is refused."""
    global _OPERATIONS
    if _OPERATIONS:
        return _OPERATIONS
    import torch
    from dsl import torch_bridge as tb

    def results_of(ctx, outs: Sequence) -> tuple:
        """Tensors over the result arrays `outs`, the integer ones marked
        as having no gradient."""
        results = tuple(tb._tensor(o) for o in outs)
        constants = [r for r in results if not r.is_floating_point()]
        if constants:
            ctx.mark_non_differentiable(*constants)
        return results

    class AotCall(torch.autograd.Function):
        @staticmethod
        def forward(ctx, bridge: AotTorch, arrays: dict, names: tuple, *tensors):
            f = bridge.function
            outs, ctx.pullback = f._vjp_bound(arrays)
            ctx.bridge, ctx.names, ctx.bound = bridge, names, tuple(arrays)
            ctx.save_for_backward(*tensors)  # (torch checks they are not modified in place)
            return results_of(ctx, outs)

        @staticmethod
        def backward(ctx, *cts):
            f = ctx.bridge.function
            tensors = ctx.saved_tensors  # (torch raises if it freed them, or one was modified)
            grads = dict(zip(ctx.bound, ctx.pullback(
                *(tb._array_of(ct, f, "a cotangent") for ct in cts))))
            names = [n for n, need in zip(ctx.names, ctx.needs_input_grad[3:])
                     if need and grads.get(n) is not None]
            results = [grads[n] for n in names]
            if torch.is_grad_enabled():  # (create_graph=True) recorded, not differentiable
                results = AotGradientCall.apply(
                    f"differentiating the backward of {ctx.bridge.__name__}", f,
                    tuple(results), *tensors, *cts)
            else:
                results = [tb._tensor(g) for g in results]
            given = dict(zip(names, results))
            return (None, None, None, *(given.get(n) for n in ctx.names))

    class AotGradientCall(torch.autograd.Function):
        """Results `outs` of a gradient program (arrays), recorded as
        computed from `tensors`: `what` (differentiating them) is refused."""

        @staticmethod
        def forward(ctx, what: str, f: AotFunction, outs: tuple, *tensors):
            ctx.what, ctx.f = what, f
            return results_of(ctx, outs)

        @staticmethod
        def backward(ctx, *cts):
            raise needs_ir(f"{ctx.what} (a second derivative)", ctx.f)

    _OPERATIONS = (AotCall, AotGradientCall)
    return _OPERATIONS


class AotJax(_AotBridged):
    library = "jax"

    @user_facing
    def __call__(self, *args, **kwargs):
        import jax
        import jax.numpy as jnp
        f = self.function
        if f.target.name != "cpu":  # (the callbacks get host arrays)
            raise ArgumentError(f"{self.__name__} runs only a module compiled for the cpu "
                                f"target; this one was compiled for {f.target.name!r}")

        def stand_in(value, where: str):
            if isinstance(value, np.ndarray):  # (made a JAX array, as jnp functions do)
                value = jnp.asarray(value)
            if not isinstance(value, (jax.Array, jax.core.Tracer)):
                return value, None
            dtype = np.dtype(value.dtype)
            if dtype not in SUPPORTED:
                raise ArgumentError(f"{where} is a JAX array of dtype {dtype}; gradlang takes "
                                    "float32 and float64 (and int32, int64, bool constants)")
            return placeholder(tuple(value.shape), dtype), value

        bound, inputs = bind_foreign(f, self.__name__, args, kwargs, stand_in)
        names = tuple(inputs)
        kind, sig = self.kind, f._signature(bound)
        outs = [jax.ShapeDtypeStruct(shape, jax.dtypes.canonicalize_dtype(dtype))
                for dtype, shape in f.out_types(kind, bound)]
        arranged = self.f.arrange(outs, sig) if isinstance(self.f, AotGradient) else (
            outs[0] if len(outs) == 1 else tuple(outs))
        shapes = _flat(arranged)

        def arrays(values) -> dict[str, Any]:
            given = dict(zip(names, values))
            return f._on_target({n: np.asarray(given[n]).astype(a.dtype, copy=False)
                                 if n in given else a for n, a in bound.items()})

        def run(*values):
            flat, _ = self._run(arrays(values))
            return tuple(np.asarray(o, s.dtype) for o, s in zip(flat, shapes))

        @jax.custom_jvp
        def call(*values):
            return jax.pure_callback(run, shapes, *values, vmap_method="sequential")

        @call.defjvp
        def _(primals, tangents):  # (the gradient's, or forward mode over reverse)
            raise needs_ir(f"a second derivative (or forward mode) of {self.__name__}", f)

        if isinstance(self.f, AotGradient) or not names:
            return _arranged(arranged, list(call(*inputs.values())))
        differentiable = set(f.differentiable_names(bound))
        wrt = [n for n in f.wrt.get(sig, ()) if n in names]  # (the pullback's results)
        grad_shapes = tuple(jax.ShapeDtypeStruct(bound[n].shape, jax.dtypes.canonicalize_dtype(
            bound[n].dtype)) for n in wrt)

        def pullback(*values):
            primals, cts = values[:len(names)], values[len(names):]
            _, back = f._vjp_bound(arrays(primals))
            grads = dict(zip(bound, back(*(np.asarray(ct) for ct in cts))))
            return tuple(np.asarray(grads[n], s.dtype) for n, s in zip(wrt, grad_shapes))

        @jax.custom_jvp
        def backward(*values):
            return jax.pure_callback(pullback, grad_shapes, *values, vmap_method="sequential")

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
        return _arranged(arranged, list(operation(*inputs.values())))
