"""AST -> IR, for one call signature.

Contract: `lower_entry(program, fdef, arg_types)` returns an `ir.Function`
whose parameters are the runtime arguments (in the order of `arg_types`,
which names the parameters the caller passed) and whose body is the
function's computation with every call to a function without grad blocks
inlined.  A call to a function with grad blocks becomes one `custom_vjp`
equation carrying two sub-functions:

- `fwd(args) -> (outputs..., residuals...)`: the body, also returning the
  forward locals the first grad block reads;
- `bwd(args, residuals, cotangents) -> one cotangent per arg`: the block.

Values that are known at compile time (literals, `x.shape[k]`, arithmetic
on them, tuples) stay Python values until they meet an array: then a
literal takes the array's dtype (language.md section 4).  Every problem is
raised as a `GradError` at the span of the expression that caused it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

from compiler import ops
from compiler.ir import FLOATS, INTS, Atom, Builder, Function, Lit, TensorType, Var
from dsl import ast
from dsl.errors import GradError, Span

Static = Union[int, float, bool, tuple]
Value = Union[Var, Lit, int, float, bool, tuple]


@dataclass(frozen=True)
class Program:
    """What lowering needs to resolve names: the module being compiled and
    the functions it can call (its own and imported ones)."""

    module: ast.Module
    functions: dict[str, ast.FuncDef]


def is_static(v: Value) -> bool:
    return not isinstance(v, (Var, Lit))


# ------------------------------------------------------------- dtype rules


def promote(a: str, b: str) -> str:
    if a == b:
        return a
    if a in FLOATS or b in FLOATS:
        return "f64" if "f64" in (a, b) else "f32"
    if "i64" in (a, b) or "bool" in (a, b) and "i32" not in (a, b):
        return "i64"
    return "i32"


def _weak_dtype(value: Static) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "i64"
    return "f64"


def as_atom(b: Builder, v: Value, span: Optional[Span], dtype: Optional[str] = None) -> Atom:
    """A compile-time value becomes a literal (of `dtype` when given)."""
    if isinstance(v, (Var, Lit)):
        return cast(b, v, dtype) if dtype else v
    if isinstance(v, tuple):
        raise GradError("a tuple cannot be used as an array here", span)
    return b.lit(v, dtype or _weak_dtype(v))


def cast(b: Builder, a: Atom, dtype: str) -> Atom:
    if a.type.dtype == dtype:
        return a
    if isinstance(a, Lit):
        return b.lit(a.value, dtype)
    return b.bind("cast", a, dtype=dtype)


def unify(b: Builder, values: Sequence[Value], span: Optional[Span],
          float_result: bool = False, arithmetic: bool = True) -> list[Atom]:
    """Bring operands to one dtype: arrays promote (f32 with f64 gives f64),
    literals take the arrays' dtype (a float literal makes ints f64)."""
    arrays = [v for v in values if not is_static(v)]
    if arrays:
        dtype = arrays[0].type.dtype
        for a in arrays[1:]:
            dtype = promote(dtype, a.type.dtype)
        if any(isinstance(v, float) for v in values if is_static(v)) and dtype not in FLOATS:
            dtype = "f64"
    else:
        dtype = "f64" if any(isinstance(v, float) for v in values) else "i64"
    if arithmetic and dtype == "bool":
        dtype = "i64"
    if float_result and dtype not in FLOATS:
        dtype = "f64"
    return [as_atom(b, v, span, dtype) for v in values]


# ----------------------------------------------------------------- lowering


