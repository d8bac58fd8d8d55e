"""`gradlang::call`, the torch custom operation a call of a `dsl.to_torch`
function is where torch traces it rather than runs it: `torch.compile`
(dynamo hands the call to AOTAutograd, which traces it with FakeTensors),
`torch.export`, `make_fx`, `torch.jit.trace`, FakeTensorMode and
functionalization.

Contract: `apply(f, bound, tensors)` returns f's raw results for the
validated arguments `bound`, where the names in `tensors` (name -> tensor:
a plain one, a FakeTensor, a tracer's) are bound as stand-ins of their
shapes and dtypes (`dsl.dask_bridge.placeholder`), as the results of one
call of the operation on those tensors.  The operation's other argument is
a key naming a registered `OpCall`: f, which of its arguments are the
tensors, and the values of the others (constants, copied), but for the
module params the call left out, which it reads when it runs.  The key is a hash of
those (f's identity, which holds its module's sources, its target, the
constants' bytes), so no user text reaches torch's registry or the code of
a traced graph, and two functions of one name from different files never
share one.  The operation's fake rule gives the results' shapes and dtypes
from the IR of the program it runs (`program_result_types`) without
running anything, in torch's symbols
where its sizes are (dynamic shapes: `OpCall.traced_result_types`); its
real rule runs
f's kernels on the tensors' memory, its results contiguous as the fake
rule's are (inductor checks their strides; results that would share an
input's memory, or one another's, are copied: torch's custom operations
may not alias); its autograd rule's backward is the same operation of f's backward
pass (`backward_function`: f's grad blocks), which has that autograd rule
too, so each order of derivative torch asks for is our compiled gradient
differentiated again.  A call autograd records in a compiled step
(`apply`'s `differentiated`) is the operation of f's forward pass
(`ForwardPass`): its results past f's are the residuals f's backward pass
reads (the fake rule gives their types too), which autograd saves, unseen,
and its backward is the operation of that backward pass reading them
(`BackwardPass`), so the step computes f's forward once, as the eager
bridge does.  That backward operation is differentiated (second order) as
the backward pass that recomputes the forward, whose operation every
other call's backward is too (other tracers' graphs, traced once for any
use, keep no residuals).  The operation
takes no torch.func transform and has no forward-mode rule (torch's
custom operations take none: `dsl.torch_bridge` refuses them under a
tracer).  torch is imported only when the operation is first needed.
"""
from __future__ import annotations

import hashlib
from typing import Any, Optional, Sequence

import numpy as np

from dsl.dask_bridge import placeholder
from dsl.function import (Compiled, backward_function, backward_pass_function,
                          forward_pass_function, program_result_types,
                          symbolic_result_types)
from gradlang.compiler.shapes import Sym, evaluate
from gradlang.runtime.errors import ArgumentError, called
from gradlang.runtime.forking import ChildSafeLock

_CALLS: dict[str, "OpCall"] = {}  # key -> the call it names (kept: traced graphs hold keys)
_OPERATION: list = []  # the custom operation, defined on first use
_DEFINING = ChildSafeLock()  # (threads tracing at once define it once)


def apply(f: Compiled, bound: dict[str, Any], tensors: dict[str, Any],
          live: tuple[str, ...] = (), differentiated: bool = False) -> tuple:
    """f's raw results on `bound` as one call of `gradlang::call` on
    `tensors` (see the module's contract), where the module params `live`
    (those the call left out) take their values when it runs; a call
    `differentiated` (autograd records it) runs f's forward pass, whose
    residuals its backward reads."""
    call = op_call(f, bound, tuple(tensors), live)
    if differentiated:
        call = call.keeping_residuals()
    return tuple(operation()(call.key, list(tensors.values()))[:call.n_results])


def op_call(f: Compiled, bound: dict[str, Any], names: tuple[str, ...],
            live: tuple[str, ...] = ()) -> "OpCall":
    """The registered `OpCall` of f on `bound` whose arguments `names` are
    the operation's tensors, `live` module params read when it runs, the
    others constants."""
    # (with live params, f itself: two loads of one source hold params of their own)
    identity = (f.identity(), f.target.name, names, live, id(f) if live else None,
                tuple((n, a.dtype.str, a.shape, None if n in names or n in live
                       else np.ascontiguousarray(a).tobytes())
                      for n, a in bound.items()))
    key = hashlib.sha256(repr(identity).encode()).hexdigest()[:32]
    call = _CALLS.get(key)
    if call is None:
        call = _CALLS[key] = OpCall(key, f, bound, names, live)
    return call


