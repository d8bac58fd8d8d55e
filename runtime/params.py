"""Module-level `param` values, set from Python.

Contract: a `ParamStore` is a mapping from declared param names to arrays.
Setting a value converts it to the declared dtype and checks its rank and
fixed dimensions (raising `ArgumentError`); setting an undeclared name is
an error; reading an unset param through `require` is an `ArgumentError`
naming it and saying how to set it.
"""
from __future__ import annotations

from collections.abc import MutableMapping
from typing import Iterator, Sequence

import numpy as np

from dsl.errors import ArgumentError
from runtime.args import ParamSpec, check_shape, convert


class ParamStore(MutableMapping):
    def __init__(self, specs: Sequence[ParamSpec], module_name: str = "module"):
        self._specs = {s.name: s for s in specs}
        self._values: dict[str, np.ndarray] = {}
        self._module = module_name

    def spec(self, name: str) -> ParamSpec:
        return self._specs[name]

    def __setitem__(self, name: str, value) -> None:
        if name not in self._specs:
            known = ", ".join(self._specs) or "none"
            raise ArgumentError(f"{self._module} declares no param {name!r} (params: {known})")
        spec = self._specs[name]
        array = convert(f"param {name}", spec, value, None)
        check_shape(f"param {name}", spec, array, {}, None)
        self._values[name] = array

    def __getitem__(self, name: str) -> np.ndarray:
        return self._values[name]

    def __delitem__(self, name: str) -> None:
        del self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def require(self, name: str, reader: str) -> np.ndarray:
        if name not in self._values:
            raise ArgumentError(f"{reader}() reads param {name!r}, which is not set; set it "
                                f"with module.params[{name!r}] = ...")
        return self._values[name]

    def __repr__(self) -> str:
        return f"ParamStore({dict(self._values)!r})"
