"""Load-time checks of a parsed module, before anything is compiled.

Contract: `check(module, functions)` raises the first `GradError` it finds
among: duplicate definitions or parameters; unknown decorators; names read
before they are defined; calls to unknown functions or with the wrong
number of arguments or unknown keywords; statements after `return`; bodies
without one; and the grad-block contract:

- the first block takes one upstream cotangent per value the function
  returns;
- it returns one cotangent per differentiable parameter (float or
  unannotated, not `const`), positionally in order and/or by name
  (`x=...`); `0` is a zero cotangent.  A missing, extra, duplicated or
  misnamed cotangent is an error naming the function, the block's line and
  what was expected;
- `@pass_through` functions take no grad block and have exactly one
  differentiable parameter.

Shapes and dtypes are checked when a call binds them (`compiler.lower`).
"""
from __future__ import annotations

from typing import Iterable

from compiler.lower import BUILTINS, free_names
from dsl import ast
from dsl.errors import GradError

DECORATORS = ("recompute", "pass_through")


def check(module: ast.Module, functions: dict[str, ast.FuncDef]) -> None:
    seen: dict[str, ast.FuncDef] = {}
    for f in module.funcs:
        if f.name in seen:
            raise GradError(f"function {f.name!r} is already defined at line "
                            f"{seen[f.name].span.line}", f.span)
        if f.name in BUILTINS:
            raise GradError(f"function {f.name!r} shadows a builtin", f.span)
        seen[f.name] = f
    declared: set[str] = set()
    for p in module.params:
        if p.name in declared or p.name in seen:
            raise GradError(f"{p.name!r} is already defined", p.span)
        declared.add(p.name)
    for f in module.funcs:
        _check_function(f, functions)


def _check_function(f: ast.FuncDef, functions: dict[str, ast.FuncDef]) -> None:
    names: set[str] = set()
    for p in f.params:
        if p.name in names:
            raise GradError(f"duplicate parameter {p.name!r} in {f.name}()", p.span)
        names.add(p.name)
    for d in f.decorators:
        if d.name not in DECORATORS:
            raise GradError(f"unknown decorator @{d.name} (known: "
                            f"{', '.join('@' + n for n in DECORATORS)})", d.span)
    n_returns = _check_block(f.body, set(names), functions, f"{f.name}()", allow_named=False)
    if any(d.name == "pass_through" for d in f.decorators):
        if f.grads:
            raise GradError(f"@pass_through function {f.name}() cannot have a grad block; "
                            "its gradient is the identity", f.grads[0].span)
        if len(f.differentiable_params) != 1 or n_returns != 1:
            raise GradError(f"@pass_through function {f.name}() needs exactly one "
                            "differentiable parameter and one result", f.span)
    locals_ = _assigned(f.body) | names
    visible = set(locals_)
    for index, block in enumerate(f.grads):
        _check_grad_block(f, block, index, n_returns, visible, functions)
        visible |= set(block.upstream) | _assigned(block.body)


def _check_grad_block(f: ast.FuncDef, block: ast.GradBlock, index: int, n_returns: int,
                      visible: set[str], functions) -> None:
    where = f"grad block of {f.name}() (line {block.span.line})"
    if len(set(block.upstream)) != len(block.upstream):
        raise GradError(f"{where} repeats an upstream name", block.span)
    if index == 0 and len(block.upstream) != n_returns:
        raise GradError(f"{where} takes {len(block.upstream)} upstream cotangent(s), but "
                        f"{f.name}() returns {n_returns} value(s)", block.span)
    _check_block(block.body, visible | set(block.upstream), functions, where,
                 allow_named=True)
    if index > 0:
        return  # later blocks: contract checked when higher orders are built
    returns = [s for s in block.body if isinstance(s, ast.Return)]
    items = returns[0].items
    expected = [p.name for p in f.differentiable_params]
    positional = [it for it in items if it.name is None]
    named = [it for it in items if it.name is not None]
    want = (f"one cotangent for each of {', '.join(expected)}" if expected
            else "no cotangents (it has no differentiable parameters)")
    if len(positional) > len(expected):
        raise GradError(f"{where} returns {len(items)} cotangent(s); expected {want}",
                        positional[len(expected)].span)
    covered = expected[:len(positional)]
    for it in named:
        if it.name not in expected:
            p = f.param(it.name)
            why = ("is const" if p is not None and p.is_const else
                   "is not differentiable" if p is not None else
                   f"is not a parameter of {f.name}()")
            raise GradError(f"{where} returns a cotangent for {it.name!r}, which {why}; "
                            f"expected {want}", it.span)
        if it.name in covered:
            raise GradError(f"{where} returns the cotangent for {it.name!r} twice",
                            it.span)
        covered.append(it.name)
    missing = [n for n in expected if n not in covered]
    if missing:
        raise GradError(f"{where} is missing the cotangent for "
                        f"{', '.join(repr(m) for m in missing)}; expected {want}",
                        returns[0].span)


