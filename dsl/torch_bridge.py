"""`dsl.to_torch(f)`: a compiled function as an operation PyTorch's
autograd and `torch.func` transforms record.

Contract: `to_torch(f)(*args, **kwargs)` takes f's arguments as torch
tensors (Python numbers and NumPy arrays are constants) and the module
params f reads as keyword tensors (a param left out takes the module's
value and gets no gradient), and returns torch tensors shaped as f's
results.  The forward runs f's compiled kernels (its split forward pass,
keeping the residuals, when autograd records and an input requires grad);
the backward runs the compiled pullback.  torch holds the residuals (saved
for backward, as tensors over their memory): it frees them after the
backward unless retain_graph, and its saved-tensor hooks (non-reentrant
checkpoint, save_on_cpu) apply to them as to its own.  A call with nothing
to record (positional CPU tensors or nn.Parameters, none requiring grad,
or under no_grad) is f's own call on their NumPy views, with its fast path
for repeated signatures.  Under `create_graph=True` the backward is
itself such an operation, made from f's backward pass as a compiled
function (`dsl.function.VjpFunction`), so double backward differentiates
our compiled gradient again (grad blocks included), to any order.

`torch.func` (grad, vjp, jvp, vmap, jacrev, jacfwd, hessian, and
functional_call over them) works through it: the operation is an
`autograd.Function` in the `setup_context` style whose every rule is
again such an operation of a function derived from f, so transforms nest
to any depth and every derivative follows f's grad blocks.  Reverse mode:
the backward above (the `VjpFunction` whenever a transform or
create_graph records it).  Forward mode (`jvp` rule): f's compiled jvp
(`dsl.function.JvpFunction`, `dsl.jvp`'s program: through a grad block it
runs the block's transposition).  `vmap` rule: f with the batched
arguments stacked along a leading axis (`dsl.function.Stacked`,
`compiler.vectorize`) in one program, or one call per example where that
has no rule (a batched index array, a batched const or size argument;
an `ArgumentError` where the examples' results differ in shape).  A
transform's tensor is bound as a stand-in of its shape (it has no memory)
and checked there; the kernels read the plain tensor under it when the
operation's forward gets that.

Where torch traces instead of running (`torch.compile`, `torch.export`
with strict=False, `make_fx`, `torch.jit.trace`, FakeTensorMode,
functionalization), a call is one `gradlang::call` custom operation
(`dsl.torch_op`: its result shapes from f's IR, its backward f's backward
pass as another), so a compiled graph has no break around it (dynamo
hands the call untraced to AOTAutograd: `nonstrict_trace`).  Under a
tracer, a torch.func transform or forward-mode AD (linearize) is an
`ArgumentError` (custom operations take none), which under
`torch.compile` is a graph break that runs the call eagerly (the
operation's methods are `torch.compiler.disable`d, since the autograd
engine runs a backward inside a compiled step, and torch.func a forward
inside a compiled transform).

Tensors are shared, never copied: a CPU tensor is passed to the kernels as
the NumPy view of its memory and results come back as tensors over the
kernels' output arrays; for a module loaded with target="cuda", CUDA
tensors go to the kernels through `__cuda_array_interface__` and results
come back the same way.  Float tensors must be f32 or f64 (integer and
bool tensors are constants); a tensor of another dtype, a sparse or nested
one, one batched by torch's legacy vmap (`torch.autograd.functional`'s
vectorize=True: it has no memory to read; torch.func's vmap works), one
on a device the module's target does not run on (a torch.func transform's
CUDA tensor: checked when its forward runs), or one requiring grad for a
parameter without a gradient (const or integer) is an `ArgumentError`
before anything runs (one carrying a forward-mode tangent other than
zero, when the jvp rule runs).  torch is imported when `to_torch` is first called,
never by `import dsl`.
"""
from __future__ import annotations

import functools
import importlib
import warnings
import weakref
from typing import Any, Optional, Sequence

import numpy as np

from dsl.aot_bridge import AotBridged, arranged
from dsl.bridge import Bridged, bind_foreign, bridged, widened_halves
from dsl.dask_bridge import placeholder
from dsl.function import (Compiled, FastPath, Stacked, backward_function, batched_function,
                          fast_key, holding_nothing, jvp_function, needs_ir, result_types,
                          results_like, split_of_bound)
from dsl.torch_op import _memory, _shareable, _tensor, apply as apply_operation, hint
from gradlang.runtime.aot import AotFunction, AotGradient
from gradlang.runtime.args import INTEGRAL
from gradlang.runtime.boundary import user_facing
from gradlang.runtime.errors import ArgumentError, GradError, called


def to_torch(f: Compiled) -> "TorchFunction":
    """f as a function of torch tensors that torch.autograd and torch.func
    differentiate, and torch.compile compiles as one operation (of a
    gradc-compiled module's function, first order: `dsl.aot_bridge`)."""
    if isinstance(f, (AotFunction, AotGradient)):
        return AotTorch(f)
    return TorchFunction(bridged(f, "to_torch"))


