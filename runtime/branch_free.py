"""Branch-free Python helpers, lowered straight to LLVM IR inside a kernel.

Contract: `kernel_function(public, select)` makes a call to `public` inside
a Numba kernel (typed by a template, lowered by `lower_builtin`) run the
helper that `select(argument types)` picks, with no Numba compile of the
helper: its body is translated to LLVM IR, at the kernel's typing (to
learn the result's type) and at its lowering, into an `alwaysinline`
internal function of the kernel's own LLVM module, whose float
instructions carry the `contract` fast-math flag only.  The result is that
of compiling the helper with `njit(fastmath={'contract'},
error_model='numpy')` and inlining it: every operation is typed by Numba's
typing context (`resolve_function_type`, `unify_types`) and lowered by the
target context's own implementation (`get_function`, `cast`), so Numba's
typing rules (int32 arithmetic in int64, float32 op Python float in
float64, ...) and its instructions hold bit for bit.  Called from Python,
`public` stays what it is.

Why: compiled by Numba, each helper was a function of its own, typed and
optimized in its own LLVM module (0.05-0.13 s each in a cold process) only
to be inlined into the kernel anyway.

Helpers are marked `@branch_free`; their syntax is checked when a kernel
first needs them.  The subset: positional arguments; assignments (tuple unpacking too);
one `return` (of a tuple too), last; `a if c else b` (a select);
`if c: <assignments>` (a branch and a phi, as Numba makes); `for v in
<constant tuple or slice of one>` (unrolled; a variable it assigns must
keep its type); `+ - * / & | ^ << >>`, unary `-` and `not`, single
comparisons, `and`/`or` of booleans; subscripts and slices of tuples by
constants; calls, with `*tuple` arguments, of other `@branch_free` helpers
(inlined), of registered public functions (dispatched by `select`), and of
anything Numba can type (`abs`, `float`, `np.float32`, intrinsics);
constants from module globals and closure cells (numbers, NumPy scalars,
tuples of them) and attributes of modules (`np.inf`).  Anything else
raises `BranchFreeError` when a kernel first translates it, never a
miscompile (a helper calling itself is refused too).  `select` may also
name a non-helper (`operator.pow` for two integers): Numba's own typing
and lowering of it, at the call site.  Intrinsics called from a helper
are lowered as Numba lowers them: their typing registers their lowering,
which the target context finds by refreshing itself once.
"""
from __future__ import annotations

import ast
import inspect
import itertools
import linecache
import operator
import re
import textwrap
import types as pytypes
from typing import Any, Callable, Optional

from llvmlite import ir
from numba.core import callconv, types
from numba.core.extending import type_callable
from numba.core.fastmathpass import FastFloatBinOpVisitor, FastFloatCallVisitor
from numba.core.imputils import lower_builtin

Selector = Callable[..., Optional[tuple[Any, tuple[types.Type, ...]]]]


class BranchFreeError(Exception):
    """A helper outside the translatable subset (an internal error)."""


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.BitAnd: operator.and_, ast.BitOr: operator.or_,
           ast.BitXor: operator.xor, ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_UNARY = {ast.USub: operator.neg, ast.Not: operator.not_}
_COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
            ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne}
_FLAGS = ("contract",)  # as fastmath={'contract'} sets them

# ------------------------------------------------------------ marking


_HELPERS: dict[pytypes.FunctionType, Optional[ast.FunctionDef]] = {}
_SOURCES: dict[str, dict[int, ast.FunctionDef]] = {}
_ORDER = itertools.count()
_NUMBERS: dict[pytypes.FunctionType, int] = {}


