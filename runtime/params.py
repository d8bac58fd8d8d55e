"""Module-level `param` values, set from Python.

Contract: a `ParamStore` is a mapping from declared param names to arrays.
Setting a value converts it to the declared dtype and checks its rank and
fixed dimensions (raising `ArgumentError`, at the param's declaration
where the store was given its place); setting an undeclared name is an
error; reading an unset param through `require` is an `ArgumentError`
naming it and saying how to set it.
"""
from __future__ import annotations

import gc
import sys
import types
from collections.abc import MutableMapping
from typing import Iterator, Optional, Sequence

import numpy as np

from gradlang.runtime.args import (ParamSpec, cast, check_shape, convert, foreign_array,
                                  is_foreign_array, plain)
from gradlang.runtime.errors import ArgumentError, GradError, Span, shown
from gradlang.runtime.recording import TapeError, followed_by_a_tape


class ParamError(ArgumentError, KeyError):
    """An undeclared or unset param (a KeyError too, as mappings raise)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return ArgumentError.__str__(self)


class ParamStore(MutableMapping):
    def __init__(self, specs: Sequence[ParamSpec], module_name: str = "module",
                 places: Optional[dict[str, tuple[Span, Optional[str]]]] = None):
        """`places`: each param's declaration and the text of its file, at
        which a value refused by `m.params[name] = value` is reported (a
        gradc-compiled module has no source: its errors name the param)."""
        self._specs = {s.name: s for s in specs}
        self._values: dict[str, np.ndarray] = {}
        self._module = module_name
        self._places = places or {}

    def spec(self, name: str) -> ParamSpec:
        return self._specs[name]

    def declares(self, name: str) -> bool:
        return name in self._specs

    def _spec(self, name: str) -> ParamSpec:
        # (a name that is no text is no param's, and is not looked up: a
        # tuple nested 10**6 deep overflowed C's stack as it was hashed)
        if not isinstance(name, str) or name not in self._specs:
            known = ", ".join(self._specs) or "none"
            raise ParamError(f"{self._module} declares no param {shown(name)} (params: {known})")
        return self._specs[name]

    def __setitem__(self, name: str, value) -> None:
        self._values[name] = self._placed(name, value)

    def update(self, other=(), /, **kwargs) -> None:
        """Set several params: every value is checked first, so one refused
        (or a name the module does not declare) sets none of them, where
        MutableMapping's update had set those before it, and a training
        step's `update(new)` left the model half-updated."""
        values = {name: self._placed(name, value)
                  for name, value in dict(other, **kwargs).items()}
        self._values.update(values)

    def _placed(self, name: str, value) -> np.ndarray:
        """`validate`, its error at the param's declaration where known."""
        self._spec(name)  # (first: a name that is no param's is not looked up, `_spec`)
        span, source = self._places.get(name, (None, None))
        try:
            return self.validate(name, value, span)
        except GradError as err:
            raise err.with_source(source) if source is not None else err

    def validate(self, name: str, value, span: Optional[Span] = None) -> np.ndarray:
        """`value` as a value of param `name` (converted to its declared
        dtype, a copy), or `ArgumentError` (at `span`: a function given it
        for a call); stores nothing."""
        spec = self._spec(name)
        where = f"param {name!r}"
        if value is None:  # (binding's message spoke of `const` parameters, which no param is)
            raise ArgumentError(f"{where} cannot be set to None: a param holds an array; "
                                f"to unset it, del module.params[{name!r}]", span)
        if followed_by_a_tape(value):
            # (the store keeps a copy, a constant to the tape: a gradient
            # through the param silently missed where its value came from)
            raise TapeError(f"{where} cannot be set to an array a recording dsl.Tape follows "
                            "(watched, a recorded call's result, or computed from one): the "
                            "param would hold a copy, which the tape cannot follow; pass the "
                            "value as an argument, or np.array(...) of it to make it a "
                            "constant on purpose", span)
        if is_foreign_array(value):
            # (a JAX array, a CPU torch tensor: converted to the declared dtype as
            # a NumPy array is; binding it as an argument refused an f32 one for f64)
            value = foreign_array(where, value, span)
        array = plain(where, value, span) if isinstance(value, (np.ndarray, np.generic)) \
            else value
        if isinstance(array, np.ndarray) and spec.dtype is not None and \
                array.dtype.kind in "biuf":
            # a param takes its declared dtype (values it cannot hold refused), as
            # Python numbers do; the store keeps a copy of its own (cast returns
            # an array of that dtype as it is), so the caller may change theirs
            converted = cast(where, array, spec.dtype, span)
            array = converted.copy() if converted is array else converted
        array = convert(self._module, ParamSpec(name, spec.dtype, spec.dims, False, False),
                        array, span, where)
        check_shape(self._module, spec, array, {}, span, where)
        return array

    def __getitem__(self, name: str) -> np.ndarray:
        self._spec(name)
        if name not in self._values:
            raise ParamError(f"param {name!r} is not set; set it with "
                             f"module.params[{name!r}] = ...")
        return self._values[name]

    def __delitem__(self, name: str) -> None:
        # (a bare KeyError: 'z' said nothing of the module's params, where
        # setting 'z' names them; both are KeyErrors, as mappings raise)
        self._spec(name)
        if name not in self._values:
            raise ParamError(f"param {name!r} is not set, so it cannot be deleted")
        del self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def require(self, name: str, reader: str, span: Optional[Span] = None) -> np.ndarray:
        """The value of `name`, which `reader` (defined at `span`) reads."""
        if name not in self._values:
            raise ParamError(f"{reader}() reads param {name!r}, which is not set; set it "
                             f"with module.params[{name!r}] = ...", span)
        return self._values[name]

    def __repr__(self) -> str:
        return f"ParamStore({dict(self._values)!r})"


