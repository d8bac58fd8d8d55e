"""The typed SSA intermediate representation.

Contract: everything here is immutable.  A `Function` is a list of `Eqn`s in
topological order; each `Eqn` applies one primitive (named in
`compiler.ops.OPS`) to input atoms (`Var`s defined earlier or `Lit`s) and
defines fresh output `Var`s.  Shapes are concrete: a function is lowered
once per call signature, and the kernels it turns into are shape-generic, so
they are reused across signatures.  A pass takes a Function and returns a new
one (`compiler.builder` holds the one mutable helper, used while
constructing a function); `print_function` is the one textual form (MLIR-flavoured, with
deterministic names).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Union

from gradlang.runtime.args import NUMPY
from gradlang.runtime.errors import Span

DTYPES = ("bool", "i32", "i64", "f32", "f64")
FLOATS = ("f32", "f64")
INTS = ("i32", "i64")
NUMPY_DTYPES = {name: dtype.type for name, dtype in NUMPY.items()}  # NumPy's scalar types
# their names in NumPy's namespace, for generated Python source
NUMPY_NAMES = {"bool": "bool_", "i32": "int32", "i64": "int64", "f32": "float32",
               "f64": "float64"}


@dataclass(frozen=True)
class TensorType:
    dtype: str
    shape: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS

    def __str__(self) -> str:
        if not self.shape:
            return self.dtype
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class StaticScalar(TensorType):
    """The type of an integer or bool `const` argument whose value the
    program is specialized on: lowering sees the value (usable as an axis,
    an index or a size); the argument itself goes unused."""

    value: Union[int, bool] = 0


_var_ids = itertools.count()


@dataclass(frozen=True, eq=False)
class Var:
    """An SSA value.  Identity is the object; `hint` is a source name used
    only to make printed IR readable."""

    type: TensorType
    hint: str = ""
    uid: int = field(default_factory=lambda: next(_var_ids))

    def __repr__(self) -> str:
        return f"Var({self.hint or '_'}#{self.uid}: {self.type})"


@dataclass(frozen=True, eq=False)
class WeakVar(Var):
    """A Var whose dtype is weak during lowering, as a Python number's is:
    `arange`'s and `one_hot`'s results, and what arithmetic with numbers,
    elementwise functions (`exp`), negation, indexing, layout ops, `where`
    between weak values and float reductions make of them.  Where it meets
    other arrays it takes their dtype as a literal does
    (`compiler.values.unify`), so `arange(n) * 0.5` beside f32 arrays is
    f32.  Passes see a plain Var."""


@dataclass(frozen=True)
class Lit:
    """A scalar constant of a concrete dtype."""

    value: Union[int, float, bool]
    type: TensorType

    def __repr__(self) -> str:
        return f"Lit({self.value!r}: {self.type})"


Atom = Union[Var, Lit]


@dataclass(frozen=True)
class Eqn:
    op: str
    inputs: tuple[Atom, ...]
    outputs: tuple[Var, ...]
    params: tuple[tuple[str, Any], ...] = ()
    span: Span | None = None

    @property
    def p(self) -> dict[str, Any]:
        return dict(self.params)

    @property
    def out(self) -> Var:
        (only,) = self.outputs
        return only


@dataclass(frozen=True)
class Function:
    name: str
    params: tuple[Var, ...]
    eqns: tuple[Eqn, ...]
    outputs: tuple[Atom, ...]

    @property
    def in_types(self) -> tuple[TensorType, ...]:
        return tuple(v.type for v in self.params)

    @property
    def out_types(self) -> tuple[TensorType, ...]:
        return tuple(a.type for a in self.outputs)


def vars_in(atoms: Iterable[Atom]) -> Iterator[Var]:
    return (a for a in atoms if isinstance(a, Var))


def use_counts(eqns: Iterable[Eqn]) -> dict[Var, int]:
    """How many inputs of `eqns` each value is (`x + x` reads x twice)."""
    counts: dict[Var, int] = {}
    for eqn in eqns:
        for v in vars_in(eqn.inputs):
            counts[v] = counts.get(v, 0) + 1
    return counts


def readers(eqns: Iterable[Eqn]) -> dict[Var, list[Eqn]]:
    """The equations that read each value, each once, in order."""
    found: dict[Var, list[Eqn]] = {}
    for eqn in eqns:
        for v in vars_in(dict.fromkeys(eqn.inputs)):
            found.setdefault(v, []).append(eqn)
    return found


# ------------------------------------------------------------------ printer


class Namer:
    """A printer of atoms: each variable is named once, in order of first
    printing (`%hintN` or `%N`); a literal is `value:dtype`.  It also
    labels the sub-functions printed: a function held in several places
    (a stage every call alike shares, `compiler.staging`) is printed in
    full once and referred to by its label after, which keeps the text
    linear in the program, not in the number of paths through it."""

    def __init__(self):
        self.names: dict[Var, str] = {}
        # id -> (the function, kept so that its id stays its own; its label)
        self.functions: dict[int, tuple["Function", str]] = {}
        self.labels: set[str] = set()

    def __call__(self, a: Atom) -> str:
        if isinstance(a, Lit):
            return f"{a.value!r}:{a.type.dtype}"
        if a not in self.names:
            self.names[a] = f"%{a.hint}{len(self.names)}" if a.hint else f"%{len(self.names)}"
        return self.names[a]

    def printed(self, fn: "Function") -> "str | None":
        """The label of fn if it was printed already, else None (and fn
        gets a label of its own: its name, numbered where another function
        printed has that name)."""
        known = self.functions.get(id(fn))
        if known is not None and known[0] is fn:
            return known[1]
        label = fn.name
        if label in self.labels:
            label = next(f"{fn.name}#{k}" for k in itertools.count(2)
                         if f"{fn.name}#{k}" not in self.labels)
        self.labels.add(label)
        self.functions[id(fn)] = (fn, label)
        return None


def signature_line(fn: Function, name: Callable[[Atom], str], label: str = "") -> str:
    params = ", ".join(f"{name(v)}: {v.type}" for v in fn.params)
    outs = ", ".join(str(t) for t in fn.out_types)
    return f"func @{label or fn.name}({params}) -> ({outs}) {{"


def print_function(fn: Function, name: "Namer | None" = None) -> str:
    """MLIR-flavoured text; names are numbered in order of definition (a
    sub-function's, such as a loop body's, continue its parent's)."""
    name = name or Namer()
    name.printed(fn)
    lines = [signature_line(fn, name, name.functions[id(fn)][1])]
    lines += print_eqns(fn.eqns, name, "  ")
    lines.append(f"  return {', '.join(name(a) for a in fn.outputs)}")
    lines.append("}")
    return "\n".join(lines)


def print_eqns(eqns: Iterable[Eqn], name: Namer, indent: str) -> list[str]:
    lines = []
    for eqn in eqns:
        outs = ", ".join(name(v) for v in eqn.outputs)
        ins = ", ".join(name(a) for a in eqn.inputs)
        attrs = {k: v for k, v in eqn.params if not isinstance(v, Function)}
        subs = {k: v for k, v in eqn.params if isinstance(v, Function)}
        attr_text = (" {" + ", ".join(f"{k} = {_fmt(v)}" for k, v in attrs.items()) + "}"
                     if attrs else "")
        types = ", ".join(str(v.type) for v in eqn.outputs)
        if eqn.outputs:
            lines.append(f"{indent}{outs} = {eqn.op} {ins}{attr_text} : {types}")
        else:  # (a check, run for the error it may raise)
            lines.append(f"{indent}{eqn.op} {ins}{attr_text}")
        for key, sub in subs.items():
            known = name.functions.get(id(sub))
            if known is not None and known[0] is sub:
                lines.append(f"{indent}  {key}: @{known[1]} (printed above)")
                continue
            lines.append(f"{indent}  {key}:")
            lines += ["  " + indent + l for l in print_function(sub, name).splitlines()]
    return lines


def _fmt(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    return repr(value)
