"""AST -> IR, for one call signature.

Contract: `Lowerer(namespace).lower_entry(fdef, types)` returns an
`ir.Function` whose parameters are the runtime arguments named by `types`
(the function's parameters the caller passed, then the module `param`s it
reads, directly or through calls) and whose body is the computation, with
every call to a function without grad blocks inlined.

A call of a function with grad blocks (or a gradient decorator) becomes
a `custom_vjp` equation whose backward pass is the grad block
(`compiler.staging`); `grad(f)(...)` in the language is f's gradient IR,
inlined, so it can be differentiated again.

`for` and `if` statements lower through `compiler.control`.

Values known at compile time (literals, `x.shape[k]`, arithmetic on them,
tuples) stay Python values until they meet an array (`compiler.values`).
Every problem is raised as a `GradError` at the span that caused it.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import operator
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

from gradlang.compiler import ast, autodiff, control, forward, ops, products
from gradlang.compiler.builder import Builder, coerce, fit_constant, inline, parameter_number
from gradlang.compiler.builtins import (BUILTINS, MASK_HINT, NONE_IS_NO_VALUE, TRANSFORMS,
                                        by_value, compile_time_hint, index_operand,
                                        jvp_layout, take)
from gradlang.compiler.checker import ATTRIBUTES_SHOWN, wrt_positions
from gradlang.compiler.library import in_library
from gradlang.compiler.linearity import CallKinds
from gradlang.compiler.ir import (FLOATS, INTS, NUMPY_DTYPES, Atom, Eqn, Function, Lit,
                                  StaticScalar, TensorType, Var, WeakVar)
from gradlang.compiler.namespace import Namespace, param_reads
from gradlang.compiler.source import too_deep
from gradlang.compiler.shapes import (Dim, NeedsConcrete, Sym, bound_of, broadcasts_to,
                                      derivation, is_lone, limited, plain_size, region_size,
                                      shortened)
from gradlang.compiler.staging import Lowered, Reach, lower_staged
from gradlang.compiler.values import (RUN_TIME, ArgumentValue, ByValueArgument, NotCompileTime,
                                      RunTimeBool, RunTimeInt, StaticList, Value, as_atom,
                                      as_results, cast, check_range_fits, entry_results,
                                      is_argument, is_integer, is_run_time, is_static,
                                      naming_arguments, number_type, of_sizes_only, promote,
                                      run_time_atom, run_time_number,
                                      run_time_product, sequence_kind, unify, weak_float_dtype,
                                      weak_number, weak_result)
from gradlang.runtime.args import admits, admitted, check_dims, kind_text, number_dtype
from gradlang.runtime.common import index_out_of_range_message
from gradlang.runtime.errors import ArgumentError, GradError, Span, one_line


# True while compiling ahead of time (`dsl.aot`): a fixed region (`t[0:2]`,
# `t[3]`) of an axis of symbolic size lowers, its driver checking that the
# axis reaches it (`codegen.check_reaches`), since no program can be made
# later for the call's sizes.  Otherwise it needs concrete sizes: a call on
# a shorter axis then gets NumPy's shorter slice, in a program of its own.
REGIONS_OF_SYMBOLIC_AXES = contextvars.ContextVar("regions_of_symbolic_axes", default=False)

# Calls are inlined by recursion, several Python frames per level; a
# bound well inside Python's default stack turns a deeper chain into an
# error at the call rather than a RecursionError.
MAX_CALL_DEPTH = 64

# Each call is a copy of the function called, so functions that each call
# the one before twice double the program at every level, and each
# in-language `grad(f)` of a function holding one triples it: a bound on
# the operations one program lowers (expressions, and the equations of
# derived gradients it inlines; well past any program written by hand or
# generated that compiles in reasonable time; ~10 us each) turns that
# exponential blow-up into an error within seconds.
MAX_PROGRAM_SIZE = 100_000


class Lowerer:
    def __init__(self, namespace: Namespace, numbers_of_sizes: bool = True):
        self.namespace = namespace
        # whether a float that compile-time arithmetic makes of a symbolic
        # size (`0.1 / k`) is computed at run time (`size_number`) rather
        # than raising NeedsConcrete; and how many such numbers were made
        # (`pipeline.lower_entry` lowers again without them where one was)
        self.numbers_of_sizes = numbers_of_sizes
        self.size_numbers = 0
        # The numbers `n - c` of a size n and an int c >= 0 that `size_number`
        # made, and the size max(0, n - c) each is where a bound clamps it
        # at 0 (`range(n - 1)`, `arange(n - 1)`, `x[:n - 1]`: `shortened_bound`)
        self.shortened_numbers: dict[Var, Sym] = {}
        self.call_stack: list[ast.FuncDef] = []  # (by identity: two files may share a name)
        self.call_spans: list[Span] = []  # where each call of call_stack is
        self.size = 0  # operations lowered so far: MAX_PROGRAM_SIZE
        # the entry parameters by name, and values standing for one: a
        # stage's parameter (alias_arguments), `k + 1` (of_arguments)
        self.arguments: dict[Var, str] = {}
        # the entry's parameters of no annotation, which take Python numbers
        # and lists as floats (`runtime.args`): `builtins.python_values_hint`
        self.unannotated: frozenset[str] = frozenset()
        # inside a @recompute function with loops: their checkpoint interval
        # (trips per segment), or "sqrt" for about the trip count's root
        self.checkpoint: "int | str | None" = None
        # inside the branches of runtime ifs: each condition, and whether
        # its branch is the one where it holds (`index_guard`)
        self.branches: tuple[tuple[Atom, bool], ...] = ()
        # stages lowered, by what their lowering depends on, for the calls
        # alike to reuse (`staging.Chain.lowered`); what the stage being
        # lowered reaches (None outside one); `staging.inlined_size`'s memo
        self.stages: dict[tuple, Lowered] = {}
        self.reach: Optional[Reach] = None
        self.sizes: dict[int, tuple[Function, int]] = {}
        self.unnoted: dict[int, tuple[Function, bool]] = {}  # `_Notes`'s memo
        self.linear_kinds: CallKinds = {}  # `linearity.check_linear`'s memo
        # the grad block being lowered, as (id of its function, its number),
        # None in a function's body; and the errors of its if conditions and
        # loop bounds that are no scalar bool or integer, held back until the
        # block's linearity is checked (`defer_in_block`)
        self.in_block: Optional[tuple[int, int]] = None
        self.upstream: tuple[Value, ...] = ()  # (that block's upstream cotangents)
        # names a runtime if dropped, bound in only some of its branches, by
        # the function lowered (`current_function`): the line of the last
        # such if, for the error of a grad block reading one
        self.dropped: dict[tuple[Optional[int], str], int] = {}
        self.deferred: list[tuple[Optional[tuple[int, int]], GradError]] = []

    def alias_arguments(self, params: Sequence[Var], values: Sequence[Value]) -> None:
        """Parameters of a stage's function (`compiler.staging`) standing
        for `values`: each value that is an argument of the entry, its
        parameter is too, so that `builtins.by_value` can ask for it."""
        for p, v in zip(params, values):
            if isinstance(v, Var) and v in self.arguments:
                self.arguments[p] = self.arguments[v]

    def for_another_entry(self) -> "Lowerer":
        """A lowerer for another entry of the same namespace that reuses
        the stages (and memos) this one lowered: what a stage's lowering
        depends on is in its key, the entry's state (size, call stack) is
        not shared."""
        other = Lowerer(self.namespace, self.numbers_of_sizes)
        other.stages, other.sizes, other.unnoted = self.stages, self.sizes, self.unnoted
        other.linear_kinds = self.linear_kinds
        return other

    def lower_entry(self, fdef: ast.FuncDef, types: dict[str, TensorType],
                    name: Optional[str] = None) -> Function:
        """`types` names the parameters passed and the params read."""
        b = Builder()
        params = [Var(t, n) for n, t in types.items()]
        self.arguments = dict(zip(params, types))  # which Var is which argument: NeedsValue
        self.unannotated = frozenset(p.name for p in fdef.params if p.ann is None)
        env: dict[str, Value] = dict(zip(types, params))
        consts = {p.name for p in fdef.params if p.is_const}
        env.update({n: _static_value(n, t, n not in consts) for n, t in types.items()
                    if isinstance(t, StaticScalar)})
        args = {p.name: env[p.name] for p in fdef.params if p.name in env}
        outs = self.call(b, fdef, self.namespace, [], args, fdef.span, env)
        if self.deferred:  # (of a block whose gradient nothing takes: not checked)
            raise self.deferred[0][1]
        results = entry_results(b, fdef.name, outs, fdef.result_dtype, fdef.result_spans)
        return b.function(name or fdef.name, params, results)

    def current_function(self) -> Optional[int]:
        """The function being lowered, by identity (None: none yet)."""
        return id(self.call_stack[-1]) if self.call_stack else None

    @contextlib.contextmanager
    def block_context(self, block: Optional[tuple[int, int]],
                      upstream: Sequence[Value] = ()) -> Iterator[None]:
        """Lowering grad block `block` ((id of its function, its number);
        None: a function's body), whose upstream cotangents are `upstream`,
        inside the `with`."""
        outer = self.in_block, self.upstream
        self.in_block, self.upstream = block, tuple(upstream)
        try:
            yield
        finally:
            self.in_block, self.upstream = outer

    def judge_compile_time(self, b: Builder, err: NotCompileTime) -> None:
        """Marks `err` (raised in an expression lowered into `b`) as
        `of_upstream` where its value is computed from the upstream
        cotangents of the grad block being lowered: then every signature
        that lowers the block there fails alike (a cotangent is a run-time
        value at all of them), and the load says so.  Only the innermost
        expression judges it, since its builder (and the outer ones) made
        the value."""
        if err.judged:
            return
        err.judged = True
        if self.in_block is not None and isinstance(err.value, Var):
            err.of_upstream = b.computed_from(err.value, self.upstream)
            if err.of_upstream:
                err.add_note("it is computed from the grad block's upstream cotangents, which "
                             "are known only when the block runs")

    def defer_in_block(self, error: GradError) -> None:
        """`error`, a condition's or a loop bound's type that no call can
        change, raised now outside a grad block; inside one, held back (the
        caller lowers the value as one of the right type, marked with its
        role) until the block's linearity check has run: that check then
        reports a condition or bound that depends on the upstream
        cotangents as not linear, at load, where the type error of a
        representative signature is not reported (another signature may
        have a bool or an integer there; a cotangent is always a float)."""
        if self.in_block is None:
            raise error
        self.deferred.append((self.in_block, error))

    def raise_deferred(self, block: tuple[int, int], since: int) -> None:
        """The first error held back for `block` since `deferred` had
        `since` entries, raised (its linearity now checked)."""
        for tag, error in self.deferred[since:]:
            if tag == block:
                raise error

    # ------------------------------------------------------------ calls

    def bind_args(self, fdef: ast.FuncDef, positional: Sequence[Value],
                  keywords: dict[str, Value], span: Span) -> dict[str, Value]:
        if len(positional) > len(fdef.params):
            raise GradError(f"{fdef.name}() takes {len(fdef.params)} arguments but "
                            f"{len(positional)} were given", span)
        bound = {p.name: v for p, v in zip(fdef.params, positional)}
        for key, value in keywords.items():
            if fdef.param(key) is None:
                raise GradError(f"{fdef.name}() has no parameter {key!r}", span)
            if key in bound:
                raise GradError(f"{fdef.name}() got two values for {key!r}", span)
            bound[key] = value
        for p in fdef.params:
            if p.name not in bound:
                if p.default is None:
                    raise GradError(f"{fdef.name}() is missing argument {p.name!r}", span)
                dtype = p.ann.dtype if p.ann is not None else None
                # the checker made sure it fits: `a: f64 = 1` is 1.0, a float
                # (a number still, weakly typed: `a: float = 1` too)
                value = p.default.value
                bound[p.name] = value if dtype is None else \
                    coerce(value, number_dtype(dtype), p.default.span)
        return {p.name: bound[p.name] for p in fdef.params}

    def call(self, b: Builder, fdef: ast.FuncDef, ns: Namespace, positional: Sequence[Value],
             keywords: dict[str, Value], span: Span, caller_env: dict[str, Value]) -> list[Value]:
        if any(f is fdef for f in self.call_stack):
            raise GradError(f"recursive call to {fdef.name}() is not supported", span)
        if len(self.call_stack) >= MAX_CALL_DEPTH:
            raise GradError(f"calls are nested more than {MAX_CALL_DEPTH} deep here (from "
                            f"{self.call_stack[0].name}()); calls are inlined", span)
        if self.reach is not None:
            self.reach.enter(fdef, len(self.call_stack))
        args = self.bind_args(fdef, positional, keywords, span)
        dims = self.check_annotations(fdef, args, span)
        inputs = annotated_numbers(b, fdef, args, span)
        for w in param_reads(fdef, ns):
            inputs[w] = caller_env[w]
        self.call_stack.append(fdef)
        self.call_spans.append(span)
        # Which call in the entry function's file reached a place: the
        # innermost whose function's text holds it, or that leads to
        # another file (std's, an import's).  (None for the entry function
        # itself, whose call is the user's.)
        note = f"in {fdef.name}(), called at {one_line(str(span))}"  # (one line: a note)
        names_places = len(self.call_stack) > 1 and span.file == self.call_spans[0].file

        def reached(place: Span) -> bool:
            return names_places and (not place.via or _is_library_note(place.via)) and \
                (place.file != span.file or _in_text_of(ns.module, fdef, place))
        first = len(b.eqns)
        try:
            outs = self.call_body(b, fdef, ns, inputs, span)
            check_results(fdef, outs, dims)
        except RecursionError:  # deep in fdef's own code: calls nest at most 64 deep
            err = too_deep(ns.module.source, ns.module.file)
            if reached(err.span):
                err.note = note
            raise err from None
        except GradError as err:
            if in_library(fdef.span.file) and not in_library(span.file):
                at_library_call(err, fdef, ns.module, span)
            library_note = getattr(err, "library_note", None)
            if err.note in (None, library_note) and reached(err.span):
                err.note = note if err.note is None else f"{note}\nnote: {err.note}"
            raise
        finally:
            self.call_stack.pop()
            self.call_spans.pop()
        # for the errors of later passes and of run time
        if in_library(fdef.span.file) and not in_library(span.file):
            b.eqns[first:] = [_respanned(e, functools.partial(
                _at_library_span, fdef=fdef, module=ns.module, call=span)) for e in b.eqns[first:]]
        elif names_places:
            notes = _Notes(note, reached, self.unnoted)
            b.eqns[first:] = [notes.eqn(e) for e in b.eqns[first:]]
        return outs

    def may_reuse(self, reach: Reach) -> bool:
        """Whether a stage whose lowering reached `reach` lowers here as it
        did: with no call in it recursive or nested too deep here."""
        return reach.fits(self.call_stack, MAX_CALL_DEPTH)

    def call_body(self, b: Builder, fdef: ast.FuncDef, ns: Namespace,
                  inputs: dict[str, Value], span: Span) -> list[Value]:
        every = control.checkpoint_interval(fdef)
        if every is not None:
            outer, self.checkpoint = self.checkpoint, every
            try:
                return self.body(b, fdef, inputs)
            finally:
                self.checkpoint = outer
        if fdef.grads or fdef.decorators:
            # its stages are functions of their own, which cannot read a
            # branch's condition
            outer_branches, self.branches = self.branches, ()
            try:
                return lower_staged(self, b, fdef, ns, inputs, span)
            finally:
                self.branches = outer_branches
        return self.body(b, fdef, inputs)

    def index_guard(self, b: Builder) -> Optional[Atom]:
        """Inside a runtime if's branch, the scalar bool that holds where
        the branch is taken (else None): a run-time index there reads 0
        where it is not (`index_operand`), since both branches run and the
        values of the one not taken are selected away, so an index only
        the taken branch keeps in range is no error."""
        guard = None
        for cond, taken in self.branches:
            term = cond if taken else b.bind("logical_not", cond)
            guard = term if guard is None else b.bind("logical_and", guard, term)
        return guard

    def body(self, b: Builder, fdef: ast.FuncDef, env: dict[str, Value]) -> list[Value]:
        """fdef's body on `env`: its results, a compile-time number taken as
        a value of the dtype its return annotation names (`-> f64` makes
        `return 1` the float 1.0, as a default's annotation does)."""
        outs = self.block(b, fdef.body, env)
        ann, dtype = fdef.ret, fdef.result_dtype
        if ann is not None and len(outs) == 1 and isinstance(outs[0], WeakVar):
            # (weakly typed, as a number: `-> f32` on arange(n) * 0.5 is f32)
            fit_constant(weak_number(outs[0]), dtype, f"the weakly typed "
                         f"{outs[0].type.dtype} result of {fdef.name}()", ann.span)
            check_range_fits(b, outs[0], dtype, ann.span)
            return [cast(b, outs[0], dtype)]
        if ann is None or not is_static(outs[0]) or isinstance(outs[0], tuple):
            return outs  # (a tuple is refused by check_results)
        (value,) = outs  # the checker allows an annotation on one result only
        if isinstance(value, Sym):
            if dtype not in INTS:
                raise NeedsConcrete(f"a size is returned as {ann.dtype}")
            return outs
        return [fit_constant(value, dtype, f"the result {value!r} of {fdef.name}()",
                             ann.span)]

    def check_annotations(self, fdef: ast.FuncDef, args: dict[str, Value],
                          span: Span) -> dict[str, tuple[Dim, str]]:
        """The arguments against their parameters' annotations; returns the
        sizes the annotations' names are bound to (name -> (size, "for 'x'"))."""
        dims: dict[str, tuple[Dim, str]] = {}
        for p in fdef.params:
            ann, value = p.ann, args[p.name]
            if ann is None or (ann.dtype is None and ann.dims is None):
                continue
            if is_static(value):
                if isinstance(value, tuple):
                    raise GradError(f"argument {p.name!r} of {fdef.name}() must be an "
                                    f"array, not a {sequence_kind(value)}", span)
                # (a by-value argument's or a typed number is checked as
                # the array of its dtype it stands for)
                shape, dtype = (), value.dtype if isinstance(value, RUN_TIME) else None
            elif isinstance(value, WeakVar) and weak_fits(value, ann.dtype):
                shape, dtype = value.type.shape, None  # (it takes the dtype: a number's)
            else:
                shape, dtype = value.type.shape, value.type.dtype
            if dtype is not None and not admits(ann.dtype, dtype):
                raise GradError(f"argument {p.name!r} of {fdef.name}() has dtype {dtype}; "
                                f"its annotation says {kind_text(ann.dtype)}", span)
            if ann.dims is None:
                continue
            if _fixed_meets_symbol(ann.dims, shape):
                raise NeedsConcrete(f"a size of {p.name!r} meets a fixed size")
            check_dims(f"argument {p.name!r} of {fdef.name}()", ann.text, ann.dims, shape, dims,
                       GradError, span, bound_by=f"for {p.name!r}")
        return dims

    def transform_call(self, b: Builder, inner: ast.Call, outer: ast.Call,
                       env: dict[str, Value]) -> Value:
        """`grad(f, wrt=k)(args)` / `value_and_grad(f, wrt=k)(args)` /
        `jvp(f, wrt=k)(args, tangents)` in the language: f's gradient (or
        jvp) IR, inlined, so it can be differentiated again."""
        kind = inner.func.id
        target = self.namespace.resolve(inner.args[0]) if inner.args else None
        if target is None:
            raise GradError(f"{kind}() takes a function name as its first argument",
                            inner.span)
        fdef, ns = target
        wrt_value = (self.expr(b, inner.args[1], env) if len(inner.args) > 1 else
                     next((self.expr(b, k.value, env) for k in inner.kwargs if k.name == "wrt"),
                          0))
        single = not isinstance(wrt_value, tuple)
        args = [self.expr(b, a, env) for a in outer.args]
        kwargs = {k.name: self.expr(b, k.value, env) for k in outer.kwargs}
        n_tangents = (1 if single else len(wrt_value)) if kind == "jvp" else 0
        if len(args) < n_tangents:
            raise GradError(jvp_layout(fdef.name, n_tangents), outer.span)
        tangents, args = args[len(args) - n_tangents:], args[:len(args) - n_tangents]
        try:
            bound = self.bind_args(fdef, args, kwargs, outer.span)
        except GradError as err:  # (a wrt the checker could not count: a name, a const)
            if kind == "jvp":
                err.add_note(jvp_layout(fdef.name, n_tangents))
            raise
        count = len(fdef.params)  # (a negative position counts from the last)
        wrt_items = tuple(w + count if number_type(w) is int and -count <= w < 0 else w
                          for w in ((wrt_value,) if single else wrt_value))
        bound = numbers_as_arrays(b, fdef, bound, wrt_items, outer.span)
        wrt_names = self.transform_wrt(fdef, bound, wrt_items, inner.span)
        arrays = [n for n, v in bound.items() if not is_static(v)]
        reads = list(param_reads(fdef, ns))
        sub = self.sub_function(fdef, ns, bound, {w: env[w] for w in reads}, outer.span)
        if kind == "jvp":
            return self.jvp_call(b, sub, [bound[n] for n in arrays] + [env[w] for w in reads],
                                 [arrays.index(n) for n in wrt_names], tangents, outer)
        with_value = kind == "value_and_grad"
        g = autodiff.grad_of_sum(sub, [arrays.index(n) for n in wrt_names], with_value)
        self.grow(len(g.eqns), outer.span)
        start = len(b.eqns)
        results = inline(b, g, [bound[n] for n in arrays] + [env[w] for w in reads])
        _spanned(b, start, outer.span)
        grads = results[len(results) - len(wrt_names):]
        grads_value = grads[0] if single else tuple(grads)
        if not with_value:
            return grads_value
        values = results[:len(sub.outputs)]
        return (values[0] if len(values) == 1 else tuple(values)), grads_value

    def jvp_call(self, b: Builder, sub: Function, inputs: list[Value], wrt: list[int],
                 tangents: list[Value], call: ast.Call) -> Value:
        """`jvp(f, wrt=k)(args..., t)`: (f's value, its tangent along t), by
        forward mode (through f's grad blocks, transposed)."""
        ts = []
        for index, t in zip(wrt, tangents):
            target = sub.params[index].type
            if isinstance(t, bool) or (not is_static(t) and not t.type.is_float):
                # (as dsl.jvp and jax.jvp: a cast True would be a tangent of 1)
                got = "bool" if isinstance(t, bool) else t.type.dtype
                raise GradError(f"a tangent for {sub.params[index].hint!r} has dtype {got}: "
                                "a tangent is a float value (float64(t) converts one)",
                                call.span)
            t = cast(b, as_atom(b, t, call.span), target.dtype)
            if t.type.shape != target.shape:
                if not broadcasts_to(t.type.shape, target.shape):
                    raise GradError(f"a tangent of shape {list(t.type.shape)} for "
                                    f"{sub.params[index].hint!r}, which has shape "
                                    f"{list(target.shape)}", call.span)
                t = b.bind("broadcast_to", t, shape=target.shape, span=call.span)
            ts.append(t)
        program = forward.jvp(sub, wrt)
        self.grow(len(program.eqns), call.span)
        start = len(b.eqns)
        results = inline(b, program, list(inputs) + ts)
        _spanned(b, start, call.span)
        n = len(sub.outputs)
        values, out_tangents = results[:n], results[n:]
        if n == 1:
            return values[0], out_tangents[0]
        return tuple(values), tuple(out_tangents)

    @staticmethod
    def transform_wrt(fdef: ast.FuncDef, bound: dict[str, Value], wrt_items: tuple,
                      span: Span) -> list[str]:
        """The parameters `wrt` names: positions of float array parameters
        (a negative one made positive already)."""
        if not wrt_items:
            raise GradError(f"wrt must name at least one parameter of {fdef.name}()", span)
        names = []
        for w in wrt_items:
            if isinstance(w, Sym):
                raise NeedsConcrete("a size is a wrt position")
            if not is_integer(w) or not 0 <= w < len(fdef.params):
                got = repr(w) if is_static(w) else "a value computed at run time"
                raise GradError(f"wrt must be parameter positions of {fdef.name}() "
                                f"({wrt_positions(len(fdef.params))}), got {got}", span)
            name = fdef.params[w].name
            value = bound[name]
            if not fdef.params[w].differentiable or is_static(value) or not value.type.is_float:
                raise GradError(f"cannot differentiate {fdef.name}() with respect to "
                                f"{name!r}: it is not a float array here", span)
            names.append(name)
        return names

    def sub_function(self, fdef: ast.FuncDef, ns: Namespace, bound: dict[str, Value],
                     reads: dict[str, Value], span: Span) -> Function:
        """fdef on `bound` as a function of its own: parameters are the
        array arguments, then the params it reads; static ones are baked in."""
        arrays = [n for n, v in bound.items() if not is_static(v)]
        sb = Builder()
        # (a weakly typed argument stays weak, as a number baked in is:
        # `0.3 / n`, a number of sizes, is the literal n's value folds to)
        sparams = [(WeakVar if isinstance(bound[n], WeakVar) else Var)(bound[n].type, n)
                   for n in arrays]
        self.alias_arguments(sparams, [bound[n] for n in arrays])  # (`k: i64`, an axis)
        pparams = [Var(v.type, w) for w, v in reads.items()]
        senv = dict(zip(reads, pparams))
        sargs = {**{n: v for n, v in bound.items() if is_static(v)}, **dict(zip(arrays, sparams))}
        outer_branches, self.branches = self.branches, ()  # sb cannot read their conditions
        # fdef's body names what its own module defines, as in a plain call
        outer_namespace, self.namespace = self.namespace, ns
        try:
            outs = self.call(sb, fdef, ns, [], sargs, span, senv)
        finally:
            self.branches = outer_branches
            self.namespace = outer_namespace
        results = as_results(sb, outs, fdef.result_dtype, fdef.result_spans)
        return sb.function(fdef.name, sparams + pparams, results)

    # ------------------------------------------------------- statements

    def block(self, b: Builder, body: Sequence[ast.Stmt], env: dict[str, Value]) -> list[Value]:
        items = self.block_items(b, body, env)
        for name, _, sp in items:
            if name is not None:
                raise GradError("named return values are only allowed in grad blocks", sp)
        return [v for _, v, _ in items]

    def block_items(self, b: Builder, body: Sequence[ast.Stmt],
                    env: dict[str, Value]) -> list[tuple[Optional[str], Value, Span]]:
        for stmt in body:
            if isinstance(stmt, ast.Return):
                return [(it.name, self.expr(b, it.value, env), it.span) for it in stmt.items]
            self.statement(b, stmt, env)
        raise GradError("function body has no return statement",
                        body[-1].span if body else None)

    def statements(self, b: Builder, body: Sequence[ast.Stmt], env: dict[str, Value]) -> None:
        """A loop's or branch's statements (the checker rules out a return)."""
        for stmt in body:
            self.statement(b, stmt, env)

    def statement(self, b: Builder, stmt: ast.Stmt, env: dict[str, Value]) -> None:
        """One statement other than a return, binding names in `env`."""
        if isinstance(stmt, ast.For):
            control.lower_for(self, b, stmt, env)
        elif isinstance(stmt, ast.If):
            control.lower_if(self, b, stmt, env)
        elif isinstance(stmt, ast.Assign):
            self.assign(b, stmt, env)
        elif isinstance(stmt, ast.AugAssign):
            if stmt.target not in env:
                raise GradError(f"name {stmt.target!r} is not defined", stmt.span)
            rhs = self.expr(b, stmt.value, env)
            if stmt.op == "@":  # (`a @= w`: a rebound to a @ w, as NumPy's)
                env[stmt.target] = self.matmul(b, env[stmt.target], rhs, stmt.span)
                return
            env[stmt.target] = self.binary(b, _BINOPS[stmt.op], env[stmt.target], rhs,
                                           stmt.span, (stmt.span, stmt.value.span))
        else:
            raise GradError("return inside a loop or branch is not supported", stmt.span)

    def assign(self, b: Builder, stmt: ast.Assign, env: dict[str, Value]) -> None:
        value = self.expr(b, stmt.value, env)
        if len(stmt.targets) == 1:
            env[stmt.targets[0]] = self.named(b, value, stmt.targets[0])
            return
        if not isinstance(value, tuple) or len(value) != len(stmt.targets):
            got = len(value) if isinstance(value, tuple) else 1
            raise GradError(f"cannot unpack {got} value(s) into "
                            f"{len(stmt.targets)} names", stmt.span)
        for target, v in zip(stmt.targets, value):
            env[target] = self.named(b, v, target)

    @staticmethod
    def named(b: Builder, value: Value, name: str) -> Value:
        # Give the defining equation's output a readable name in printed IR.
        if isinstance(value, Var) and b.eqns and value in b.eqns[-1].outputs and not value.hint:
            object.__setattr__(value, "hint", name)
        return value

    # ------------------------------------------------------ expressions

    def grow(self, n: int, span: Span) -> None:
        """Counts n more operations of the program (`MAX_PROGRAM_SIZE`)."""
        self.size += n
        if self.size > MAX_PROGRAM_SIZE:
            # at the entry function's call that leads here (or in its own body)
            at = self.call_spans[1] if len(self.call_spans) > 1 else span
            raise GradError(f"{self.call_stack[0].name}() is too big to compile: with its calls "
                            f"inlined it has more than {MAX_PROGRAM_SIZE} operations (each "
                            "call is a copy of the function it calls, and a gradient about "
                            "three times its function)", at)

    def expr(self, b: Builder, e: ast.Expr, env: dict[str, Value],
             none_ok: bool = False) -> Value:
        """e's value; None (`None`, or a `const` parameter given it) only
        where `none_ok` says, a call's argument: anywhere else None is no
        value, an error at e."""
        self.grow(1, e.span)
        method = getattr(self, "expr_" + type(e).__name__)
        try:
            value = method(b, e, env)
        except NeedsConcrete as err:  # where, for a caller that cannot lower again
            err.spans += (e.span,) if e.span else ()
            raise
        except NotCompileTime as err:
            self.judge_compile_time(b, err)
            raise
        if value is None and not none_ok:
            if isinstance(e, ast.Name):
                raise GradError(f"{e.id!r} is None here, which is not a value (None is an "
                                f"argument that means \"not given\": pass it on as one, "
                                f"sum(x, axis={e.id}))", e.span)
            raise GradError(NONE_IS_NO_VALUE, e.span)
        return value

    def expr_Name(self, b, e: ast.Name, env):
        if e.id in env:
            return env[e.id]
        if self.namespace.resolve(e) is not None or e.id in BUILTINS:
            raise GradError(f"function {e.id!r} used as a value; call it", e.span)
        line = self.dropped.get((self.current_function(), e.id))
        if line is not None:
            raise GradError(f"name {e.id!r} is bound in only some branches of the if at line "
                            f"{line}, whose condition is known only at run time; bind it in "
                            "every branch (or before the if)", e.span)
        raise GradError(f"name {e.id!r} is not defined", e.span)

    def expr_Num(self, b, e: ast.Num, env):
        return e.value

    def expr_Bool(self, b, e: ast.Bool, env):
        return e.value

    def expr_NoneLit(self, b, e: ast.NoneLit, env):
        return None

    def expr_Str(self, b, e: ast.Str, env):
        return e  # einsum's subscripts (the checker allows a string nowhere else)

    def expr_TupleExpr(self, b, e: ast.TupleExpr, env):
        return tuple(self.expr(b, item, env) for item in e.items)

    def expr_ListExpr(self, b, e: ast.ListExpr, env):
        return StaticList(self.expr(b, item, env) for item in e.items)

    def expr_binary(self, b, e: ast.BinOp | ast.Compare | ast.BoolOp, env):
        """A binary operation and the chain of them down its left side,
        evaluated left to right in a loop (`ast.left_chain`): a generated
        sum of 10,000 terms nests 10,000 deep."""
        first, chain = ast.left_chain(e)
        value = self.expr(b, first, env)
        for operation in chain:
            if isinstance(operation, ast.BoolOp) and isinstance(value, bool) \
                    and value == (operation.op == "or"):
                # decided at compile time: the right side is not lowered, as
                # Python does not evaluate it (`x.ndim == 2 and x.shape[1] == 3`)
                continue
            right = self.expr(b, operation.right, env)
            value = getattr(self, "apply_" + type(operation).__name__)(b, operation, value, right)
        return value

    expr_BinOp = expr_Compare = expr_BoolOp = expr_binary

    def apply_BinOp(self, b, e: ast.BinOp, left: Value, right: Value) -> Value:
        if e.op == "@":
            return self.matmul(b, left, right, e.span)
        return self.binary(b, _BINOPS[e.op], left, right, e.span, (e.left.span, e.right.span))

    def apply_Compare(self, b, e: ast.Compare, left: Value, right: Value) -> Value:
        op = _COMPARE[e.op]
        if is_static(left) and is_static(right):
            if _at_run_time(left, right) and all(
                    number_type(v) in (int, float, bool) for v in (left, right)):
                # (as the kernel compares them: `k == 2.0 ** 53` in f64)
                x, y = unify(b, [left, right], e.span, arithmetic=False,
                             spans=(e.left.span, e.right.span))
                # (the bool scalar the comparison is at run time: `RunTimeBool`)
                return RunTimeBool(ops.fold(op, [x.value, y.value], [x.type.dtype] * 2, "bool"))
            return _static_compare(e.op, left, right, e.span)
        x, y = unify(b, [left, right], e.span, arithmetic=False,
                     spans=(e.left.span, e.right.span))
        return b.bind(op, x, y, span=e.span)

    def apply_BoolOp(self, b, e: ast.BoolOp, left: Value, right: Value) -> Value:
        # (a by-value argument's number is its run-time scalar, no bool: the
        # same error as at run time, not Python's `k and 3`)
        if is_static(left) and is_static(right) and not _at_run_time(left, right):
            return (left and right) if e.op == "and" else (left or right)
        if _run_time_bools(left, right):  # (`k == 1 and k > 0`, folded as the run time's)
            return RunTimeBool(bool(left) and bool(right) if e.op == "and"
                               else bool(left) or bool(right))
        x, y = self.as_bool(b, left, e.span), self.as_bool(b, right, e.span)
        return b.bind("logical_" + e.op, x, y, span=e.span)

    def expr_UnaryOp(self, b, e: ast.UnaryOp, env):
        v = self.expr(b, e.operand, env)
        if e.op == "not":
            if is_static(v) and not isinstance(v, RUN_TIME):  # (`not k`: as apply_BoolOp)
                return not v
            if isinstance(v, RunTimeBool):
                return RunTimeBool(not v)
            return b.bind("logical_not", self.as_bool(b, v, e.span), span=e.span)
        if is_static(v):
            if isinstance(v, tuple):
                raise GradError(f"cannot negate a {sequence_kind(v)}", e.span)
            if isinstance(v, RUN_TIME):  # (-k wraps for the least integer)
                dtype = "i64" if v.dtype == "bool" else v.dtype  # (a bool's, as at run time)
                return run_time_number(_run_time_value("neg", (v,), dtype), dtype)
            return -v
        return self.of_arguments(b.bind("neg", cast(b, v, "i64") if v.type.dtype == "bool"
                                        else v, span=e.span, weak=isinstance(v, WeakVar)), (v,))

    def as_bool(self, b, v: Value, span,
                role: str = "an operand of `and`, `or` or `not`") -> Atom:
        """v as a bool array; `role` names it where it is not one and
        depends on a grad block's upstream (`defer_in_block`).  A by-value
        argument's number is the scalar of its dtype (`run_time_atom`)."""
        a = as_atom(b, run_time_atom(b, v, span), span)
        if a.type.dtype != "bool":
            self.defer_in_block(GradError(f"expected a bool value, got {a.type.dtype}", span))
            a = b.bind("ne", a, Lit(0, TensorType(a.type.dtype, ())), span=span, role=role)
        return a

    def expr_Attr(self, b, e: ast.Attr, env):
        v = self.expr(b, e.value, env)
        if is_static(v):
            raise GradError(f"a compile-time value has no attribute {e.name!r}",
                            e.name_span)
        if e.name == "T":
            return self.transpose(b, v, None, e.span)
        if e.name == "mT":  # NumPy's (and JAX's, torch's) transpose of a stack of matrices
            rank = v.type.rank
            if rank < 2:
                raise GradError(f".mT transposes the last two axes, and needs rank 2 or more, "
                                f"got rank {rank}", e.span)
            return self.transpose(b, v, tuple(range(rank - 2)) + (rank - 1, rank - 2), e.span)
        if e.name == "shape":
            return tuple(plain_size(d) for d in v.type.shape)
        if e.name == "ndim":
            return v.type.rank
        if e.name == "size":
            return v.type.size
        raise GradError(f"arrays have no attribute {e.name!r} (only {ATTRIBUTES_SHOWN})",
                        e.name_span)

    def expr_Index(self, b, e: ast.Index, env):
        if len(e.items) == 1 and isinstance(e.items[0], ast.TupleExpr):
            # x[(i, j)] is x[i, j], and x[()] is x, as in NumPy
            e = replace(e, items=e.items[0].items)
        v = self.expr(b, e.value, env)
        if isinstance(v, tuple):
            return self.index_sequence(b, v, e, env)
        if is_static(v):
            # a number is a weakly typed 0-d array, as `broadcast_to(v, ())`
            # of it is: `None` and `...` index it, as NumPy's and JAX's
            atom = as_atom(b, v, e.span)
            out = self.index(b, atom, e, env)
            return v if out is atom else b.weaken(out)
        return self.index(b, v, e, env)

    def index_sequence(self, b, v: tuple, e: ast.Index, env) -> Value:
        """A compile-time sequence indexed, as Python indexes a tuple: one
        integer (`x.shape[-1]`) gives an item, one slice (`x.shape[1:]`,
        `x.shape[::-1]`) a sequence of the same kind; every bound is a
        compile-time integer (a size still symbolic asks for concrete ones)."""
        kind = sequence_kind(v)
        item = e.items[0] if len(e.items) == 1 else None
        if item is None or isinstance(item, (ast.NewAxis, ast.EveryOtherAxis)):
            raise GradError(f"a {kind} takes one integer index or one slice", e.span)
        if isinstance(item, ast.Slice):
            start, stop, step = (None if part is None else
                                 self.sequence_bound(b, part, kind, env)
                                 for part in (item.start, item.stop, item.step))
            if step == 0:
                raise zero_slice_step(step, item.step.span)
            part = v[start:stop:step]
            return StaticList(part) if isinstance(v, StaticList) else part
        k = self.sequence_bound(b, item, kind, env)
        if not -len(v) <= k < len(v):
            raise sequence_index_out_of_range(k, kind, len(v), item.span)
        return v[k]

    def sequence_bound(self, b, e: ast.Expr, kind: str, env) -> int:
        """An index or slice bound of a compile-time sequence: an integer
        known at compile time, since the items it selects are."""
        v = self.expr(b, e, env)
        by_value(self, v)  # (an integer argument: `x.shape[k]`)
        if not is_static(v):
            raise NotCompileTime(f"a {kind}'s index and slice bounds must be known at compile "
                                 f"time (a literal, x.shape[k], x.ndim, or arithmetic on them); "
                                 f"this one is computed at run time (as a `for` loop's index is: "
                                 f"a loop runs, it is not unrolled)", e.span, v)
        return self.as_static_int(v, e.span)

    def index(self, b, v: Atom, e: ast.Index, env) -> Atom:
        """Compile-time integers and slices select statically (a `slice`);
        a run-time integer scalar or an integer array gathers (`take`) along
        its axis, as NumPy indexes with one of them; `None` inserts an axis
        of size 1 where it stands among the result's axes (a `reshape`),
        and `...` stands for a full slice of each axis no other item indexes."""
        shape = v.type.shape
        given = expand_every_other_axis(e.items, len(shape), e.span)
        e = replace(e, items=tuple(i for i in given if not isinstance(i, ast.NewAxis)))
        if len(e.items) > len(shape):
            raise GradError(f"too many indices ({len(e.items)}) for an array of rank "
                            f"{len(shape)}", e.span)
        values = [item if isinstance(item, ast.Slice) else self.expr(b, item, env)
                  for item in e.items]
        for k, value in enumerate(values):
            if isinstance(value, StaticList):  # x[[0, 2]]: an index array, as NumPy's
                values[k] = self.index_list(b, value, e.items[k].span)
        gathers = [k for k, value in enumerate(values)
                   if not isinstance(value, ast.Slice) and not is_static(value)]
        arrays = [k for k in gathers if values[k].type.rank > 0]
        if arrays and len(values) - sum(isinstance(x, ast.Slice) for x in values) > 1:
            # NumPy's rules for several of them (broadcast together, moved
            # to the front) are better spelled with take()
            raise GradError("an index array can only be combined with slices (x[:, idx]); "
                            "use take() or take_along_axis()", e.items[arrays[0]].span)
        for k in gathers:
            values[k] = index_operand(self, b, values[k], e.items[k].span)
        starts, stops, steps, keep = [], [], [], []
        for axis, size in enumerate(shape):
            item = e.items[axis] if axis < len(e.items) else None
            value = values[axis] if axis < len(values) else None
            if axis in gathers:  # the whole axis, gathered below
                item = value = None
            if isinstance(size, Sym):
                start, stop, step = self.symbolic_axis_bounds(b, item, value, axis, size, env)
                if not REGIONS_OF_SYMBOLIC_AXES.get() and not isinstance(stop, Sym) \
                        and not isinstance(start, Sym):
                    # (a stop of symbolic size selects what NumPy's slice
                    # does for every size: `x[1:]`, `x[:-1]`)
                    raise NeedsConcrete(f"axis {axis} of size {size} is indexed")
                starts.append(start)
                stops.append(stop)
                steps.append(step)
                if item is None or isinstance(item, ast.Slice):  # (an integer drops the axis)
                    keep.append(region_size(start, stop, step, size)
                                if isinstance(stop, Sym) or isinstance(start, Sym)
                                else len(range(start, stop, step)))
                continue
            if item is None or isinstance(item, ast.Slice):
                bounds = [None if part is None else self.static_int(b, part, env)
                          for part in ((item.start, item.stop, item.step) if item else ())]
                if item is not None and bounds[2] == 0:
                    raise zero_slice_step(bounds[2], item.span)
                start, stop, step = slice(*bounds).indices(size) if item else (0, size, 1)
                keep.append(len(range(start, stop, step)))
            else:
                k = self.as_static_int(value, item.span)
                if not -size <= k < size:
                    raise static_index_out_of_range(k, axis, size, item.span)
                k %= size
                start, stop, step = k, k + 1, 1
            starts.append(start)
            stops.append(stop)
            steps.append(step)
        everything = (tuple(starts), tuple(stops), tuple(steps)) == \
            ((0,) * len(shape), shape, (1,) * len(shape))
        out = v if everything else b.bind("slice", v, starts=tuple(starts), stops=tuple(stops),
                                          steps=tuple(steps), span=e.span)
        if out.type.shape != tuple(keep):
            out = b.bind("reshape", out, shape=tuple(keep), span=e.span)
        # Right to left, so that each gather's axis (counted among the axes
        # the static part kept) is not moved by the ones after it.
        for k in reversed(gathers):
            axis = sum(1 for j in range(k) if j in gathers or isinstance(values[j], ast.Slice))
            out = take(b, out, values[k], axis, e.span)
        if len(given) > len(e.items):
            out = b.bind("reshape", out, shape=with_new_axes(out.type.shape, given, values),
                         span=e.span)
        return b.weaken(out) if isinstance(v, WeakVar) and out is not v else out

    def symbolic_axis_bounds(self, b, item, value, axis: int, size: Sym, env) -> tuple:
        """The (start, stop, step) that `item` (a slice, a compile-time
        integer, or None: the whole axis) selects of an axis of symbolic
        size: the whole axis, or bounds that do not count from its end
        (`t[0:1]`, `t[2]`, `t[:4:2]`), which need the axis to reach `stop`:
        a size the driver checks before any kernel runs (the `slice`'s stop
        beyond a symbolic size, `codegen.bind_symbols`)."""
        if item is None:
            return 0, size, 1
        if isinstance(item, ast.Slice):
            start, step = (None if part is None else self.static_int(b, part, env)
                           for part in (item.start, item.step))
            stop = None if item.stop is None else self.slice_stop(b, item.stop, size, env)
            if step == 0:
                raise zero_slice_step(step, item.span)
            if isinstance(stop, Sym):  # (`x[:n - 1]`, `x[:n - 1:2]`)
                if (start or 0) < 0 or (step or 1) < 0:
                    raise NeedsConcrete(f"axis {axis} of size {size} is sliced from its end")
                return start or 0, stop, step or 1
            if stop is not None and stop > sys.maxsize:
                # no axis is that long (NumPy's sizes are ssize_t), so it
                # runs to the end of every axis, as NumPy reads it; as a
                # bound the axis must reach, its length fits no ssize_t
                stop = None
            if (start, stop, step) in ((None, None, None), (0, None, None), (None, None, 1),
                                        (0, None, 1)):
                return 0, size, 1
            if step is not None and step < 0 and is_lone(size):
                bounds = self.backward_bounds(size, start, stop, step)
                if bounds is not None:
                    return bounds
            start, step = start or 0, step or 1
            if is_lone(size):
                bounds = self.bounds_of_every_size(size, start, stop, step)
                if bounds is not None:
                    return bounds
            if stop is None:
                raise NeedsConcrete(f"axis {axis} of size {size} is sliced to its end, a length "
                                    f"that depends on {size}")
            if start < 0 or stop < 0 or step < 0:
                raise NeedsConcrete(f"axis {axis} of size {size} is sliced from its end")
            return start, max(start, stop), step
        k = self.as_static_int(value, item.span)
        if k < 0:
            raise NeedsConcrete(f"axis {axis} of size {size} is indexed from its end")
        return k, k + 1, 1

    @staticmethod
    def bounds_of_every_size(size: Sym, start: int, stop: Optional[int], step: int
                             ) -> Optional[tuple]:
        """(start, stop, step) selecting what NumPy's slice start:stop:step
        does of an axis of every size n (a lone symbol), each bound an int
        or a size computed from n, or None where none does so (a negative
        step, `x[-3:2]`).  From the end, `x[1:]`, `x[:-1]`, `x[1::2]`:
        ceil(max(0, n - c) / s) elements (`shapes.sliced`); of the last k,
        `x[-k:]`, `x[-k:-1]`, `x[-k::2]`: a start of max(0, n - k)
        (`shapes.shortened`);
        to a fixed stop k, `x[:k]`, `x[2:k:2]`: a stop of min(n, k)
        (`shapes.limited`), but ahead of time, where a fixed region's
        driver checks that n reaches it instead (`REGIONS_OF_SYMBOLIC_AXES`:
        the region has its fixed shape, which `x[:2] * w` of a w of 2
        elements needs; unless no size reaches it, `_past_every_length`)."""
        if step < 1:
            return None
        end = size if stop is None else shortened(size, -stop) if stop < 0 else None
        if start >= 0 and end is not None:
            return start, end, step
        if start < 0 and end is not None and (stop is None or start < stop):
            return shortened(size, -start), end, step
        if start >= 0 and end is None and (not REGIONS_OF_SYMBOLIC_AXES.get()
                                           or _past_every_length(size, start, stop, step)):
            return start, limited(size, stop), step
        return None

    @staticmethod
    def backward_bounds(size: Sym, start: Optional[int], stop: Optional[int], step: int
                        ) -> Optional[tuple]:
        """`bounds_of_every_size` of a slice of negative step, from the
        axis's end or an element counted from it (`x[::-1]`, `x[-2::-2]`)
        down past its front or to a fixed stop k (`x[:0:-1]`): a start of
        max(0, n - 1 - d) (`shapes.shortened`; below 0 the slice is empty,
        so its clamp reads nothing) and a stop of -1 (past the front, as
        the normalized slice's) or k, ceil(max(0, n - d - 1 - stop) / -step)
        elements (`shapes.region_size`); or None (a start >= 0, a stop
        counted from the end)."""
        back = 1 if start is None else -start
        if back < 1 or (stop is not None and stop < 0):
            return None
        first = shortened(size, back)
        if not isinstance(first, Sym):  # (an axis of at most back - 1 elements)
            return None
        return first, -1 if stop is None else stop, step

    def slice_stop(self, b, e: ast.Expr, size: Sym, env) -> "int | Sym":
        """A slice's stop on an axis of symbolic size n: a compile-time
        integer, or the size max(0, n - c) where it is the number n - c of
        c at most 2 (`x[:n - 1]`, `shortened_bound`): NumPy reads a
        negative stop from the end, n - c + n, which is at most 0 (nothing)
        for every n < c only where c <= 2 (`x[:n - 3]` of 2 elements is
        `x[:-1]`, 1 element)."""
        value = self.expr(b, e, env)
        bound = self.shortened_bound(value)
        if isinstance(bound, Sym) and is_lone(size):
            # (of an axis itself shortened, `y[:y.shape[0] - 1]` for y =
            # x[1:], c counts from that axis's length, in its steps: y =
            # x[::2] of n is ceil(n / 2), and y.shape[0] - 1 of it is
            # ceil(max(0, n - 2) / 2), `shapes.sliced`; but not of another
            # axis of the same n, `x[:x[:3].shape[0] - 1]`, whose stop
            # counts from 3)
            (base, less, every, _), (axis_base, axis_less, axis_every, _) = (
                derivation(d.factors[0]) or (d.factors[0], 0, 1, None) for d in (bound, size))
            short, apart = divmod(less - axis_less, every)
            if (base, every, apart) == (axis_base, axis_every, 0) and 0 <= short <= 2 \
                    and shortened(size, short) == bound:
                return bound
        return self.as_static_int(value, e.span)

    def index_list(self, b, items: StaticList, span: Span) -> Atom:
        """A list of integers (or of such lists) as an index: the integer
        array it spells, as NumPy reads `x[[0, 2]]` (a list of bools would
        be a mask there: an error, as for a mask array)."""
        if not items:
            raise GradError("an empty list selects nothing; index with a non-empty list "
                            "of integers", span)
        if any(isinstance(v, bool) for v in items):
            raise GradError("a list of bools is a mask, and a mask cannot index: "
                            f"{MASK_HINT}", span)
        rows = [self.index_list(b, v, span) if isinstance(v, StaticList) else v
                for v in items]
        return BUILTINS["stack"].lower(self, b, [StaticList(rows)], {}, span)

    def static_int(self, b, e: ast.Expr, env) -> int:
        return self.as_static_int(self.expr(b, e, env), e.span)

    @staticmethod
    def as_static_int(v: Value, span: Span) -> int:
        if isinstance(v, Sym):
            raise NeedsConcrete(f"the size {v} is used as an index")
        if not is_integer(v):
            hint = ""
            if isinstance(v, Var) and v.type.rank == 0 and v.type.dtype in INTS:
                # (a slice is a region fixed when compiled; a loop's index or an
                # argument moves it at run time, which a gather does)
                hint = ("; this one is known only at run time (a loop's index, an "
                        "argument): gather a window of fixed length at a run-time start "
                        "with take(x, i + arange(n), axis), or, for a bound that is an "
                        "argument (x[:k]), declare it `k: const i64`: one program per value")
            raise NotCompileTime("expected a compile-time integer (a literal, x.shape[k], or "
                                 f"arithmetic on them){hint}", span, v)
        return v

    def expr_Call(self, b, e: ast.Call, env):
        if (isinstance(e.func, ast.Call) and isinstance(e.func.func, ast.Name)
                and e.func.func.id in TRANSFORMS):
            return self.transform_call(b, e.func, e, env)
        target = self.namespace.resolve(e.func)
        if target is None and not isinstance(e.func, ast.Name):
            raise GradError("only named functions can be called", e.func.span)
        name = e.func.id if isinstance(e.func, ast.Name) else e.func.name
        if isinstance(e.func, ast.Name) and name in env:
            raise GradError(f"{name!r} is a value, not a function", e.func.span)
        args = [self.expr(b, a, env, none_ok=True) for a in e.args]
        kwargs = {k.name: self.expr(b, k.value, env, none_ok=True) for k in e.kwargs}
        if len(kwargs) != len(e.kwargs):  # (the checker's error first: `_keyword_names`)
            repeated = next(k for i, k in enumerate(e.kwargs)
                            if any(k.name == j.name for j in e.kwargs[:i]))
            raise GradError(f"keyword argument {repeated.name!r} repeated", repeated.span)
        if target is not None:
            fdef, ns = target
            _refuse_none(e, args, kwargs, fdef.refuses_none)
            outer, self.namespace = self.namespace, ns
            try:
                outs = self.call(b, fdef, ns, args, kwargs, e.span, env)
            finally:
                self.namespace = outer
            return outs[0] if len(outs) == 1 else tuple(outs)
        builtin = BUILTINS.get(name)
        if builtin is None:
            raise GradError(f"unknown function {name!r}", e.func.span)
        builtin.check(name, len(args), kwargs, e.span)
        _refuse_none(e, args, kwargs, functools.partial(builtin.refuses_none, name))
        try:
            return builtin.lower(self, b, args, kwargs, e.span)
        except ops.AxisOutOfRange as err:
            if err.span == e.span:  # (the call's own axis, not a nested call's)
                err.span = _where_written(e, err.axis) or err.span
            if is_argument(err.axis):
                raise argument_axis_out_of_range(err) from None
            raise

    # ---------------------------------------------------- op helpers

    def binary(self, b, op: str, left: Value, right: Value, span,
               operand_spans: Optional[tuple[Span, Span]] = None) -> Value:
        if isinstance(left, tuple) or isinstance(right, tuple):
            if op == "mul":  # (a tuple repeated an integer argument's times: `(1,) * k`)
                by_value(self, right if isinstance(left, tuple) else left)
            return sequence_arithmetic(op, left, right, span, operand_spans)
        if is_static(left) and is_static(right):
            try:
                if _at_run_time(left, right):
                    return self.run_time_arithmetic(b, op, left, right, span, operand_spans)
                return _fold(op, left, right)
            except NeedsConcrete as err:
                return self.size_number(b, op, (left, right), span, err)
            except ZeroDivisionError:  # Python says "float modulo" for 3.0 % 0.0
                raise GradError("compile-time arithmetic failed: division by zero",
                                span) from None
            except (OverflowError, ValueError) as err:
                raise GradError(f"compile-time arithmetic failed: {err}", span) from None
        self.inexact_of_sizes(b, op, (left, right))
        self.division_of_sizes(b, op, left, right)
        x, y = unify(b, [left, right], span, float_result=op in ops.FLOAT_ONLY,
                     spans=operand_spans)
        _refuse_negative_power(op, x, right, span, operand_spans)
        return self.of_arguments(b.bind(op, x, y, span=span, weak=weak_result([left, right])),
                                 (left, right))

    def run_time_arithmetic(self, b, op: str, left: Value, right: Value, span,
                            operand_spans: Optional[tuple[Span, Span]]) -> Value:
        """`op` of compile-time operands, one of them a by-value argument's
        number (`RunTimeInt`, `RunTimeFloat`), as the program computes it
        where that argument is not taken by value: the kernel's value, as
        `ops.fold` (and the pow op's reference, for integers) computes it,
        again such a number: an integer wraps around to its dtype, `//` and
        `%` by 0 give 0, a negative power rounds toward zero; a float is
        inf for `k / 0`.  A float power (`k ** 0.5`, not `exact`: the
        kernel's pow may differ from NumPy's by an ulp) is computed at run
        time.  A literal that does not fit the argument's dtype, or a
        negative literal exponent of it, is the error it is at run time."""
        if isinstance(left, Sym) or isinstance(right, Sym):
            # (NeedsConcrete but for a product: `binary` makes a float a
            # run-time number, else the program is lowered for concrete
            # sizes.  A product is still a size, of the run-time operands'
            # dtype: `sqrt(x.shape[0] * k)` was weakly typed, f32 with f32
            # x, where with k at run time, or with concrete sizes, it is f64)
            return run_time_product(_fold(op, left, right), _run_time_dtype(left, right))
        x, y = unify(b, [left, right], span, float_result=op in ops.FLOAT_ONLY,
                     spans=operand_spans)
        dtype = x.type.dtype
        _refuse_negative_power(op, x, right, span, operand_spans)
        if dtype not in INTS and not ops.OPS[op].exact:
            return b.bind(op, x, y, span=span)
        return run_time_number(_run_time_value(op, (x.value, y.value), dtype), dtype)

    def of_arguments(self, out: Value, operands: Sequence[Value]) -> Value:
        """out, an integer scalar computed from integer arguments and
        compile-time numbers alone (`k + 1`, `-k`, `2 * k`), marked as
        standing for the first of those arguments, so that where its
        value is needed (`arange(k + 1)`, `axis=k - 1`: `builtins.by_value`)
        the function is compiled for that argument's value, which folds
        it; anything else (a loop's index in it) leaves it unmarked."""
        if not (isinstance(out, Var) and out.type.rank == 0 and out.type.dtype in INTS):
            return out
        named = [self.arguments.get(a) if isinstance(a, Var) else None for a in operands]
        if any(n is None and not is_static(a) for n, a in zip(named, operands)):
            return out
        first = next((n for n in named if n is not None), None)
        if first is not None:
            self.arguments[out] = first
        return out

    def size_number(self, b, op: str, operands: Sequence[Value], span,
                    err: NeedsConcrete) -> WeakVar:
        """`op` of compile-time numbers, some of them symbolic sizes, where
        `_fold` raised `err` since it needs their values: a number
        (`_number_of_sizes`: `0.1 / k`, `k * 0.5`, `1 / n`, `n - 1`, `n //
        2`) is computed at run time, so that the program stays symbolic;
        where something then needs it known at compile time (`x[:n // 2]`,
        `arange(n // 2)`; but `n - c` is a size there: `shortened_bound`),
        `pipeline.lower_entry` lowers again for concrete sizes.  Each size
        is a `dim` op (the driver's value of the symbol), and the op
        computes in f64 for a float, as the concrete lowering folds it (an
        `exact` op: the same bits), in i64 for an integer, as a size has
        it; the result is weak, so it takes the dtype of the arrays it
        meets as that folded number does.  Of a by-value
        argument's number it is that scalar's arithmetic, in its dtype, not
        weak (`x * (n / k)` is f64 for f32 x), and a divisor of 0 is the
        run time's (`k // 0` is 0), as `run_time_arithmetic` folds it.
        Anything else, or with `numbers_of_sizes` off, raises err."""
        if not (self.numbers_of_sizes and _number_of_sizes(op, operands)):
            raise err
        self.size_numbers += 1
        run_time = _at_run_time(*operands)
        dtype = "f64" if _float_of_sizes(op, operands) else \
            _run_time_dtype(*operands) if run_time else "i64"
        atoms = [_size_operand(b, v, span, dtype,
                               divisor=op in _DIVISIONS and k == 1 and not run_time)
                 for k, v in enumerate(operands)]
        out = b.bind(op, *atoms, span=span, weak=not run_time)
        made = None if run_time or len(operands) != 2 else _size_less(op, *operands)
        size = None if made is None else shortened(*made)
        # (only a size: `x[-3:].shape[0] - 3` clamped is 0 for every n, an
        # int that no longer says it is a number clamped, so a loop counting
        # down to it ran no trip where range(0, min(n, 3) - 3, -1) has some;
        # as a run-time number it is each n's)
        if isinstance(size, Sym):
            self.shortened_numbers[out] = size
        return out

    def shortened_bound(self, v: Value) -> Value:
        """v, or the size max(0, n - c) where v is the number `n - c`
        (`shortened_numbers`): for a bound that clamps at 0 as `range`
        and `arange` do, the same bound, which keeps the program symbolic."""
        return self.shortened_numbers.get(v, v) if isinstance(v, Var) else v

    def inexact_of_sizes(self, b, op: str, operands: Sequence[Value]) -> None:
        """NeedsConcrete where `op`, a math function whose kernel may differ
        by an ulp from the NumPy that folds it (`**`, `exp`: not `exact`,
        nor the correctly rounded sqrt), takes a number made of sizes
        (`size_number`): for concrete sizes it folds (`x ** (n / 2)` is
        x ** 3.0, products), so computed at run time it may give other bits."""
        if self.numbers_of_sizes and self.size_numbers and op not in SIZE_NUMBER_OPS \
                and not ops.OPS[op].exact and any(
                    isinstance(v, WeakVar) and v.type.rank == 0 and of_sizes_only(b, v)
                    for v in operands):
            raise NeedsConcrete(f"a number made of a size is an operand of {op}")

    def division_of_sizes(self, b, op: str, left: Value, right: Value) -> None:
        """NeedsConcrete where a division of numbers known for concrete sizes
        (compile-time ones, or weak ones `size_number` made of sizes) has
        a divisor made of sizes (`5 % (n - 4)`, `1 / (n * 0.5)`): for
        concrete sizes it folds, and a divisor of 0 is the error that
        compile-time arithmetic raises, where the kernel gives 0 or inf."""
        if self.numbers_of_sizes and self.size_numbers and op in _DIVISIONS \
                and self.number_of_sizes(b, right) \
                and (is_static(left) and not is_run_time(left) or self.number_of_sizes(b, left)):
            raise NeedsConcrete(f"a number made of a size divides ({op})")

    @staticmethod
    def number_of_sizes(b, v: Value) -> bool:
        """Whether v is a weak number `size_number` made of sizes alone."""
        return isinstance(v, WeakVar) and v.type.rank == 0 and of_sizes_only(b, v)

    def unary(self, b, op: str, v: Value, span) -> Atom:
        (x,) = unify(b, [v], span, float_result=op in ops.FLOAT_ONLY)
        return b.bind(op, x, span=span)

    def matmul(self, b, left: Value, right: Value, span) -> Atom:
        return products.matmul(b, *unify(b, [left, right], span), span)

    def transpose(self, b, v: Atom, axes: Optional[tuple], span) -> Atom:
        rank = v.type.rank
        perm = tuple(reversed(range(rank))) if axes is None else tuple(
            a % rank if -rank <= a < rank else a for a in axes)
        if sorted(perm) != list(range(rank)):  # (axes of an argument's value: its error)
            raise naming_arguments(axes, f"transpose axes {list(perm)} do not match rank "
                                         f"{rank}", span)
        if perm == tuple(range(rank)):
            return v
        return b.bind("transpose", v, perm=perm, span=span, weak=isinstance(v, WeakVar))

    def reduced_axes(self, x: Atom, axis, span) -> tuple[int, ...]:
        rank = x.type.rank
        if axis is None:
            axes = tuple(range(rank))
        elif isinstance(axis, tuple):
            axes = axis
        else:
            axes = (axis,)
        for a in axes:
            by_value(self, a)
            if not is_integer(a):
                raise NotCompileTime("axis must be a compile-time integer or tuple of integers"
                                     f"{compile_time_hint(a)}", span, a)
        return ops._normalize_axes(axes, rank, span)

    def reduce(self, b, op: str, v: Value, axis, keepdims, span,
               initial: Optional[int | float | Atom] = None) -> Atom:
        """v reduced by `op` over `axis`, as NumPy's, with `initial` (a
        number, or a scalar atom, of v's dtype, i64 for bools) taken in: a
        max over an empty axis is `initial`, else an error."""
        x = as_atom(b, v, span)
        if not isinstance(keepdims, (bool, int)):  # an int as NumPy takes one, not an array
            raise NotCompileTime("keepdims must be True or False, known at compile time", span,
                                 keepdims)
        axes = self.reduced_axes(x, axis, span)
        if x.type.dtype == "bool":
            x = cast(b, x, "i64")
        # (a run-time initial: the max over an empty axis is the lowest
        # value, which `maximum` with initial below then gives as initial)
        empty = {} if initial is None or op != "reduce_max" else \
            {"empty": _lowest(x.type.dtype) if isinstance(initial, Atom) else initial}
        if op == "reduce_max" and not empty and any(x.type.shape[a] == 0 for a in axes):
            raise GradError("max/min of an empty array (give it an initial value: "
                            "max(x, axis, initial=v))", span)
        out = b.bind(op, x, axes=axes, span=span, **empty) if axes else x
        if initial is not None and op == "reduce_max":
            # initial first: NumPy's reduction starts from it, and so takes an
            # element equal to it (max(x, initial=-0.0) of zeros is 0.0, and
            # min(x, initial=0.0) of -0.0s is -0.0), as `maximum` takes its
            # second operand where neither is greater
            out = b.bind("maximum", as_atom(b, initial, span, out.type.dtype), out, span=span)
        elif initial is not None:
            out = b.bind("add", out, as_atom(b, initial, span, out.type.dtype), span=span)
        if keepdims:
            kept = tuple(1 if i in axes else d for i, d in enumerate(x.type.shape))
            if out.type.shape != kept:
                out = b.bind("reshape", out, shape=kept, span=span)
        return out


def _past_every_length(size: Sym, start: int, stop: int, step: int) -> bool:
    """Whether the fixed region start:stop:step reaches past every length
    an axis of `size` may have (one of at most k elements, `x[-3:]`, and
    `[:4:3]` of it): no driver's check that the axis reaches the region
    could pass (`codegen.check_reaches`), so ahead of time too it is the
    slice's own length (`shapes.limited`), as NumPy's for every size."""
    picked, longest = range(start, stop, step), bound_of(size)
    return bool(picked) and longest is not None and picked[-1] >= longest


def _lowest(dtype: str) -> int | float:
    """The least value of `dtype` (an integer or float)."""
    return -math.inf if dtype in FLOATS else int(np.iinfo(NUMPY_DTYPES[dtype]).min)


_OPERATOR_TEXT = {"add": "+", "sub": "-", "mul": "*", "div": "/", "pow": "**",
                  "floor_divide": "//", "remainder": "%"}


def sequence_arithmetic(op: str, left: Value, right: Value, span: Span,
                        operand_spans: Optional[tuple[Span, Span]]) -> tuple:
    """`+` and `*` where a side is a compile-time sequence, as Python's on
    tuples: `x.shape[:-1] + (k, m)` concatenates two sequences of the same
    kind, `(1,) * x.ndim` repeats one a compile-time number of times.
    Anything else (a sequence with an array or a number under `+`, a list
    with a tuple, another operator) is a `GradError` at the operand that
    cannot take part (or the operation)."""
    spans = operand_spans or (span, span)
    seq_side = 0 if isinstance(left, tuple) else 1
    seq, other = (left, right) if seq_side == 0 else (right, left)
    kind = sequence_kind(seq)
    if op == "add":
        if isinstance(other, tuple):
            if sequence_kind(other) != kind:
                raise GradError(f"can only concatenate a {kind} to a {kind}, not a "
                                f"{sequence_kind(other)} (as in Python: write both as "
                                f"tuples, (1,) + x.shape)", span)
            if len(left) + len(right) > MAX_PROGRAM_SIZE:  # (`t = t + t` repeated)
                raise GradError(f"a {kind} of {len(left) + len(right)} items is too long "
                                f"(at most {MAX_PROGRAM_SIZE})", span)
            joined = tuple(left) + tuple(right)
            return StaticList(joined) if kind == "list" else joined
        what = "a number" if is_static(other) else f"an array ({other.type})"
        raise GradError(f"a {kind} cannot be used as an array here: + joins two {kind}s "
                        f"(x.shape + (1,)), and the other operand is {what}; build an "
                        f"array with stack([...])", spans[seq_side])
    if op == "mul" and not isinstance(other, tuple):
        if isinstance(other, Sym):
            raise NeedsConcrete(f"a {kind} is repeated a size's number of times")
        if not is_integer(other):
            what = "a number" if is_static(other) else "an array"
            raise NotCompileTime(f"a {kind} can only be repeated (* n) a compile-time "
                                 f"integer number of times, not by {what}", spans[1 - seq_side],
                                 other)
        if len(seq) * other > MAX_PROGRAM_SIZE:  # (each item is lowered where it is used)
            raise GradError(f"a {kind} of {len(seq) * other} items is too long (at most "
                            f"{MAX_PROGRAM_SIZE})", span)
        repeated = tuple(seq) * other
        return StaticList(repeated) if kind == "list" else repeated
    raise GradError(f"{_OPERATOR_TEXT[op]} does not apply to a {kind}: a {kind} is a "
                    f"compile-time sequence, not an array (+ concatenates two, * n repeats "
                    f"one; build an array with stack(...))", span)


def _where_written(call: ast.Call, value: int) -> Optional[Span]:
    """Where `call` writes the integer `value` as an argument (or an item
    of one: `axis=(0, 7)`), if it does so exactly once: an out-of-range
    axis is reported there, not at the call."""
    found = [item.span for a in (*call.args[1:], *(k.value for k in call.kwargs))
             for item in (a.items if isinstance(a, (ast.TupleExpr, ast.ListExpr)) else (a,))
             if ast.written_int(item) == value]
    return found[0] if len(found) == 1 else None


def _refuse_none(call: ast.Call, args: list, kwargs: dict,
                 refuses: Callable[[int, Optional[str]], Optional[str]]) -> None:
    """A GradError at the first argument of `call` that is None where
    `refuses(position, keyword)` says why it cannot be (a const parameter
    given None passes it on: the checker saw only the literals)."""
    for i, (arg, value) in enumerate(zip(call.args, args)):
        why = refuses(i, None) if value is None else None
        if why is not None:
            raise GradError(why, arg.span)
    for k in call.kwargs:
        why = refuses(len(args), k.name) if kwargs[k.name] is None else None
        if why is not None:
            raise GradError(why, k.value.span)


def check_results(fdef: ast.FuncDef, outs: list[Value], dims: dict[str, tuple[Dim, str]]
                  ) -> None:
    """fdef's result against its return annotation, a `GradError` at the
    annotation where they disagree: the dtype exactly, or one of the kind
    it names (an array is never cast, as an argument is not), the rank,
    fixed sizes, and named sizes: a name the parameters' annotations bound
    (`dims`) must have their size, and one they did not is bound by the
    result's first axis it names.  A symbolic size is checked only where the symbols decide it:
    a fixed size needs the concrete one (`NeedsConcrete`, as for an
    argument); two different symbols disagree, as they do when shapes
    broadcast.  A compile-time result was made a value of the dtype by
    `Lowerer.body`."""
    ann = fdef.ret
    if ann is None:
        return
    (value,) = outs
    where = f"the result of {fdef.name}()"
    if isinstance(value, tuple):
        raise GradError(f"{where} is a {sequence_kind(value)} of {len(value)} values, but its "
                        f"annotation {ann.text} describes one array", ann.span)
    if is_static(value):
        shape: tuple[Dim, ...] = ()
    else:
        shape = value.type.shape
        if not admits(ann.dtype, value.type.dtype):
            raise GradError(f"{where} has dtype {value.type.dtype}, but its annotation says "
                            f"{kind_text(ann.dtype)}", ann.span)
    if ann.dims is None:
        return
    if _fixed_meets_symbol(ann.dims, shape):
        raise NeedsConcrete(f"a size of {where} meets a fixed size")
    check_dims(where, ann.text, ann.dims, shape, dict(dims), GradError, ann.span)


def expand_every_other_axis(items: tuple, rank: int, span: Span) -> tuple:
    """An index's items with its `...` (at most one, as in NumPy) replaced
    by a full slice of each axis that the other items leave (none when
    they index every axis): every item but `None` and `...` indexes one."""
    dots = [item for item in items if isinstance(item, ast.EveryOtherAxis)]
    if not dots:
        return items
    if len(dots) > 1:
        raise GradError("an index can only have a single ellipsis ('...')", dots[1].span)
    at = items.index(dots[0])
    indexing = sum(not isinstance(item, (ast.NewAxis, ast.EveryOtherAxis)) for item in items)
    if indexing > rank:
        raise GradError(f"too many indices ({indexing}) for an array of rank {rank}", span)
    full = ast.Slice(None, None, None, dots[0].span)
    return items[:at] + (full,) * (rank - indexing) + items[at + 1:]


def with_new_axes(shape: tuple, items: Sequence, values: Sequence) -> tuple:
    """`shape`, an index's result without its `None` items, with a 1 where
    each stands in `items`: after the axes the items before it give (a
    slice one, an integer none, an index array its rank), as in NumPy."""
    out, position, kept = list(shape), 0, iter(values)
    for item in items:
        if isinstance(item, ast.NewAxis):
            out.insert(position, 1)
            position += 1
            continue
        value = next(kept)
        position += 1 if isinstance(value, ast.Slice) else (
            0 if is_static(value) else value.type.rank)
    return tuple(out)


def _fixed_meets_symbol(dims_ann, shape) -> bool:
    """Whether a fixed size of an annotation meets a symbolic size, which
    only the concrete sizes decide."""
    return any(isinstance(d, int) and isinstance(size, Sym) for d, size in zip(dims_ann, shape))


def _static_compare(op: str, left, right, span: Span) -> bool:
    """A comparison of compile-time values, as Python compares them (and
    as compile-time arithmetic is done): numbers exactly, whatever their
    size (NumPy's comparison overflows on `2**70 > True`), and sequences as
    tuples (`x.shape == (3, 4)`, item by item), which needs every item
    known: a size still symbolic asks for concrete sizes, and a run-time
    value inside is an error (Python would compare identities)."""
    for v in (left, right):
        if _holds(v, Sym):
            raise NeedsConcrete("a size is compared")
        if _holds(v, (Var, Lit)):
            raise GradError(f"cannot compare a {sequence_kind(v)} holding run-time values; "
                            "compare its items", span)
    try:
        return bool(_PYTHON_COMPARE[op](left, right))
    except TypeError:
        kinds = [sequence_kind(v) if isinstance(v, tuple) else "number" for v in (left, right)]
        raise GradError(f"cannot compare a {kinds[0]} with a {kinds[1]} using {op}",
                        span) from None


def _holds(v, kind) -> bool:
    """Whether `v`, or an item of it at any depth, is of type `kind`."""
    if isinstance(v, tuple):
        return any(_holds(item, kind) for item in v)
    return isinstance(v, kind)


_PYTHON_COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
                   "==": operator.eq, "!=": operator.ne}
_BINOPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "**": "pow", "//": "floor_divide",
           "%": "remainder"}
