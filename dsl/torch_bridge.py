"""`dsl.to_torch(f)`: a compiled function as an operation PyTorch's
autograd records.

Contract: `to_torch(f)(*args, **kwargs)` takes f's arguments as torch
tensors (Python numbers and NumPy arrays are constants) and the module
params f reads as keyword tensors (a param left out takes the module's
value and gets no gradient), and returns torch tensors shaped as f's
results.  The forward runs f's compiled kernels (its split forward pass,
keeping the residuals, when an input requires grad); the backward runs the
compiled pullback.  A call with nothing to record (positional CPU tensors,
none requiring grad) is f's own call on their NumPy views, with its fast
path for repeated signatures.  Under `create_graph=True` the backward is itself such
an operation, made from f's backward pass as a compiled function
(`dsl.function.VjpFunction`), so double backward differentiates our
compiled gradient again (grad blocks included), to any order.

Tensors are shared, never copied: a CPU tensor is passed to the kernels as
the NumPy view of its memory and results come back as tensors over the
kernels' output arrays; for a module loaded with target="cuda", CUDA
tensors go to the kernels through `__cuda_array_interface__` and results
come back the same way.  Float tensors must be f32 or f64 (integer and
bool tensors are constants); a tensor of another dtype, a sparse one, one
on a device the module's target does not run on, one of a `torch.func` transform
(whose wrappers have no memory the kernels could read: use torch.autograd),
or one requiring grad for a parameter without a gradient (const or
integer) is an `ArgumentError` before anything runs.  torch is imported
when `to_torch` is first called, never by `import dsl`.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from dsl.bridge import Bridged, bind_foreign, bridged
from dsl.function import Compiled, backward_function, vjp_of_bound
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError


def to_torch(f: Compiled) -> "TorchFunction":
    """f as a function of torch tensors that torch.autograd differentiates."""
    return TorchFunction(bridged(f, "to_torch"))


class TorchFunction(Bridged):
    library = "torch"

    def __init__(self, f: Compiled):
        super().__init__(f)
        import torch
        _fill_dtypes(torch)
        # whether CPU tensors' NumPy views are arrays f's kernels take as they are
        self._takes_numpy = f.target.is_array(np.empty(0)) and not f.host_results

    @user_facing
    def __call__(self, *args, **kwargs):
        if not kwargs and self._takes_numpy:
            views = _constant_views(args)
            if views is not None:  # nothing to record: f's own call, its fast path
                return _tensors(self.f(*views))
        f = self.f

        def array(value, where: str):
            if not _is_tensor(value):
                return value, None
            return _array_of(value, f, where), value

        bound, by_name = bind_foreign(f, self.__name__, args, kwargs, array)
        differentiable = set(f.differentiable_names(bound))
        for name, t in by_name.items():
            if t.requires_grad and name not in differentiable:
                raise ArgumentError(f"{self.__name__}: {name!r} has no gradient (it is const "
                                    "or not a float), but its tensor requires grad; pass "
                                    "it detached", f.span)
        return f.format(apply(f, bound, by_name))


def apply(f: Compiled, bound: dict[str, Any], tensors: dict[str, Any]) -> tuple:
    """Run f on validated arguments `bound` as one recorded torch
    operation whose inputs are `tensors` (name -> the tensor whose memory
    `bound[name]` is)."""
    names = tuple(tensors)
    return _operation().apply(f, bound, names, *(tensors[n] for n in names))


_OPERATION = None


def _operation():
    """The `torch.autograd.Function` (defined on first use: torch is
    imported lazily)."""
    global _OPERATION
    if _OPERATION is not None:
        return _OPERATION
    import torch

    class CompiledOperation(torch.autograd.Function):
        @staticmethod
        def forward(ctx, f: Compiled, bound: dict, names: tuple, *tensors):
            if any(ctx.needs_input_grad[3:]):
                outs, ctx.pullback = vjp_of_bound(f, bound)
            else:
                outs = f.call_bound(bound)
            ctx.f, ctx.bound, ctx.names = f, bound, names
            ctx.save_for_backward(*tensors)  # torch checks they are not modified in place
            results = tuple(_tensor(o) for o in outs)
            ctx.mark_non_differentiable(*(r for r in results if not r.is_floating_point()))
            ctx.outs = [(tuple(o.shape), np.dtype(o.dtype)) for o in outs]
            return results

        @staticmethod
        def backward(ctx, *cts):
            f, needs = ctx.f, ctx.needs_input_grad[3:]
            cts = [torch.zeros(shape, dtype=_TORCH[dtype]) if ct is None else ct
                   for ct, (shape, dtype) in zip(cts, ctx.outs)]
            if torch.is_grad_enabled():  # create_graph: a recorded, compiled backward
                vjp = backward_function(f, len(cts))
                bound = dict(ctx.bound)
                inputs = dict(zip(ctx.names, ctx.saved_tensors))
                for name, ct in zip(vjp.ct_names, cts):
                    bound[name] = _array_of(ct, f, "a cotangent")
                    inputs[name] = ct
                grads = dict(zip(f.differentiable_names(ctx.bound), apply(vjp, bound, inputs)))
            else:
                raw = ctx.pullback(*(_array_of(ct, f, "a cotangent") for ct in cts))
                grads = {n: _tensor(g) for n, g in zip(ctx.bound, raw) if g is not None}
            return (None, None, None,
                    *(grads.get(n) if need else None for n, need in zip(ctx.names, needs)))

    _OPERATION = CompiledOperation
    return _OPERATION


def _constant_views(args: tuple) -> "list[np.ndarray] | None":
    """The NumPy views of positional arguments when every one is a CPU
    tensor of a dtype gradlang takes that does not require grad (so no
    operation is recorded, and the function checks the views as it checks
    any array), else None (a torch.func wrapper too: it has no memory of
    its own, and the slow path says so)."""
    views = []
    for t in args:
        if type(t) is not _TENSOR[0] or t.requires_grad or not t.is_cpu \
                or t.dtype not in _NUMPY or _WRAPPED[0](t) or t.layout is not _STRIDED[0]:
            return None
        views.append(t.numpy())
    return views


def _tensors(result: Any) -> Any:
    """A function's (formatted) results, each array a tensor over it."""
    if isinstance(result, tuple):
        return tuple(_tensors(r) for r in result)
    return _tensor(result)


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "requires_grad")


