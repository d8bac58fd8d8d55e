"""A Jacobian as a function of its own, for the transforms to take:
`grad(jacfwd(f))`, `jvp(jacrev(f), ...)`, `jacfwd(jacrev(f))`,
`hessian(...)` of a Jacobian's sum, and so on to any order.

Contract: `jacobian_function(jacobian)` (for a `dsl.forward.Jacobian`
`jacfwd(f, wrt)`, `jacrev(f, wrt)` or `hessian(f, wrt)`) is a `Compiled`
whose call gives what the Jacobian's own call gives (the same shapes and
structure; its values to rounding), as one program that the transforms
differentiate: f's jvp along every `wrt` argument at once, on one-hot
tangents stacked (`Stacked`, the rows of the identity, one per element of
the `wrt` arguments), its stacked tangents laid out as `out.shape +
arg.shape` (an integer output's Jacobian is zero, in the argument's
dtype).  The one-hot tangents are hidden arguments that `bind` adds
(f's jvp's tangent names, its `hidden` ones): they carry no gradient, take
no tangent, and a pullback has no cotangent for them.
The program is lowered for concrete sizes (the identity has a row per
element), and holds every column at once: a Jacobian called directly runs
them in blocks (`dsl.forward`), which this form cannot.  A Jacobian taken
by a transform (`require_function`) becomes this (`Jacobian.as_function`).
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Optional

import numpy as np

from dsl.function import Derived, Stacked, bind_at_defaults, derived, jvp_function
from gradlang.compiler.builder import Builder, inline
from gradlang.compiler.ir import Function, TensorType
from gradlang.compiler.shapes import NeedsConcrete
from gradlang.runtime.common import require_host_room


def jacobian_function(jacobian: Any) -> "JacobianFunction":
    """The `JacobianFunction` of a Jacobian, one per (function, wrt, kind
    of result, mode: the name its errors give), so that its programs
    compile once (jacfwd's and jacrev's are one program)."""
    return derived(jacobian.f, ("jacobian", jacobian.wrt, jacobian.single, jacobian.mode,
                                jacobian.name),
                   lambda: JacobianFunction(jacobian))


class JacobianFunction(Derived):
    """The Jacobians of `jacobian` (of its f with respect to the arguments
    `wrt`, names), one per output and argument (`single`: wrt was one
    argument, not a tuple)."""

    def __init__(self, jacobian: Any):
        super().__init__(jacobian.f)
        self.jacobian = jacobian
        self.wrt, self.single, self.name = jacobian.wrt, jacobian.single, jacobian.name
        # each argument once: a jvp along `wrt=(0, 0)`'s x twice took one of
        # its two tangents (the other's Jacobian was zero); repeats share its columns
        self.unique = tuple(dict.fromkeys(self.wrt))
        self.jvp = jvp_function(self.inner, self.unique)
        self.columns = Stacked(self.jvp, self.jvp.tangent_names, "tangents")
        self.param_specs = self.jvp.param_specs  # inner's, then the one-hot tangents
        self.hidden = self.inner.hidden | frozenset(self.jvp.tangent_names)

    def recipe(self) -> tuple:
        return jacobian_function, (self.jacobian,)

    def call_signature(self, out: bool = True) -> Optional[inspect.Signature]:
        return self.inner.call_signature(out)  # (it binds as inner binds)

    def bind(self, args, kwargs, params: Optional[dict[str, Any]] = None
             ) -> dict[str, np.ndarray]:
        bound = bind_at_defaults(self.inner, args, kwargs, params, self.jacobian.wrt)
        self.jacobian.require_wrt(bound)  # (refused as the Jacobian's own call refuses them)
        sizes = [math.prod(bound[name].shape) for name in self.unique]
        rows, start = sum(sizes), 0
        for name, tangent, size in zip(self.unique, self.jvp.tangent_names, sizes):
            x = bound[name]
            # (refused by name before NumPy is asked for terabytes)
            require_host_room((rows, size), x.dtype, f"the one-hot tangents along {name!r}",
                              self.span)
            basis = np.zeros((rows, size), x.dtype)
            basis[start + np.arange(size), np.arange(size)] = 1
            bound[tangent] = basis.reshape((rows, *x.shape))
            start += size
        return bound

    def lower(self, types: dict[str, TensorType]) -> Function:
        if any(not isinstance(d, int) for t in types.values() for d in t.shape):
            raise NeedsConcrete("a Jacobian's one-hot tangents have a row per element")
        stacked = self.columns.lower(types)
        b = Builder()
        outs = inline(b, stacked, stacked.params)
        n = len(outs) // 2
        starts, start = {}, 0  # each argument's first row among the columns
        for name in self.unique:
            starts[name], start = start, start + math.prod(types[name].shape)
        jacobians = []
        for value, columns in zip(outs[:n], outs[n:]):
            out_shape = columns.type.shape[1:]
            for name in self.wrt:
                shape = types[name].shape
                size, rank, start = math.prod(shape), len(shape), starts[name]
                if not value.type.is_float:  # zero, in the argument's dtype
                    jacobians.append(b.bind("broadcast_to", b.lit(0, types[name].dtype),
                                            shape=out_shape + shape))
                    continue
                block = b.bind("slice", columns, starts=(start,) + (0,) * len(out_shape),
                               stops=(start + size,) + out_shape,
                               steps=(1,) * (1 + len(out_shape)))
                block = b.bind("reshape", block, shape=shape + out_shape)
                jacobians.append(b.bind("transpose", block, perm=tuple(
                    range(rank, rank + len(out_shape))) + tuple(range(rank))))
        return b.function(self.name, stacked.params, jacobians)

    def identity(self) -> tuple:
        return ("jacobian", self.inner.identity(), self.wrt)

    def format(self, outs):
        k = len(self.wrt)
        per_output = [outs[i:i + k] for i in range(0, len(outs), k)]
        return self.inner.format([js[0] if self.single else tuple(js) for js in per_output])