def _definition(fn: pytypes.FunctionType) -> Optional[ast.FunctionDef]:
    """`fn`'s definition, parsed from its own lines where its code says
    where they end (`co_positions`, Python 3.11 on), else found among its
    file's (`_definitions`).  A kernel calls a few of cpu_math's 45
    helpers: parsing those took 2-3 ms of CPU, all of cpu_math 11-15."""
    code = fn.__code__
    if hasattr(code, "co_positions"):
        start = code.co_firstlineno - 1  # its first decorator's line
        lines = linecache.getlines(code.co_filename)[start:_last_line(code)]
        try:
            # dedented: a nested function's lines are indented
            tree = ast.parse(textwrap.dedent("".join(lines)), code.co_filename)
        except SyntaxError:  # (a string's lines indented less, say)
            tree = None
        if tree is not None and len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef):
            ast.increment_lineno(tree, start)
            return tree.body[0]
    return _definitions(code.co_filename).get(code.co_firstlineno)


def _last_line(code: pytypes.CodeType) -> int:
    """The last source line of `code` (a nested function's or
    comprehension's lie within the instruction that makes it)."""
    return max((end for _, end, _, _ in code.co_positions() if end is not None),
               default=code.co_firstlineno)


def _definitions(filename: str) -> dict[int, ast.FunctionDef]:
    """Every function definition of a source file, by its first line (that
    of its first decorator, as `co_firstlineno` counts)."""
    if filename not in _SOURCES:
        with open(filename, encoding="utf-8") as source:
            tree = ast.parse(source.read(), filename)
        _SOURCES[filename] = {
            min([node.lineno] + [d.lineno for d in node.decorator_list]): node
            for node in _function_definitions(tree.body)}
    return _SOURCES[filename]


def _function_definitions(body: list):
    """The function definitions in statements, nested ones too (walking
    statements only: all of the tree took 5x as long)."""
    for node in body:
        if isinstance(node, ast.FunctionDef):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            yield from _function_definitions(getattr(node, field, ()))


def branch_free(fn: pytypes.FunctionType) -> pytypes.FunctionType:
    """Marks `fn` as a helper kernels inline.  Its source is parsed and
    checked when a kernel first needs it (parsing all of cpu_math took ~20 ms,
    which a process that only loads cached kernels need not pay)."""
    _HELPERS[fn] = None
    _NUMBERS[fn] = next(_ORDER)
    return fn


def _syntax(fn: pytypes.FunctionType) -> ast.FunctionDef:
    """The checked syntax tree of a helper."""
    node = _HELPERS[fn]
    if node is None:
        node = _definition(fn)
        if node is None or node.name != fn.__name__:
            raise BranchFreeError(f"{fn.__qualname__}: source not found")
        _check_function(fn, node)
        _HELPERS[fn] = node
    return node


def _fail(fn, node: Optional[ast.AST], message: str) -> BranchFreeError:
    if fn is None:
        return BranchFreeError(message)
    return BranchFreeError(f"{fn.__qualname__} ({fn.__code__.co_filename}:"
                           f"{getattr(node, 'lineno', '?')}): {message}")


def _check_function(fn, node: ast.FunctionDef) -> None:
    a = node.args
    if a.vararg or a.kwarg or a.kwonlyargs or a.defaults or a.posonlyargs:
        raise _fail(fn, node, "only plain positional arguments")
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]  # the docstring
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        raise _fail(fn, node, "must end with `return <value>`")
    for statement in body[:-1]:
        _check_statement(fn, statement)
    _check_expression(fn, body[-1].value)


def _check_statement(fn, node: ast.stmt) -> None:
    if isinstance(node, ast.Assign):
        if len(node.targets) != 1:
            raise _fail(fn, node, "one target per assignment")
        _check_target(fn, node.targets[0])
        _check_expression(fn, node.value)
    elif isinstance(node, (ast.If, ast.For)):
        if node.orelse:
            raise _fail(fn, node, "no `else` on a statement")
        if isinstance(node, ast.If):
            _check_expression(fn, node.test)
        else:
            if not isinstance(node.target, ast.Name):
                raise _fail(fn, node, "a loop binds one name")
            _check_expression(fn, node.iter)
        for inner in node.body:
            if not isinstance(inner, ast.Assign):
                raise _fail(fn, inner, "only assignments inside `if` and `for`")
            _check_statement(fn, inner)
    else:
        raise _fail(fn, node, f"unsupported statement {type(node).__name__}")


