"""The Python API: load modules, transform functions.

Contract: `load(path)` and `loads(text)` parse and check a `.grad` module
now (raising `GradError` on any problem) and compile nothing; each function
becomes a module attribute that compiles on first call per signature.
`grad`, `value_and_grad` and `vjp` take any compiled function, including
the results of other transforms, and the functions of a `gradc compile`
module (`runtime.aot.AotFunction`), which give the first-order gradients
and pullbacks they were compiled with.  Forward mode (`jvp`, `jacfwd`,
`jacrev`, `hessian`: `dsl/forward.py`) takes loaded functions and the
results of transforms.  A `Module` pickles as the sources of its files
(`modules.import_graph`: no file is read again where it is unpickled),
its target, where its results go and its param values, and is checked
again where it is unpickled; its functions, the transforms of them and
the bridges' wrappers pickle as the module and the transforms on top
(`Compiled.recipe`), and compile there on first call.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from gradlang.runtime.collection import imports_unwalked
from gradlang.runtime.params import refuse_rebinding

# Numba and the compiler, imported without the collector walking them
# (runtime/collection.py): 25 ms of a warm process's CPU.
with imports_unwalked():
    from dsl.function import (Compiled, GradFn, GradFunction, HvpFunction, Wrt, flag_option,
                              grad_function, require_function, resolve_wrt)
    from dsl.forward import Jacobian
    from dsl.forward import hessian as _hessian
    from dsl.forward import jacfwd as _jacfwd
    from dsl.forward import jacrev as _jacrev
    from dsl.forward import jvp as _jvp
    from dsl.function import vjp as _vjp
    from dsl.mapped import InAxes, MappedJacobian, OutAxes, VmapFunction
    from dsl.mapped import vmap as _vmap
    from gradlang.compiler import ast
    from gradlang.compiler.modules import ImportGraph, import_graph, read_source
    from gradlang.compiler.namespace import Namespace
    from gradlang.compiler.pipeline import front_end
    from gradlang.runtime import target as targets
    from gradlang.runtime.aot import AotFunction, AotGradient
    from gradlang.runtime.args import ParamSpec
    from gradlang.runtime.boundary import user_facing
    from gradlang.runtime.errors import ArgumentError, Span, kind_of, shown
    from gradlang.runtime.params import ParamStore
    from gradlang.runtime.target import Target


# wrt's default, the first parameter: a 0 that `_wrt` tells from one the
# caller wrote (`grad(f, 0, argnums=1)` gives both)
FIRST = type("FirstParameter", (int,), {})(0)


class Module:
    """A loaded `.grad` file: its functions (and those it imports by name)
    as attributes, and `params`, the values of its `param` declarations."""

    def __init__(self, module: ast.Module, namespace: Namespace,
                 target: "Target | str" = targets.DEFAULT, host_results: bool = False):
        target = targets.get(target)
        self.__file__ = module.file
        self.target = target
        self._ast, self._namespace, self._host_results = module, namespace, host_results
        specs = [ParamSpec(d.name, d.type.dtype, d.type.dims, False, False)
                 for d in namespace.params.values()]
        places = {d.name: (d.span, module.source if d.span.file == module.file else None)
                  for d in namespace.params.values()}
        self.params = ParamStore(specs, module.file, places)
        self._functions = {name: GradFn(self, namespace, fdef, host_results)
                           for name, (fdef, _) in namespace.functions.items()}
        # Instance attributes, found with no failed lookup before
        # `__getattr__` (which cost 0.5-1 us of each `m.f(x)`); a name the
        # module already has (`params`, `target`, `functions`) stays its own.
        self.__dict__.update((name, f) for name, f in self._functions.items()
                             if name not in self.__dict__ and not hasattr(Module, name))

    def __reduce__(self):
        # its state, as plain values: the sources (not paths: the files may
        # be absent where it is unpickled), and its params, as a torch
        # module's weights are
        return (rebuilt_module, (import_graph(self._namespace), self.target.name,
                                 self._host_results, dict(self.params)))

    def __getattr__(self, name: str):
        functions = self.__dict__.get("_functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"module {self.__dict__.get('__file__')!r} has no function "
                             f"{name!r}; it defines: {', '.join(functions) or 'nothing'}")

    def __setattr__(self, name: str, value) -> None:
        # `m.w = ...` for a param `w`, or `m.params = {...}`, would leave
        # the params as they were, the functions reading the store: say how
        # to set them instead.
        refuse_rebinding(self.__dict__.get("params"), name, self.__dict__.get("__file__"))
        if name in self.__dict__.get("_functions", {}):
            raise AttributeError(f"{name!r} is a function of module {self.__file__!r}, "
                                 "which cannot be replaced")
        object.__setattr__(self, name, value)

    def __dir__(self):
        return list(self._functions) + ["functions", "params"]

    @property
    def functions(self) -> dict[str, GradFn]:
        return dict(self._functions)

    def __repr__(self) -> str:
        return f"<.grad module {self.__file__} ({', '.join(self._functions)})>"


@user_facing
def rebuilt_module(graph: ImportGraph, target: str, host_results: bool,
                   params: dict[str, np.ndarray]) -> Module:
    """A pickled `Module` again: checked from its sources, its params set."""
    file, source, _ = graph[0]
    module = Module(*front_end(source, file, graph), target, host_results)
    for name, value in params.items():
        module.params[name] = value
    return module


@user_facing
def loads(source: str, file: "str | os.PathLike" = "<string>",
          target: "Target | str" = targets.DEFAULT, host_results: bool = False) -> Module:
    """Parse and check source text.  `target` names where kernels run
    (`gradlang.runtime.target.TARGETS`); on a device target results stay
    on the device unless host_results=True."""
    # (ArgumentErrors, TypeErrors too: a plain TypeError left with the
    # frames of this package above the caller's)
    if not isinstance(source, str):
        raise ArgumentError(f"loads() takes source text, got {kind_of(source)}")
    if not isinstance(file, (str, bytes, os.PathLike)):
        raise ArgumentError(f"loads() takes a file name (a str or a path), got "
                            f"{kind_of(file)}")
    flag_option(host_results, "loads", "host_results")
    # (as text: a Path failed when called, sorted among the str names of
    # the modules it imports, and bytes where an import looked beside it)
    # (an empty name would begin each message with ":2:14: error")
    file = os.fsdecode(file) or "<string>"
    module, namespace = front_end(source, file)
    return Module(module, namespace, target, host_results)


@user_facing
def load(path: Union[str, bytes, os.PathLike], target: "Target | str" = targets.DEFAULT,
         host_results: bool = False) -> Module:
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise ArgumentError(f"load() takes a path to a .grad file, got {kind_of(path)}")
    flag_option(host_results, "load", "host_results")
    if not os.fsdecode(path):  # (Path('') is '.': "cannot read .: it is a directory")
        raise ArgumentError("load() takes a path to a .grad file, got an empty path")
    path = Path(os.fsdecode(path))
    source = read_source(path, Span(str(path), 1, 1))
    return loads(source, str(path), target, host_results)


Function = Union[Compiled, AotFunction]


@user_facing
def grad(f: Function, wrt: Wrt = FIRST, *, has_aux: bool = False, argnums: Optional[Wrt] = None
         ) -> "GradFunction | AotGradient":
    """The gradient of the sum of f's outputs w.r.t. parameter(s) `wrt`
    (`argnums`, as JAX and torch.func name it, is the same); with
    `has_aux`, of its first output's, returned as (gradient, the other
    outputs), as JAX's."""
    f = require_function(f, "grad")
    return grad_function(f, _wrt(f, wrt, argnums), False, _flag(f, has_aux, "has_aux"))


