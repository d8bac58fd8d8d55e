"""What the bridges to other array libraries (`dsl.torch_bridge`,
`dsl.jax_bridge`) share: which functions they take, and how a call's
keywords split into arguments and module params.

Contract: `bridged(f, what)` returns f when it is a function the bridges
can run and differentiate to any order (a `Compiled`: a loaded `.grad`
function or a transform of one), else raises `ArgumentError` (a
gradc-compiled function, which has no IR to differentiate again) or
`TypeError`.  `require(library)` imports an optional library, or raises
`ImportError` naming the extra that installs it.  `split_params(f, kwargs)`
separates the keywords naming module params that f reads from those
naming its arguments.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from dsl.function import Compiled
from gradlang.runtime.aot import AotFunction
from gradlang.runtime.errors import ArgumentError


def bridged(f: Any, what: str) -> Compiled:
    if isinstance(f, Compiled):
        return f
    if isinstance(f, AotFunction):
        raise ArgumentError(f"{what}() differentiates {f.name}() to any order, which needs "
                            "its IR, and a function of a gradc-compiled module has only its "
                            "first-order programs; load the .grad file with dsl.load for this")
    raise TypeError(f"{what}() takes a function of a loaded .grad module, got "
                    f"{type(f).__name__}")


def require(library: str) -> ModuleType:
    try:
        return importlib.import_module(library)
    except ImportError as err:
        raise ImportError(f"this needs {library}, which is not installed: pip install "
                          f"'gradlang[{library}]'") from err


def split_params(f: Compiled, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(keyword arguments, module param values) of a call's keywords."""
    param_names = {s.name for s in f.param_specs}
    arguments = {k: v for k, v in kwargs.items() if k not in param_names}
    params = {k: v for k, v in kwargs.items() if k in param_names}
    return arguments, params