class TorchFunction(Bridged):
    library = "torch"

    def __init__(self, f: Compiled):
        super().__init__(f)
        import torch
        _fill_dtypes(torch)
        # whether CPU tensors' NumPy views are arrays f's kernels take as they are
        self._takes_numpy = f.target.is_array(np.empty(0)) and not f.host_results
        # what dynamo hands the call it graphs untraced (`_traced`), and guards on
        self._identity = _Identity(self)
        # the positions and names of integer parameters, which a Python float
        # given for under torch.compile is bound by value (checked as eagerly)
        integral = [(i, s.name) for i, s in enumerate(f.specs) if s.dtype in INTEGRAL]
        self._integral = frozenset(x for pair in integral for x in pair)
        # fast_key of a call's views -> (names bound, those with a gradient)
        self._bindings: dict[tuple, tuple] = {}

    @user_facing
    def __call__(self, /, *args, **kwargs):
        if _COMPILING[0]():
            # (dynamo holds a NumPy array as a tensor, which nonstrict_trace takes;
            # a Python float that changed between calls, it makes a symbol that
            # nonstrict_trace takes only by specializing on its value, a compile
            # per value: it goes as a 0-d tensor, the positions of such named)
            floats = tuple(k for k, v in (*enumerate(args), *kwargs.items())
                           if isinstance(v, float) and k not in self._integral)
            args = [_traceable(v, i in floats) for i, v in enumerate(args)]
            return _TRACED[0](self._identity, floats, *args,
                              **{k: _traceable(v, k in floats) for k, v in kwargs.items()})
        return self._call(args, kwargs)

    def _traced_call(self, args: tuple, kwargs: dict, floats: tuple):
        """The call as dynamo's nonstrict_trace makes it (`_traced`): the
        Python floats at `floats` are 0-d tensors (see `__call__`)."""
        tracer = _tracer()
        if tracer is None:  # a graph run untraced (backend="eager"): the call, floats as given
            return self._call([a.item() if i in floats else a for i, a in enumerate(args)],
                              {k: v.item() if k in floats else v for k, v in kwargs.items()})
        return self._operation(args, kwargs, tracer, floats, compiled=True)

    def _call(self, args: tuple, kwargs: dict):
        tracer = _tracer()
        if tracer is not None:
            # the kernels read memory that torch's tracers cannot see: the call
            # is one operation they record (its results are not constants)
            return self._operation(args, kwargs, tracer)
        if not kwargs and self._takes_numpy and _FORWARD_AD[0]._current_level < 0:
            # (under a forward-mode dual level a tensor may carry a tangent)
            views = _plain_views(args)
            if views is not None:
                if not (_GRAD_ENABLED[0]() and any(t.requires_grad for t in args)):
                    return _tensors(self.f(*views))  # nothing to record: f's own call
                if not _TRANSFORMS_ACTIVE[0]():
                    result = self._recorded_fast(args, views)
                    if result is not None:
                        return result
        return self._recorded(args, kwargs)

    def _recorded_fast(self, args: tuple, views: list) -> Any:
        """The recorded call, outside torch.func transforms, of plain CPU
        tensors `args` (their NumPy `views`) bound as a call of the same
        dtypes, shapes and strides was before (`_remember`), without binding
        them again; None if none was, or a tensor requiring grad has no
        gradient (the slow path says so)."""
        known = self._bindings.get(fast_key(views))
        if known is None:
            return None
        names, differentiable = known
        if not all(n in differentiable for n, t in zip(names, args) if t.requires_grad):
            return None
        f = self.f
        call = Call(f, dict(zip(names, views)), dict(zip(names, args)))
        return f.format(_operations()[2](call, *args))

    def _recorded(self, args: tuple, kwargs: dict):
        f = self.f
        args, kwargs = _widened(f, args, kwargs)

        views = []  # the arrays bound for tensors, in order

        def array(value, where: str):
            if not _is_tensor(value):
                return value, None
            views.append(_array_of(value, f, where))
            return views[-1], value

        bound, by_name = bind_foreign(f, self.__name__, args, kwargs, array)
        self._refuse_grad_without_gradient(bound, by_name)
        if not kwargs and not _TRANSFORMS_ACTIVE[0]() and _plain_views(args) is not None:
            self._remember(args, views, bound, by_name)
        return f.format(apply(f, bound, by_name))

    def _remember(self, args: tuple, views: list, bound: dict, by_name: dict) -> None:
        """Keep the names that a call of plain CPU tensors `args` bound,
        by the dtypes, shapes and strides of their `views` (`fast_key`), if
        binding took each view as it is and added nothing (no module
        param): binding then depends on nothing else, and a call like it
        binds as it did (`_recorded_fast`)."""
        taken_as_is = len(bound) == len(args) == len(views) and all(
            b is v and by_name.get(n) is t
            for n, b, t, v in zip(bound, bound.values(), args, views))
        key = fast_key(views) if taken_as_is else None
        if key is not None:
            if len(self._bindings) >= FastPath.SIZE:
                self._bindings.clear()
            self._bindings[key] = (tuple(bound), frozenset(self.f.differentiable_names(bound)))

    def _operation(self, args: tuple, kwargs: dict, tracer: str, floats: tuple = (),
                   compiled: bool = False):
        """The call as one `gradlang::call` operation for `tracer` to
        record, its tensors bound as stand-ins of their shapes; in a
        `compiled` step (torch.compile) that autograd records, the call of
        f's forward pass, whose residuals the backward reads (other
        tracers' graphs, traced once for any use, recompute them).  A number
        that is a symbol of the tracer's (a SymInt, a SymFloat; dynamo's
        Python floats, passed as 0-d tensors at `floats`, the positions or
        keywords) is an input of the operation, a 0-d tensor bound as a
        Python number, unless it picks the program (a const or size
        integer) or is a float for an integer: then its value is bound,
        which guards the graph on it."""
        f = self.f
        args, kwargs = _widened(f, args, kwargs)
        if _FORWARD_AD[0]._current_level >= 0 or _TRANSFORMS_ACTIVE[0]():
            # the operation has no forward-mode rule (a jvp through it was zero),
            # and torch's custom operations take no torch.func transform
            # (pytorch issue 168393): under torch.compile, a graph break
            raise ArgumentError(f"{tracer} cannot record {self.__name__} under a torch.func "
                                "transform or forward-mode AD (linearize): torch's custom "
                                "operations do not support them; call the transform "
                                "eagerly, or use torch.autograd", f.span)

        # id of a number's 0-d tensor -> the number (None: dynamo's float,
        # whose value only the tensor holds)
        numbers: dict[int, Any] = {}

        def stand_in(value, where: str):
            if id(value) in numbers:  # a number's tensor: bound as a number
                return _fresh_number(value, numbers[id(value)]), value
            if not _is_tensor(value):
                return value, None
            _check_tensor(value, f, where)
            if (value.device.type == "cpu") != f.target.is_array(np.empty(0)):
                _wrong_device(value, f, where)
            with warnings.catch_warnings():
                # (jit.trace's sizes are tensors: the operation runs for any size)
                warnings.simplefilter("ignore", _TRACER_WARNING[0])
                shape = tuple(map(hint, value.shape))  # (the fake rule takes symbolic ones)
            return placeholder(shape, _NUMPY[value.dtype]), value

        args, kwargs = list(args), dict(kwargs)
        for where, value in (*enumerate(args), *kwargs.items()):
            if where in floats or isinstance(value, _SYMBOLIC_NUMBERS[0]):
                tensor = value if where in floats else _SCALAR_TENSOR[0](
                    value, dtype=_TORCH[np.dtype(_SYMBOLIC_DTYPE[type(value).__name__])])
                numbers[id(tensor)] = None if where in floats else value
                if isinstance(where, int):
                    args[where] = tensor
                else:
                    kwargs[where] = tensor
        try:
            bound, by_name = bind_foreign(f, self.__name__, args, kwargs, stand_in)
        except ArgumentError as err:  # (as an eager call would raise it)
            raise _shown(err) from None
        if any(id(t) in numbers and not t.is_floating_point() for t in by_name.values()):
            # (an integer a program uses as a size picks it by value: lowering
            # for the example's values finds it, as an eager call's does)
            try:
                f.retrying_by_value(bound, lambda: result_types(f, bound))
            except GradError as err:
                raise _shown(err) from None
        statics = f.static_names(bound) if numbers else ()
        by_value = {id(t): self._value_of(numbers[id(t)], n) for n, t in by_name.items()
                    if id(t) in numbers and (n in statics or (
                        t.is_floating_point() and bound[n].dtype.kind != "f"))}
        if by_value:
            args = [by_value.get(id(a), a) for a in args]
            kwargs = {k: by_value.get(id(v), v) for k, v in kwargs.items()}
            bound, by_name = bind_foreign(f, self.__name__, args, kwargs, stand_in)
        try:
            self._refuse_grad_without_gradient(bound, by_name)
        except ArgumentError as err:
            raise _shown(err) from None
        if not by_name:  # constants only: so are the results
            return _tensors(f.format(f.call_bound(bound)))
        # (the module params left out: read when the operation runs)
        live = tuple(n for n in f.module_params() if n not in kwargs and n in bound)
        differentiated = compiled and _GRAD_ENABLED[0]() and any(
            t.requires_grad for t in by_name.values())
        try:
            return f.format(apply_operation(f, bound, by_name, live, differentiated))
        except GradError as err:  # (a tensor for a const that picks the program, a
            raise _shown(err) from None  # program that does not compile)

    def _value_of(self, number: Any, name: str) -> Any:
        """A symbolic number's value as a Python number, which guards the
        graph traced on it."""
        if number is None:
            raise ArgumentError(f"{self.__name__}: {name!r} is an integer, but a torch.compile'd "
                                "call gave it a Python float; pass an int", self.f.span)
        return int(number) if isinstance(number, _SYMBOLIC_NUMBERS[0][0]) else float(number)

    def _refuse_grad_without_gradient(self, bound: dict, by_name: dict) -> None:
        differentiable = set(self.f.differentiable_names(bound))
        for name, t in by_name.items():
            if t.requires_grad and name not in differentiable:
                raise ArgumentError(f"{self.__name__}: {name!r} has no gradient (it is const "
                                    "or not a float), but its tensor requires grad; pass "
                                    "it detached", self.f.span)


