"""The checked surface syntax tree of a `.grad` file.

Contract: immutable dataclasses, one per construct of the language, each with
the `Span` of the source text it came from.  The parser builds them
(`compiler.parser`), the checker validates them (`compiler.checker`) and the compiler
lowers them to IR (`compiler.lower`).  Nothing here knows about shapes or
dtypes of call arguments; those are bound at call time.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import ClassVar, Union

from gradlang.runtime.args import floating, number_dtype
from gradlang.runtime.errors import Span, one_line

# ----------------------------------------------------------------- expressions


@dataclass(frozen=True)
class Name:
    id: str
    span: Span


@dataclass(frozen=True)
class Num:
    value: Union[int, float]
    span: Span

    @property
    def is_float(self) -> bool:
        return isinstance(self.value, float)


def written_int(e) -> "int | None":
    """The integer `e` writes (`3`, `-1`), else None."""
    negated = isinstance(e, UnaryOp) and e.op == "-"
    e = e.operand if negated else e
    if isinstance(e, Num) and isinstance(e.value, int) and not isinstance(e.value, bool):
        return -e.value if negated else e.value
    return None


@dataclass(frozen=True)
class Bool:
    value: bool
    span: Span


@dataclass(frozen=True)
class NoneLit:
    """`None`: an argument that means "not given", where a builtin's option
    takes it (`sum(x, axis=None)`) or a `const` parameter does (and so its
    default may be None); nothing else is None.  In an index it is a new
    axis (the parser makes it a `NewAxis`), and a slice's bound written
    None is one left out (`x[None:2]`, as Python's)."""

    span: Span
    value: ClassVar[None] = None  # as a default's, `Num.value`'s peer


@dataclass(frozen=True)
class Str:
    """A string literal: the language reads one only as einsum's subscripts."""
    value: str
    span: Span


@dataclass(frozen=True)
class BinOp:
    op: str  # + - * / ** @
    left: "Expr"
    right: "Expr"
    span: Span


@dataclass(frozen=True)
class UnaryOp:
    op: str  # - + not
    operand: "Expr"
    span: Span


@dataclass(frozen=True)
class Compare:
    op: str  # < <= > >= == !=
    left: "Expr"
    right: "Expr"
    span: Span


@dataclass(frozen=True)
class BoolOp:
    op: str  # and or
    left: "Expr"
    right: "Expr"
    span: Span


@dataclass(frozen=True)
class Keyword:
    name: str
    value: "Expr"
    span: Span


@dataclass(frozen=True)
class Call:
    func: "Expr"
    args: tuple["Expr", ...]
    kwargs: tuple[Keyword, ...]
    span: Span


@dataclass(frozen=True)
class Attr:
    value: "Expr"
    name: str
    span: Span

    @property
    def name_span(self) -> Span:
        """Where the attribute's name is written (an error about the name
        points there, not at the start of `x.T.zz`): the end of the span,
        a name being one token on its last line; else the whole span."""
        span = self.span
        if not span.end_line or span.end_col <= len(self.name):
            return span
        return replace(span, line=span.end_line, col=span.end_col - len(self.name))


@dataclass(frozen=True)
class Slice:
    start: "Expr | None"
    stop: "Expr | None"
    step: "Expr | None"
    span: Span


@dataclass(frozen=True)
class NewAxis:
    """`None` among an index's items (`x[:, None]`): an axis of size 1
    inserted there, as NumPy's `np.newaxis`."""

    span: Span


@dataclass(frozen=True)
class EveryOtherAxis:
    """`...` among an index's items (`x[..., 0]`): a full slice of each
    axis the other items do not index, as NumPy's `Ellipsis`."""

    span: Span


@dataclass(frozen=True)
class Index:
    value: "Expr"
    items: tuple["Expr | Slice | NewAxis | EveryOtherAxis", ...]
    span: Span


@dataclass(frozen=True)
class TupleExpr:
    items: tuple["Expr", ...]
    span: Span


@dataclass(frozen=True)
class ListExpr:
    """`[a, b]`: the same compile-time sequence as a tuple (NumPy spelling
    for `stack([a, b])`, shapes and axes); only messages tell them apart."""

    items: tuple["Expr", ...]
    span: Span


Expr = Union[Name, Num, Bool, NoneLit, Str, BinOp, UnaryOp, Compare, BoolOp, Call, Attr,
             Index, TupleExpr, ListExpr]

# The operators with a left and a right operand.
BINARY = (BinOp, Compare, BoolOp)


def left_chain(e: Expr) -> tuple[Expr, list[Union[BinOp, Compare, BoolOp]]]:
    """`e` as the operand at the bottom of its left side and the binary
    operations above it, innermost first: `a + b - c` is `a` and
    [`a + b`, `a + b - c`].  A chain of n left-associative operators nests
    n deep on the left, and generated sources hold thousands; the passes
    walk the chain with a loop, so that only nesting on the right
    (parentheses, `**`, unary operators) costs them stack."""
    chain = []
    while isinstance(e, BINARY):
        chain.append(e)
        e = e.left
    chain.reverse()
    return e, chain

# ------------------------------------------------------------------ statements


@dataclass(frozen=True)
class Assign:
    targets: tuple[str, ...]  # one name, or several for `a, b = e`
    value: Expr
    span: Span


@dataclass(frozen=True)
class AugAssign:
    target: str
    op: str  # + - * /
    value: Expr
    span: Span


@dataclass(frozen=True)
class ReturnItem:
    name: str | None  # `x=...` names a cotangent; None is positional
    value: Expr
    span: Span


@dataclass(frozen=True)
class Return:
    items: tuple[ReturnItem, ...]
    span: Span


@dataclass(frozen=True)
class For:
    """`for var in range(args):` -- the names the body rebinds that exist
    before the loop are its carried values; the rest are local to it."""

    var: str
    args: tuple[Expr, ...]  # range()'s start, stop, step as written (1 to 3)
    body: tuple["Stmt", ...]
    span: Span  # the header, `for ... :`


@dataclass(frozen=True)
class If:
    """`if cond: ... else: ...`; `elif` is an `If` alone in `orelse`
    (`elif_chain` reads the chain back as a list)."""

    cond: Expr
    body: tuple["Stmt", ...]
    orelse: tuple["Stmt", ...]
    span: Span  # the header, `if ... :` (`elif ... :` for an elif)


Stmt = Union[Assign, AugAssign, Return, For, If]


def elif_chain(stmt: If) -> tuple[list[If], tuple["Stmt", ...]]:
    """`if a: A elif b: B else: C` as its arms, `[if a: A, elif b: B]`
    (each arm's `cond` and `body` are its own; its `orelse` is the rest of
    the chain), and the final else body, `C` (`()` without one).  An elif
    chain nests once per `elif` on the right, and generated sources hold
    hundreds: the passes loop over the arms instead of recursing into
    `orelse`, so that only blocks nested in blocks cost them stack.  (An
    `else:` holding only an `if` is the same chain, as it means the same.)"""
    arms = [stmt]
    while len(stmt.orelse) == 1 and isinstance(stmt.orelse[0], If):
        stmt = stmt.orelse[0]
        arms.append(stmt)
    return arms, stmt.orelse


def assigned_names(body: "tuple[Stmt, ...] | list[Stmt]") -> list[str]:
    """Every name a statement list binds, nested statements included, in
    order of first binding (loop variables excluded: they are local)."""
    out: dict[str, None] = {}
    for s in body:
        if isinstance(s, Assign):
            out.update(dict.fromkeys(s.targets))
        elif isinstance(s, AugAssign):
            out[s.target] = None
        elif isinstance(s, For):
            out.update(dict.fromkeys(n for n in assigned_names(s.body) if n != s.var))
        elif isinstance(s, If):
            arms, orelse = elif_chain(s)
            for arm in arms:
                out.update(dict.fromkeys(assigned_names(arm.body)))
            out.update(dict.fromkeys(assigned_names(orelse)))
    return list(out)

# ------------------------------------------------------------------ top level

@dataclass(frozen=True)
class TypeAnn:
    """`f64` (a scalar), `f64[n, 3]` (named or fixed dims), `f64[...]` (any
    rank), or `const` / `const f64[n]`.  dtype None means any dtype; a
    kind (`float[n]`, `runtime.args.KINDS`) any dtype of the kind."""

    dtype: str | None
    dims: tuple[Union[str, int], ...] | None  # None: any rank
    const: bool
    span: Span

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    @property
    def text(self) -> str:
        """The dtype and dims as written: `f64`, `f64[n, 3]`, `f64[...]`."""
        dims = "..." if self.dims is None else ", ".join(map(str, self.dims))
        return f"{self.dtype or ''}[{dims}]" if dims else self.dtype or ""


@dataclass(frozen=True)
class Param:
    name: str
    ann: TypeAnn | None
    default: Num | Bool | NoneLit | None  # None: no default
    span: Span

    @property
    def is_const(self) -> bool:
        return self.ann is not None and self.ann.const

    @property
    def differentiable(self) -> bool:
        """Float (or not annotated) and not `const`: gets a cotangent."""
        if self.ann is None:
            return True
        if self.ann.const:
            return False
        return self.ann.dtype is None or floating(self.ann.dtype)


@dataclass(frozen=True)
class GradBlock:
    upstream: tuple[str, ...]
    body: tuple[Stmt, ...]
    span: Span
    # each upstream name's place, for an error about one (none: the block's)
    upstream_spans: tuple[Span, ...] = field(default=(), repr=False, compare=False)

    def upstream_span(self, k: int) -> Span:
        """Where the block names its k-th upstream cotangent."""
        return self.upstream_spans[k] if k < len(self.upstream_spans) else self.span


@dataclass(frozen=True)
class Decorator:
    name: str
    span: Span
    args: tuple[Keyword, ...] = ()  # `@recompute(every=4)`


def has_loop(body: tuple[Stmt, ...]) -> bool:
    """Whether a statement list holds a for loop, at any depth."""
    for s in body:
        if isinstance(s, For):
            return True
        if isinstance(s, If):
            arms, orelse = elif_chain(s)
            if any(has_loop(arm.body) for arm in arms) or has_loop(orelse):
                return True
    return False


@dataclass(frozen=True)
class FuncDef:
    name: str
    params: tuple[Param, ...]
    ret: TypeAnn | None
    body: tuple[Stmt, ...]
    grads: tuple[GradBlock, ...]
    decorators: tuple[Decorator, ...]
    span: Span

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def refuses_none(self, position: int, keyword: str | None) -> str | None:
        """Why `None` cannot be the argument at `position` (or `keyword`) of
        a call, or None where it can: a `const` parameter of no dtype takes
        it (an axis, as NumPy's `axis=None`); no parameter there is the
        arity check's to report."""
        if keyword is None:
            param = self.params[position] if position < len(self.params) else None
        else:
            param = self.param(keyword)
        if param is None or param.is_const and param.ann.dtype is None:
            return None
        kind = f"is `const {param.ann.dtype}`" if param.is_const else "is not one"
        return (f"None can only be passed to a `const` parameter of no dtype (such as "
                f"`axis: const`); {param.name!r} of {self.name}() {kind}")

    @property
    def differentiable_params(self) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.differentiable)

    @property
    def result_dtype(self) -> str | None:
        """The dtype a compile-time result takes from the return annotation
        (`args.number_dtype`: `-> float` makes `return 1` an f64); None
        without one."""
        return None if self.ret is None else number_dtype(self.ret.dtype)

    @property
    def result_spans(self) -> tuple[Span, ...]:
        """Where each result is returned: the items of the body's return
        (the checker made sure there is one, outside loops and branches)."""
        ret = next((s for s in self.body if isinstance(s, Return)), None)
        return () if ret is None else tuple(item.span for item in ret.items)