_COMPARE = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


# A compile-time integer past this many bits fits no dtype (f64 ends below
# 2**1024), so an integer power that would pass it (a product: twice it)
# is refused before it is computed: `9 ** 9 ** 9` would take 1.2e9 bits
# and minutes.
_MAX_STATIC_BITS = 1024


def _size_less(op: str, left, right) -> Optional[tuple[Sym, int]]:
    """(n, c) where `op` of these operands is n - c, a lone size n and an
    int c >= 0 (`n - 1`, `n + -1`, `-1 + n`), else None."""
    if op == "sub" and is_lone(left) and is_integer(right) and right >= 0:
        return left, right
    if op == "add":
        size, number = (left, right) if is_lone(left) else (right, left)
        if is_lone(size) and is_integer(number) and number <= 0:
            return size, -number
    return None


# The ops on compile-time numbers that `Lowerer.size_number` computes at
# run time where a symbolic size is among them: `exact` ones (`ops.Op`),
# and sqrt, which IEEE 754 rounds correctly as it does those (NumPy's,
# Numba's and CUDA's f64 sqrt alike: attention's `q / sqrt(d)`), so the
# program computes the number folding gives, bit for bit, on every target.
# Integer arithmetic on a size (`n - 1`) may make a size or an index, and
# `exp` or `**` is a math function that may differ by an ulp between
# NumPy and a kernel: those still need concrete sizes.
SIZE_NUMBER_OPS = frozenset({"add", "sub", "mul", "div", "floor_divide", "remainder", "sqrt"})
_FLOAT_RESULT = frozenset({"div", "sqrt"})  # a float even of integers
_DIVISIONS = frozenset({"div", "floor_divide", "remainder"})  # (by a second operand of 0)
# an integer of sizes (`n - 1`); not a product, which is a size (a `Sym`),
# or, of more factors than a size has, bounded with concrete sizes
_INTEGER_RESULT = frozenset({"add", "sub", "floor_divide", "remainder"})


