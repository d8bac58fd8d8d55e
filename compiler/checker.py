"""Load-time checks of a parsed module, before anything is compiled.

Contract: `check(module, namespace)` raises the first `GradError` it finds
among: duplicate definitions or parameters; a `param` declared with a
dtype kind (`float`), as its one value has one dtype; names that shadow a
module `param`; unknown decorators; names read before they are defined; calls to
unknown functions or with the wrong number of arguments or unknown
keywords; statements after `return`; bodies without one; a `return`
inside a loop or an `if`; a loop variable that rebinds a name; names read
after a loop or an `if` that only its body or some of its branches bind
(the error says so); decorator arguments other than `@recompute(every=K)`
with K a positive integer, on a function with a loop and no grad block; a
return annotation on a function that returns several values; a grad block
reading a name local to a loop of the body or of an earlier block; and the
grad-block contract:

- block 1 takes one upstream cotangent per value the function returns; a
  later block takes one per cotangent the block before it returns;
- block 1 returns one cotangent per differentiable parameter (float or
  unannotated, not `const`), positionally in order and/or by name
  (`x=...`), and by name one for each float `param` the function reads,
  directly or through calls; `0` is a zero cotangent;
- block k > 1 is the VJP of block k-1 seen as a function of (block k-1's
  upstream cotangents, then block k-1's inputs), and returns one cotangent
  for each of those, in that order or by name;
- a missing, extra, duplicated or misnamed cotangent is an error naming the
  function, the block's line and what was expected;
- `@pass_through` functions take no grad block, have exactly one
  differentiable parameter and one result, and read no float `param`
  (directly or through calls), which their identity gradient would give
  no cotangent.

Shapes and dtypes, of arguments and results, are checked when a call
binds them (`compiler.lower`).
"""
from __future__ import annotations

import difflib
from typing import Iterable, Optional

from gradlang.compiler import ast
from gradlang.compiler.builder import coerce, parameter_number
from gradlang.compiler.builtins import (BUILTINS, NONE_IS_NO_VALUE, TRANSFORMS, jvp_layout,
                                         numpy_keyword)
from gradlang.compiler.ir import INTS
from gradlang.compiler.library import std_functions
from gradlang.compiler.namespace import Namespace
from gradlang.compiler.staging import named_cotangents, positional_cotangents
from gradlang.runtime.args import KINDS, admitted, number_dtype
from gradlang.runtime.errors import GradError

DECORATORS = ("recompute", "pass_through")
# builtins whose second argument is an index array
INDEXED_BY = ("take", "take_along_axis", "scatter_add", "segment_sum")
ATTRIBUTES = ("T", "mT", "shape", "ndim", "size")
ATTRIBUTES_SHOWN = ", ".join("." + a for a in ATTRIBUTES)


def check(module: ast.Module, ns: Namespace) -> None:
    seen: dict[str, ast.FuncDef] = {}
    for f in module.funcs:
        if f.name in seen:
            raise GradError(f"function {f.name!r} is already defined at line "
                            f"{seen[f.name].span.line}", f.span)
        if f.name in BUILTINS or f.name in TRANSFORMS:
            raise GradError(f"function {f.name!r} shadows a builtin", f.span)
        if f.name == "range":  # (no builtin function: a for loop's syntax)
            raise GradError("function 'range' shadows the range() a for loop iterates over "
                            "(`for i in range(n):` would not call it)", f.span)
        seen[f.name] = f
    declared: set[str] = set()
    for p in module.params:
        if p.name in declared or p.name in seen:
            raise GradError(f"{p.name!r} is already defined", p.span)
        if p.type.dtype in KINDS:  # (it is set once, to one array: its dtype is the program's)
            raise GradError(f"a param has one dtype: write {' or '.join(KINDS[p.type.dtype])} "
                            f"for {p.type.dtype} (a kind is for a function's parameters)",
                            p.type.span)
        declared.add(p.name)
    for f in module.funcs:
        _Function(f, ns).check()