class _Identity:
    """A `TorchFunction` as dynamo hands it to `_traced`: a pytree constant,
    equal to another only of the same compiled function (which calls the
    same), on which dynamo guards a compiled graph.  (The call was a
    closure over the function, which dynamo guarded by its code alone, the
    same for every function: a graph traced for one function ran it for
    any other called at the same place, as in the forward of two modules.)"""

    __slots__ = ("function",)

    def __init__(self, function: TorchFunction):
        self.function = function

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.function.f is self.function.f

    def __hash__(self) -> int:
        return id(self.function.f)


def _traced(identity: _Identity, floats: tuple, /, *args, **kwargs):
    """The call as dynamo puts it in its graph, untraced (nonstrict_trace:
    it cannot trace the binding, NumPy, the compiler); AOTAutograd then
    traces it with FakeTensors, where it is one `gradlang::call` operation."""
    return identity.function._traced_call(args, kwargs, floats)


def apply(f: Compiled, bound: dict[str, Any], tensors: dict[str, Any]) -> tuple:
    """Run f on validated arguments `bound` as one recorded torch
    operation whose inputs are `tensors` (name -> the tensor whose memory
    `bound[name]` is, or that a stand-in there stands for: `_array_of`)."""
    plain, transformable, _ = _operations()
    operation = transformable if _TRANSFORMS_ACTIVE[0]() else plain
    return operation.apply(Call(f, bound, tensors), *tensors.values())


