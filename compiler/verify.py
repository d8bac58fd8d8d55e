"""IR verifier, run between stages in tests and when GRADC_VERIFY=1.

Contract: `verify(fn, stage)` raises `IRVerificationError` (naming the
stage and printing the IR around the bad equation) unless every variable
is defined once before use and every equation's output types are what the
op table's type rule gives for its inputs; a `loop`'s body is verified
too.
"""
from __future__ import annotations

from gradlang.compiler.ir import Function, Var, print_function
from gradlang.compiler.ops import OPS, output_types


class IRVerificationError(AssertionError):
    pass


def verify(fn: Function, stage: str) -> None:
    defined: set[Var] = set()
    for v in fn.params:
        if v in defined:
            _fail(fn, stage, f"parameter {v!r} repeated")
        defined.add(v)
    for index, eqn in enumerate(fn.eqns):
        for a in eqn.inputs:
            if isinstance(a, Var) and a not in defined:
                _fail(fn, stage, f"equation {index} ({eqn.op}) reads undefined {a!r}")
        for o in eqn.outputs:
            if o in defined:
                _fail(fn, stage, f"equation {index} ({eqn.op}) redefines {o!r}")
            defined.add(o)
        if eqn.op not in OPS:
            _fail(fn, stage, f"equation {index}: unknown op {eqn.op!r}")
        expected = output_types(eqn.op, [a.type for a in eqn.inputs], eqn.params, eqn.span)
        if eqn.op == "loop":
            verify(eqn.p["body"], f"{stage}, body of equation {index}")
        if list(expected) != [o.type for o in eqn.outputs]:
            _fail(fn, stage, f"equation {index} ({eqn.op}) has output types "
                  f"{[str(o.type) for o in eqn.outputs]}, rule gives "
                  f"{[str(t) for t in expected]}")
    for a in fn.outputs:
        if isinstance(a, Var) and a not in defined:
            _fail(fn, stage, f"output {a!r} is undefined")


def _fail(fn: Function, stage: str, message: str) -> None:
    raise IRVerificationError(f"IR verification failed after stage {stage!r}: {message}\n"
                              + print_function(fn))