def _number_of_sizes(op: str, operands: Sequence) -> bool:
    """Whether `Lowerer.size_number` computes `op` of compile-time
    `operands` at run time: one of `SIZE_NUMBER_OPS`, of numbers and sizes."""
    return op in SIZE_NUMBER_OPS and all(isinstance(v, (int, float, Sym)) for v in operands) \
        and (op in _INTEGER_RESULT or _float_of_sizes(op, operands))


def _float_of_sizes(op: str, operands: Sequence) -> bool:
    """Whether `op` (`SIZE_NUMBER_OPS`) of compile-time `operands` gives a
    float: a true division, a square root, or a float among the operands
    (not `n - 1`, an integer)."""
    return op in _FLOAT_RESULT or any(number_type(v) is float for v in operands)


def _size_operand(b: Builder, v, span: Span, dtype: str, divisor: bool) -> Atom:
    """An operand of `Lowerer.size_number`, in `dtype`.  A size that
    divides is checked at the call (`nonzero`): 0 is the division by zero
    that compile-time arithmetic raises, not an infinity; a number that
    divides is checked now."""
    if not divisor:
        return as_atom(b, v, span, dtype)
    if isinstance(v, Sym):
        return b.bind("dim", value=v, dtype=dtype, nonzero=True, span=span)
    if v == 0:
        raise GradError("compile-time arithmetic failed: division by zero", span)
    return as_atom(b, v, span, dtype)


