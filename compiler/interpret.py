"""A NumPy reference interpreter of the IR: the oracle for generated kernels.

Contract: `interpret(fn, *arrays)` evaluates `fn` equation by equation with
each op's NumPy reference (`Op.ref`), `custom_vjp` calls by their `fwd`
body, `loop`s by running their body once per trip (a step of 0 is an
`ArgumentError`), and returns the outputs as arrays of the IR's dtypes and
shapes.  It shares nothing with codegen beyond the op table, so agreement
between the two is evidence that fusion and codegen are right.
"""
from __future__ import annotations

import numpy as np

from gradlang.compiler.ir import NUMPY_DTYPES, Eqn, Function, Lit, Var
from gradlang.compiler.ops import OPS, loop_groups
from gradlang.compiler.shapes import Sym, evaluate
from gradlang.runtime.common import nonzero_divisor, trip_count, where_of


def _concrete(value, binding: dict[str, int]):
    if isinstance(value, tuple):
        return tuple(_concrete(v, binding) for v in value)
    if isinstance(value, Sym):
        return evaluate(value, binding)
    return value


def interpret(fn: Function, *arrays) -> tuple[np.ndarray, ...]:
    return _run(fn, arrays, {})


def _run(fn: Function, arrays, outer: dict[str, int]) -> tuple[np.ndarray, ...]:
    """`fn` on `arrays`; `outer` binds the sizes of enclosing functions."""
    env: dict[Var, np.ndarray] = {v: np.asarray(a) for v, a in zip(fn.params, arrays, strict=True)}
    binding = dict(outer)
    binding.update({d.factors[0]: size for v in fn.params
                    for d, size in zip(v.type.shape, env[v].shape) if isinstance(d, Sym)})

    def read(a):
        if isinstance(a, Lit):
            return np.asarray(a.value, NUMPY_DTYPES[a.type.dtype])
        return env[a]

    with np.errstate(all="ignore"):
        for eqn in fn.eqns:
            inputs = [read(a) for a in eqn.inputs]
            if eqn.op == "loop":
                outs = _loop(eqn, inputs, binding)
            else:
                params = {k: v if isinstance(v, Function) else _concrete(v, binding)
                          for k, v in eqn.params}
                if eqn.op == "dim":
                    outs = (params["value"],)
                    if params.get("nonzero"):
                        nonzero_divisor(params["value"], where_of("", eqn.span))
                elif eqn.op == "custom_vjp":
                    outs = _run(params["fwd"], inputs, binding)[:params["n_out"]]
                elif OPS[eqn.op].kind == "check":  # (raising the drivers' errors)
                    where = where_of(params.get("what", ""), eqn.span)
                    outs = (OPS[eqn.op].ref(*inputs, **params, where=where),)
                else:
                    outs = (OPS[eqn.op].ref(*inputs, **params),)
            for var, value in zip(eqn.outputs, outs):
                dtype = NUMPY_DTYPES[var.type.dtype]
                env[var] = np.broadcast_to(np.asarray(value).astype(dtype, copy=False),
                                           _concrete(var.type.shape, binding))
    return tuple(np.array(read(a)) for a in fn.outputs)


def _loop(eqn: Eqn, inputs: list[np.ndarray], binding: dict[str, int]) -> list[np.ndarray]:
    """Runs a `loop`, binding its trip-count symbol in `binding`."""
    p = eqn.p
    body, n_carry = p["body"], p["n_carry"]
    start, stop, step = (int(x) for x in inputs[:3])
    trips = trip_count(start, stop, step, where_of("", eqn.span))
    if isinstance(p["trip"], Sym):
        binding[p["trip"].factors[0]] = trips
    _, carry, invariants, xs = loop_groups(inputs, p)
    ys: list[list] = [[None] * trips for _ in body.outputs[n_carry:]]
    order = range(trips - 1, -1, -1) if p["reverse"] else range(trips)
    for t in order:
        index = np.asarray(start + t * step, np.int64)
        results = _run(body, [index, *carry, *invariants, *(x[t] for x in xs)], binding)
        carry = list(results[:n_carry])
        for stack, y in zip(ys, results[n_carry:]):
            stack[t] = y
    stacked = [np.stack(stack) if trips else
               np.empty((0,) + _concrete(y.type.shape, binding), NUMPY_DTYPES[y.type.dtype])
               for stack, y in zip(ys, body.outputs[n_carry:])]
    return carry + stacked