class Call:
    """One call of f as a torch operation: its bound arguments, where the
    tensors named `names` are the operation's inputs (a torch.func
    transform's tensor is bound as a stand-in of its shape until the
    operation's forward gets the plain tensor under it)."""

    def __init__(self, f: Compiled, bound: dict[str, Any], tensors: dict[str, Any]):
        self.f, self.bound, self.names = f, bound, tuple(tensors)
        # the tensors bound, while the forward that reads them has not run
        self.given: Optional[tuple] = tuple(map(id, tensors.values()))
        self.pullback = None  # kept by a forward whose inputs require grad, reading none
        self.residuals: tuple = ()  # its residuals, until torch holds them
        # (a weak reference to each residual tensor, and to the array under it)
        self.residual_refs: tuple = ()
        # weak references to the residual tensors once torch holds them (None
        # before): every context set up for the call saves these same tensors
        self.residual_tensors: Optional[tuple] = None
        # whether autograd records the operation (no_grad: an evaluation loop
        # over parameters that require grad needs no residuals)
        self.recording = _GRAD_ENABLED[0]()

    def forward_bound(self, tensors: Sequence[Any]) -> dict[str, Any]:
        """The arguments for the operation's forward: as bound, unless a
        torch.func transform hands it other tensors than those bound (the
        plain tensors under its wrappers)."""
        given, self.given = self.given, None
        if given == tuple(map(id, tensors)):
            return self.bound
        return self.rebound(tensors)[0]

    def residual_arrays(self, tensors: Sequence[Any]) -> list:
        """The arrays under the residual tensors torch gives back: the
        array a tensor was made over where torch gives back the tensor it
        was given (no saved-tensor hook made another), else its memory."""
        return [array() if made is not None and made() is t else _memory(t)
                for t, (made, array) in zip(tensors, self.residual_refs)]

    def rebound(self, tensors: Sequence[Any], extra: Optional[dict] = None,
                extra_what: str = "") -> tuple[dict[str, Any], dict[str, Any]]:
        """(bound, name -> tensor) for running a function derived from f
        on these tensors (the operation's inputs, at the level of a
        transform the derived function runs at), with `extra` tensors by
        name added (`extra_what`: cotangents, tangents)."""
        inputs = {**dict(zip(self.names, tensors)), **(extra or {})}
        bound = dict(self.bound)
        bound.update({n: _as(self.bound.get(n), _array_of(
            t, self.f, extra_what if n in (extra or ()) else f"argument {n!r}"))
            for n, t in inputs.items()})
        return bound, inputs


def _as(bound_before: Any, array: Any) -> Any:
    """`array` in the dtype the binding gave its argument (a param's
    declared dtype), if it had one (a CUDA tensor: as it is)."""
    if bound_before is None or not isinstance(array, np.ndarray) \
            or bound_before.dtype == array.dtype:
        return array
    return array.astype(bound_before.dtype)


_OPERATIONS: tuple = ()