def _at_run_time(*operands: Value) -> bool:
    """Whether arithmetic on these compile-time operands is the run
    time's: one is a by-value argument's number (`RunTimeInt`), or a
    float made of one (`RunTimeFloat`)."""
    return any(is_run_time(v) for v in operands)


def _run_time_bools(*operands: Value) -> bool:
    """Whether `and`/`or` of these compile-time operands is of bools, one
    of them a `RunTimeBool`, which folds as the run time's logical op."""
    return any(isinstance(v, RunTimeBool) for v in operands) and all(
        number_type(v) is bool for v in operands)


def _run_time_dtype(*operands: Value) -> str:
    """The dtype of arithmetic on compile-time operands, some of which
    stand for run-time scalars (`is_run_time`): theirs, promoted (the
    others are weakly typed, and take it); i64 of bools alone, since
    arithmetic on a bool is on i64 (`unify`'s): `x.shape[0] + (k == 1)`
    by value was the bool True, and `x.shape[0] * (k == 1)` a size of
    dtype bool, which no run-time product has (a KeyError)."""
    dtype = functools.reduce(promote, [v.dtype for v in operands if is_run_time(v)])
    return "i64" if dtype == "bool" else dtype


def _run_time_value(op: str, values: Sequence, dtype: str):
    """`op` on numbers of `dtype`, as a kernel computes it: the op's
    template on NumPy scalars (`ops.fold`), or for an integer power (not
    `exact`, as a float one is not) its reference, which the integer
    template matches (wrapping around; a negative exponent rounds toward
    zero)."""
    if op == "pow":
        with np.errstate(all="ignore"):
            arrays = [np.array(v, ops.NUMPY_DTYPES[dtype]) for v in values]
            return int(ops.OPS["pow"].ref(*arrays))
    return ops.fold(op, values, [dtype] * len(values), dtype)


