"""The one mutable helper of the IR: `Builder` accumulates equations while
a function is constructed, type-checking each through the op table, and
`inline` copies a function's body into a builder.

Contract: `Builder.bind(op, *inputs, **params)` appends one equation whose
output types come from `OPS[op].type_rule` (raising `GradError` on a type
error) and returns its output; `function(...)` freezes what was bound into
an immutable `Function`.  It sits above both `ir` and `ops` so that neither
imports the other's dependents.
"""
from __future__ import annotations

from typing import Any, Iterable, Union

from gradlang.compiler.ir import INTS, Atom, Eqn, Function, Lit, TensorType, Var
from gradlang.compiler.ops import OPS
from gradlang.runtime.errors import Span


class Builder:
    """Accumulates equations; `bind` type-checks through the op table."""

    def __init__(self) -> None:
        self.eqns: list[Eqn] = []

    def bind(self, op: str, *inputs: Atom, span: Span | None = None,
             hint: str = "", **params: Any) -> Var:
        (out,) = self.bind_multi(op, *inputs, span=span, hint=hint, **params)
        return out

    def bind_multi(self, op: str, *inputs: Atom, span: Span | None = None,
                   hint: str = "", **params: Any) -> tuple[Var, ...]:
        out_types = OPS[op].type_rule([a.type for a in inputs], params, span)
        outs = tuple(Var(t, hint) for t in out_types)
        self.eqns.append(Eqn(op, tuple(inputs), outs,
                             tuple(sorted(params.items())), span))
        return outs

    def lit(self, value: Union[int, float, bool], dtype: str) -> Lit:
        return Lit(_coerce(value, dtype), TensorType(dtype, ()))

    def function(self, name: str, params: Iterable[Var],
                 outputs: Iterable[Atom]) -> Function:
        return Function(name, tuple(params), tuple(self.eqns), tuple(outputs))


def _coerce(value: Union[int, float, bool], dtype: str) -> Union[int, float, bool]:
    if dtype == "bool":
        return bool(value)
    if dtype in INTS:
        return int(value)
    return float(value)


def inline(builder: Builder, fn: Function, args: Iterable[Atom]) -> list[Atom]:
    """Append a copy of `fn`'s body to `builder` with fresh output vars,
    substituting `args` for its parameters; return its outputs."""
    env: dict[Var, Atom] = dict(zip(fn.params, args, strict=True))

    def sub(a: Atom) -> Atom:
        return env.get(a, a) if isinstance(a, Var) else a

    for eqn in fn.eqns:
        outs = tuple(Var(v.type, v.hint) for v in eqn.outputs)
        env.update(zip(eqn.outputs, outs))
        builder.eqns.append(Eqn(eqn.op, tuple(sub(a) for a in eqn.inputs),
                                outs, eqn.params, eqn.span))
    return [sub(a) for a in fn.outputs]