def _operations() -> tuple:
    """The `torch.autograd.Function`s (defined on first use: torch is
    imported lazily): one for plain autograd, in the ctx style, and one
    for torch.func transforms, in the setup_context style they need (whose
    apply binds the forward's signature: some 20 us a call more); and the
    plain one's apply for plain tensors outside transforms.  Their
    forward runs kernels only on plain tensors; their backward, jvp and
    vmap rules are again such operations (of f's backward pass, its jvp,
    f stacked), so that transforms compose through them to any depth."""
    global _OPERATIONS
    if _OPERATIONS:
        return _OPERATIONS
    import torch

    def forward(call: Call, *tensors) -> tuple:
        f = call.f
        bound = call.forward_bound(tensors)
        if call.recording and any(t.requires_grad for t in tensors):  # keep the residuals
            outs, call.residuals, call.pullback = split_of_bound(f, bound)
        else:
            outs = f.call_bound(bound)
        return tuple(_tensor(o) for o in outs)

    def setup_context(ctx, inputs: tuple, output: tuple) -> None:
        call = ctx.call = inputs[0]
        residuals = ()
        # whether this context saves the residuals its backward's pullback reads
        ctx.holds_residuals = False
        if call.pullback is not None and call.residual_tensors is None:
            # torch holds the residuals, as tensors over their memory: it frees
            # them after the backward (unless retain_graph), and its saved-tensor
            # hooks (checkpoint, save_on_cpu) apply to them as to its own
            arrays = tuple(map(_shareable, call.residuals))
            residuals = tuple(map(_tensor, arrays))
            call.residuals = ()
            # (weakly: torch alone holds them) each tensor and the array under it
            call.residual_refs = tuple((weakref.ref(t), weakref.ref(a))
                                   if isinstance(a, np.ndarray) else (None, None)
                                   for t, a in zip(residuals, arrays))
            call.residual_tensors = tuple(map(weakref.ref, residuals))
            ctx.holds_residuals = True
        elif call.pullback is not None:
            # another context of the call: a torch.func transform sets up one
            # for each level it runs at (the plain one first), which saves the
            # same tensors (the residuals were handed to the first alone, and
            # the refs set anew for none: the first's backward read no
            # residuals, an internal TypeError); where one is gone (a
            # saved-tensor hook kept another), its backward recomputes them
            alive = tuple(ref() for ref in call.residual_tensors)
            if all(t is not None for t in alive):
                residuals, ctx.holds_residuals = alive, True
        # torch checks the inputs are not modified in place
        ctx.save_for_backward(*inputs[1:], *residuals)
        ctx.save_for_forward(*inputs[1:])
        # a tensor without a tangent reaches `jvp` as None, not as zeros: a
        # zero tangent taken as given is 0 * inf = NaN through an infinite
        # slope (sqrt(w) * x along x at w = 0), where torch's ops give 0;
        # `backward` makes the zeros of an output's unused cotangent itself
        ctx.set_materialize_grads(False)
        ctx.output_types = [(o.shape, o.dtype, o.device) for o in output]
        constants = [r for r in output if not r.is_floating_point()]
        if constants:
            ctx.mark_non_differentiable(*constants)

    def backward(ctx, *cts) -> tuple:
        # zeros for the cotangent of an output torch did not use (None:
        # `set_materialize_grads(False)`, for `jvp`'s sake)
        cts = tuple(ct if ct is not None else torch.zeros(shape, dtype=dtype, device=device)
                    for ct, (shape, dtype, device) in zip(cts, ctx.output_types))
        call, needs = ctx.call, ctx.needs_input_grad[1:]
        f = call.f
        saved = ctx.saved_tensors  # (torch raises here if it freed them, or one was modified)
        tensors, residuals = saved[:len(call.names)], saved[len(call.names):]
        if ctx.holds_residuals and not torch.is_grad_enabled() \
                and not any(map(_WRAPPED[0], cts)):
            raw = call.pullback.call_reading(
                call.residual_arrays(residuals), *(_array_of(ct, f, "a cotangent") for ct in cts))
            wanted = {n for n, need in zip(call.names, needs) if need}
            grads = {n: _tensor(g) for n, g in zip(call.bound, raw)
                     if n in wanted and g is not None}
        else:  # create_graph, or a torch.func transform: a recorded, compiled backward
            vjp = backward_function(f, len(cts))
            bound, inputs = call.rebound(tensors, dict(zip(vjp.ct_names, cts)), "a cotangent")
            grads = dict(zip(f.differentiable_names(call.bound), apply(vjp, bound, inputs)))
        return (None, *(grads.get(n) if need else None for n, need in zip(call.names, needs)))

    def jvp(ctx, _, *tangents) -> tuple:
        call = ctx.call
        f = call.f
        differentiable = set(f.differentiable_names(call.bound))
        given = {n: t for n, t in zip(call.names, tangents)
                 if t is not None and n in differentiable}
        refused = [n for n, t in zip(call.names, tangents)
                   if n not in differentiable and _nonzero(t)]
        if refused:  # (taken as zero, the derivative would be silently wrong)
            raise ArgumentError(f"forward-mode AD differentiates {called(f.name)} with respect "
                                f"to {refused[0]!r}, which has no gradient (it is const or not "
                                "a float); pass its tensor without a tangent", f.span)
        jf = jvp_function(f, [n for n in call.bound if n in given])
        bound, inputs = call.rebound(
            ctx.saved_tensors[:len(call.names)],
            dict(zip(jf.tangent_names, (given[n] for n in jf.active))), "a tangent")
        outs = apply(jf, bound, inputs)
        n = len(outs) // 2
        return tuple(t if o.is_floating_point() else None for o, t in zip(outs, outs[n:]))

    def vmap(info, in_dims: tuple, call: Call, *tensors) -> tuple:
        dims = dict(zip(call.names, in_dims[1:]))
        batched = [n for n in call.names if dims[n] is not None]
        tensors = [t if dims[n] is None else t.movedim(dims[n], 0)
                   for n, t in zip(call.names, tensors)]
        stacked = _batched(call, batched)
        if stacked is not None:
            outs = apply(stacked, *call.rebound(tensors))
        else:  # one example at a time
            each = [apply(call.f, *call.rebound(
                [t if dims[n] is None else t[i] for n, t in zip(call.names, tensors)]))
                for i in range(info.batch_size)]
            if each:
                outs = tuple(torch.stack(_same_shapes(o, call.f)) for o in zip(*each))
            else:  # no example: empty results of the shapes f's IR gives, none run (as dsl.vmap)
                example = {n: holding_nothing(tuple(t.shape[1:]), call.bound[n].dtype)
                           for n, t in zip(call.names, tensors) if dims[n] is not None}
                device = next(t.device for n, t in zip(call.names, tensors) if n in example)
                outs = tuple(torch.from_numpy(np.empty((0, *r.shape), r.dtype)).to(device)
                             for r in results_like(call.f, {**call.bound, **example}))
        return outs, (0,) * len(outs)

    def forward_with_ctx(ctx, call: Call, *tensors) -> tuple:
        output = forward(call, *tensors)
        setup_context(ctx, (call, *tensors), output)
        return output

    def rule(method):
        # Each runs eagerly: the autograd engine runs a backward inside a
        # compiled step's frame, and torch.func a forward inside a compiled
        # transform's, where dynamo would trace them with FakeTensors.
        return staticmethod(torch.compiler.disable(method))

    methods = {"backward": rule(backward), "jvp": rule(jvp)}
    plain = type("CompiledOperation", (torch.autograd.Function,),
                 {"forward": rule(forward_with_ctx), **methods})
    transformable = type("TransformableCompiledOperation", (torch.autograd.Function,),
                         {"forward": rule(forward), "setup_context": rule(setup_context),
                          "vmap": rule(vmap), **methods})
    # plain's apply as torch's Python `Function.apply` calls it where no
    # torch.func transform runs and no argument is a transform's (dead)
    # wrapper: for plain tensors, it adds nothing but some 2 us
    plain_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, plain)
    _OPERATIONS = (plain, transformable, plain_apply)
    return _OPERATIONS