def _refuse_negative_power(op: str, x: Atom, exponent: Value, span,
                           operand_spans: Optional[tuple[Span, Span]]) -> None:
    """An integer x to a negative literal exponent is an error, as NumPy's
    (an integer cannot hold it); one an argument gives at run time, or by
    value, is rounded toward zero instead (docs/language.md)."""
    if op != "pow" or x.type.dtype not in INTS or isinstance(exponent, RunTimeInt):
        return
    value = exponent.value if isinstance(exponent, Lit) else exponent
    if number_type(value) is int and value < 0:
        raise GradError(f"an integer to a negative power ({value}) is not an integer: "
                        f"write a float exponent ({float(value)})",
                        operand_spans[1] if operand_spans else span)


def _fold(op: str, x, y):
    if op == "add":
        result = x + y
    elif op == "sub":
        result = x - y
    elif op == "mul":
        if (number_type(x) is int and number_type(y) is int and x and y
                and abs(x).bit_length() + abs(y).bit_length() - 2 >= 2 * _MAX_STATIC_BITS):
            # (as a power: `a = a * a` repeated took 2**30 times the bits, and
            # hours; one of two numbers each in range is made, and its
            # constant said to be beyond the range of the dtype it meets)
            raise OverflowError("the integer product is beyond the range of every dtype")
        result = x * y
    elif op == "div":
        result = x / y
    elif op == "floor_divide":  # Python's, as NumPy's: rounded toward -inf
        result = x // y
    elif op == "remainder":  # with the divisor's sign
        result = x % y
    elif op == "pow":
        if (number_type(x) is int and number_type(y) is int and y > 0 and abs(x) > 1
                and (abs(x).bit_length() - 1) * y >= _MAX_STATIC_BITS):
            raise OverflowError("the integer power is beyond the range of every dtype")
        try:
            result = x ** y
        except OverflowError:  # a float power raises where a product gives inf
            raise OverflowError("the result is beyond the range of f64") from None
        if isinstance(result, complex):
            raise ValueError("negative base with fractional exponent")
    elif op in ("maximum", "minimum"):
        if isinstance(x, Sym) or isinstance(y, Sym):
            raise NeedsConcrete("a size is compared")
        if isinstance(x, float) or isinstance(y, float):  # NumPy's: maximum(3, 2.5) is 3.0
            x, y = float(x), float(y)
        # as the op's template: NaN propagates from either side
        wins = x > y if op == "maximum" else x < y
        result = x if wins or x != x else y
    else:
        raise ValueError(op)
    if isinstance(result, float) and not math.isfinite(result) and _finite(x) and _finite(y):
        # (infinity is written 1e400; arithmetic on it may give inf or nan)
        raise OverflowError("the result is beyond the range of f64")
    return result