_NUMPY_DTYPES = ("float32", "float64", "int32", "int64", "bool")
_TORCH: dict = {}  # NumPy dtype -> torch dtype, filled on first use
_NUMPY: dict = {}  # torch dtype -> NumPy dtype
_TENSOR: list = []  # torch.Tensor
_WRAPPED: list = []  # whether a tensor is a torch.func transform's wrapper
_STRIDED: list = []  # torch.strided, the layout of dense tensors


def _fill_dtypes(torch) -> None:
    if not _TORCH:
        _TORCH.update({np.dtype(n): getattr(torch, n) for n in _NUMPY_DTYPES})
        _NUMPY.update({v: k for k, v in _TORCH.items()})
        _TENSOR.append(torch.Tensor)
        _WRAPPED.append(torch._C._functorch.is_functorch_wrapped_tensor)
        _STRIDED.append(torch.strided)


def _array_of(t, f: Compiled, where: str):
    """The array the kernels of f's target take for tensor t, sharing its
    memory: the NumPy view of a CPU tensor, the tensor itself (through its
    `__cuda_array_interface__`) for a CUDA one."""
    if t.dtype not in _NUMPY:
        raise ArgumentError(f"{where} is a tensor of dtype {t.dtype}; gradlang takes float32 "
                            "and float64 (and int32, int64, bool constants)", f.span)
    if _WRAPPED[0](t):
        # torch.func's wrappers have no memory of their own for the kernels to read
        raise ArgumentError(f"{where} is a tensor of a torch.func transform (grad, vmap, "
                            "jvp, ...), which compiled functions do not support; use "
                            "torch.autograd (backward, torch.autograd.grad)", f.span)
    if t.layout is not _STRIDED[0]:  # no memory of the array's shape to share
        raise ArgumentError(f"{where} is a tensor of layout {t.layout}; compiled functions "
                            "take dense tensors (t.to_dense())", f.span)
    view = t.detach()
    view = view.numpy() if view.device.type == "cpu" else view
    if not f.target.is_array(view):
        raise ArgumentError(f"{where} is a tensor on device {t.device}, but {f.name}() runs "
                            f"on target {f.target.name!r}; move the tensor there, or load "
                            "the module for its device", f.span)
    return view


def _tensor(array):
    """A tensor over a result array's memory (CPU or CUDA)."""
    import torch
    if isinstance(array, np.ndarray):
        if not array.flags.writeable or any(s < 0 for s in array.strides):
            array = np.array(array)  # torch shares only writable, forward-strided memory
        return torch.from_numpy(array)
    return torch.as_tensor(array, device="cuda")

