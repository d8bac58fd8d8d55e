"""What a module's code can name, and what a function reads.

Contract: a `Namespace` maps the names a module's code may call to their
definitions (its own functions, those imported by name, and `m.f` for an
imported module `m`) and holds every `param` visible to it.
`param_reads(fdef, ns)` is the sorted tuple of module params a function
reads, directly or through the functions it calls (grad blocks and
`grad(f)(...)` included), worked out once per function and kept in the
namespace; `free_names(body, bound)` the names a statement
list reads before assigning them; `calls_in(bodies)` its call expressions (`nodes_in` every node),
`call_targets(call, ns)` the definitions a call names.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

from gradlang.compiler import ast
from gradlang.compiler.builtins import TRANSFORMS


@dataclass
class Namespace:
    """What a module's code can name: its functions and those it imports
    (`from m import f`), imported modules (`import m`, then `m.f`), and the
    `param`s declared by it and by the modules it imports."""

    module: ast.Module
    functions: dict[str, tuple[ast.FuncDef, "Namespace"]] = field(default_factory=dict)
    modules: dict[str, "Namespace"] = field(default_factory=dict)
    params: dict[str, ast.ParamDecl] = field(default_factory=dict)
    # the namespace each import statement's module resolved to, by its name
    imported: dict[str, "Namespace"] = field(default_factory=dict, repr=False, compare=False)
    # param_reads's answers, by id() of this module's FuncDefs
    reads: dict[int, tuple[str, ...]] = field(default_factory=dict, repr=False)

    def resolve(self, func: ast.Expr) -> Optional[tuple[ast.FuncDef, "Namespace"]]:
        if isinstance(func, ast.Name):
            return self.functions.get(func.id)
        if (isinstance(func, ast.Attr) and isinstance(func.value, ast.Name)
                and func.value.id in self.modules):
            return self.modules[func.value.id].functions.get(func.name)
        return None

    def source_of(self, file: str) -> Optional[str]:
        """The text of `file` when it is this module or one its imports
        reach (an error's span may name any of them), else None."""
        seen: set[int] = set()
        todo = [self]
        while todo:
            ns = todo.pop()
            if id(ns) in seen:
                continue
            seen.add(id(ns))
            if ns.module.file == file:
                return ns.module.source
            todo += ns.modules.values()
            todo += (home for _, home in ns.functions.values())
        return None


def param_reads(fdef: ast.FuncDef, ns: Namespace) -> tuple[str, ...]:
    """The module params a function reads, directly or through calls.

    Worked out once per function (kept in `ns.reads`): one walk of the call
    graph from `fdef` answers for every function it reaches."""
    if id(fdef) not in ns.reads:
        _close_param_reads(fdef, ns)
    return ns.reads[id(fdef)]


def _close_param_reads(root: ast.FuncDef, root_ns: Namespace) -> None:
    """Tarjan's strongly connected components, iteratively (a call chain may
    be deeper than Python's stack): functions that call each other read the
    union of what they read (recursion itself is an error when lowered)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    reads: dict[int, set[str]] = {}
    owner: dict[int, Namespace] = {}
    component: list[int] = []
    work: list[tuple[int, Iterator[tuple[ast.FuncDef, Namespace]]]] = []

    def enter(fdef: ast.FuncDef, ns: Namespace) -> None:
        key = id(fdef)
        index[key] = low[key] = len(index)
        owner[key] = ns
        reads[key], callees = _direct_reads(fdef, ns)
        component.append(key)
        work.append((key, iter(callees)))

    enter(root, root_ns)
    while work:
        key, callees = work[-1]
        for fdef, ns in callees:
            callee = id(fdef)
            if callee in ns.reads:
                reads[key].update(ns.reads[callee])
            elif callee not in index:
                enter(fdef, ns)
                break
            else:  # on the component stack: a cycle back to it
                low[key] = min(low[key], index[callee])
        else:
            work.pop()
            if low[key] == index[key]:
                members = component[component.index(key):]
                del component[component.index(key):]
                closed = set().union(*(reads[m] for m in members))
                for m in members:
                    reads[m] = closed
                    owner[m].reads[m] = tuple(sorted(closed))
            if work:
                caller = work[-1][0]
                low[caller] = min(low[caller], low[key])
                reads[caller].update(reads[key])


def _direct_reads(fdef: ast.FuncDef, ns: Namespace
                  ) -> tuple[set[str], list[tuple[ast.FuncDef, Namespace]]]:
    """The params a function's own text reads, and the functions it calls
    (by name, or through `grad(f)`)."""
    bodies = [fdef.body] + [g.body for g in fdef.grads]
    local = {p.name for p in fdef.params}
    reads = {n for body in bodies for n in free_names(body, local) if n in ns.params}
    callees = [t for call in calls_in(bodies) for t in call_targets(call, ns)]
    return reads, callees


def call_targets(call: ast.Call, ns: Namespace) -> list[tuple[ast.FuncDef, Namespace]]:
    """The definitions a call names: its function, and an in-language
    transform's function (`grad(g)`)."""
    targets = [call.func]
    if isinstance(call.func, ast.Name) and call.func.id in TRANSFORMS and call.args:
        targets.append(call.args[0])
    return [t for t in map(ns.resolve, targets) if t is not None]


def calls_in(bodies) -> list[ast.Call]:
    """Every call expression in the given statement lists, in source order."""
    return [node for node in nodes_in(bodies) if isinstance(node, ast.Call)]


def nodes_in(tree) -> Iterator:
    """Every node of a tree (a node, or a tuple or list of them: statement
    lists), itself first, in source order (walked with a stack of its own:
    a tree is as deep as its longest chain of operators)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (tuple, list)):
            todo += node[::-1]
            continue
        yield node
        if hasattr(node, "__dataclass_fields__"):
            todo += [getattr(node, name) for name in reversed(node.__dataclass_fields__)
                     if name != "span"]


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
        elif isinstance(e, ast.BINARY):
            first, chain = ast.left_chain(e)
            visit(first)
            for operation in chain:
                visit(operation.right)
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
        elif isinstance(e, (ast.TupleExpr, ast.ListExpr)):
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
        elif isinstance(stmt, ast.For):
            for a in stmt.args:
                visit(a)
            free |= free_names(stmt.body, bound | {stmt.var})
        elif isinstance(stmt, ast.If):
            arms, orelse = ast.elif_chain(stmt)
            branches = [arm.body for arm in arms] + [orelse]
            for arm in arms:
                visit(arm.cond)
            for branch in branches:
                free |= free_names(branch, bound)
            # bound after the if: what every branch binds
            bound.update(set.intersection(*(set(ast.assigned_names(branch))
                                             for branch in branches)))
        elif isinstance(stmt, ast.Return):
            for item in stmt.items:
                visit(item.value)
    return free