def _check_target(fn, node: ast.expr) -> None:
    if isinstance(node, ast.Tuple):
        for element in node.elts:
            _check_target(fn, element)
    elif not isinstance(node, ast.Name):
        raise _fail(fn, node, "assign to names only")


def _check_expression(fn, node: ast.expr) -> None:
    children: list[ast.expr]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        children = [node.left, node.right]
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        children = [node.operand]
    elif isinstance(node, ast.BoolOp):
        children = node.values
    elif isinstance(node, ast.Compare) and len(node.ops) == 1 \
            and type(node.ops[0]) in _COMPARE:
        children = [node.left, node.comparators[0]]
    elif isinstance(node, ast.IfExp):
        children = [node.test, node.body, node.orelse]
    elif isinstance(node, ast.Call) and not node.keywords:
        children = [node.func] + [a.value if isinstance(a, ast.Starred) else a
                                  for a in node.args]
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        children = []
    elif isinstance(node, ast.Subscript):
        children = [node.value]
        index = node.slice
        parts = ([index.lower, index.upper, index.step] if isinstance(index, ast.Slice)
                 else [index])
        if not all(p is None or _constant_int(p) is not None for p in parts):
            raise _fail(fn, node, "subscripts are integer constants")
    elif isinstance(node, ast.Tuple):
        children = node.elts
    elif isinstance(node, ast.Name):
        children = []
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
        children = []
    else:
        raise _fail(fn, node, f"unsupported expression {ast.dump(node)[:60]}")
    for child in children:
        _check_expression(fn, child)


def _constant_int(node: ast.expr) -> Optional[int]:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _constant_int(node.operand)
        return None if inner is None else -inner
    return None


# ------------------------------------------------------------ translation


# Numba's typing of an operation, once per process: the typing pass and
# each emission ask again and again (about 0.5 ms a time).
_SIGNATURES: dict[tuple, Any] = {}


class _Value:
    """A translated value: its Numba type, and its LLVM value (None while
    only typing)."""
    __slots__ = ("type", "llvm")

    def __init__(self, numba_type: types.Type, llvm: Optional[ir.Value]):
        self.type = numba_type
        self.llvm = llvm


class _Constant:
    """A Python constant, typed (as Numba types a global) where it is used."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


class _Object:
    """A Python object that is not a value: a callee or a module."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _type_only(item):
    if isinstance(item, tuple):
        return tuple(_type_only(i) for i in item)
    return _Value(item.type, None) if isinstance(item, _Value) else item


def _wrap(value):
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, (bool, int, float, complex)) or (
            hasattr(value, "dtype") and getattr(value, "shape", None) == ()):
        return _Constant(value)
    return _Object(value)