@dataclass(frozen=True)
class ParamDecl:
    name: str
    type: TypeAnn
    span: Span


@dataclass(frozen=True)
class Import:
    module: str
    names: tuple[str, ...] | None  # None: `import module`
    span: Span


@dataclass(frozen=True)
class Module:
    file: str
    source: str = field(repr=False)
    imports: tuple[Import, ...]
    params: tuple[ParamDecl, ...]
    funcs: tuple[FuncDef, ...]

    def func(self, name: str) -> FuncDef | None:
        return next((f for f in self.funcs if f.name == name), None)


def flatten(node) -> list:
    """`node` as a flat list, whose pickle never recurses deeper than one
    node (pickling the tree itself recursed once per level: a generated sum
    of 400 terms was never stored).  Each dataclass or tuple is an
    entry after those of its items: `(2, type, n)` or `(1, n)`; any other
    value is `(0, value)`.  `unflatten` builds the tree back."""
    out: list = []
    todo: list = [(node, False)]
    while todo:
        item, built = todo.pop()
        if is_dataclass(item) and not isinstance(item, type):
            items = [getattr(item, f.name) for f in fields(item)]
            header = (2, type(item), len(items))
        elif type(item) is tuple:
            items, header = list(item), (1, len(item))
        else:
            out.append((0, item))
            continue
        if built:
            out.append(header)
        else:
            todo.append((item, True))
            todo += [(child, False) for child in reversed(items)]
    return out


