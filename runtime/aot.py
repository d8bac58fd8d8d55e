"""The runtime side of an ahead-of-time compiled module (`gradc compile`).

Contract: a compiled module holds a literal `SPEC` (its target, each
function's
parameter specs, the params it reads, and for each signature and kind —
call, grad, value_and_grad — the name of a kernel file beside it and the
source of a plain-Python driver) and builds its functions with
`AotModule`.  Nothing here imports the parser or the compiler: a call binds
and validates its arguments (`runtime.args`), picks the program by dtype
and rank, and runs it; kernels load from files beside the module, whose
machine code Numba caches there, so a process that imports a module
compiled with `--sig` neither parses nor compiles.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from gradlang.runtime import target as targets
from gradlang.runtime.args import ParamSpec, bind, call_key, static_names
from gradlang.runtime.errors import ArgumentError
from gradlang.runtime.loader import load_kernel_file, make_driver
from gradlang.runtime.params import ParamStore

KINDS = ("call", "grad", "value_and_grad")


class AotModule:
    def __init__(self, name: str, file: str, spec: dict):
        self.name = name
        self.directory = os.path.dirname(os.path.abspath(file))
        self.target = targets.get(spec.get("target", targets.DEFAULT))
        self.helpers = self.target.helpers
        self.params = ParamStore([ParamSpec(*p) for p in spec["params"]], name)
        self.functions = {fname: AotFunction(self, fname, fspec)
                          for fname, fspec in spec["functions"].items()}
        self._drivers: dict[tuple, Any] = {}

    def export(self, namespace: dict) -> None:
        """Make `namespace` (a compiled module's globals) hold `params`,
        `functions`, and each function under its own name, unless the
        module already uses that name (SPEC, a dunder, ...), so no
        function name, a keyword included, can break the module."""
        namespace["params"] = self.params
        namespace["functions"] = dict(self.functions)
        for fname, function in self.functions.items():
            namespace.setdefault(fname, function)

    def driver(self, program: dict):
        key = (program["kernels"], program["driver"])
        if key not in self._drivers:
            path = os.path.join(self.directory, program["kernels"] + ".py")
            kernels = load_kernel_file(path)
            self._drivers[key] = make_driver(program["driver"], kernels, self.helpers)
        return self._drivers[key]


class AotFunction:
    """A compiled function: call it, or its `.grad` / `.value_and_grad`
    (the gradient of the sum of its outputs w.r.t. every float argument)."""

    def __init__(self, module: AotModule, name: str, spec: dict):
        self.module = module
        self.name = self.__name__ = name
        self.specs = tuple(ParamSpec(*p) for p in spec["params"])
        self.reads = tuple(spec["reads"])
        self.programs = {(kind, tuple(tuple(a) for a in sig)): program
                         for kind, sig, program in spec["programs"]}
        self.wrt = {tuple(tuple(a) for a in sig): tuple(names)
                    for sig, names in spec["wrt"]}

    def _bind(self, args, kwargs) -> dict[str, np.ndarray]:
        bound = bind(self.name, self.specs, args, kwargs)
        for w in self.reads:
            bound[w] = self.module.params.require(w, self.name)
        return bound

    def _run(self, kind: str, args, kwargs):
        bound = self._bind(args, kwargs)
        sig = call_key(bound, static_names(self.specs, bound))
        program = self.programs.get((kind, sig))
        if program is None and kind != "call" and (("call", sig) in self.programs):
            raise ArgumentError(f"{self.name}() has no float arguments to differentiate")
        if program is None:
            have = sorted({self._describe(s) for (k, s) in self.programs if k == kind})
            raise ArgumentError(f"{self.name}() was compiled for {', '.join(have)}; "
                                f"this call is {self._describe(sig)}; add it with "
                                "gradc compile --sig")
        accept = self.module.target.accept
        arrays = [accept(a, f"argument {n!r} of {self.name}()") for n, a in bound.items()]
        outs = self.module.driver(program)(*arrays)
        return outs, sig

    def _describe(self, sig: Sequence) -> str:
        names = {"<f8": "f64", "<f4": "f32", "<i8": "i64", "<i4": "i32", "|b1": "bool"}
        parts = [repr(rest[0]) if rest else
                 names.get(dt, dt) + ("[" + ", ".join(":" * ndim) + "]" if ndim else "")
                 for _, dt, ndim, *rest in sig]
        return f"{self.name}({', '.join(parts)})"

    def __call__(self, *args, **kwargs):
        outs, _ = self._run("call", args, kwargs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def grad(self, *args, **kwargs):
        outs, sig = self._run("grad", args, kwargs)
        return outs[0] if len(self.wrt[sig]) == 1 else tuple(outs)

    def value_and_grad(self, *args, **kwargs):
        outs, sig = self._run("value_and_grad", args, kwargs)
        n = len(self.wrt[sig])
        values, grads = outs[:len(outs) - n], outs[len(outs) - n:]
        value = values[0] if len(values) == 1 else tuple(values)
        return value, (grads[0] if n == 1 else tuple(grads))

    def __repr__(self) -> str:
        return f"<compiled .grad function {self.name}>"