class OpCall:
    """One registered call: f on the constants of `bound`, whose arguments
    `names` are the operation's tensors (bound in these dtypes: a param
    declared f64 takes an f32 tensor as f64), and whose module params
    `live` take the module's values when it runs, as an eager call's do
    (a graph traced before `module.params[...] = ...` runs with the new
    value)."""

    def __init__(self, key: str, f: Compiled, bound: dict[str, Any], names: tuple[str, ...],
                 live: tuple[str, ...] = ()):
        self.key, self.f, self.names, self.live = key, f, names, live
        self.dtypes = [bound[n].dtype for n in names]
        # the constants, in f's order, with stand-ins for the tensors; copies,
        # as the key has their values (a caller's array changed in place would
        # change them for every graph naming this call, and one traced anew
        # with the old values would find this call by them)
        self.bound = {n: placeholder(a.shape, a.dtype) if n in names
                      else np.array(a) if isinstance(a, np.ndarray) else a
                      for n, a in bound.items()}
        statics = f.static_names(self.bound) & set(names)
        if statics:
            _by_value_error(f, min(statics))
        self._backward: dict[int, tuple[OpCall, list[str]]] = {}
        self._forward: Optional[OpCall] = None  # (`keeping_residuals`)
        # a call of f's forward pass: how many of its results are f's (the
        # others are residuals, which autograd saves, named `saved_names`)
        self.n_results: Optional[int] = None
        self.saved_names = names
        # a call of f's backward pass reading residuals: the call of the
        # VjpFunction that recomputes them, which its own backward differentiates
        self.recomputing: Optional[OpCall] = None

    def bound_with(self, arrays: Sequence[Any]) -> dict[str, Any]:
        bound = dict(self.bound)
        bound.update(zip(self.names, arrays))
        return bound

    def result_types(self, shapes: Sequence[tuple]) -> tuple:
        """(shape, NumPy dtype) of each result for tensors of these shapes,
        as the program `run` runs for them gives them (a forward pass's
        residuals: `program_result_types`)."""
        bound = self.bound_with([placeholder(s, d) for s, d in zip(shapes, self.dtypes)])
        return self._retrying(lambda: program_result_types(self.f, bound), bound)

    def traced_result_types(self, shapes: Sequence[tuple]) -> list:
        """`result_types` for tensors whose sizes may be symbols of torch's
        dynamic shapes (SymInts): the results' sizes are then expressions
        in them.  f is lowered with a symbol for each of torch's, or else
        (a shape rule that needs to know two sizes equal) for the pattern
        of equal sizes in the traced example, on which the graph is then
        guarded; where f needs concrete sizes, the graph is specialized.  A
        lowering with other residuals (a forward pass's: f's results are the
        same in every one) than the program run for the example, lowered
        for its pattern (`result_types`), is passed over as one that fails."""
        hints = [tuple(map(hint, s)) for s in shapes]
        if all(type(d) is int for s in shapes for d in s):
            return self.result_types(hints)
        bound = self.bound_with([placeholder(h, d) for h, d in zip(hints, self.dtypes)])
        given = dict(zip(self.names, shapes))
        expected = len(self.result_types(hints))
        symbolic = None
        # a symbol of ours for each of torch's, or else for each size of
        # torch's symbols in the example (those equal in it sharing one)
        for same in (lambda d: d.node.expr, hint):
            if symbolic is None:
                symbolic = self._retrying(lambda: symbolic_result_types(
                    self.f, bound, _symbols(given, same)), bound)
                if symbolic is not None and len(symbolic[1]) != expected:
                    symbolic = None
        if symbolic is None:
            return self.result_types([tuple(int(d) for d in s) for s in shapes])
        types, outs = symbolic
        sizes: dict[str, Any] = {}
        for name, t in types.items():
            for d, size in zip(getattr(t, "shape", ()), given.get(name, self.bound[name].shape)):
                known = sizes.setdefault(d.factors[0], size) if isinstance(d, Sym) else d
                # (for the pattern of the example, the comparison guards the graph:
                # it holds while the sizes keep it, as they do here)
                if known is not size and not known == size:
                    raise AssertionError(f"{size} != {known}: not the pattern of the hints")
        return [(tuple(evaluate(d, sizes) for d in shape), dtype) for shape, dtype in outs]

    def _retrying(self, run, bound: dict[str, Any]):
        """run(), and again each time f compiles for the value of an
        integer argument used as a size (an error if that is a tensor)."""
        def refuse(name: str) -> None:
            if name in self.names:
                _by_value_error(self.f, name)
        return self.f.retrying_by_value(bound, run, refuse)

    def run(self, tensors: Sequence[Any]) -> list:
        """The results of f's kernels on the tensors' memory."""
        arrays = [_memory(t) for t in tensors]
        arrays = [a if not isinstance(a, np.ndarray) or a.dtype == d else a.astype(d)
                  for a, d in zip(arrays, self.dtypes)]
        bound = self.bound_with(arrays)
        if self.live:
            bound.update(self._live_params())
        # (contiguous, as the fake rule's results are: inductor asserts the
        # strides it traced, and a kernel may give a transposed array)
        results = [_tensor(o).contiguous() for o in self.f.call_known(bound)]
        if self.n_results is not None and \
                len(results) != self.n_results + len(self.saved_names) - len(self.names):
            raise ArgumentError(f"{called(self.f.name)} keeps other residuals for these sizes "
                                "than where torch traced it: compile it without dynamic "
                                "shapes", self.f.span)
        # torch's custom operations may not return memory an input (a function
        # returning its argument) or another result holds
        taken = {t.untyped_storage().data_ptr() for t in tensors}
        unshared = []
        for r in results:
            memory = r.untyped_storage().data_ptr()
            unshared.append(r.clone() if memory in taken else r)
            taken.add(memory)
        return unshared

    def _live_params(self) -> dict[str, Any]:
        """The values of the module params `live` now: ArgumentError if one
        no longer has the shape the call was traced with."""
        values = self.f.module_params()
        for n in self.live:
            traced = self.bound[n]
            if n not in values:
                raise ArgumentError(f"{called(self.f.name)} reads param {n!r}, which is no "
                                    "longer set", self.f.span)
            if values[n].shape != traced.shape or values[n].dtype != traced.dtype:
                raise ArgumentError(f"param {n!r} read by {called(self.f.name)} has shape "
                                    f"{list(values[n].shape)} now, but {list(traced.shape)} "
                                    "where torch traced the call: trace it again", self.f.span)
        return {n: values[n] for n in self.live}

    def keeping_residuals(self) -> "OpCall":
        """The call of f's forward pass (`ForwardPass`) on these tensors:
        f's results, then the residuals its backward reads; this call
        itself (whose backward computes them again) where a residual has a
        size known only when the forward runs (a loop's trip count given by
        an argument's value, or one that is no product of the sizes of the
        pattern the program is lowered for), which torch's fake rule must
        give beforehand."""
        if self._forward is None:
            kept = op_call(forward_pass_function(self.f), self.bound, self.names, self.live)
            types = kept._result_types()
            if not all(type(d) is int for shape, _ in types for d in shape):
                self._forward = self
                return self
            kept.n_results = len(self._result_types())
            kept.saved_names = self.names + backward_pass_function(
                self.f, kept.n_results, len(types) - kept.n_results).residual_names
            self._forward = kept
        return self._forward

    def backward(self, n_outputs: int) -> tuple["OpCall", list[str]]:
        """(the call of f's backward pass on these tensors, the residuals a
        call of f's forward pass saved, and `n_outputs` cotangents, the
        names of the tensors its results are the cotangents of).  A call of
        a backward pass reading residuals is differentiated as the
        `VjpFunction` call it stands for, which computes them again: the
        cotangents of its residuals are None."""
        back = self._backward.get(n_outputs)
        if back is None:
            if self.recomputing is not None:
                back = self.recomputing.backward(n_outputs)
            elif self.n_results is not None:
                f = self.f.inner
                bf = backward_pass_function(f, n_outputs,
                                            len(self.saved_names) - len(self.names))
                types = self._result_types()
                bound = dict(self.bound)
                bound.update({n: placeholder(s, d) for n, (s, d) in zip(
                    bf.residual_names + bf.ct_names,
                    types[self.n_results:] + types[:self.n_results])})
                call = op_call(bf, bound, self.saved_names + bf.ct_names, self.live)
                call.recomputing = op_call(f, self.bound, self.names, self.live).backward(
                    n_outputs)[0]
                back = (call, self.differentiable)
            else:
                vf = backward_function(self.f, n_outputs)
                bound = dict(self.bound)
                bound.update({c: placeholder(s, d)
                              for c, (s, d) in zip(vf.ct_names, self._result_types())})
                back = (op_call(vf, bound, self.names + vf.ct_names, self.live),
                        self.differentiable)
            self._backward[n_outputs] = back
        return back

    def _result_types(self) -> tuple:
        """`result_types` for the tensors' shapes where this call was traced."""
        return self.result_types([self.bound[n].shape for n in self.names])

    @property
    def differentiable(self) -> list[str]:
        return self.f.differentiable_names(self.bound)