class _Function:
    def __init__(self, f: ast.FuncDef, ns: Namespace):
        self.f = f
        self.ns = ns
        self.assigned = _assigned(f.body)
        # why a name bound only inside a loop or some branches is not
        # visible after it, for the error where it is read
        self.local_to: dict[str, str] = {}

    def check(self) -> None:
        f = self.f
        names: set[str] = set()
        for p in f.params:
            if p.name in names:
                raise GradError(f"duplicate parameter {p.name!r} in {f.name}()", p.span)
            self.not_a_param(p.name, p.span, "a parameter")
            self.default_fits(p)
            names.add(p.name)
        for ann in [p.ann for p in f.params] + [f.ret]:
            self.sizes_named_apart(ann, names)
        defaults = [p.default is not None for p in f.params]
        if True in defaults and False in defaults[defaults.index(True):]:
            # (as in Python: a call could not pass it by position)
            p = f.params[defaults.index(False, defaults.index(True))]
            raise GradError(f"parameter {p.name!r} of {f.name}() has no default but follows "
                            "one with a default: parameters with defaults come last", p.span)
        for d in f.decorators:
            if d.name not in DECORATORS:
                raise GradError(f"unknown decorator @{d.name} (known: "
                                f"{', '.join('@' + n for n in DECORATORS)})", d.span)
        for d in f.decorators:
            self.decorator_args(d)
            if d.args and not ast.has_loop(f.body):
                raise GradError(f"@{d.name}(every=...) checkpoints a loop every so many trips, "
                                f"and {f.name}() has no loop (plain @{d.name} recomputes the "
                                "whole function)", d.args[0].span)
            if d.args and f.grads:
                # a block is the gradient: no backward pass runs the loop's
                # trips in reverse, so there are no per-trip states to keep
                # or checkpoint (it was accepted and ignored)
                raise GradError(f"@{d.name}(every=...) checkpoints a loop's trips for its "
                                f"automatic gradient, and {f.name}() has a grad block (line "
                                f"{f.grads[0].span.line}), which is its gradient: the block "
                                "runs on the residuals the loop leaves, and no backward pass "
                                f"replays its trips; write plain @{d.name} (the backward pass "
                                "then reruns the body to rebuild the residuals)", d.args[0].span)
        decorators = [d.name for d in f.decorators]
        if len(set(decorators)) != len(decorators):
            raise GradError(f"@{decorators[-1]} repeated on {f.name}()", f.decorators[-1].span)
        if len(decorators) > 1:
            raise GradError(f"{f.name}() takes at most one of @recompute and @pass_through",
                            f.decorators[-1].span)
        visible = names | set(self.ns.params)
        n_outputs = self.block(f.body, visible, f"{f.name}()", allow_named=False)
        if f.ret is not None and n_outputs != 1:
            raise GradError(f"{f.name}() returns {n_outputs} values, but a return annotation "
                            "describes one result (several results cannot be annotated)",
                            f.ret.span)
        if "pass_through" in decorators:
            if f.grads:
                raise GradError(f"@pass_through function {f.name}() cannot have a grad "
                                "block; its gradient is the identity", f.grads[0].span)
            if len(f.differentiable_params) != 1 or n_outputs != 1:
                raise GradError(f"@pass_through function {f.name}() needs exactly one "
                                "differentiable parameter and one result", f.span)
            # (its gradient is the identity in that parameter: a float param
            # it reads would get none, silently, where a block must return it)
            read = [w for w in named_cotangents(f, self.ns, 1) if w in self.ns.params]
            if read:
                raise GradError(f"@pass_through function {f.name}() reads the param "
                                f"{read[0]!r}, which its identity gradient gives no "
                                "cotangent; compute what needs the param outside it "
                                f"(ste(x / {read[0]}) * {read[0]})", f.span)
        visible = visible | _assigned_outside_loops(f.body)
        for k, block in enumerate(f.grads, start=1):
            n_outputs = self.grad_block(block, k, n_outputs, visible)
            visible |= set(block.upstream) | _assigned_outside_loops(block.body)

    @staticmethod
    def decorator_args(d: ast.Decorator) -> None:
        """Only `@recompute(every=K)` takes an argument: a positive integer
        literal, the checkpoint interval of the function's loops."""
        for i, k in enumerate(d.args):
            if any(k.name == earlier.name for earlier in d.args[:i]):
                raise GradError(f"keyword argument {k.name!r} repeated", k.span)
            if d.name != "recompute" or k.name != "every":
                raise GradError(f"@{d.name} takes no argument {k.name!r}"
                                + (" (only every=)" if d.name == "recompute" else ""), k.span)
            if not (isinstance(k.value, ast.Num) and isinstance(k.value.value, int)
                    and k.value.value >= 1):
                raise GradError("every= takes a positive integer literal (the checkpoint "
                                "interval in loop trips)", k.value.span)
            coerce(k.value.value, "i64", k.value.span)  # counts trips, as i64s do

    def default_fits(self, p: ast.Param) -> None:
        """A default is a value of the parameter's annotated dtype, as the same
        number passed from Python is (`parameter_number`): `n: i64 = 1.5`
        and `flag: bool = 2` are errors, and so is a constant the dtype cannot
        hold (`k: i32 = 3000000000`); `flag: bool = 1.0` is True, `n: i64 =
        2.0` is 2, `a: f64 = 1` is the float 1.0, and so
        is `a: float = 1` (a kind's default is a number of its widest dtype,
        weakly typed as a literal is).  A number is no value of an annotation
        of rank 1 or more (`a: f64[3] = 1.0`)."""
        if isinstance(p.default, ast.NoneLit) and not (p.is_const and p.ann.dtype is None):
            raise GradError(f"a default of None needs a `const` parameter of no dtype "
                            f"(`{p.name}: const = None`), as None is no array",
                            p.default.span)
        if p.default is None or p.ann is None:
            return
        if p.ann.rank and not isinstance(p.default, ast.NoneLit):
            # (at load: every call leaving it out would be refused, as a
            # number passed for it is, since a number has rank 0)
            raise GradError(f"the default {p.default.value!r} of {p.name!r} is a number, but "
                            f"its annotation {p.ann.text} has rank {p.ann.rank}",
                            p.default.span)
        if p.ann.dtype is None:
            return
        parameter_number(p.default.value, number_dtype(p.ann.dtype),
                         f"the default of {p.name!r}", p.default.span)

    @staticmethod
    def no_none_cotangent(block: ast.GradBlock, where: str, allowed: list[str]) -> None:
        """A GradError at a None the block returns, as PyTorch's backward
        returns one for an input with no gradient (labels): here such an input
        gets no cotangent at all (it was the general "None is not a value")."""
        returned = next((st for st in block.body if isinstance(st, ast.Return)), None)
        for item in returned.items if returned is not None else ():
            if isinstance(item.value, ast.NoneLit):
                which = f"for each of {', '.join(allowed)}" if allowed else "for none here"
                raise GradError(f"{where} returns None: a block returns a cotangent {which} "
                                "(0 for a zero one), and nothing for other parameters (where "
                                "PyTorch's backward returns None)", item.value.span)

    def sizes_named_apart(self, ann: Optional[ast.TypeAnn], names: set[str]) -> None:
        """A size named in an annotation (`f64[n]`) that is also a parameter
        or a module param: the two are unrelated values (`x: f64[n], n: i64`
        took any n with any x), which reads as if they were one."""
        for d in ann.dims or () if ann is not None else ():
            if isinstance(d, str) and (d in names or d in self.ns.params):
                what = f"a parameter of {self.f.name}()" if d in names else "a module param"
                raise GradError(f"the size {d!r} of this annotation is also {what}, a value "
                                "unrelated to it; rename one (the size is x.shape[k] in the "
                                "body)", ann.span)

    def not_a_param(self, name: str, span, what: str) -> None:
        if name in self.ns.params:
            raise GradError(f"{what} named {name!r} would shadow the module param "
                            f"{name!r}", span)

    def grad_block(self, block: ast.GradBlock, k: int, n_upstream: int, visible: set[str]) -> int:
        """Check block k; return how many cotangents it returns."""
        f = self.f
        where = f"grad block {k} of {f.name}() (line {block.span.line})"
        for i, u in enumerate(block.upstream):  # (each error at the name)
            if u in block.upstream[:i]:
                raise GradError(f"{where} repeats an upstream name", block.upstream_span(i))
            if u in visible:
                raise GradError(f"{where}: upstream name {u!r} is already defined",
                                block.upstream_span(i))
        what = "value(s) the function returns" if k == 1 else \
            f"cotangent(s) block {k - 1} returns"
        if len(block.upstream) != n_upstream:
            raise GradError(f"{where} takes {len(block.upstream)} upstream cotangent(s), "
                            f"but there are {n_upstream} {what}", block.span)
        allowed = named_cotangents(f, self.ns, k)
        self.no_none_cotangent(block, where, allowed)
        self.block(block.body, visible | set(block.upstream), where, allow_named=True)
        items = next(s for s in block.body if isinstance(s, ast.Return)).items
        positional_names = positional_cotangents(f, k)
        want = (f"one cotangent for each of {', '.join(allowed)}" if allowed
                else "no cotangents (it has no differentiable parameters)")
        if k > 1:
            want += f" (block {k} differentiates block {k - 1} w.r.t. its upstream, " \
                    "then the function's parameters)"
        positional = [it for it in items if it.name is None]
        named = [it for it in items if it.name is not None]
        first_named = items.index(named[0]) if named else len(items)
        after = [it for it in items[first_named:] if it.name is None]
        if after:  # (as Python's "positional argument follows keyword argument")
            raise GradError(f"{where} returns a positional cotangent after a named one "
                            f"({named[0].name}=...): positional ones come first", after[0].span)
        if len(positional) > len(positional_names):
            raise GradError(f"{where} returns {len(items)} cotangent(s); expected {want}",
                            positional[len(positional_names)].span)
        covered = positional_names[:len(positional)]
        for it in named:
            if it.name not in allowed:
                p = f.param(it.name)
                why = ("is const" if p is not None and p.is_const else
                       "is not differentiable" if p is not None else
                       "is a param the function does not read" if it.name in self.ns.params
                       else f"is not an input of block {k - 1}" if k > 1
                       else f"is not a parameter of {f.name}()")
                raise GradError(f"{where} returns a cotangent for {it.name!r}, which {why}; "
                                f"expected {want}", it.span)
            if it.name in covered:
                raise GradError(f"{where} returns the cotangent for {it.name!r} twice",
                                it.span)
            covered.append(it.name)
        missing = [n for n in allowed if n not in covered]
        if missing:
            span = items[-1].span if items else block.span
            # a parameter meant as a setting (`delta=1.0`) takes no gradient when const
            setting = next((m for m in missing if k == 1 and f.param(m) is not None
                            and f.param(m).default is not None), None)
            hint = (f" (a setting with no gradient is declared const: `{setting}: const = "
                    f"...`)" if setting else "")
            raise GradError(f"{where} is missing the cotangent for "
                            f"{', '.join(repr(m) for m in missing)}; expected {want}{hint}", span)
        return len(allowed)

    def block(self, body, defined: set[str], where: str, allow_named: bool) -> int:
        """Check one statement list; return how many values its return gives."""
        n_returns = self.statements(body, set(defined), allow_named, nested=None)
        if n_returns < 0:
            span = body[-1].span if body else None
            raise GradError(f"{where} has no return statement", span)
        return n_returns

    def statements(self, body, defined: set[str], allow_named: bool,
                   nested: Optional[str]) -> int:
        """Check statements, binding names in `defined`; return the number
        of values the return gives, or -1 without one.  `nested` names the
        compound statement the list is the body of (a return there is an
        error)."""
        n_returns = -1
        for stmt in body:
            if n_returns >= 0:
                raise GradError("statement after return is unreachable", stmt.span)
            if isinstance(stmt, ast.Assign):
                self.expr(stmt.value, defined)
                if len(set(stmt.targets)) != len(stmt.targets):
                    raise GradError("a name is assigned twice in one statement", stmt.span)
                for t in stmt.targets:
                    self.not_a_param(t, stmt.span, "a local")
                defined.update(stmt.targets)
            elif isinstance(stmt, ast.AugAssign):
                if stmt.target not in defined:
                    self.undefined(stmt.target, stmt.span)
                self.not_a_param(stmt.target, stmt.span, "a local")
                self.expr(stmt.value, defined)
            elif isinstance(stmt, ast.For):
                self.for_loop(stmt, defined, allow_named)
            elif isinstance(stmt, ast.If):
                self.if_branches(stmt, defined, allow_named)
            elif isinstance(stmt, ast.Return):
                if nested is not None:
                    raise GradError(f"return inside {nested} is not supported; assign the "
                                    "result and return it after", stmt.span)
                for item in stmt.items:
                    if item.name is not None and not allow_named:
                        raise GradError("named return values are only allowed in grad "
                                        "blocks", item.span)
                    self.expr(item.value, defined)
                n_returns = len(stmt.items)
        return n_returns

    def for_loop(self, stmt: ast.For, defined: set[str], allow_named: bool) -> None:
        """The loop variable and the names first bound in the body are local
        to it; names bound before it and rebound in it are carried."""
        if "range" in defined:  # (as a call of it would be, not the builtin all the same)
            raise GradError("'range' is a value here, not the range() a for loop iterates "
                            "over; rename it", stmt.span)
        for a in stmt.args:
            self.expr(a, defined)
        if stmt.var in defined:
            raise GradError(f"the loop variable {stmt.var!r} is already defined; use a "
                            "new name", stmt.span)
        self.not_a_param(stmt.var, stmt.span, "a loop variable")
        inner = defined | {stmt.var}
        self.statements(stmt.body, inner, allow_named, "a for loop")
        for name in inner - defined - {stmt.var}:
            self.local_to[name] = (f"is bound only inside the for loop at line "
                                   f"{stmt.span.line}; bind it before the loop to carry it "
                                   "through and out of the loop")
        # (Python's loop variable outlives its loop; here it does not, so
        # say where it was, as for a name the body binds)
        self.local_to[stmt.var] = (f"is the variable of the for loop at line {stmt.span.line} "
                                   "and local to it; to keep its last value, bind a name "
                                   "before the loop and rebind it in the body")

    def if_branches(self, stmt: ast.If, defined: set[str], allow_named: bool) -> None:
        """A name is defined after the if when it was before, or when every
        branch binds it (the arms of an elif chain and its else: an if
        without else binds nothing in its else)."""
        arms, orelse = ast.elif_chain(stmt)
        after = []

        def branch(body) -> None:
            inner = set(defined)
            self.statements(body, inner, allow_named, "an if")
            after.append(inner)

        for arm in arms:
            self.expr(arm.cond, defined)
            branch(arm.body)
        branch(orelse)
        both = set.intersection(*after)
        for name in set.union(*after) - both:
            self.local_to[name] = (f"is bound in only some branches of the if at line "
                                   f"{stmt.span.line}; bind it in every branch (or before "
                                   "the if)")
        defined.update(both)

    def undefined(self, name: str, span) -> None:
        why = self.local_to.get(name, "is not defined" + _CONSTANTS.get(name, ""))
        raise GradError(f"name {name!r} {why}", span)

    def expr(self, e, defined: set[str]) -> None:
        if isinstance(e, ast.Name):
            if e.id not in defined:
                if self.ns.resolve(e) is not None or e.id in BUILTINS:
                    raise GradError(f"function {e.id!r} used as a value; call it", e.span)
                if e.id in self.ns.modules:  # (not "name 'std' is not defined")
                    raise GradError(f"module {e.id!r} used as a value; call one of its "
                                    f"functions: {e.id}.NAME(...)", e.span)
                self.undefined(e.id, e.span)
        elif isinstance(e, ast.Call):
            self.call(e, defined)
        elif isinstance(e, ast.BINARY):
            first, chain = ast.left_chain(e)
            self.expr(first, defined)
            for operation in chain:
                self.expr(operation.right, defined)
        elif isinstance(e, ast.UnaryOp):
            self.expr(e.operand, defined)
        elif isinstance(e, ast.Attr):
            if self.ns.resolve(e) is not None:
                raise GradError(f"function {e.name!r} used as a value; call it", e.span)
            if isinstance(e.value, ast.Name) and e.value.id in self.ns.modules:
                raise GradError(no_such_function(e.value.id, e.name,
                                                 self.ns.modules[e.value.id]), e.span)
            if isinstance(e.value, ast.Name) and e.value.id not in defined \
                    and e.name in _CONSTANTS:  # `np.pi`, `math.inf`
                raise GradError(f"name {e.value.id!r} is not defined{_CONSTANTS[e.name]}",
                                e.value.span)
            self.expr(e.value, defined)
            if e.name not in ATTRIBUTES:
                raise GradError(f"arrays have no attribute {e.name!r} (only "
                                f"{ATTRIBUTES_SHOWN})", e.name_span)
        elif isinstance(e, ast.Index):
            self.expr(e.value, defined)
            for item in e.items:
                self.expr(item, defined)
                self.index(item)
        elif isinstance(e, ast.Slice):
            for part in (e.start, e.stop, e.step):
                if part is not None:
                    self.expr(part, defined)
        elif isinstance(e, (ast.TupleExpr, ast.ListExpr)):
            for item in e.items:
                self.expr(item, defined)
        elif isinstance(e, ast.Str):
            raise GradError("a string can only be einsum()'s subscripts, written in the "
                            "call: einsum(\"ij,jk->ik\", a, b)", e.span)
        elif isinstance(e, ast.NoneLit):
            raise GradError(NONE_IS_NO_VALUE, e.span)

    def call(self, e: ast.Call, defined: set[str]) -> None:
        kw_names = _keyword_names(e)
        func = e.func
        if isinstance(func, ast.Call) and isinstance(func.func, ast.Name) \
                and func.func.id in TRANSFORMS and func.func.id not in defined:
            target = self.transform(func, defined)
            n_args = len(e.args)
            count = _wrt_count(func) if func.func.id == "jvp" else 0
            if count is not None:  # (else lowering knows it, and checks there)
                n_args -= count  # jvp's: the arguments, then one tangent per wrt
                if n_args < 0:
                    raise GradError(jvp_layout(target.name, count), e.span)
                try:
                    _check_call_arity(target, n_args, kw_names, e)
                except GradError as err:
                    if func.func.id == "jvp":
                        err.add_note(jvp_layout(target.name, count))
                    raise
        elif isinstance(func, ast.Name) and func.id in TRANSFORMS and func.id not in defined:
            raise GradError(f"{func.id}(f, wrt=...) builds a function; call it on "
                            f"arguments: {func.id}(f)(x)", e.span)
        else:
            target = self.ns.resolve(func)
            if target is not None:
                _check_call_arity(target[0], len(e.args), kw_names, e)
            elif isinstance(func, ast.Name):
                if func.id in defined:
                    raise GradError(f"{func.id!r} is a value, not a function", func.span)
                if func.id in self.ns.modules:  # (not "unknown ...; import it first")
                    raise GradError(f"{func.id!r} is a module, not a function; call one of its "
                                    f"functions: {func.id}.NAME(...)", func.span)
                if func.id not in BUILTINS:
                    raise GradError(f"unknown function {func.id!r}"
                                    f"{_spelled_otherwise(func.id, self.ns)}", func.span)
                BUILTINS[func.id].check(func.id, len(e.args), kw_names, e.span)
            elif isinstance(func, ast.Attr) and isinstance(func.value, ast.Name) \
                    and func.value.id in self.ns.modules:
                raise GradError(no_such_function(func.value.id, func.name,
                                                 self.ns.modules[func.value.id]), func.span)
            elif isinstance(func, ast.Attr) and (func.name in BUILTINS
                                                 or func.name in _METHODS):
                self.method_call(func, e, defined)
            elif isinstance(func, ast.Attr) and isinstance(func.value, ast.Index) \
                    and isinstance(func.value.value, ast.Attr) and func.value.value.name == "at":
                raise GradError(f"arrays cannot be changed, and have no .at[...].{func.name}() as "
                                "JAX's do: build a new array (where(), scatter_add(), "
                                "concatenate())", func.span)
            elif isinstance(func, ast.Attr) and isinstance(func.value, ast.Name) \
                    and func.value.id not in defined:
                # the module's hint (`std`), else the function's (`np.zeros`, `F.softmax`)
                hint = _spelled_otherwise(func.value.id) or _spelled_otherwise(func.name, self.ns)
                raise GradError(f"{func.value.id!r} is not defined{hint}", func.value.span)
            elif isinstance(func, ast.Attr):  # `x.unsqueeze(0)`, `(x + 1).softmax(1)`
                raise GradError(self.no_method(func), func.span)
            else:
                if isinstance(func, ast.Call):
                    # (what it calls first: `grad = ...` then `grad(g)(x)` is a
                    # call of the value grad, which this message did not say)
                    self.call(func, defined)
                raise GradError("only named functions can be called", func.span)
        subscripts = isinstance(func, ast.Name) and func.id == "einsum" \
            and self.ns.resolve(func) is None and func.id not in defined
        for i, a in enumerate(e.args):
            if isinstance(a, ast.NoneLit):
                none_argument(e, i, None, a.span, self.ns)
            elif not (subscripts and i == 0 and isinstance(a, ast.Str)):
                self.expr(a, defined)
        for k in e.kwargs:
            if isinstance(k.value, ast.NoneLit):
                none_argument(e, len(e.args), k.name, k.value.span, self.ns)
            else:
                self.expr(k.value, defined)
        if isinstance(func, ast.Name) and func.id in INDEXED_BY and len(e.args) > 1:
            self.index(e.args[1])

    def index(self, e) -> None:
        """An index naming a parameter annotated with a non-integer dtype
        is an error now; any other is checked when its dtype is known."""
        if not isinstance(e, ast.Name) or e.id in self.assigned:
            return
        p = self.f.param(e.id)
        dtype = p.ann.dtype if p is not None and p.ann is not None else None
        if dtype is not None and not set(admitted(dtype)) <= set(INTS):
            raise GradError(f"an index must be an integer array (i32 or i64), but "
                            f"{e.id!r} is declared {dtype}", e.span)

    def no_method(self, func: ast.Attr) -> str:
        """The error of a method that is neither a builtin's name nor one of
        `_METHODS` (`x.unsqueeze(0)`, `x.softmax(1)`): how the language
        writes it, if it knows, else that it has no such function (it was
        "only named functions can be called", which says neither)."""
        shown = func.value.id if isinstance(func.value, ast.Name) else "x"
        hint = _spelled_otherwise(func.name, self.ns)
        if hint:
            return f"arrays have no methods ({shown}.{func.name}(...)){hint}"
        return (f"arrays have no methods ({shown}.{func.name}(...)), and there is no "
                f"function {func.name!r}")

    @staticmethod
    def method_call(func: ast.Attr, e: ast.Call, defined: set[str]) -> None:
        """`x.sum()` or `np.exp(x)`, as NumPy, JAX and torch spell them: an
        error saying how the language spells it (builtins are functions)."""
        receiver = func.value.id if isinstance(func.value, ast.Name) else None
        if receiver is not None and receiver not in defined and func.name in BUILTINS:
            raise GradError(f"{receiver!r} is not defined; builtins are called by their "
                            f"name alone: {func.name}(...)", func.span)
        if receiver is not None and receiver not in defined:  # a module (`torch.clamp`)
            raise GradError(f"{receiver!r} is not defined; "
                            f"{_METHODS[func.name].format(x='x')} for {receiver}."
                            f"{func.name}(...)", func.span)
        shown = receiver or "x"
        if func.name in _METHODS:
            raise GradError(f"arrays have no methods; {_METHODS[func.name].format(x=shown)} "
                            f"for {shown}.{func.name}(...)", func.span)
        rest = ", ..." if e.args or e.kwargs else ""
        raise GradError(f"arrays have no methods; write {func.name}({shown}{rest}) for "
                        f"{shown}.{func.name}({rest[2:]})", func.span)

    def transform(self, e: ast.Call, defined: set[str]) -> ast.FuncDef:
        """`grad(f, wrt=...)`: f must name a function; returns it."""
        name = e.func.id
        _keyword_names(e)
        target = self.ns.resolve(e.args[0]) if e.args else None
        if target is None:
            named = ""
            if e.args and isinstance(e.args[0], ast.Name):
                fn = e.args[0].id
                named = (f" ({fn!r} is a builtin: define a function that calls it, "
                         f"def g(x): return {fn}(x), and take {name}(g))" if fn in BUILTINS
                         else f" (no function {fn!r} is defined or imported)")
            raise GradError(f"{name}() takes the name of a function as its first "
                            f"argument{named}", e.args[0].span if e.args else e.span)
        extra = [k.name for k in e.kwargs if k.name != "wrt"]
        if len(e.args) > 2 or extra or (len(e.args) == 2 and e.kwargs):
            raise GradError(f"{name}() takes a function and wrt=", e.span)
        for arg in list(e.args[1:]) + [k.value for k in e.kwargs]:
            items = arg.items if isinstance(arg, (ast.TupleExpr, ast.ListExpr)) else (arg,)
            for item in items:
                if isinstance(item, ast.Str):  # (not the einsum subscripts' error)
                    raise GradError(_wrt_name_error(target[0], item.value), item.span)
                position = ast.written_int(item)
                count = len(target[0].params)
                if position is not None and not -count <= position < count:
                    # (here, at the position: the lowering knows only the call)
                    raise GradError(f"wrt must be parameter positions of {target[0].name}() "
                                    f"({wrt_positions(count)}), got {position}", item.span)
            self.expr(arg, defined)
        return target[0]