class _Translator:
    """Types (and, given a builder, emits) one helper call after another."""

    def __init__(self, typingctx, context=None, builder: Optional[ir.IRBuilder] = None):
        self.typingctx = typingctx
        self.context = context
        self.builder = builder
        self.inlining: list[pytypes.FunctionType] = []  # (to refuse recursion)

    # -- values

    def value(self, item, fn, node) -> _Value:
        if isinstance(item, _Value):
            return item
        if isinstance(item, _Constant):
            numba_type = types.unliteral(self.typingctx.resolve_value_type(item.value))
            llvm = (None if self.builder is None
                    else self.context.get_constant(numba_type, item.value))
            return _Value(numba_type, llvm)
        raise _fail(fn, node, "expected a scalar value")

    def cast(self, value: _Value, to: types.Type) -> _Value:
        if self.builder is None or value.type == to:
            return _Value(to, value.llvm)
        return _Value(to, self.context.cast(self.builder, value.llvm, value.type, to))

    def numba_call(self, callee, arguments: list[_Value], fn, node) -> _Value:
        """`callee(*arguments)` as Numba types and lowers it; callee is an
        operator or a Numba function type."""
        argtypes = tuple(a.type for a in arguments)
        key = (self.typingctx, callee, argtypes)
        signature = _SIGNATURES.get(key)
        if signature is None:
            try:
                signature = self.typingctx.resolve_function_type(callee, argtypes, {})
            except Exception as error:  # Numba's typing errors have many classes
                raise _fail(fn, node, f"Numba cannot type {callee}{argtypes}: {error}") \
                    from None
            _SIGNATURES[key] = signature
        if signature is None:
            raise _fail(fn, node, f"Numba cannot type {callee}{argtypes}")
        if self.builder is None:
            return _Value(signature.return_type, None)
        cast = [self.cast(a, t).llvm for a, t in zip(arguments, signature.args)]
        implementation = self.context.get_function(callee, signature)
        return _Value(signature.return_type, implementation(self.builder, cast))

    def truth(self, value: _Value) -> _Value:
        if value.type == types.boolean:
            return value
        return self.numba_call(self.typingctx.resolve_value_type(bool), [value], None, None)

    def select(self, condition: _Value, a, b, fn, node):
        """`a if condition else b`, in the type they unify to (of tuples,
        element by element, as Numba unifies tuple types)."""
        if isinstance(a, tuple) or isinstance(b, tuple):
            if not (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)):
                raise _fail(fn, node, "both sides must be tuples of one length")
            condition = self.truth(condition)
            return tuple(self.select(condition, x, y, fn, node) for x, y in zip(a, b))
        a, b = self.value(a, fn, node), self.value(b, fn, node)
        unified = self.typingctx.unify_types(a.type, b.type)
        if unified is None:
            raise _fail(fn, node, f"cannot unify {a.type} and {b.type}")
        a, b = self.cast(a, unified), self.cast(b, unified)
        if self.builder is None:
            return _Value(unified, None)
        return _Value(unified, self.builder.select(self.truth(condition).llvm, a.llvm, b.llvm))

    # -- functions

    def inline(self, fn: pytypes.FunctionType, arguments: list, call_node=None):
        """The value (or tuple) fn(*arguments) returns, translated in place."""
        if fn not in _HELPERS:
            raise _fail(fn, call_node, "not a @branch_free helper")
        if fn in self.inlining:
            raise _fail(fn, call_node, "calls itself")
        node = _syntax(fn)
        names = [a.arg for a in node.args.args]
        if len(names) != len(arguments):
            raise _fail(fn, node, f"takes {len(names)} arguments, given {len(arguments)}")
        scope = _Scope(fn, dict(zip(names, arguments)))
        self.inlining.append(fn)
        for statement in node.body[:-1]:
            self.statement(scope, statement)
        result = self.expression(scope, node.body[-1].value)
        self.inlining.pop()
        return result

    def statement(self, scope: "_Scope", node: ast.stmt) -> None:
        if isinstance(node, ast.Expr):
            return  # the docstring
        if isinstance(node, ast.Assign):
            self.assign(scope, node.targets[0], self.expression(scope, node.value))
        elif isinstance(node, ast.If):
            self.conditional(scope, node)
        else:
            self.unrolled(scope, node)

    def assign(self, scope: "_Scope", target: ast.expr, value) -> None:
        if isinstance(target, ast.Name):
            scope.names[target.id] = value
            return
        if not isinstance(value, tuple) or len(value) != len(target.elts):
            raise _fail(scope.fn, target, "unpacking needs a tuple of as many values")
        for element, item in zip(target.elts, value):
            self.assign(scope, element, item)

    def conditional(self, scope: "_Scope", node: ast.If) -> None:
        """`if c: <assignments>`: a branch, and after it a phi per name the
        body assigns, in the type both sides unify to (Numba's lowering)."""
        condition = self.truth(self.value(self.expression(scope, node.test), scope.fn, node))
        assigned = list(dict.fromkeys(t.id for s in node.body for t in ast.walk(s.targets[0])
                                      if isinstance(t, ast.Name)))
        for name in assigned:
            if name not in scope.names:
                raise _fail(scope.fn, node, f"`{name}` is assigned only inside the `if`")
        # the types after the `if` (each name's old and new types unified),
        # from a typing pass over a copy
        typing = _Translator(self.typingctx)
        typing.inlining = self.inlining
        shadow = _Scope(scope.fn, {k: _type_only(v) for k, v in scope.names.items()})
        for statement in node.body:
            typing.statement(shadow, statement)
        after = {name: typing.unify(typing.value(scope.names[name], scope.fn, node),
                                    shadow.names[name], scope.fn, node) for name in assigned}
        if self.builder is None:
            scope.names.update({name: _Value(after[name], None) for name in assigned})
            return
        old = {name: self.cast(self.value(scope.names[name], scope.fn, node), after[name])
               for name in assigned}  # (casts before the branch)
        entry = self.builder.block
        with self.builder.if_then(condition.llvm):
            for statement in node.body:
                self.statement(scope, statement)
            new = {name: self.cast(self.value(scope.names[name], scope.fn, node), after[name])
                   for name in assigned}
            body_end = self.builder.block
        for name in assigned:
            phi = self.builder.phi(old[name].llvm.type)
            phi.add_incoming(new[name].llvm, body_end)
            phi.add_incoming(old[name].llvm, entry)
            scope.names[name] = _Value(after[name], phi)

    def unify(self, old: _Value, new, fn, node) -> types.Type:
        new = self.value(new, fn, node)
        unified = self.typingctx.unify_types(old.type, new.type)
        if unified is None:
            raise _fail(fn, node, f"cannot unify {old.type} and {new.type}")
        return unified

    def unrolled(self, scope: "_Scope", node: ast.For) -> None:
        sequence = self.expression(scope, node.iter)
        if not isinstance(sequence, tuple):
            raise _fail(scope.fn, node, "a loop runs over a constant tuple")
        for item in sequence:
            before = {k: v.type for k, v in scope.names.items() if isinstance(v, _Value)}
            scope.names[node.target.id] = item
            for statement in node.body:
                self.statement(scope, statement)
            for name, old_type in before.items():
                new = scope.names[name]
                new_type = new.type if isinstance(new, _Value) else None
                if name != node.target.id and new_type != old_type:
                    # Numba would unify it over the loop; no helper needs that
                    raise _fail(scope.fn, node, f"`{name}` changes type in the loop")

    # -- expressions

    def expression(self, scope: "_Scope", node: ast.expr):
        fn = scope.fn
        if isinstance(node, ast.Constant):
            return _Constant(node.value)
        if isinstance(node, ast.Name):
            return scope.lookup(node)
        if isinstance(node, ast.Attribute):
            owner = scope.lookup(node.value)
            if not (isinstance(owner, _Object) and isinstance(owner.value, pytypes.ModuleType)):
                raise _fail(fn, node, "attributes of modules only")
            return _wrap(getattr(owner.value, node.attr))
        if isinstance(node, ast.Tuple):
            return tuple(self.expression(scope, e) for e in node.elts)
        if isinstance(node, ast.Subscript):
            sequence = self.expression(scope, node.value)
            if not isinstance(sequence, tuple):
                raise _fail(fn, node, "subscripts of tuples only")
            index = node.slice
            if isinstance(index, ast.Slice):
                return sequence[slice(*(None if p is None else _constant_int(p)
                                        for p in (index.lower, index.upper, index.step)))]
            return sequence[_constant_int(index)]
        if isinstance(node, ast.IfExp):
            condition = self.value(self.expression(scope, node.test), fn, node)
            return self.select(condition, self.expression(scope, node.body),
                               self.expression(scope, node.orelse), fn, node)
        if isinstance(node, ast.BinOp):
            operands = [self.value(self.expression(scope, e), fn, node)
                        for e in (node.left, node.right)]
            return self.numba_call(_BINARY[type(node.op)], operands, fn, node)
        if isinstance(node, ast.UnaryOp):
            operand = self.value(self.expression(scope, node.operand), fn, node)
            return self.numba_call(_UNARY[type(node.op)], [operand], fn, node)
        if isinstance(node, ast.Compare):
            operands = [self.value(self.expression(scope, e), fn, node)
                        for e in (node.left, node.comparators[0])]
            return self.numba_call(_COMPARE[type(node.ops[0])], operands, fn, node)
        if isinstance(node, ast.BoolOp):
            return self.boolean(scope, node)
        return self.call(scope, node)

    def boolean(self, scope: "_Scope", node: ast.BoolOp) -> _Value:
        """`and`/`or` of booleans: one `and`/`or` instruction (Numba's
        short circuit gives the same value, as nothing here has effects)."""
        values = [self.value(self.expression(scope, e), scope.fn, node) for e in node.values]
        if any(v.type != types.boolean for v in values):
            raise _fail(scope.fn, node, "`and` and `or` of booleans only")
        if self.builder is None:
            return _Value(types.boolean, None)
        combine = self.builder.and_ if isinstance(node.op, ast.And) else self.builder.or_
        result = values[0].llvm
        for v in values[1:]:
            result = combine(result, v.llvm)
        return _Value(types.boolean, result)

    def call(self, scope: "_Scope", node: ast.Call):
        fn = scope.fn
        callee = self.expression(scope, node.func)
        if not isinstance(callee, _Object):
            raise _fail(fn, node, "not a callable")
        arguments: list = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                expanded = self.expression(scope, a.value)
                if not isinstance(expanded, tuple):
                    raise _fail(fn, node, "`*` of a tuple only")
                arguments.extend(expanded)
            else:
                arguments.append(self.expression(scope, a))
        target = callee.value
        if target in _PUBLIC:
            values = [self.value(a, fn, node) for a in arguments]
            chosen = _PUBLIC[target](*(v.type for v in values))
            if chosen is None:
                raise _fail(fn, node, f"{target.__name__} takes no {[v.type for v in values]}")
            implementation, parameter_types = chosen
            values = [self.cast(v, t) for v, t in zip(values, parameter_types)]
            if implementation in _HELPERS:
                return self.inline(implementation, values, node)
            return self.numba_call(implementation, values, fn, node)
        if isinstance(target, pytypes.FunctionType):
            return self.inline(target, arguments, node)
        values = [self.value(a, fn, node) for a in arguments]
        try:
            function_type = self.typingctx.resolve_value_type(target)
        except Exception:
            raise _fail(fn, node, f"Numba cannot type the callee {target!r}") from None
        return self.numba_call(function_type, values, fn, node)


