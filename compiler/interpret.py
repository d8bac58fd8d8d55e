"""A NumPy reference interpreter of the IR: the oracle for generated kernels.

Contract: `interpret(fn, *arrays)` evaluates `fn` equation by equation with
each op's NumPy reference (`Op.ref`), `custom_vjp` calls by their `fwd`
body, and returns the outputs as arrays of the IR's dtypes and shapes.  It
shares nothing with codegen beyond the op table, so agreement between the
two is evidence that fusion and codegen are right.
"""
from __future__ import annotations

import numpy as np

from gradlang.compiler.ir import NUMPY_DTYPES, Function, Lit, Var
from gradlang.compiler.ops import OPS
from gradlang.compiler.shapes import Sym, evaluate


def _concrete(value, binding: dict[str, int]):
    if isinstance(value, tuple):
        return tuple(_concrete(v, binding) for v in value)
    if isinstance(value, Sym):
        return evaluate(value, binding)
    return value


def interpret(fn: Function, *arrays) -> tuple[np.ndarray, ...]:
    env: dict[Var, np.ndarray] = {v: np.asarray(a) for v, a in zip(fn.params, arrays, strict=True)}
    binding = {d.factors[0]: size for v in fn.params
               for d, size in zip(v.type.shape, env[v].shape) if isinstance(d, Sym)}

    def read(a):
        if isinstance(a, Lit):
            return np.asarray(a.value, NUMPY_DTYPES[a.type.dtype])
        return env[a]

    with np.errstate(all="ignore"):
        for eqn in fn.eqns:
            inputs = [read(a) for a in eqn.inputs]
            params = {k: v if isinstance(v, Function) else _concrete(v, binding)
                      for k, v in eqn.params}
            if eqn.op == "dim":
                outs = (params["value"],)
            elif eqn.op == "custom_vjp":
                outs = interpret(params["fwd"], *inputs)[:params["n_out"]]
            else:
                ref = OPS[eqn.op].ref
                if eqn.op == "full":
                    outs = (ref(**params),)
                else:
                    outs = (ref(*inputs, **params),)
            for var, value in zip(eqn.outputs, outs):
                dtype = NUMPY_DTYPES[var.type.dtype]
                env[var] = np.broadcast_to(np.asarray(value).astype(dtype, copy=False),
                                           _concrete(var.type.shape, binding))
    return tuple(np.array(read(a)) for a in fn.outputs)