# NumPy's, torch's and Python's names for what the language spells
# otherwise: an unknown name or method says what to write.
_FUNCTIONS = {
    "float": "; float64(x) or float32(x) converts an array",
    "pow": "; write x ** y",
    "dot": "; write a @ b",
    "swapaxes": "; write transpose(x, axes) (x.mT swaps the last two)",
    "moveaxis": "; write transpose(x, axes)",
    "zeros": "; write zeros_like(x), or broadcast_to(0.0, shape)",
    "ones": "; write ones_like(x), or broadcast_to(1.0, shape)",
    "eye": "; one_hot(arange(n), n) is the identity matrix",
    "clamp": "; write clip(x, lo, hi)",
    "var": "; write mean((x - mean(x, axis, keepdims=True)) ** 2, axis)",
    "prod": "; for positive x, exp(sum(log(x)))",
    "square": "; write x * x",
    "power": "; write x ** y",
    "concat": "; write concatenate([a, b], axis)",
    "cat": "; write concatenate([a, b], axis)",
    "fori_loop": "; loops are `for i in range(n):`, carrying the names the body rebinds",
    "scan": "; loops are `for i in range(n):`, carrying the names the body rebinds (a "
            "row per trip: `hs = scatter_add(hs, i, h)`)",
    "squeeze": "; write reshape(x, shape), or index the axis away: x[:, 0]",
    "expand_dims": "; write x[None] (None inserts an axis where it stands: x[:, None])",
    "unsqueeze": "; write x[None] (None inserts an axis where it stands: x[:, None])",
    "flatten": "; write reshape(x, [-1])",
    "log2": "; write log(x) / log(2.0)",
    "log10": "; write log(x) / log(10.0)",
    "rsqrt": "; write 1.0 / sqrt(x)",
    "dropout": "; a function draws no random numbers: pass a mask from Python, as an "
               "argument (x * mask / (1.0 - p))",
    **{name: "; a function draws no random numbers: pass them from Python, as an argument"
       for name in ("rand", "randn", "normal", "uniform", "random")},
}
# NumPy's and math's constants, which the language writes as numbers
_CONSTANTS = {
    "inf": "; infinity is the number 1e400 (a float literal beyond f64, as in Python)",
    "pi": "; write 3.141592653589793",
}
_METHODS = {
    "astype": "write float32({x}) or float64({x})",
    "float": "write float32({x})",
    "double": "write float64({x})",
    "clamp": "write clip({x}, lo, hi)",
    "size": "write {x}.size (no call)",
    "permute": "write transpose({x}, axes)",
    "view": "write reshape({x}, shape)",
}