def unflatten(entries: list):
    """The tree `flatten` wrote as `entries`."""
    stack: list = []
    for entry in entries:
        if entry[0] == 0:
            stack.append(entry[1])
            continue
        n = entry[-1]
        items = stack[len(stack) - n:]
        del stack[len(stack) - n:]
        stack.append(tuple(items) if entry[0] == 1 else entry[1](*items))
    (tree,) = stack
    return tree


class _Text(str):
    """Text `dump` writes as it is (a delimiter), not as a repr."""


def dump(node) -> str:
    """`repr(node)`, written with a stack of its own instead of Python's: a
    tree is as deep as its deepest expression, and the parser accepts
    expressions deeper than recursion into repr can print (`gradc show
    --emit ast` of `return - - ... - x`, 400 deep, raised RecursionError)."""
    out: list[str] = []
    todo: list = [node]
    while todo:
        item = todo.pop()
        if isinstance(item, _Text):
            out.append(item)
            continue
        if is_dataclass(item) and not isinstance(item, type):
            shown = [f for f in fields(item) if f.repr]
            parts: list = [_Text(f"{type(item).__name__}(")]
            for i, f in enumerate(shown):
                parts += [_Text(f"{', ' if i else ''}{f.name}="), getattr(item, f.name)]
            parts.append(_Text(")"))
        elif type(item) is tuple:
            parts = [_Text("(")]
            for i, element in enumerate(item):
                parts += [_Text(", ")] * bool(i) + [element]
            parts.append(_Text(",)" if len(item) == 1 else ")"))
        else:
            out.append(repr(item))
            continue
        todo += reversed(parts)
    return "".join(out)