class _Scope:
    """A helper's local names over its closure cells and globals."""

    def __init__(self, fn: pytypes.FunctionType, names: dict):
        self.fn = fn
        self.names = names

    def lookup(self, node: ast.Name):
        name = node.id
        if name in self.names:
            return self.names[name]
        code = self.fn.__code__
        if name in code.co_freevars:
            return _wrap(self.fn.__closure__[code.co_freevars.index(name)].cell_contents)
        if name in self.fn.__globals__:
            return _wrap(self.fn.__globals__[name])
        builtins = self.fn.__globals__.get("__builtins__")
        table = builtins if isinstance(builtins, dict) else vars(builtins)
        if name in table:
            return _Object(table[name])
        raise _fail(self.fn, node, f"unknown name `{name}`")


# ------------------------------------------------------------ registration

_PUBLIC: dict[Callable, Selector] = {}
_RETURN_TYPES: dict[tuple, types.Type] = {}


def _return_type(typingctx, implementation, argtypes: tuple) -> Optional[types.Type]:
    key = (implementation, argtypes)
    if key not in _RETURN_TYPES:
        translator = _Translator(typingctx)
        result = translator.inline(implementation, [_Value(t, None) for t in argtypes])
        if isinstance(result, tuple):
            raise BranchFreeError(f"{implementation.__qualname__} returns a tuple")
        _RETURN_TYPES[key] = translator.value(result, implementation, None).type
    return _RETURN_TYPES[key]