def _spelled_otherwise(name: str, ns: Optional[Namespace] = None) -> str:
    """A hint for a name that is not the language's: the standard library's
    import for one of its functions, else how the language writes it, else
    (given the module's namespace) the one function of a close spelling
    that the module can call or import from the standard library."""
    if name == "std":
        return "; import it first: `import std`, or `from std import f`"
    if name in std_functions():
        return f"; it is in the standard library: `from std import {name}`"
    if name in _FUNCTIONS or ns is None:
        return _FUNCTIONS.get(name, "")
    callable_here = [*BUILTINS, *ns.functions]
    close = difflib.get_close_matches(name, [*callable_here, *std_functions()], n=1, cutoff=0.8)
    if not close:
        return ""
    if close[0] in callable_here:
        return f"; did you mean {close[0]!r}?"
    return f"; did you mean {close[0]!r}? (`from std import {close[0]}`)"


def no_such_function(module: str, name: str, namespace: Namespace,
                     importing: bool = False) -> str:
    """The error for `module.name` (or `from module import name` when
    `importing`, which also takes a builtin) where module has no function
    `name`, with the one of a close spelling it has, if any."""
    message = f"module {module!r} has no function {name!r}"
    if name in BUILTINS and not importing:
        return f"{message}; {name} is a builtin: call it without `{module}.`"
    candidates = [*namespace.functions, *(BUILTINS if importing else ())]
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.8)
    return f"{message}; did you mean {close[0]!r}?" if close else message