def _finite(v) -> bool:
    return not isinstance(v, float) or math.isfinite(v)


class _Notes:
    """Notes one call's equations: `note` as the `via` of each span
    `reached`, in the functions they hold too (a loop's body, a grad
    block's stages); a standard library's note a span has stays, after it
    (`at_library_call`).  A function a program holds in several places (a
    stage reused, `staging`) is noted once (`done`, by id, holding it so
    its id stays its own); one with no span left that a note may take
    (none without one, or with a standard library's only) is not walked
    (`unnoted`: the lowerer's, kept across calls, as functions
    never change): what inner calls noted is not walked again by every
    call around them."""

    def __init__(self, note: str, reached: Callable[[Span], bool],
                 unnoted: dict[int, tuple[Function, bool]]) -> None:
        self.note, self.reached, self.unnoted = note, reached, unnoted
        self.done: dict[int, tuple[Function, Function]] = {}

    def eqn(self, eqn: Eqn) -> Eqn:
        params = tuple((key, self.function(v) if isinstance(v, Function) else v)
                       for key, v in eqn.params)
        span = eqn.span
        if span is not None and self.reached(span):
            span = replace(span, via=f"{self.note}\nnote: {span.via}" if span.via else self.note)
        if span is eqn.span and all(new is old for (_, new), (_, old) in zip(params, eqn.params)):
            return eqn
        return Eqn(eqn.op, eqn.inputs, eqn.outputs, params, span)

    def function(self, fn: Function) -> Function:
        if id(fn) in self.done:
            return self.done[id(fn)][1]
        noted = fn
        if _has_unnoted(fn, self.unnoted):
            eqns = tuple(self.eqn(e) for e in fn.eqns)
            if any(new is not old for new, old in zip(eqns, fn.eqns)):
                noted = replace(fn, eqns=eqns)
        self.done[id(fn)] = (fn, noted)
        return noted