class Lowerer:
    def __init__(self, program: Program):
        self.program = program
        self.call_stack: list[str] = []

    def lower_entry(self, fdef: ast.FuncDef, arg_types: dict[str, TensorType],
                    name: Optional[str] = None) -> Function:
        b = Builder()
        params = [Var(t, n) for n, t in arg_types.items()]
        args = dict(zip(arg_types, params))
        outs = self.call(b, fdef, [], args, fdef.span)
        return b.function(name or fdef.name, params, [as_atom(b, o, fdef.span) for o in outs])

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
                bound[p.name] = p.default.value
        return {p.name: bound[p.name] for p in fdef.params}

    def call(self, b: Builder, fdef: ast.FuncDef, positional: Sequence[Value],
             keywords: dict[str, Value], span: Span) -> list[Value]:
        if fdef.name in self.call_stack:
            raise GradError(f"recursive call to {fdef.name}() is not supported", span)
        args = self.bind_args(fdef, positional, keywords, span)
        self.check_annotations(fdef, args, span)
        self.call_stack.append(fdef.name)
        try:
            if fdef.grads:
                return self.custom_call(b, fdef, args, span)
            env = dict(args)
            return self.block(b, fdef.body, env)
        finally:
            self.call_stack.pop()

    def check_annotations(self, fdef: ast.FuncDef, args: dict[str, Value], span: Span) -> None:
        dims: dict[str, tuple[int, str]] = {}
        for p in fdef.params:
            ann, value = p.ann, args[p.name]
            if ann is None or (ann.dtype is None and ann.dims is None):
                continue
            if is_static(value):
                if isinstance(value, tuple):
                    raise GradError(f"argument {p.name!r} of {fdef.name}() must be an "
                                    "array, not a tuple", span)
                shape, dtype = (), None
            else:
                shape, dtype = value.type.shape, value.type.dtype
            if ann.dtype is not None and dtype is not None and dtype != ann.dtype:
                raise GradError(f"argument {p.name!r} of {fdef.name}() has dtype {dtype}; "
                                f"its annotation says {ann.dtype}", span)
            if ann.dims is None:
                continue
            if len(shape) != len(ann.dims):
                raise GradError(f"argument {p.name!r} of {fdef.name}() has rank {len(shape)} "
                                f"(shape {list(shape)}); its annotation "
                                f"{_ann_text(ann)} has rank {len(ann.dims)}", span)
            for axis, (dim, size) in enumerate(zip(ann.dims, shape)):
                if isinstance(dim, int):
                    if dim != size:
                        raise GradError(f"argument {p.name!r} of {fdef.name}() has size "
                                        f"{size} on axis {axis}; its annotation says {dim}",
                                        span)
                elif dim in dims and dims[dim][0] != size:
                    raise GradError(f"dimension {dim!r} is {dims[dim][0]} for "
                                    f"{dims[dim][1]!r} but {size} for {p.name!r} "
                                    f"in a call to {fdef.name}()", span)
                else:
                    dims.setdefault(dim, (size, p.name))

    def custom_call(self, b: Builder, fdef: ast.FuncDef, args: dict[str, Value],
                    span: Span) -> list[Value]:
        """A call to a function with a grad block: one `custom_vjp` equation."""
        block = fdef.grads[0]
        array_names = [n for n, v in args.items() if not is_static(v)]
        statics = {n: v for n, v in args.items() if is_static(v)}

        # fwd: the body, returning its outputs and the residuals.
        fb = Builder()
        fparams = [Var(args[n].type, n) for n in array_names]
        env: dict[str, Value] = {**statics, **dict(zip(array_names, fparams))}
        outs = [as_atom(fb, o, span) for o in self.block(fb, fdef.body, env)]
        residual_names = [n for n in sorted(free_names(block.body, set(block.upstream)))
                          if n in env and n not in args]
        res_arrays = [n for n in residual_names if not is_static(env[n])]
        res_statics = {n: env[n] for n in residual_names if is_static(env[n])}
        fwd = fb.function(f"{fdef.name}_fwd", fparams,
                          outs + [env[n] for n in res_arrays])

        # bwd: the grad block, from (args, residuals, cotangents).
        bb = Builder()
        bargs = [Var(v.type, v.hint) for v in fparams]
        bres = [Var(env[n].type, n) for n in res_arrays]
        bcts = [Var(o.type, u) for o, u in zip(outs, block.upstream)]
        if len(block.upstream) != len(outs):
            raise GradError(f"grad block of {fdef.name}() takes {len(block.upstream)} "
                            f"cotangents but {fdef.name}() returns {len(outs)} values",
                            block.span)
        benv: dict[str, Value] = {**statics, **res_statics,
                                  **dict(zip(array_names, bargs)),
                                  **dict(zip(res_arrays, bres)),
                                  **dict(zip(block.upstream, bcts))}
        items = self.block_items(bb, block.body, benv)
        cts = self.grad_results(bb, fdef, block, items, args)
        bwd = bb.function(f"{fdef.name}_bwd", bargs + bres + bcts,
                          [cts[n] for n in array_names])

        inputs = [args[n] for n in array_names]
        return list(b.bind_multi("custom_vjp", *inputs, span=span, fwd=fwd, bwd=bwd,
                                 n_out=len(outs), name=fdef.name))

    def grad_results(self, b: Builder, fdef: ast.FuncDef, block: ast.GradBlock,
                     items: list[tuple[Optional[str], Value, Span]],
                     args: dict[str, Value]) -> dict[str, Atom]:
        """Map a grad block's returned items onto the parameters, checking
        each cotangent's shape; non-differentiable parameters get zeros."""
        expected = [p.name for p in fdef.differentiable_params]
        given: dict[str, tuple[Value, Span]] = {}
        positional = [it for it in items if it[0] is None]
        for name, (_, value, sp) in zip(expected, positional):
            given[name] = (value, sp)
        for name, value, sp in items:
            if name is not None:
                given[name] = (value, sp)
        out: dict[str, Atom] = {}
        for p in fdef.params:
            arg = args[p.name]
            if is_static(arg):
                continue
            t = arg.type
            if p.name not in given or not t.is_float:
                out[p.name] = ops.zeros_like(b, t)
                continue
            value, sp = given[p.name]
            if is_static(value):
                if isinstance(value, tuple):
                    raise GradError(f"cotangent for {p.name!r} is a tuple", sp)
                out[p.name] = ops.full(b, value, t.shape, t.dtype)
                continue
            if value.type.shape != t.shape:
                # A cotangent of the shape the parameter was broadcast to is
                # summed back, as derived gradients are; a size-1 one spreads.
                if _broadcasts(t.shape, value.type.shape):
                    value = ops.unbroadcast(b, value, t.shape)
                elif value.type.size == 1 and value.type.rank <= t.rank:
                    value = b.bind("broadcast_to", value, shape=t.shape, span=sp)
                else:
                    raise GradError(
                        f"grad block of {fdef.name}() (line {block.span.line}) returns a "
                        f"cotangent of shape {list(value.type.shape)} for {p.name!r}, "
                        f"which has shape {list(t.shape)}", sp)
            out[p.name] = cast(b, value, t.dtype)
        return out

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
            if isinstance(stmt, ast.Assign):
                value = self.expr(b, stmt.value, env)
                if len(stmt.targets) == 1:
                    env[stmt.targets[0]] = self.named(b, value, stmt.targets[0])
                    continue
                if not isinstance(value, tuple) or len(value) != len(stmt.targets):
                    got = len(value) if isinstance(value, tuple) else 1
                    raise GradError(f"cannot unpack {got} value(s) into "
                                    f"{len(stmt.targets)} names", stmt.span)
                for target, v in zip(stmt.targets, value):
                    env[target] = self.named(b, v, target)
            elif isinstance(stmt, ast.AugAssign):
                if stmt.target not in env:
                    raise GradError(f"name {stmt.target!r} is not defined", stmt.span)
                rhs = self.expr(b, stmt.value, env)
                env[stmt.target] = self.binary(b, _BINOPS[stmt.op], env[stmt.target], rhs,
                                               stmt.span)
            elif isinstance(stmt, ast.Return):
                return [(it.name, self.expr(b, it.value, env), it.span) for it in stmt.items]
        raise GradError("function body has no return statement",
                        body[-1].span if body else None)

    @staticmethod
    def named(b: Builder, value: Value, name: str) -> Value:
        # Give the defining equation's output a readable name in printed IR.
        if isinstance(value, Var) and b.eqns and value in b.eqns[-1].outputs and not value.hint:
            object.__setattr__(value, "hint", name)
        return value

    # ------------------------------------------------------ expressions

    def expr(self, b: Builder, e: ast.Expr, env: dict[str, Value]) -> Value:
        method = getattr(self, "expr_" + type(e).__name__)
        return method(b, e, env)

    def expr_Name(self, b, e: ast.Name, env):
        if e.id in env:
            return env[e.id]
        if e.id in self.program.functions or e.id in BUILTINS:
            raise GradError(f"function {e.id!r} used as a value; call it", e.span)
        raise GradError(f"name {e.id!r} is not defined", e.span)

    def expr_Num(self, b, e: ast.Num, env):
        return e.value

    def expr_Bool(self, b, e: ast.Bool, env):
        return e.value

    def expr_TupleExpr(self, b, e: ast.TupleExpr, env):
        return tuple(self.expr(b, item, env) for item in e.items)

    def expr_BinOp(self, b, e: ast.BinOp, env):
        left, right = self.expr(b, e.left, env), self.expr(b, e.right, env)
        if e.op == "@":
            return self.matmul(b, left, right, e.span)
        return self.binary(b, _BINOPS[e.op], left, right, e.span)

    def expr_UnaryOp(self, b, e: ast.UnaryOp, env):
        v = self.expr(b, e.operand, env)
        if e.op == "not":
            if is_static(v):
                return not v
            return b.bind("logical_not", self.as_bool(b, v, e.span), span=e.span)
        if is_static(v):
            if isinstance(v, tuple):
                raise GradError("cannot negate a tuple", e.span)
            return -v
        return b.bind("neg", cast(b, v, "i64") if v.type.dtype == "bool" else v, span=e.span)

    def expr_Compare(self, b, e: ast.Compare, env):
        left, right = self.expr(b, e.left, env), self.expr(b, e.right, env)
        op = _COMPARE[e.op]
        if is_static(left) and is_static(right):
            return bool(ops.OPS[op].ref(left, right))
        x, y = unify(b, [left, right], e.span, arithmetic=False)
        return b.bind(op, x, y, span=e.span)

    def expr_BoolOp(self, b, e: ast.BoolOp, env):
        left, right = self.expr(b, e.left, env), self.expr(b, e.right, env)
        if is_static(left) and is_static(right):
            return (left and right) if e.op == "and" else (left or right)
        x, y = self.as_bool(b, left, e.span), self.as_bool(b, right, e.span)
        return b.bind("logical_" + e.op, x, y, span=e.span)

    def as_bool(self, b, v: Value, span) -> Atom:
        a = as_atom(b, v, span)
        if a.type.dtype != "bool":
            raise GradError(f"expected a bool value, got {a.type.dtype}", span)
        return a

    def expr_Attr(self, b, e: ast.Attr, env):
        v = self.expr(b, e.value, env)
        if is_static(v):
            raise GradError(f"a compile-time value has no attribute {e.name!r}", e.span)
        if e.name == "T":
            return self.transpose(b, v, None, e.span)
        if e.name == "shape":
            return tuple(v.type.shape)
        if e.name == "ndim":
            return v.type.rank
        if e.name == "size":
            return v.type.size
        raise GradError(f"arrays have no attribute {e.name!r} (only .T, .shape, .ndim, "
                        ".size)", e.span)

    def expr_Index(self, b, e: ast.Index, env):
        v = self.expr(b, e.value, env)
        if isinstance(v, tuple):
            if len(e.items) != 1 or isinstance(e.items[0], ast.Slice):
                raise GradError("a tuple takes one integer index", e.span)
            k = self.static_int(b, e.items[0], env)
            if not -len(v) <= k < len(v):
                raise GradError(f"index {k} is out of range for a tuple of length "
                                f"{len(v)}", e.items[0].span)
            return v[k]
        if is_static(v):
            raise GradError("cannot index a scalar literal", e.span)
        return self.index(b, v, e, env)

    def index(self, b, v: Atom, e: ast.Index, env) -> Atom:
        shape = v.type.shape
        if len(e.items) > len(shape):
            raise GradError(f"too many indices ({len(e.items)}) for an array of rank "
                            f"{len(shape)}", e.span)
        starts, stops, steps, keep = [], [], [], []
        for axis, size in enumerate(shape):
            item = e.items[axis] if axis < len(e.items) else None
            if item is None or isinstance(item, ast.Slice):
                bounds = [None if part is None else self.static_int(b, part, env)
                          for part in ((item.start, item.stop, item.step) if item else ())]
                if item is not None and bounds[2] == 0:
                    raise GradError("slice step cannot be zero", item.span)
                start, stop, step = slice(*bounds).indices(size) if item else (0, size, 1)
                keep.append(len(range(start, stop, step)))
            else:
                k = self.static_int(b, item, env)
                if not -size <= k < size:
                    raise GradError(f"index {k} is out of range for axis {axis} of size "
                                    f"{size}", item.span)
                k %= size
                start, stop, step = k, k + 1, 1
            starts.append(start)
            stops.append(stop)
            steps.append(step)
        out = b.bind("slice", v, starts=tuple(starts), stops=tuple(stops),
                     steps=tuple(steps), span=e.span)
        if out.type.shape != tuple(keep):
            out = b.bind("reshape", out, shape=tuple(keep), span=e.span)
        return out

    def static_int(self, b, e: ast.Expr, env) -> int:
        v = self.expr(b, e, env)
        if isinstance(v, bool) or not isinstance(v, int):
            raise GradError("expected a compile-time integer (a literal, x.shape[k], or "
                            "arithmetic on them)", e.span)
        return v

    def expr_Call(self, b, e: ast.Call, env):
        if not isinstance(e.func, ast.Name):
            raise GradError("only named functions can be called", e.func.span)
        name = e.func.id
        if name in env:
            raise GradError(f"{name!r} is a value, not a function", e.func.span)
        args = [self.expr(b, a, env) for a in e.args]
        kwargs = {k.name: self.expr(b, k.value, env) for k in e.kwargs}
        if len(kwargs) != len(e.kwargs):
            raise GradError("keyword argument repeated", e.span)
        fdef = self.program.functions.get(name)
        if fdef is not None:
            outs = self.call(b, fdef, args, kwargs, e.span)
            return outs[0] if len(outs) == 1 else tuple(outs)
        builtin = BUILTINS.get(name)
        if builtin is None:
            raise GradError(f"unknown function {name!r}", e.func.span)
        builtin.check(name, len(args), kwargs, e.span)
        return builtin.lower(self, b, args, kwargs, e.span)

    # ---------------------------------------------------- op helpers

    def binary(self, b, op: str, left: Value, right: Value, span) -> Value:
        if is_static(left) and is_static(right):
            if isinstance(left, tuple) or isinstance(right, tuple):
                raise GradError("arithmetic on tuples is not supported", span)
            try:
                return _fold(op, left, right)
            except (ZeroDivisionError, OverflowError, ValueError) as err:
                raise GradError(f"compile-time arithmetic failed: {err}", span) from None
        x, y = unify(b, [left, right], span, float_result=op in ops.FLOAT_ONLY)
        return b.bind(op, x, y, span=span)

    def unary(self, b, op: str, v: Value, span) -> Atom:
        (x,) = unify(b, [v], span, float_result=op in ops.FLOAT_ONLY)
        return b.bind(op, x, span=span)

    def matmul(self, b, left: Value, right: Value, span) -> Atom:
        x, y = unify(b, [left, right], span)
        if x.type.rank == 0 or y.type.rank == 0 or x.type.rank > 2 or y.type.rank > 2:
            raise GradError(f"@ needs arrays of rank 1 or 2, got shapes "
                            f"{list(x.type.shape)} and {list(y.type.shape)}", span)
        x2 = x if x.type.rank == 2 else b.bind("reshape", x, shape=(1, x.type.size), span=span)
        y2 = y if y.type.rank == 2 else b.bind("reshape", y, shape=(y.type.size, 1), span=span)
        out = b.bind("matmul", x2, y2, span=span)
        shape = (x.type.shape[:1] if x.type.rank == 2 else ()) + \
                (y.type.shape[1:] if y.type.rank == 2 else ())
        return out if out.type.shape == shape else b.bind("reshape", out, shape=shape, span=span)

    def transpose(self, b, v: Atom, axes: Optional[tuple], span) -> Atom:
        rank = v.type.rank
        perm = tuple(reversed(range(rank))) if axes is None else tuple(
            a % rank if -rank <= a < rank else a for a in axes)
        if perm == tuple(range(rank)):
            return v
        return b.bind("transpose", v, perm=perm, span=span)

    def reduce(self, b, op: str, v: Value, axis, keepdims, span) -> Atom:
        x = as_atom(b, v, span)
        rank = x.type.rank
        if axis is None:
            axes = tuple(range(rank))
        elif isinstance(axis, tuple):
            axes = axis
        else:
            axes = (axis,)
        if any(isinstance(a, bool) or not isinstance(a, int) for a in axes):
            raise GradError("axis must be a compile-time integer or tuple of integers", span)
        axes = ops._normalize_axes(axes, rank, span)
        if op == "reduce_max" and any(x.type.shape[a] == 0 for a in axes):
            raise GradError("max/min of an empty array", span)
        if x.type.dtype == "bool":
            x = cast(b, x, "i64")
        out = b.bind(op, x, axes=axes, span=span) if axes else x
        if keepdims:
            kept = tuple(1 if i in axes else d for i, d in enumerate(x.type.shape))
            if out.type.shape != kept:
                out = b.bind("reshape", out, shape=kept, span=span)
        return out