def registered(key: str) -> OpCall:
    """The call a key names, registered when this process traced it."""
    call = _CALLS.get(key)
    if call is None:  # (a key is a hash: no user text)
        raise ArgumentError(f"gradlang::call {key!r} names no call this process has traced: "
                            "a graph traced by another (an ExportedProgram loaded from a "
                            "file) runs here once this process has traced the same call")
    return call


def _by_value_error(f: Compiled, name: str):
    raise ArgumentError(f"argument {name!r} of {called(f.name)} picks the compiled program "
                        "by its value (it is const, or gives a size), so a traced call "
                        "(torch.compile, export, make_fx) must pass it as a Python number "
                        "or NumPy array, not a tensor", f.span)


def operation():
    """The custom operation `gradlang::call(str call, Tensor[] inputs) ->
    Tensor[]` with its fake and autograd rules, defined on first use."""
    if not _OPERATION:
        with _DEFINING:
            if not _OPERATION:
                _OPERATION.append(_defined())
    return _OPERATION[0]


def _defined():
    """The operation, defined (once: torch's registry takes one definition)."""
    import torch

    # (the schema is spelled out: this module's annotations are strings)
    @torch.library.custom_op("gradlang::call", mutates_args=(),
                             schema="(str call, Tensor[] inputs) -> Tensor[]")
    def call(call: str, inputs: list) -> list:
        return registered(call).run(inputs)

    @call.register_fake
    def _(call: str, inputs: list) -> list:
        known = registered(call)
        device = inputs[0].device if inputs else torch.device("cpu")
        return [torch.empty(shape, dtype=_TORCH[dtype], device=device)
                for shape, dtype in known.traced_result_types(
                    [tuple(t.shape) for t in inputs])]

    def setup_context(ctx, inputs: tuple, output: list) -> None:
        known = ctx.call = registered(inputs[0])
        # (a forward pass's results past f's are its residuals: saved, not seen)
        ctx.outputs = [(o.shape, o.dtype) for o in output[:known.n_results]]
        ctx.save_for_backward(*inputs[1], *output[len(ctx.outputs):])

    def backward(ctx, cts: list) -> tuple:
        known: OpCall = ctx.call
        saved = ctx.saved_tensors
        # (torch gives None for the cotangent of an output it did not use; a
        # residual's is zero, as only a backward pass, whose backward gives
        # its residuals none, reads it)
        cts = [torch.zeros(shape, dtype=dtype, device=saved[0].device) if ct is None else ct
               for ct, (shape, dtype) in zip(cts, ctx.outputs)]
        back, wrt = known.backward(len(cts))
        given = dict(zip(known.saved_names, saved))
        given.update(zip(back.names[len(back.names) - len(cts):], cts))
        grads = dict(zip(wrt, call(back.key, [given[n] for n in back.names])))
        return None, [grads.get(n) for n in known.names]

    call.register_autograd(backward, setup_context=setup_context)
    _TORCH.update({np.dtype(n): getattr(torch, n)
                   for n in ("float32", "float64", "int32", "int64", "bool")})
    return call