def outline(node) -> str:
    """`node` as `gradc show --emit ast` prints it: as `repr` would, but a
    field holding nodes on lines of its own, indented by depth, and a span
    as `line:col-end_line:end_col` (the outermost node's with its file).
    Written with a stack of its own, as `dump` is."""
    lines: list[list] = []  # [depth, text]
    todo: list = [(node, 0, "")]  # (a node, a tuple of nodes or closing text, depth, prefix)
    while todo:
        item, depth, prefix = todo.pop()
        if isinstance(item, _Text):
            lines[-1][1] += item
            continue
        if type(item) is tuple:
            lines.append([depth, f"{prefix}("])
            children = [(child, depth + 1, "") for child in item]
        else:
            inline, children = [], []
            for f in fields(item):
                value = getattr(item, f.name)
                if f.repr and _holds_nodes(value):
                    children.append((value, depth + 1, f"{f.name}="))
                elif f.repr:
                    shown = _span_text(value, with_file=not lines) if isinstance(value, Span) \
                        else repr(value)
                    inline.append(f"{f.name}={shown}")
            lines.append([depth, f"{prefix}{type(item).__name__}({', '.join(inline)}"])
            if children and inline:
                lines[-1][1] += ","
        todo.append((_Text(")"), depth, ""))
        for k in reversed(range(len(children))):
            todo.append(children[k])
            if k:
                todo.append((_Text(","), depth, ""))
    return "\n".join("  " * depth + text for depth, text in lines)


def _holds_nodes(value) -> bool:
    """Whether a field's value is a node, or a tuple holding one."""
    if type(value) is tuple:
        return any(_holds_nodes(v) for v in value)
    return is_dataclass(value) and not isinstance(value, (type, Span))


def _span_text(span: Span, with_file: bool) -> str:
    place = f"{span.line}:{span.col}-{span.end_line}:{span.end_col}"
    # (the file name as a message shows it: one holding a line break or an
    # escape sequence forged a line of the outline, or acted on the terminal)
    return f"{one_line(span.file)}:{place}" if with_file else place
