"""Holes found by adversarial testing of gradlang's ways in: the `gradc`
command line, imports of `.grad` files and of compiled modules, and the
bridges to PyTorch, JAX and Dask."""

import importlib
import sys

import numpy as np

from dsl.aot import compile_module


def test_reloading_a_recompiled_module_runs_the_new_source(tmp_path, monkeypatch):
    source = tmp_path / "scaled.grad"
    source.write_text("def f(x):\n    return x * 2.0\n")
    compile_module(str(source), str(tmp_path), ["f(f64[:])"])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "scaled", raising=False)
    import scaled
    np.testing.assert_array_equal(scaled.f(np.ones(2)), [2.0, 2.0])
    source.write_text("def f(x):\n    return x * 7.0\n")
    compile_module(str(source), str(tmp_path), ["f(f64[:])"])
    importlib.reload(scaled)
    np.testing.assert_array_equal(scaled.f(np.ones(2)), [7.0, 7.0])
    np.testing.assert_array_equal(scaled.functions["f"](np.ones(2)), [7.0, 7.0])
    np.testing.assert_array_equal(scaled.f.grad(np.ones(2)), [7.0, 7.0])