def _assigned(body: Iterable[ast.Stmt]) -> set[str]:
    out: set[str] = set()
    for s in body:
        if isinstance(s, ast.Assign):
            out.update(s.targets)
        elif isinstance(s, ast.AugAssign):
            out.add(s.target)
    return out


def _check_block(body, defined: set[str], functions, where: str, allow_named: bool) -> int:
    """Check one statement list; return how many values its return gives."""
    defined = set(defined)
    n_returns = -1
    for i, stmt in enumerate(body):
        if n_returns >= 0:
            raise GradError("statement after return is unreachable", stmt.span)
        if isinstance(stmt, ast.Assign):
            _check_expr(stmt.value, defined, functions)
            if len(set(stmt.targets)) != len(stmt.targets):
                raise GradError("a name is assigned twice in one statement", stmt.span)
            defined.update(stmt.targets)
        elif isinstance(stmt, ast.AugAssign):
            if stmt.target not in defined:
                raise GradError(f"name {stmt.target!r} is not defined", stmt.span)
            _check_expr(stmt.value, defined, functions)
        elif isinstance(stmt, ast.Return):
            for item in stmt.items:
                if item.name is not None and not allow_named:
                    raise GradError("named return values are only allowed in grad blocks",
                                    item.span)
                _check_expr(item.value, defined, functions)
            n_returns = len(stmt.items)
    if n_returns < 0:
        span = body[-1].span if body else None
        raise GradError(f"{where} has no return statement", span)
    return n_returns


def _check_expr(e, defined: set[str], functions: dict[str, ast.FuncDef]) -> None:
    if isinstance(e, ast.Name):
        if e.id not in defined:
            if e.id in functions or e.id in BUILTINS:
                raise GradError(f"function {e.id!r} used as a value; call it", e.span)
            raise GradError(f"name {e.id!r} is not defined", e.span)
    elif isinstance(e, ast.Call):
        if not isinstance(e.func, ast.Name):
            raise GradError("only named functions can be called", e.func.span)
        name = e.func.id
        kw_names = [k.name for k in e.kwargs]
        if len(set(kw_names)) != len(kw_names):
            raise GradError("keyword argument repeated", e.span)
        if name in defined:
            raise GradError(f"{name!r} is a value, not a function", e.func.span)
        if name in functions:
            _check_call_arity(functions[name], len(e.args), kw_names, e)
        elif name in BUILTINS:
            BUILTINS[name].check(name, len(e.args), kw_names, e.span)
        else:
            raise GradError(f"unknown function {name!r}", e.func.span)
        for a in e.args:
            _check_expr(a, defined, functions)
        for k in e.kwargs:
            _check_expr(k.value, defined, functions)
    elif isinstance(e, (ast.BinOp, ast.Compare, ast.BoolOp)):
        _check_expr(e.left, defined, functions)
        _check_expr(e.right, defined, functions)
    elif isinstance(e, ast.UnaryOp):
        _check_expr(e.operand, defined, functions)
    elif isinstance(e, ast.Attr):
        _check_expr(e.value, defined, functions)
        if e.name not in ("T", "shape", "ndim", "size"):
            raise GradError(f"arrays have no attribute {e.name!r} (only .T, .shape, "
                            ".ndim, .size)", e.span)
    elif isinstance(e, ast.Index):
        _check_expr(e.value, defined, functions)
        for item in e.items:
            _check_expr(item, defined, functions)
    elif isinstance(e, ast.Slice):
        for part in (e.start, e.stop, e.step):
            if part is not None:
                _check_expr(part, defined, functions)
    elif isinstance(e, ast.TupleExpr):
        for item in e.items:
            _check_expr(item, defined, functions)


def _check_call_arity(f: ast.FuncDef, n_args: int, kw_names: list[str], call: ast.Call) -> None:
    if n_args > len(f.params):
        raise GradError(f"{f.name}() takes {len(f.params)} argument(s) but {n_args} were "
                        "given", call.span)
    given = {p.name for p in f.params[:n_args]}
    for k in kw_names:
        if f.param(k) is None:
            raise GradError(f"{f.name}() has no parameter {k!r}", call.span)
        if k in given:
            raise GradError(f"{f.name}() got two values for {k!r}", call.span)
        given.add(k)
    missing = [p.name for p in f.params if p.name not in given and p.default is None]
    if missing:
        raise GradError(f"{f.name}() is missing argument(s) "
                        f"{', '.join(repr(m) for m in missing)}", call.span)
