"""The CPU driver runs a loop's parallel kernel from a size that falls with
the loop's cost per element (the op table's `cost`, summed by codegen), and
both variants compute the same values as NumPy on either side of it."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import dsl
from gradlang.compiler.codegen import generate
from gradlang.compiler.ir import TensorType
from gradlang.compiler.pipeline import optimize
from gradlang.compiler.shapes import Sym
from gradlang.runtime.cpu import MIN_PARALLEL_THRESHOLD

SOURCE = """
def cheap(x, y):
    return x * y + x

def heavy(x, y):
    return exp(x) * y

def cheap_sum(x, y):
    return sum(x * y)

def heavy_sum(x, y):
    return sum(exp(x) * y)
"""
NUMPY = {"cheap": lambda x, y: x * y + x, "heavy": lambda x, y: np.exp(x) * y,
         "cheap_sum": lambda x, y: np.sum(x * y), "heavy_sum": lambda x, y: np.sum(np.exp(x) * y)}


@pytest.fixture(scope="module")
def module():
    return dsl.loads(SOURCE, "threshold.grad")


def driver(module, name: str, size) -> str:
    types = {p: TensorType("f64", (size,)) for p in ("x", "y")}
    return generate(optimize(getattr(module, name).lower(types))).driver_source


def threshold(module, name: str) -> int:
    """The size from which the driver of `name` (symbolic size) launches
    its parallel kernel."""
    source = driver(module, name, Sym.named("n"))
    # elementwise: `(K.k if size_n >= T and R.parallel_allowed(size_n, T) else
    # K.k_serial)`; with a sum: `(K.k_serial if size_n < T else ...)`; not
    # the choice of a result's allocation (`R.pooled if size_n >= ... else R.empty`)
    (found,) = re.findall(r"K\.\w+ if size_n (?:>=|<) (\d+) (?:and|else)", source)
    return int(found)


def test_an_exp_loop_runs_in_parallel_from_fewer_elements_than_a_cheap_one(module):
    assert MIN_PARALLEL_THRESHOLD <= threshold(module, "heavy") < threshold(module, "cheap")
    assert (MIN_PARALLEL_THRESHOLD <= threshold(module, "heavy_sum")
            < threshold(module, "cheap_sum"))


def test_a_fixed_size_below_the_threshold_runs_serially_with_no_question_asked(module):
    """A fixed size past the threshold asks only whether the cores are free;
    one below it runs the serial kernel, paying nothing for the question."""
    n = 16384
    assert threshold(module, "heavy") <= n < threshold(module, "cheap")
    heavy, cheap = driver(module, "heavy", n), driver(module, "cheap", n)
    assert re.search(rf"\(K\.(k_\w+) if R\.parallel_allowed\({n}, \d+\) else K\.\1_serial\)",
                     heavy)
    assert re.search(r"K\.k_\w+_serial\(", cheap) and "parallel_allowed" not in cheap


@pytest.mark.parametrize("name", ["cheap", "heavy", "cheap_sum", "heavy_sum"])
def test_past_its_threshold_a_loop_runs_in_parallel_on_an_idle_machine(module, name,
                                                                    monkeypatch):
    """The driver's own expression, evaluated with the load policy saying
    the cores are free, picks the parallel kernel (`_all` for a full sum),
    and with it saying they are busy, the serial one (`_all_serial`)."""
    source = driver(module, name, Sym.named("n"))
    (choice,) = re.findall(r"^    (\(K\..*\))\(size_n", source, re.MULTILINE)
    kernels = type("K", (), {k: k for k in re.findall(r"K\.(\w+)", choice)})
    t = threshold(module, name)
    for idle, wanted in ((True, r"k_[0-9a-f]+(_all)?"), (False, r"k_[0-9a-f]+_(all_)?serial")):
        runtime = type("R", (), {"parallel_allowed": staticmethod(lambda size, at: idle)})
        picked = eval(choice, {"K": kernels, "R": runtime, "size_n": t})  # noqa: S307
        assert re.fullmatch(wanted, picked), (idle, picked)
        assert eval(choice, {"K": kernels, "R": runtime, "size_n": t - 1}).endswith("_serial")


@pytest.mark.parametrize("name", list(NUMPY))
def test_both_sides_of_the_threshold_agree_with_numpy(module, name, gradc_parallel):
    gradc_parallel("always")  # (a busy machine takes the serial kernel on both sides)
    rng = np.random.default_rng(0)
    t = threshold(module, name)
    for n in (t - 1, t, t + 1):
        x, y = rng.uniform(-2, 2, n), rng.uniform(-2, 2, n)
        np.testing.assert_allclose(getattr(module, name)(x, y), NUMPY[name](x, y),
                                   rtol=1e-12)


@pytest.mark.parametrize("env, spin", [({}, "3000"), ({"GOMP_SPINCOUNT": "7"}, "7"),
                                       ({"OMP_WAIT_POLICY": "active"}, "None")])
def test_numba_workers_spin_briefly_unless_the_user_says(env, spin):
    """libgomp's default 300,000-round spin after each parallel kernel took
    the cores from the BLAS threads of the next matmul (the dense benchmark
    at 1.5x NumPy, 1.2x with 3000); a user's spin count or policy wins."""
    clean = {k: v for k, v in os.environ.items()
             if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    # at `import dsl`, before `import torch` or a first kernel loads libgomp
    probe = "import os, dsl; print(os.environ.get('GOMP_SPINCOUNT'))"
    run = subprocess.run([sys.executable, "-c", probe], env={**clean, **env},
                         capture_output=True, text=True, check=True)
    assert run.stdout.strip() == spin
