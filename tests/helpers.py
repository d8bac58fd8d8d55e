"""Shared test helpers: central finite differences in f64, calls of the
examples for the bridges to other libraries, and those libraries imported
when a test first uses them (`optional_module`)."""
from __future__ import annotations

import concurrent.futures
import functools
import importlib
import sys
import threading
import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np

import dsl

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class _ImportedOnUse(ModuleType):
    """A module imported at its first attribute read: every test worker
    collects every test file, and importing torch, JAX and Dask there
    (compiling their bytecode on a fresh install) took each worker 10-20 s
    before its first test, where only the tests that use them need them."""

    def __getattr__(self, attribute: str):
        # pytest looks on every name of a test module, as it collects, for
        # dunders (`__wrapped__`, `__test__`) and a mock's `_mock_name`
        probe = attribute.startswith("__") or attribute == "_mock_name"
        if probe and self.__name__ not in sys.modules:
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self.__name__), attribute)

    # what a test sets or deletes (monkeypatch) is the module's own
    def __setattr__(self, attribute: str, value) -> None:
        setattr(importlib.import_module(self.__name__), attribute, value)

    def __delattr__(self, attribute: str) -> None:
        delattr(importlib.import_module(self.__name__), attribute)


def optional_module(name: str, extra: str) -> ModuleType:
    """`name` (a module of an optional extra), imported when first used;
    the calling test module is skipped where the extra is not installed,
    as `pytest.importorskip` would (without importing it now)."""
    import pytest
    if importlib.util.find_spec(name.partition(".")[0]) is None:
        pytest.skip(f"the {extra} extra is not installed", allow_module_level=True)
    return _ImportedOnUse(name)


def import_compiled(path) -> ModuleType:
    """Import a gradc-compiled module from its file (any file name)."""
    spec = importlib.util.spec_from_file_location(f"_compiled_{abs(hash(str(path)))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def central_difference(f, args, index, eps=1e-6):
    """d sum(f(args)) / d args[index] by central differences, elementwise."""
    x = np.array(args[index], dtype=np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        plus = list(args)
        minus = list(args)
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        plus[index], minus[index] = xp, xm
        grad[i] = (np.sum(f(*plus)) - np.sum(f(*minus))) / (2 * eps)
    return grad


def weighted(f, u):
    """x -> <u, f(x)>, for VJP checks with a cotangent u."""
    return lambda *args: np.sum(np.asarray(f(*args), dtype=np.float64) * u)


@functools.lru_cache(maxsize=None)
def load_example(name: str) -> "dsl.Module":
    """examples/NAME.grad on the CPU, loaded once per test session, so that
    the tests of every bridge share its compiled programs."""
    return dsl.load(EXAMPLES / f"{name}.grad")


# (example, function, differentiable inputs, constant keyword arguments):
# inputs away from the kinks of maximum/abs, where finite differences fail.
_RNG = np.random.default_rng(0)
EXAMPLE_CALLS = [
    ("log1pexp", "log1pexp", [np.array([-3.0, -0.4, 0.3, 2.5])], {}),
    ("bar", "bar", [np.array([1.5, -2.0]), np.array([0.5, 3.0])], {}),
    ("leaky_relu", "leaky_relu", [np.array([-2.0, -0.3, 0.4, 1.7])], {"alpha": 0.1}),
    ("dense", "dense", [_RNG.normal(size=(3, 2)), _RNG.normal(size=(2, 2)), _RNG.normal(size=2)],
     {}),
    ("dense", "loss", [_RNG.normal(size=(3, 2)), _RNG.normal(size=(2, 2)), _RNG.normal(size=2)],
     {"target": _RNG.normal(size=(3, 2))}),
    ("stylegan_r1", "discriminator", [np.array([-2.0, -0.5, 0.5, 3.0]),
                                      np.array([1.5, -1.0, 2.0, 0.7])], {}),
    ("stylegan_r1", "r1_penalty", [np.array([-2.0, -0.5, 0.5, 3.0]),
                                   np.array([1.5, -1.0, 2.0, 0.7])], {}),
    ("logistic", "loss", [_RNG.normal(size=(4, 2)), np.array([1.0, -1.0, -1.0, 1.0]),
                          _RNG.normal(size=2)], {}),
    ("cross_entropy", "pick", [_RNG.normal(size=(3, 4))], {"labels": np.array([3, 0, -1])}),
    ("embedding", "embed", [_RNG.normal(size=(4, 2))], {"ids": np.array([1, -1, 1, 0])}),
    ("embedding", "embedding_bag", [_RNG.normal(size=(4, 2))],
     {"ids": np.array([1, 3, 1]), "bag": np.array([1, 0, 1]), "w": _RNG.normal(size=2),
      "bags": 2}),
    ("segment_pool", "pool", [_RNG.normal(size=(4, 2))], {"seg": np.array([2, 0, 2, -3]),
                                                          "m": 3}),
    ("checkpoint", "checkpointed", [_RNG.normal(size=(2, 3)), _RNG.normal(size=(3, 3)) / 2], {}),
]
# The calls whose second order the bridges' tests check (every call's first
# order, and the compiled second order of every example by `gradc check`,
# test_cli): a bridge's second-order rule is one rule for every function,
# run here through a grad block, several arguments and a constant, an
# integer argument and @recompute.  (On every call it took a sixth of the
# bridges' tests' cold time.)
SECOND_ORDER_CALLS = {"log1pexp.log1pexp", "dense.loss", "cross_entropy.pick",
                      "checkpoint.checkpointed"}
assert SECOND_ORDER_CALLS <= {f"{example}.{name}" for example, name, _, _ in EXAMPLE_CALLS}


def within_seconds(seconds: float, function, *args):
    """`function(*args)`, run on a daemon thread, which a call that hangs
    leaves behind (failing the test) without holding up the process."""
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run():
        try:
            future.set_result(function(*args))
        except BaseException as err:
            future.set_exception(err)
    threading.Thread(target=run, daemon=True).start()
    return future.result(timeout=seconds)