def _broadcasts(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    if len(small) > len(big):
        return False
    return all(s in (1, g) for s, g in zip(small[::-1], big[::-1]))


def _ann_text(ann: ast.TypeAnn) -> str:
    dims = "" if not ann.dims else "[" + ", ".join(map(str, ann.dims)) + "]"
    return f"{ann.dtype or 'const'}{dims}"


_BINOPS = {"+": "add", "-": "sub", "*": "mul", "/": "div", "**": "pow"}
_COMPARE = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


def _fold(op: str, x, y):
    if op == "add":
        return x + y
    if op == "sub":
        return x - y
    if op == "mul":
        return x * y
    if op == "div":
        return x / y
    if op == "pow":
        result = x ** y
        if isinstance(result, complex):
            raise ValueError("negative base with fractional exponent")
        return result
    raise ValueError(op)


def free_names(body: Sequence[ast.Stmt], bound: set[str]) -> set[str]:
    """Names a block reads before (or without) assigning them."""
    bound = set(bound)
    free: set[str] = set()

    def visit(e) -> None:
        if isinstance(e, ast.Name):
            if e.id not in bound:
                free.add(e.id)
        elif isinstance(e, ast.Call):
            if not isinstance(e.func, ast.Name):
                visit(e.func)
            for a in e.args:
                visit(a)
            for k in e.kwargs:
                visit(k.value)
        elif isinstance(e, (ast.BinOp, ast.Compare, ast.BoolOp)):
            visit(e.left)
            visit(e.right)
        elif isinstance(e, ast.UnaryOp):
            visit(e.operand)
        elif isinstance(e, ast.Attr):
            visit(e.value)
        elif isinstance(e, ast.Index):
            visit(e.value)
            for item in e.items:
                visit(item)
        elif isinstance(e, ast.Slice):
            for part in (e.start, e.stop, e.step):
                if part is not None:
                    visit(part)
        elif isinstance(e, ast.TupleExpr):
            for item in e.items:
                visit(item)

    for stmt in body:
        if isinstance(stmt, ast.Assign):
            visit(stmt.value)
            bound.update(stmt.targets)
        elif isinstance(stmt, ast.AugAssign):
            if stmt.target not in bound:
                free.add(stmt.target)
            visit(stmt.value)
            bound.add(stmt.target)
        elif isinstance(stmt, ast.Return):
            for item in stmt.items:
                visit(item.value)
    return free


# ---------------------------------------------------------------- builtins


@dataclass(frozen=True)
class Builtin:
    """A function of the surface language: its signature (checked at load
    time) and how it lowers to primitives."""

    min_args: int
    max_args: int
    kwargs: tuple[str, ...]
    lower: Callable[[Lowerer, Builder, list, dict, Span], Value]

    def check(self, name: str, n_args: int, kwargs: dict | Sequence[str], span: Span) -> None:
        names = list(kwargs)
        n_total = n_args + sum(1 for k in names if k not in self.kwargs)
        if not self.min_args <= n_args <= self.max_args and not (
                n_args < self.min_args and n_total >= self.min_args):
            want = (str(self.min_args) if self.min_args == self.max_args
                    else f"{self.min_args} to {self.max_args}")
            raise GradError(f"{name}() takes {want} positional arguments but {n_args} "
                            f"were given", span)
        for k in names:
            if k not in self.kwargs:
                raise GradError(f"{name}() got an unexpected keyword argument {k!r}", span)


def _kw(args: list, kwargs: dict, position: int, name: str, default=None):
    if len(args) > position:
        return args[position]
    return kwargs.get(name, default)


def _unary_builtin(op: str) -> Builtin:
    return Builtin(1, 1, (), lambda L, b, a, k, s: L.unary(b, op, a[0], s))


def _binary_builtin(op: str) -> Builtin:
    return Builtin(2, 2, (), lambda L, b, a, k, s: L.binary(b, op, a[0], a[1], s))


def _reduction(op: str, negate: bool = False, mean: bool = False) -> Builtin:
    def lower(L: Lowerer, b: Builder, args, kwargs, span):
        axis = _kw(args, kwargs, 1, "axis")
        keepdims = _kw(args, kwargs, 2, "keepdims", False)
        x = as_atom(b, args[0], span)
        if mean and x.type.dtype not in FLOATS:
            x = cast(b, x, "f64")
        if negate:
            x = b.bind("neg", x, span=span)
        out = L.reduce(b, op, x, axis, keepdims, span)
        if negate:
            out = b.bind("neg", out, span=span)
        if mean:
            count = x.type.size // max(out.type.size, 1) if x.type.size else 0
            out = b.bind("div", out, b.lit(count, out.type.dtype), span=span)
        return out
    return Builtin(1, 3, ("axis", "keepdims"), lower)


def _where(L, b, args, kwargs, span):
    cond = L.as_bool(b, args[0], span)
    x, y = unify(b, args[1:], span, arithmetic=False)
    return b.bind("where", cond, x, y, span=span)


def _clip(L, b, args, kwargs, span):
    low = L.binary(b, "maximum", args[0], args[1], span)
    return L.binary(b, "minimum", low, args[2], span)


def _static_shape(v, span) -> tuple[int, ...]:
    shape = v if isinstance(v, tuple) else (v,)
    if any(isinstance(d, bool) or not isinstance(d, int) for d in shape):
        raise GradError("a shape must be a compile-time tuple of integers", span)
    return shape


def _reshape(L, b, args, kwargs, span):
    x = as_atom(b, args[0], span)
    shape = list(_static_shape(_kw(args, kwargs, 1, "shape"), span))
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise GradError(f"invalid shape {shape}", span)
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or x.type.size % known:
            raise GradError(f"cannot reshape {list(x.type.shape)} to {shape}", span)
        shape[shape.index(-1)] = x.type.size // known
    shape = tuple(shape)
    return x if shape == x.type.shape else b.bind("reshape", x, shape=shape, span=span)


def _broadcast_to(L, b, args, kwargs, span):
    x = as_atom(b, args[0], span)
    shape = _static_shape(_kw(args, kwargs, 1, "shape"), span)
    return x if shape == x.type.shape else b.bind("broadcast_to", x, shape=shape, span=span)


def _transpose(L, b, args, kwargs, span):
    x = as_atom(b, args[0], span)
    axes = _kw(args, kwargs, 1, "axes")
    if axes is not None:
        axes = _static_shape(axes, span)
    return L.transpose(b, x, axes, span)


def _concatenate(L, b, args, kwargs, span, stack: bool = False):
    seq = args[0]
    if not isinstance(seq, tuple) or not seq:
        raise GradError("expected a non-empty tuple of arrays, e.g. (a, b)", span)
    axis = _kw(args, kwargs, 1, "axis", 0)
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise GradError("axis must be a compile-time integer", span)
    items = unify(b, list(seq), span, arithmetic=False)
    rank = items[0].type.rank + (1 if stack else 0)
    if not -rank <= axis < rank or rank == 0:
        raise GradError(f"axis {axis} is out of range for rank {rank}", span)
    axis %= rank
    if stack:
        shapes = {a.type.shape for a in items}
        if len(shapes) != 1:
            raise GradError(f"stack() needs arrays of one shape, got "
                            f"{[list(s) for s in shapes]}", span)
        items = [b.bind("reshape", a, shape=a.type.shape[:axis] + (1,) + a.type.shape[axis:],
                        span=span) for a in items]
    if len(items) == 1:
        return items[0]
    return b.bind("concatenate", *items, axis=axis, span=span)


def _fill_like(value_pos: Optional[int], value=None):
    def lower(L, b, args, kwargs, span):
        x = as_atom(b, args[0], span)
        fill = args[value_pos] if value_pos is not None else value
        if not is_static(fill) or isinstance(fill, tuple):
            raise GradError("full_like() needs a compile-time fill value", span)
        return ops.full(b, fill, x.type.shape, x.type.dtype)
    return lower


def _stop_gradient(L, b, args, kwargs, span):
    v = args[0]
    return v if is_static(v) else b.bind("stop_gradient", v, span=span)


def _matmul_builtin(L, b, args, kwargs, span):
    return L.matmul(b, args[0], args[1], span)


BUILTINS: dict[str, Builtin] = {
    **{name: _unary_builtin(name) for name in (
        "exp", "log", "log1p", "expm1", "sqrt", "sin", "cos", "tan", "tanh", "sinh",
        "cosh", "arctan", "sigmoid", "erf", "abs", "sign", "floor", "ceil", "round")},
    "maximum": _binary_builtin("maximum"),
    "minimum": _binary_builtin("minimum"),
    "where": Builtin(3, 3, (), _where),
    "clip": Builtin(3, 3, (), _clip),
    "sum": _reduction("reduce_sum"),
    "mean": _reduction("reduce_sum", mean=True),
    "max": _reduction("reduce_max"),
    "min": _reduction("reduce_max", negate=True),
    "matmul": Builtin(2, 2, (), _matmul_builtin),
    "transpose": Builtin(1, 2, ("axes",), _transpose),
    "reshape": Builtin(2, 2, ("shape",), _reshape),
    "broadcast_to": Builtin(2, 2, ("shape",), _broadcast_to),
    "stack": Builtin(1, 2, ("axis",), lambda L, b, a, k, s: _concatenate(L, b, a, k, s, True)),
    "concatenate": Builtin(1, 2, ("axis",), _concatenate),
    "zeros_like": Builtin(1, 1, (), _fill_like(None, 0)),
    "ones_like": Builtin(1, 1, (), _fill_like(None, 1)),
    "full_like": Builtin(2, 2, (), _fill_like(1)),
    "stop_gradient": Builtin(1, 1, (), _stop_gradient),
}