def _emit(context, builder: ir.IRBuilder, implementation, argtypes: tuple,
          return_type: types.Type, args) -> ir.Value:
    """A call to `implementation`'s translation, an `alwaysinline` internal
    function of the kernel's module, emitted there once."""
    module = builder.module
    spelled = re.sub(r"[^A-Za-z0-9_.]", "_", implementation.__qualname__)
    name = (f"gradc_math.{_NUMBERS[implementation]}.{spelled}."
            + ".".join(str(t) for t in argtypes))
    function = module.globals.get(name)
    if function is None:
        function_type = ir.FunctionType(context.get_value_type(return_type),
                                        [context.get_value_type(t) for t in argtypes])
        function = ir.Function(module, function_type, name)
        function.linkage = "internal"
        function.attributes.add("alwaysinline")
        inner = ir.IRBuilder(function.append_basic_block("entry"))
        # error_model numpy: a float division checks nothing (and could
        # not raise from here)
        numpy_errors = context.subtarget(
            error_model=callconv.create_error_model("numpy", context))
        translator = _Translator(context.typing_context, numpy_errors, inner)
        result = translator.inline(implementation, [_Value(t, a) for t, a in
                                                    zip(argtypes, function.args)])
        inner.ret(translator.cast(translator.value(result, implementation, None),
                                  return_type).llvm)
        for visitor in (FastFloatBinOpVisitor(_FLAGS), FastFloatCallVisitor(_FLAGS)):
            visitor.visit_Function(function)
    return builder.call(function, args)