class AotTorch(AotBridged):
    library = "torch"

    def __init__(self, f: "AotFunction | AotGradient"):
        super().__init__(f)
        import torch
        _fill_dtypes(torch)
        # (torch.compile: a graph break, the call eager; its kernels are not torch's)
        self._call = torch.compiler.disable(self._call)

    @user_facing
    def __call__(self, /, *args, **kwargs):
        return self._call(args, kwargs)

    def _call(self, args: tuple, kwargs: dict):
        f = self.function
        tracer = _tracer()
        if tracer is not None:
            raise needs_ir(f"{tracer} (tracing {self.__name__})", f)
        if _TRANSFORMS_ACTIVE[0]() or _FORWARD_AD[0]._current_level >= 0:
            raise needs_ir(f"a torch.func transform or forward-mode AD of {self.__name__}", f)
        args, kwargs = _widened(f, args, kwargs)

        def array(value, where: str):
            if not _is_tensor(value):
                return value, None
            return _array_of(value, f, where), value

        bound, tensors = bind_foreign(f, self.__name__, args, kwargs, array)
        arrays = f._on_target(bound)
        self._check_compiled(arrays)
        recording = _GRAD_ENABLED[0]() and any(t.requires_grad for t in tensors.values())
        if not recording:
            results, layout = self._run(arrays)
            return arranged(layout, [_tensor(o) for o in results])
        if isinstance(self.f, AotGradient):
            results, layout = self._run(arrays)
            outs = _aot_operations()[1].apply(f"differentiating {self.__name__}", f,
                                              tuple(results), *tensors.values())
            return arranged(layout, list(outs))
        differentiable = set(f.differentiable_names(arrays))
        for name, t in tensors.items():
            if t.requires_grad and name not in differentiable:
                raise ArgumentError(f"{self.__name__}: {name!r} has no gradient (it is const "
                                    "or not a float), but its tensor requires grad; pass it "
                                    "detached")
        outs = _aot_operations()[0].apply(self, arrays, tuple(tensors), *tensors.values())
        return outs[0] if len(outs) == 1 else tuple(outs)


_AOT_OPERATIONS: tuple = ()


def _aot_operations() -> tuple:
    """The `torch.autograd.Function`s (torch is imported lazily): a
    function's call, whose backward runs its pullback program, and a
    gradient's, whose backward (second order) is refused."""
    global _AOT_OPERATIONS
    if _AOT_OPERATIONS:
        return _AOT_OPERATIONS
    import torch

    def results_of(ctx, outs: Sequence) -> tuple:
        """Tensors over the result arrays `outs`, the integer ones marked
        as having no gradient."""
        results = tuple(_tensor(o) for o in outs)
        constants = [r for r in results if not r.is_floating_point()]
        if constants:
            ctx.mark_non_differentiable(*constants)
        return results

    class AotCall(torch.autograd.Function):
        @staticmethod
        def forward(ctx, bridge: AotTorch, arrays: dict, names: tuple, *tensors):
            f = bridge.function
            outs, ctx.pullback = f._vjp_bound(arrays, read_in_place=names)  # (saved)
            ctx.bridge, ctx.names, ctx.bound = bridge, names, tuple(arrays)
            ctx.save_for_backward(*tensors)  # (torch checks they are not modified in place)
            return results_of(ctx, outs)

        @staticmethod
        def backward(ctx, *cts):
            f = ctx.bridge.function
            tensors = ctx.saved_tensors  # (torch raises if it freed them, or one was modified)
            grads = dict(zip(ctx.bound, ctx.pullback(
                *(_array_of(ct, f, "a cotangent") for ct in cts))))
            names = [n for n, need in zip(ctx.names, ctx.needs_input_grad[3:])
                     if need and grads.get(n) is not None]
            results = [grads[n] for n in names]
            if torch.is_grad_enabled():  # (create_graph=True) recorded, not differentiable
                results = AotGradientCall.apply(
                    f"differentiating the backward of {ctx.bridge.__name__}", f,
                    tuple(results), *tensors, *cts)
            else:
                results = [_tensor(g) for g in results]
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

    _AOT_OPERATIONS = (AotCall, AotGradientCall)
    return _AOT_OPERATIONS


def _batched(call: Call, names: list[str]) -> Optional[Stacked]:
    """f of `call` stacked along the arguments `names`, or None where that
    cannot be done (an op with no rule for stacked values, a const or
    size argument, which picks the program by its value)."""
    f = call.f
    if f.static_names(call.bound) & set(names):
        return None
    stacked = batched_function(f, names)
    return stacked if stacked.stacks(call.bound) else None


def _same_shapes(results: tuple, f: Compiled) -> tuple:
    """The examples' results (one result of each) for torch.func.vmap to
    stack, where they have one shape: an `ArgumentError`, as `dsl.vmap`
    raises it, where a mapped argument gave each example a size of its own
    (torch.stack's RuntimeError said only that the sizes differ)."""
    for i, r in enumerate(results):
        if r.shape != results[0].shape:
            raise ArgumentError(f"torch.func.vmap of {called(f.name)} gives results of "
                                f"different shapes: {list(results[0].shape)} for example 0, "
                                f"{list(r.shape)} for example {i} (a mapped argument gives a "
                                "size); results must stack", f.span)
    return results


def _plain_views(args: tuple) -> "list[np.ndarray] | None":
    """The NumPy views of positional arguments when every one is a plain
    CPU tensor of a dtype gradlang takes (the function checks the views as
    it checks any array), else None (a torch.func wrapper too: it has no
    memory of its own, and the slow path binds a stand-in for it)."""
    views = []
    for t in args:
        if type(t) not in _PLAIN or not t.is_cpu \
                or t.dtype not in _NUMPY or _WRAPPED[0](t) or t.layout is not _STRIDED[0]:
            return None
        try:
            views.append(t.detach().numpy() if t.requires_grad else t.numpy())
        except RuntimeError:  # no memory of its own (nested, legacy vmap): `_array_of` says so
            return None
    return views