class ParamsModule(types.ModuleType):
    """A module of `.grad` functions and their `params` (an import hook's,
    a `gradc compile`d one): `m.params = {...}` or `m.w = ...` for a param
    `w` would bind a name the functions never read (they read the store
    `m.params` is), and the calls would run on the old values: both are an
    AttributeError saying how, as on `dsl.load`'s module."""

    def __setattr__(self, name: str, value) -> None:
        refuse_rebinding(vars(self).get("params"), name, self.__name__)
        super().__setattr__(name, value)


def refuse_rebinding(params: object, name: str, module: str) -> None:
    """An AttributeError saying how to set them, where setting attribute
    `name` of the module `module` (its label) whose store is `params` (a
    `ParamStore`; anything else guards nothing) would bind a name its
    functions never read: `params` itself, or a param it declares."""
    declares = getattr(params, "declares", None)
    if declares is None:
        return
    if name == "params":
        raise AttributeError(f"the params of module {module!r} cannot be replaced: its "
                             "functions read them where they are; set them with "
                             ".params[name] = value, or .params.update({...})")
    if declares(name):
        raise AttributeError(f"{name!r} is a param of module {module!r}: set it with "
                             f".params[{name!r}] = value")


def reads_as_param(name: str, specs: Sequence[ParamSpec], param_names) -> bool:
    """Whether the value a call binds to `name` is a module param's, the
    function reading `param_names`, not an argument's (of `specs`): the
    caller passed no argument of that name, and errors name it a param."""
    return name in param_names and all(s.name != name for s in specs)


def guard_params(namespace: dict) -> None:
    """Make the module whose globals are `namespace` a `ParamsModule`:
    the one `sys.modules` holds under its name, or, for a module executed
    outside the import system (`module_from_spec` and `exec_module` with
    no `sys.modules` entry, as a file is often loaded by its path, or
    `exec` into a `types.ModuleType`), the module object holding
    `namespace`. A bare dict of globals (`exec` into a dict, what
    `runpy.run_path` returns) has no attributes to guard."""
    module = _module_of(namespace)
    if module is not None and type(module) is types.ModuleType:
        module.__class__ = ParamsModule


def _module_of(namespace: dict) -> Optional[types.ModuleType]:
    """The module whose `__dict__` is `namespace`, or None."""
    module = sys.modules.get(namespace.get("__name__", ""))
    if module is not None and vars(module) is namespace:
        return module
    # Not registered: `m.params = {...}` on it bound a name no function
    # reads, and the calls ran on the old values. A module's dict does not
    # point back at it: the caller executing it holds it (exec_module's
    # `module`), a few frames up; else ask the collector (tens of ms).
    def holds(value) -> bool:
        # (by its type, not isinstance, which asks a value for its __class__:
        # a caller's local proxy whose __class__ raises, as werkzeug's
        # LocalProxy does outside a request, failed the import)
        return issubclass(type(value), types.ModuleType) and vars(value) is namespace
    frame = sys._getframe(1)
    for _ in range(16):
        if frame is None:
            break
        if frame.f_locals is not namespace:  # (a module's frame: its globals)
            found = next((v for v in frame.f_locals.values() if holds(v)), None)
            if found is not None:
                return found
        frame = frame.f_back
    return next((r for r in gc.get_referrers(namespace) if holds(r)), None)