def none_argument(call: ast.Call, position: int, keyword: Optional[str], span,
                  ns: Namespace) -> None:
    """A GradError at `span` unless None can be this argument of `call`
    (called once its arity is checked): an option of a builtin that takes
    it, or a `const` parameter of a function."""
    func = call.func
    target = ns.resolve(func)
    if target is not None:
        why = target[0].refuses_none(position, keyword)
    elif isinstance(func, ast.Name) and func.id in BUILTINS:
        why = BUILTINS[func.id].refuses_none(func.id, position, keyword)
    else:  # the functions `grad(f)` and the like build
        why = NONE_IS_NO_VALUE
    if why is not None:
        raise GradError(why, span)


def _keyword_names(e: ast.Call) -> list[str]:
    """The keywords of a call, each once (`grad(f, wrt=0, wrt=1)` too): a
    repeated one is the error, at it, as Python's and a decorator's are."""
    names = [k.name for k in e.kwargs]
    for i, k in enumerate(e.kwargs):
        if k.name in names[:i]:
            raise GradError(f"keyword argument {k.name!r} repeated", k.span)
    return names


def _assigned(body: Iterable[ast.Stmt]) -> set[str]:
    return set(ast.assigned_names(tuple(body)))


def _assigned_outside_loops(body: Iterable[ast.Stmt]) -> set[str]:
    """The names a statement list binds outside its loops' bodies: those a
    grad block after it may read.  A name first bound in a loop's body is
    local to it, and the lowering has no value for it after the loop (a
    block reading one loaded, then failed at the call: "name 't' is not
    defined"); one bound in some branches of an if stays, as a branch
    known at compile time binds it."""
    out: set[str] = set()
    for s in body:
        if isinstance(s, ast.If):
            arms, orelse = ast.elif_chain(s)
            for arm_body in [arm.body for arm in arms] + [orelse]:
                out |= _assigned_outside_loops(arm_body)
        elif not isinstance(s, ast.For):
            out |= _assigned((s,))
    return out