@user_facing
def value_and_grad(f: Function, wrt: Wrt = FIRST, *, has_aux: bool = False,
                   argnums: Optional[Wrt] = None) -> "GradFunction | AotGradient":
    """(f's value, the gradient of the sum of its outputs); with `has_aux`,
    ((first output, the others), the gradient of the first's sum)."""
    f = require_function(f, "value_and_grad")
    return grad_function(f, _wrt(f, wrt, argnums), True, _flag(f, has_aux, "has_aux"))


def _flag(f: Function, value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentError(f"{name} is True or False, got {shown(value)}", f.span)
    return bool(value)


def _wrt(f: Function, wrt: Wrt, argnums: Optional[Wrt]) -> Wrt:
    """`wrt`, or `argnums` (JAX's and torch.func's name for it) if given,
    checked here so that an error names the option the caller wrote."""
    if argnums is None:
        return 0 if wrt is FIRST else wrt  # (a plain 0: the key of f's derived functions)
    if wrt is not FIRST:
        raise ArgumentError(f"give wrt or argnums (its other name), not both: wrt={shown(wrt)}, "
                            f"argnums={shown(argnums)}", f.span)
    resolve_wrt(f, argnums, option="argnums")
    return argnums


@user_facing
def hvp(f: Compiled, wrt: Union[int, str] = FIRST, *, argnums: Union[int, str, None] = None
        ) -> HvpFunction:
    """hvp(f)(args..., v): the Hessian of sum(f) w.r.t. `wrt`, times v (v
    converted to wrt's dtype, where jvp refuses a tangent of another one)."""
    f = require_function(f, "hvp", aot_ok=False)
    return HvpFunction(f, _wrt(f, wrt, argnums))


@user_facing
def vjp(f: Function, /, *args, **kwargs):
    """(outputs, pullback): pullback(*cotangents) gives one cotangent per
    argument passed (None for const and non-float ones)."""
    f = require_function(f, "vjp")
    if isinstance(f, AotFunction):
        return f.vjp(*args, **kwargs)
    return _vjp(f, *args, **kwargs)


@user_facing
def jvp(f: Compiled, primals, tangents):
    """(outputs, output tangents), as `jax.jvp`: tangents one per primal
    (None: none) or a dict by argument or param name (`dsl/forward.py`)."""
    return _jvp(require_function(f, "jvp", aot_ok=False), primals, tangents)


@user_facing
def vmap(f: "Compiled | Jacobian | MappedJacobian", in_axes: InAxes = 0,
         out_axes: OutAxes = 0) -> "VmapFunction | MappedJacobian":
    """f over the axis `in_axes` gives of each positional argument it
    marks (an integer, negative from the end, or None: not mapped; one
    per argument or one for all), the examples along axis `out_axes` of
    each result (one for all, or one per result), as `jax.vmap`: one
    program for every example where f stacks (`dsl/mapped.py`).  f may
    also be a Jacobian (`jacfwd`, `jacrev`, `hessian`): each example's."""
    jacobian = isinstance(f, (Jacobian, MappedJacobian))
    return _vmap(f if jacobian else require_function(f, "vmap", aot_ok=False), in_axes,
                 out_axes)


@user_facing
def jacfwd(f: Compiled, wrt: Wrt = FIRST, *, argnums: Optional[Wrt] = None) -> Jacobian:
    """The Jacobian of f's outputs w.r.t. `wrt` (out.shape + arg.shape),
    in forward mode: one jvp per element of the argument."""
    f = require_function(f, "jacfwd", aot_ok=False)
    return _jacfwd(f, _wrt(f, wrt, argnums))


@user_facing
def jacrev(f: Compiled, wrt: Wrt = FIRST, *, argnums: Optional[Wrt] = None) -> Jacobian:
    """jacfwd's Jacobian in reverse mode: one pullback per output element."""
    f = require_function(f, "jacrev", aot_ok=False)
    return _jacrev(f, _wrt(f, wrt, argnums))


@user_facing
def hessian(f: Compiled, wrt: Wrt = FIRST, *, argnums: Optional[Wrt] = None) -> Jacobian:
    """The Hessian of the sum of f's outputs w.r.t. `wrt` (arg.shape +
    arg.shape), forward over reverse."""
    f = require_function(f, "hessian", aot_ok=False)
    wrt = _wrt(f, wrt, argnums)
    return _hessian(grad_function(f, wrt, False), wrt)