def _has_unnoted(fn: Function, memo: dict[int, tuple[Function, bool]]) -> bool:
    """Whether a span in fn, or in a function it holds, has no note yet
    but a standard library's."""
    if id(fn) not in memo:
        found = any((e.span is not None and (not e.span.via or _is_library_note(e.span.via)))
                    or any(_has_unnoted(v, memo) for _, v in e.params if isinstance(v, Function))
                    for e in fn.eqns)
        memo[id(fn)] = (fn, found)
    return memo[id(fn)][1]


def _respanned(eqn: Eqn, remap: Callable[[Span], Span]) -> Eqn:
    """`eqn` with `remap` applied to its span and to those of the
    functions it holds (a loop's body, a grad block)."""
    params = tuple((key, _respanned_function(v, remap) if isinstance(v, Function) else v)
                   for key, v in eqn.params)
    span = eqn.span if eqn.span is None else remap(eqn.span)
    if span is eqn.span and all(new is old for (_, new), (_, old) in zip(params, eqn.params)):
        return eqn
    return Eqn(eqn.op, eqn.inputs, eqn.outputs, params, span)


def _respanned_function(fn: Function, remap: Callable[[Span], Span]) -> Function:
    eqns = tuple(_respanned(e, remap) for e in fn.eqns)
    if all(new is old for new, old in zip(eqns, fn.eqns)):
        return fn
    return replace(fn, eqns=eqns)