_TORCH: dict = {}  # NumPy dtype -> torch dtype


def _symbols(shapes: dict[str, tuple], same: Any) -> dict[str, tuple]:
    """`shapes` with a `Sym` for each symbolic size, the sizes for which
    `same` gives one value sharing one."""
    symbols: dict[Any, Sym] = {}
    return {n: tuple(d if type(d) is int else symbols.setdefault(
        same(d), Sym.named(f"s{len(symbols)}")) for d in s) for n, s in shapes.items()}


def hint(size: Any) -> int:
    """A tensor's size as an int: a symbolic one's (torch's dynamic shapes)
    value in the example being traced, with no guard on it; jit.trace's
    (a tensor) as it is."""
    if type(size) is int:
        return size
    node = getattr(size, "node", None)
    if node is not None and node.hint is not None:
        return node.hint
    return int(size)


def _memory(t):
    """A plain tensor's memory as f's kernels take it: the NumPy view of a
    CPU tensor, a CUDA tensor itself; a copy of one whose memory holds the
    negation of its values (torch's negative bit: `c.conj().imag` of a
    complex c), which was refused as having "no memory for compiled kernels
    to read" on the CPU (numpy() refuses it).  A CUDA tensor of another
    layout than C-contiguous is copied to one (the CUDA target refuses
    other layouts, and torch's own backward hands an output an expanded,
    zero-stride cotangent for `y.sum().backward()`), as the CPU target
    copies what its kernels cannot read in place."""
    if t.is_neg():
        t = t.detach().resolve_neg()
    if not t.is_cpu:
        return t.detach().contiguous()
    return (t.detach() if t.requires_grad else t).numpy()  # (numpy() refuses one that does)


def _tensor(array):
    """A tensor over a result array's memory (CPU or CUDA): over
    `_shareable(array)`'s."""
    import torch
    if isinstance(array, np.ndarray):
        return torch.from_numpy(_shareable(array))
    return torch.as_tensor(array, device="cuda")


def _shareable(array):
    """The array, or a copy of a NumPy array whose memory torch cannot
    share (it shares only writable, forward-strided memory)."""
    if isinstance(array, np.ndarray) and (
            not array.flags.writeable or min(array.strides, default=0) < 0):
        return np.array(array)
    return array