def _wrt_name_error(f: ast.FuncDef, name: str) -> str:
    """The message for a name in the language's wrt= (it takes positions,
    where `dsl.grad` in Python takes names too)."""
    index = next((i for i, p in enumerate(f.params) if p.name == name), None)
    found = (f"{name!r} is position {index}" if index is not None else
             f"{f.name}() has no parameter {name!r}")
    return f"wrt takes parameter positions of {f.name}(), not names: {found}"


def wrt_positions(count: int) -> str:
    """The positions of `count` parameters, for a message: "0 to 2, or -3
    to -1 from the end" (as JAX's argnums)."""
    return f"0 to {count - 1}, or {-count} to -1 from the end"


def _wrt_count(transform: ast.Call) -> Optional[int]:
    """How many parameters `grad(f, wrt=...)` names: a tuple's or a list's
    length, else 1 for a number (or no wrt); None for any other expression
    (a name bound to a tuple, a `const` argument), known only when lowered."""
    wrt = (transform.args[1] if len(transform.args) > 1 else
           next((k.value for k in transform.kwargs if k.name == "wrt"), None))
    if isinstance(wrt, (ast.TupleExpr, ast.ListExpr)):
        return len(wrt.items)
    return 1 if wrt is None or isinstance(wrt, ast.Num) else None


def _check_call_arity(f: ast.FuncDef, n_args: int, kw_names: list[str], call: ast.Call) -> None:
    if n_args > len(f.params):
        raise GradError(f"{f.name}() takes {len(f.params)} argument(s) but {n_args} were "
                        "given", call.span)
    given = {p.name for p in f.params[:n_args]}
    for k in kw_names:
        if f.param(k) is None:
            raise GradError(f"{f.name}() has no parameter {k!r}"
                            f"{numpy_keyword(k, [p.name for p in f.params])}", call.span)
        if k in given:
            raise GradError(f"{f.name}() got two values for {k!r}", call.span)
        given.add(k)
    missing = [p.name for p in f.params if p.name not in given and p.default is None]
    if missing:
        raise GradError(f"{f.name}() is missing argument(s) "
                        f"{', '.join(repr(m) for m in missing)}", call.span)
