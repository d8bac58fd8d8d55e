"""`dsl`: the Python face of the `.grad` language.

    import dsl
    m = dsl.load("examples/log1pexp.grad")
    y = m.log1pexp(x)
    g = dsl.grad(m.log1pexp)(x)

The API is imported on first use, so that `import dsl` (and catching
`dsl.GradError`) costs nothing until a module is loaded.  The layers under
it: `gradlang.compiler` (front end to codegen) and `gradlang.runtime` (what a
compiled module needs); neither imports this package.
"""
from gradlang.runtime.errors import (AllocationError, ArgumentError, GradError, SizeMismatchError,
                                     SizeOverflowError, Span)

_API = ("Module", "grad", "hvp", "load", "loads", "value_and_grad", "vjp", "jvp", "vmap", "jacfwd",
        "jacrev", "hessian", "check_gradients", "install_import_hook")
_BRIDGES = {"to_torch": "dsl.torch_bridge", "to_jax": "dsl.jax_bridge"}

__all__ = ["AllocationError", "ArgumentError", "GradError", "SizeMismatchError",
           "SizeOverflowError", "Span", "Tape", *_API, *_BRIDGES]


def __getattr__(name: str):
    # (kept as a global once found: `dsl.grad` in a loop then costs what
    # any module attribute does, not a call of this function)
    value = globals()[name] = _imported(name)
    return value


def _imported(name: str):
    if name == "install_import_hook":
        from dsl.importer import install_import_hook
        return install_import_hook
    if name == "check_gradients":
        from dsl.check import check_gradients
        return check_gradients
    if name in _BRIDGES:  # each imports its library only when called
        import importlib
        return getattr(importlib.import_module(_BRIDGES[name]), name)
    if name == "Tape":
        from dsl.tape import Tape
        return Tape
    if name in _API:
        from dsl import api
        return getattr(api, name)
    raise AttributeError(f"module 'dsl' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