_LIBRARY_NOTE = "in std function "


def _is_library_note(via: str) -> bool:
    return via.startswith(_LIBRARY_NOTE)


def library_note(fdef: ast.FuncDef, module: ast.Module, place: Span) -> str:
    """Where in the standard library's `fdef` (called by the user) `place`
    is: "in std function softmax(), at std.grad:53:11", naming the library
    function holding it where `fdef` calls it ("softmax() (in inner())")."""
    inner = next((f.name for f in module.funcs if _in_text_of(module, f, place)), fdef.name)
    within = "" if inner == fdef.name else f" (in {inner}())"
    return f"{_LIBRARY_NOTE}{fdef.name}(){within}, at {Path(place.file).name}:{place.line}:" \
           f"{place.col}"


def _at_library_span(place: Span, fdef: ast.FuncDef, module: ast.Module, call: Span) -> Span:
    """A place in the standard library's `fdef`, which the user called at
    `call`, as the errors of later passes and of run time report it: at
    the call, the library's place the note (as `at_library_call`)."""
    if not in_library(place.file):
        return place
    return replace(call, via=library_note(fdef, module, place))


def at_library_call(err: GradError, fdef: ast.FuncDef, module: ast.Module, span: Span) -> None:
    """`err`, raised in the standard library's `fdef` (or a function it
    calls) that the user's code called at `span`, moved there: the
    user's arguments caused it, and the user's line is where to look;
    the standard library's place becomes a note ("in std function
    softmax(), at std.grad:53:11"), kept as `err.library_note` so that
    the user's callers add theirs before it, as for an error in their
    own code."""
    if not in_library(err.span.file):
        return  # (at the user's call already: an argument's count or annotation)
    err.note = err.library_note = library_note(fdef, module, err.span)
    err.span = replace(span, via="")
    err.source = None  # (std's text: the user's is attached for the new place)


def _in_text_of(module: ast.Module, fdef: ast.FuncDef, span: Span) -> bool:
    """Whether `span` is in fdef's text: from its decorators to the next
    function of its file.  (An error raised while a call is lowered may
    be reported elsewhere: a program too big, at the first call the entry
    function makes.)"""
    start = min([fdef.span.line] + [d.span.line for d in fdef.decorators])
    end = min((f.span.line for f in module.funcs if f.span.line > fdef.span.line),
              default=float("inf"))
    return span.file == fdef.span.file and start <= span.line < end


def numbers_as_arrays(b: Builder, fdef: ast.FuncDef, bound: dict[str, Value], wrt_items: tuple,
                      span: Span) -> dict[str, Value]:
    """`bound`, where a number is given for a differentiable parameter that
    `wrt` names (`grad(f, wrt=1)(x, 2.0)`), with it as a 0-d array, as a
    number passed from Python to a compiled function is (f32 where the
    call's float arrays are all f32, else f64; an annotated parameter's
    dtype): its derivative is asked for, where a compile-time value has
    none.  (Other numbers stay compile-time values: sizes, exponents.)"""
    bound = dict(bound)
    for w in wrt_items:
        if type(w) is not int or not 0 <= w < len(fdef.params):
            continue  # (refused by transform_wrt)
        p = fdef.params[w]
        v = bound[p.name]
        if p.differentiable and is_static(v) and number_type(v) in (int, float):
            floats = p.ann.dtype if p.ann is not None and p.ann.dtype in FLOATS else None
            bound[p.name] = as_atom(b, float(v), span, floats or weak_float_dtype(bound.values()))
    return bound


def _spanned(b: Builder, start: int, span: Span) -> None:
    """Gives the equations from `start` on that have no span (those a
    derivative's rules made) `span`, the transform's call: an error found
    in them (a grad block not linear through `jvp(h)(dy, dy)`) points
    there, not at the function or block around it."""
    b.eqns[start:] = [e if e.span is not None else replace(e, span=span)
                      for e in b.eqns[start:]]


def annotated_numbers(b: Builder, fdef: ast.FuncDef, args: dict[str, Value],
                      span: Span) -> dict[str, Value]:
    """`args` where a compile-time number bound to a parameter annotated
    with a dtype (its default left out, or a number the caller wrote) is a
    value of that dtype, as a Python number passed for it from Python is
    (`runtime.args.bind`): the annotation fixes the dtype, so
    `def g(x, a: f64 = 1)` gives f64 for f32 x whether `a` is left out or
    passed.  A float's is an array; an integer's a `RunTimeInt`, still a
    number for a size or an axis, as a by-value argument's is (an `int`
    kind's an i64, as a Python int for it is).  (An unannotated or `float`
    kind parameter's number stays weakly typed, as a Python number for it
    does, and so does a `const` integer's, a compile-time literal given or
    left out: `_static_value`.)  A weakly typed array (`arange(n) * 0.5`)
    bound to a parameter of a dtype is cast to it, as a NumPy array passed
    for it has it."""
    out = dict(args)
    for p in fdef.params:
        value, dtype = args[p.name], p.ann.dtype if p.ann is not None else None
        if isinstance(value, WeakVar) and (dtype in FLOATS or dtype in INTS):
            # (a weakly typed array too: `arange(n) * 0.5`, as a NumPy
            # array passed for it, is one of the annotation's dtype)
            check_range_fits(b, value, dtype, span)
            out[p.name] = b.bind("cast", value, dtype=dtype, span=span)
            continue
        if not is_static(value) or isinstance(value, tuple) or value is None \
                or dtype not in FLOATS and dtype not in INTS and dtype not in ("bool", "int"):
            continue
        if isinstance(value, Sym):
            if dtype in FLOATS:
                out[p.name] = as_atom(b, value, span, dtype)
            continue
        if isinstance(value, RUN_TIME):  # (`check_annotations` checked its dtype)
            if dtype in FLOATS:
                out[p.name] = as_atom(b, coerce(value, dtype, span), span, dtype)
            continue
        # (a plain number, as `runtime.args` takes one from Python: True
        # for an f64 is 1.0, 2.0 for an i64 is 2, 0.5 for it an error)
        number = parameter_number(value, number_dtype(dtype),
                                  f"argument {p.name!r} of {fdef.name}()", span)
        if dtype in FLOATS:
            out[p.name] = as_atom(b, number, span, dtype)
        elif dtype == "bool" or p.is_const:
            out[p.name] = _argument_number(value, number)
        else:
            out[p.name] = _typed_int(_argument_number(value, number), number_dtype(dtype), span)
    return out


def _argument_number(value, number):
    """`number`, what `parameter_number` made of `value`, still naming
    the negative argument `value` stands for (`ArgumentValue`)."""
    return value if isinstance(value, ArgumentValue) and number == value else number


def weak_fits(v: WeakVar, annotated: Optional[str]) -> bool:
    """Whether a weakly typed array takes an annotation's dtype (None:
    any), as a number of its kind would (`fit_constant`): a float one any
    float dtype, an integer one any numeric dtype, a bool one bool."""
    if annotated is None:
        return True
    dtypes = admitted(annotated)
    if v.type.dtype == "bool":
        return dtypes == ("bool",)
    return all(d in FLOATS for d in dtypes) if v.type.is_float else "bool" not in dtypes


def static_index_out_of_range(k: int, axis: int, size: int, span: Span) -> GradError:
    """The error of a compile-time index `k` out of range for `axis` (of
    `size`): the caller's `ArgumentError`, as a run-time index's, where k
    is an argument's value passed on as it is (`x[i]` for `i: const
    i64`: `is_argument`), naming it; else an error in the source."""
    if is_argument(k):
        return ArgumentError(index_out_of_range_message(k, repr(k.name), size), span)
    return GradError(f"index {k} is out of range for axis {axis} of size {size}", span)


def sequence_index_out_of_range(k: int, kind: str, length: int, span: Span) -> GradError:
    """The error of a compile-time sequence's index `k` out of range
    (`x.shape[k]`): the caller's `ArgumentError`, naming the argument,
    where k is an argument's value passed on as it is (`is_argument`), as
    an array's index is (`static_index_out_of_range`); else an error in
    the source."""
    return naming_arguments((k,), f"index {k} is out of range for a {kind} of length {length}",
                            span)


def argument_axis_out_of_range(err: ops.AxisOutOfRange) -> GradError:
    """`err`, of an axis that is an argument's value passed on as it is
    (`sum(x, axis=k)` for `k: const i64`: `is_argument`), as the caller's
    `ArgumentError` naming it, as an index out of range is
    (`static_index_out_of_range`): the source is not at fault."""
    return naming_arguments((err.axis,), err.message, err.span)


def zero_slice_step(step: int, span: Span) -> GradError:
    """The error of a slice's step of 0: the caller's `ArgumentError`,
    naming the argument, where the step is an argument's value passed on
    as it is (`x[::k]` for `k: const i64`, as a `range()` step of 0 given
    at run time is), else an error in the source."""
    return naming_arguments((step,), "slice step cannot be zero", span)


def _typed_int(value: int, dtype: str, span: Span) -> RunTimeInt:
    """A compile-time integer as the run-time scalar of `dtype` it is when
    passed as an argument (`RunTimeInt`; an argument's value still
    naming it); a `GradError` at `span` where the dtype cannot hold it."""
    number = coerce(value, dtype, span)
    if isinstance(value, ArgumentValue):
        return ByValueArgument(number, dtype, value.name)
    return RunTimeInt(number, dtype)


def _static_value(name: str, t: StaticScalar, by_value: bool):
    """A `const` or by-value argument's value (of type `t`) as lowering
    sees it: an integer remembers its argument (`ArgumentValue`); one
    taken by value stands for the run-time scalar it is otherwise (a
    `RunTimeInt`, `ByValueArgument`), so that arithmetic on it folds as
    the program computes it then."""
    value = t.value
    if not isinstance(value, int) or isinstance(value, bool) or t.dtype not in INTS:
        return value
    if by_value:
        return ByValueArgument(value, t.dtype, name)
    return ArgumentValue(value, name)