def kernel_function(public: Callable, select: Selector) -> None:
    """Calls of `public` in a kernel run `select(*argument types)`'s
    choice: (helper, the types its arguments are converted to), or None
    where the types are not for it."""
    arity = len(inspect.signature(public).parameters)
    if arity not in (1, 2):
        raise BranchFreeError(f"{public.__qualname__}: one or two arguments only")
    _PUBLIC[public] = select

    def result_type(typingctx, argtypes):
        chosen = select(*argtypes)
        if chosen is None:
            return None
        implementation, parameter_types = chosen
        if implementation in _HELPERS:
            return _return_type(typingctx, implementation, parameter_types)
        signature = typingctx.resolve_function_type(implementation, parameter_types, {})
        return None if signature is None else signature.return_type

    @type_callable(public)
    def typer(typingctx):
        if arity == 1:
            return lambda x: result_type(typingctx, (x,))
        return lambda x, y: result_type(typingctx, (x, y))

    @lower_builtin(public, *[types.Any] * arity)
    def lower(context, builder, signature, args):
        implementation, parameter_types = select(*signature.args)
        cast = [context.cast(builder, a, t, p)
                for a, t, p in zip(args, signature.args, parameter_types)]
        if implementation not in _HELPERS:  # Numba's own, here
            inner = context.typing_context.resolve_function_type(
                implementation, parameter_types, {})
            cast = [context.cast(builder, a, t, p)
                    for a, t, p in zip(cast, parameter_types, inner.args)]
            result = context.get_function(implementation, inner)(builder, cast)
            return context.cast(builder, result, inner.return_type, signature.return_type)
        return _emit(context, builder, implementation, tuple(parameter_types),
                     signature.return_type, cast)