def _nonzero(tangent: Any) -> bool:
    """Whether a tangent torch gives may be other than zero (torch.func
    gives zeros for an input it does not differentiate): the values of the
    plain tensor under its wrappers."""
    if tangent is None:
        return False
    while _WRAPPED[0](tangent):
        tangent = _UNWRAPPED[0](tangent)
    return bool(tangent.any())


def _tensors(result: Any) -> Any:
    """A function's (formatted) results, each array a tensor over it."""
    if isinstance(result, tuple):
        return tuple(_tensors(r) for r in result)
    return _tensor(result)


def _shown(err: GradError) -> GradError:
    """err, raised where torch traces a call, as the error of the call
    (not a graph break) while dynamo traces it: a bad argument, or a
    program that does not compile (shapes that do not broadcast), which
    the eager call would raise too.  Dynamo makes any other error of a
    `nonstrict_trace` call a graph break, which under fullgraph=True it
    reports as 'Unsupported output type for nonstrict_trace-ed function',
    our message lost (and without it traces our Python, which then
    misreads its fake tensors); an IndexError (of a tensor's dimension)
    it passes on: so err comes back as an IndexError too, of its own
    class besides."""
    if not _COMPILING[0]():
        return err
    shown_class = _shown_class(type(err))
    shown = shown_class.__new__(shown_class, *err.args)
    shown.__dict__.update(err.__dict__)
    return shown


@functools.lru_cache(maxsize=None)
def _shown_class(cls: type) -> type:
    """cls, an IndexError too, named as cls (for the user, it is one)."""
    return type(cls.__name__, (cls, IndexError), {"__module__": cls.__module__,
                                                  "__qualname__": cls.__qualname__,
                                                  "__doc__": cls.__doc__})


class _Float(float):
    """A Python float that is its own object (`bind_foreign` tells the
    values it binds apart by identity)."""


class _Int(int):
    """A Python int that is its own object."""


def _fresh_number(tensor: Any, number: Any) -> Any:
    """A number to bind for the 0-d tensor standing for `number` (a
    symbolic one: its value in the example, with no guard on it; dynamo's
    float, None: any, for only its dtype is bound)."""
    if not tensor.is_floating_point():
        return _Int(hint(number))
    return _Float(0.0 if number is None or number.node.hint is None else number.node.hint)


def _traceable(value: Any, number: bool) -> Any:
    """A call's argument as dynamo passes it to nonstrict_trace: a NumPy
    array as a tensor, and a Python float if `number` as a 0-d tensor."""
    if isinstance(value, np.ndarray):
        return _AS_TENSOR[0](value)
    if number:
        # (a product: dynamo keeps the float an input of the graph, where it
        # specialized the graph on the value of a scalar_tensor of it)
        return _SCALAR_TENSOR[0](1.0, dtype=_TORCH[np.dtype(np.float64)]) * value
    return value


def _is_tensor(value: Any) -> bool:
    return isinstance(value, _TENSOR[0])  # a subclass too (nn.Parameter, a user's own)


def _tracer() -> Optional[str]:
    """The torch tracer recording this call, if any (one that would keep
    the kernels' results as constants, or has no memory for them to read):
    jit.trace, export, make_fx's proxy mode (functorch's linearize too),
    FakeTensorMode, functionalization."""
    if _TRACING[0]():
        return "torch.jit.trace"
    if _EXPORTING[0]():  # (its non-strict mode ignores torch.compiler.disable)
        return "torch.export"
    if _DISPATCH_STACK[0]():  # any dispatch mode at all (a cheap test: most calls have none)
        for key, what in _DISPATCH_MODES:
            if _DISPATCH_MODE[0](key) is not None:
                return what
    return None


_NUMPY_DTYPES = ("float32", "float64", "int32", "int64", "bool")
_TORCH: dict = {}  # NumPy dtype -> torch dtype, filled on first use
_NUMPY: dict = {}  # torch dtype -> NumPy dtype
_TENSOR: list = []  # torch.Tensor
_AS_TENSOR: list = []  # torch.as_tensor
_PLAIN: list = []  # the types of tensors with nothing to dispatch: Tensor, nn.Parameter
_WRAPPED: list = []  # whether a tensor is a torch.func transform's wrapper
_UNWRAPPED: list = []  # the tensor under a torch.func transform's wrapper
_LEGACY_BATCHED: list = []  # whether a tensor is batched by torch's legacy vmap
_STRIDED: list = []  # torch.strided, the layout of dense tensors
_HALF: list = []  # torch.float16 and torch.bfloat16, computed in float32
_NO_TRANSFORM: list = []  # a context in which torch.func transforms are off
_TRANSFORMS_ACTIVE: list = []  # whether a torch.func transform is running
_GRAD_ENABLED: list = []  # torch.is_grad_enabled: whether autograd records
_FORWARD_AD: list = []  # torch.autograd.forward_ad, whose level says if one is open
_COMPILING: list = []  # torch.compiler.is_compiling: whether dynamo is tracing
_TRACING: list = []  # whether torch.jit.trace is recording
_EXPORTING: list = []  # whether torch.export is tracing
_DISPATCH_STACK: list = []  # how many torch dispatch modes are active
_DISPATCH_MODE: list = []  # the active torch dispatch mode of a key, or None
_DISPATCH_MODES: list = []  # (key, what sets it) of the modes that trace
_TRACER_WARNING: list = []  # torch.jit's TracerWarning
_TRACED: list = []  # `_traced`, as dynamo graphs it, untraced (nonstrict_trace)
_SYMBOLIC_NUMBERS: list = []  # (torch.SymInt, SymFloat): a tracer's numbers
_SYMBOLIC_DTYPE = {"SymInt": "int64", "SymFloat": "float64"}
_SCALAR_TENSOR: list = []  # torch.scalar_tensor


def _fill_dtypes(torch) -> None:
    if not _TORCH:
        _TORCH.update({np.dtype(n): getattr(torch, n) for n in _NUMPY_DTYPES})
        _NUMPY.update({v: k for k, v in _TORCH.items()})
        _TENSOR.append(torch.Tensor)
        _AS_TENSOR.append(torch.as_tensor)
        _PLAIN.extend([torch.Tensor, torch.nn.Parameter])
        _WRAPPED.append(torch._C._functorch.is_functorch_wrapped_tensor)
        _UNWRAPPED.append(torch._C._functorch.get_unwrapped)
        _LEGACY_BATCHED.append(torch._C._functorch.is_legacy_batchedtensor)
        _STRIDED.append(torch.strided)
        _HALF.extend([torch.float16, torch.bfloat16])
        _NO_TRANSFORM.append(torch._C._DisableFuncTorch)
        _TRANSFORMS_ACTIVE.append(torch._C._are_functorch_transforms_active)
        _GRAD_ENABLED.append(torch.is_grad_enabled)
        _FORWARD_AD.append(importlib.import_module("torch.autograd.forward_ad"))
        _COMPILING.append(torch.compiler.is_compiling)
        _TRACING.append(torch._C._is_tracing)
        _EXPORTING.append(torch.compiler.is_exporting)
        _DISPATCH_STACK.append(torch._C._len_torch_dispatch_stack)
        _DISPATCH_MODE.append(torch._C._get_dispatch_mode)
        keys = torch._C._TorchDispatchModeKey
        _DISPATCH_MODES.extend([(keys.PROXY, "make_fx (or torch.func.linearize)"),
                                (keys.FAKE, "FakeTensorMode"),
                                (keys.FUNCTIONAL, "functionalization")])
        _TRACER_WARNING.append(torch.jit.TracerWarning)
        torch.utils._pytree.register_constant(_Identity)
        _TRACED.append(importlib.import_module("torch._dynamo").nonstrict_trace(_traced))
        _SYMBOLIC_NUMBERS.append((torch.SymInt, torch.SymFloat))
        _SCALAR_TENSOR.append(torch.scalar_tensor)


def _array_of(t, f: Compiled, where: str):
    """The array the kernels of f's target take for tensor t, sharing its
    memory: the NumPy view of a CPU tensor, the tensor itself (through its
    `__cuda_array_interface__`) for a CUDA one."""
    _check_tensor(t, f, where)
    if _WRAPPED[0](t):
        # torch.func's wrappers have no memory of their own for the kernels
        # to read (and torch ops on them make wrappers again): a stand-in of
        # the shape, until the operation's forward gets the plain tensor
        # under the wrapper (where a device tensor is checked)
        view = placeholder(tuple(t.shape), _NUMPY[t.dtype])
        if t.device.type != "cpu":
            return view
    elif _TRANSFORMS_ACTIVE[0]():
        # a plain tensor a function under a torch.func transform closes
        # over: reading its memory is refused there unless functorch is off
        with _NO_TRANSFORM[0]():
            view = _memory(t)
    else:
        try:
            view = _memory(t)
        except RuntimeError as err:  # a subclass with no memory (a FakeTensor)
            raise ArgumentError(f"{where} is a {type(t).__name__}, which has no memory for "
                                f"compiled kernels to read ({err})", f.span) from None
    if not f.target.is_array(view):
        _wrong_device(t, f, where)
    return view


def _wrong_device(t, f: Compiled, where: str):
    raise ArgumentError(f"{where} is a tensor on device {t.device}, but {called(f.name)} runs "
                        f"on target {f.target.name!r}; move the tensor there, or load "
                        "the module for its device", f.span)


def _widened(f: Compiled, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`widened_halves` of torch's float16 and bfloat16 tensors, as torch's
    losses compute under autocast."""
    return widened_halves(f, args, kwargs, lambda v: _is_tensor(v) and v.dtype in _HALF,
                          lambda v: v.float())


def _check_tensor(t, f: Compiled, where: str) -> None:
    """ArgumentError unless t is a dense tensor of a dtype gradlang takes
    that the kernels can read (not one batched by the legacy vmap)."""
    if t.dtype not in _NUMPY:
        half = ("; float16 and bfloat16 are cast to float32 only for a parameter that takes "
                "float32" if t.dtype in _HALF else "")
        raise ArgumentError(f"{where} is a tensor of dtype {t.dtype}; gradlang takes float32 "
                            f"and float64 (and int32, int64, bool constants){half}", f.span)
    if t.layout is not _STRIDED[0] or t.is_nested:  # no memory of the array's shape
        what, dense = (("a nested tensor", "t.to_padded_tensor(0.0)") if t.is_nested
                       else (f"a tensor of layout {t.layout}", "t.to_dense()"))
        raise ArgumentError(f"{where} is {what}; compiled functions take dense tensors "
                            f"({dense})", f.span)
    if _LEGACY_BATCHED[0](t):
        # its batch lives in a wrapper torch gives no access to from Python
        raise ArgumentError(f"{where} is batched by torch's legacy vmap (autograd.grad's "
                            "is_grads_batched, autograd.functional's vectorize=True, "
                            "gradcheck's check_batched_grad), whose tensors have no memory "
                            "for compiled kernels; use torch.func (vmap, jacrev, jacfwd, "
                            "hessian), or turn that option off", f.span)

