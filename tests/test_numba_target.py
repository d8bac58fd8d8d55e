"""gradc's kernels compile against a lean Numba CPU target (no NumPy array
math, linear algebra or SciPy import), and the rest of the process still
sees all of Numba: a user's own jitted function that needs what the lean
target skipped compiles and runs, before or after gradc's kernels."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from numba.core import types

ROOT = Path(__file__).resolve().parent.parent

# Compiles (fresh caches) a program with elementwise, reduction, loop and
# indexing kernels, checks its values, then reports what Numba imported;
# "user-first" compiles the user's function first and then one kernel,
# "user-after" all of them, then the user's.
PROGRAM = r'''
import sys
import numpy as np
import numba

@numba.njit
def user(a):
    return np.sum(a) + np.median(a) + np.cumsum(a)[-1] + len(str(3))

def check_user():
    a = np.arange(6.0)
    assert user(a) == 15.0 + 2.5 + 15.0 + 1

if "user-first" in sys.argv:
    check_user()
import dsl
m = dsl.loads("""
def softplus(x):
    return log1p(exp(x))
def loss(x, w):
    return sum(softplus(x @ w) * 2.0, axis=1)
def grow(u, k: i64):
    for i in range(k):
        u = u * 1.5 + sin(u)
    return sum(u * u)
def pick(x, i: i64):
    return x[i] * x[i]
""")
x, w = np.linspace(-2.0, 2.0, 12).reshape(4, 3), np.linspace(0.5, 1.5, 6).reshape(3, 2)
expected = (np.log1p(np.exp(x @ w)) * 2.0).sum(axis=1)
assert np.allclose(m.loss(x, w), expected, rtol=1e-14)
if "user-after" in sys.argv:  # (after the user's compile, one kernel tells)
    s = 1 / (1 + np.exp(-(x @ w)))
    assert np.allclose(dsl.grad(m.loss, wrt=1)(x, w), x.T @ (2.0 * s), rtol=1e-13)
    u = np.linspace(0.1, 0.3, 5)
    v = u
    for _ in range(3):
        v = v * 1.5 + np.sin(v)
    assert np.allclose(m.grow(u, 3), np.sum(v * v), rtol=1e-14)
    assert m.pick(np.arange(4.0), 3) == 9.0
lean = "numba.np.arraymath" not in sys.modules and "scipy.linalg" not in sys.modules
if "user-after" in sys.argv:
    check_user()
print("lean" if lean else "whole")
'''


def run(tmp_path: Path, *flags: str) -> str:
    env = {**os.environ, "GRADC_CACHE_DIR": str(tmp_path / "gradc"),
           "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", PROGRAM, *flags], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("flag, prepared", [("user-after", "lean"), ("user-first", "whole")])
def test_kernels_compile_lean_and_user_code_sees_all_of_numba(tmp_path, flag, prepared):
    assert run(tmp_path, flag) == prepared


# A managed dispatcher calling another, neither compiled yet: the inner
# compile runs inside the outer's lean preparation.
NESTED = r'''
import numba
from gradlang.runtime.loader import manage_dispatcher

@numba.njit(no_cfunc_wrapper=True)
def inner(x):
    return x + 1.0

@numba.njit(no_cfunc_wrapper=True)
def outer(x):
    return inner(x) * 2.0

manage_dispatcher(inner)
manage_dispatcher(outer)
print(outer(1.5))
'''


def test_a_lean_compile_inside_another_keeps_the_outer_ones_preparation(tmp_path):
    # the inner compile removed the lean preparation on leaving, and the
    # outer one then failed to remove it (AttributeError)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", NESTED], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["5.0"]


# gradc kernels compiling in two threads while a third compiles a user's
# function that needs the whole target (np.median, a typed list).
THREADS = r'''
import threading
import numpy as np
import numba
from numba.typed import List
import dsl

@numba.njit
def user(a):
    medians = List()
    medians.append(np.median(a))
    return np.cumsum(a)[-1] + medians[0]

m = dsl.loads("""
def f(x):
    return sum(exp(x) * x)
def g(x, w):
    return sum(tanh(x @ w))
""")
x, w = np.linspace(-1.0, 1.0, 6), np.linspace(0.5, 1.5, 6).reshape(3, 2)
start = threading.Barrier(3)
results, errors = {}, []

def run(name, work):
    start.wait()
    try:
        results[name] = work()
    except BaseException as err:
        errors.append(repr(err))

threads = [threading.Thread(target=run, args=args) for args in (
    ("f", lambda: dsl.grad(m.f)(x)), ("g", lambda: dsl.grad(m.g, wrt=1)(x.reshape(2, 3), w)),
    ("user", lambda: user(np.arange(5.0))))]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
assert np.allclose(results["f"], np.exp(x) * (1 + x), rtol=1e-13)
h = x.reshape(2, 3)
assert np.allclose(results["g"], h.T @ (1 - np.tanh(h @ w) ** 2), rtol=1e-13)
assert results["user"] == 10.0 + 2.0
print("ok")
'''


def test_kernels_and_user_code_compile_in_threads_at_once(tmp_path):
    env = {**os.environ, "GRADC_CACHE_DIR": str(tmp_path / "gradc"),
           "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", THREADS], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok"]


def test_a_typing_refresh_in_a_lean_compile_runs_only_when_declarations_were_added(monkeypatch):
    # Numba refreshes its typing context before each method template's
    # first use (some 200 times in a first compile); inside `lean_target`
    # a refresh with no declaration added since the last is skipped, and
    # one after a declaration still installs it
    from numba.core.registry import cpu_target
    from numba.core.typing import templates

    from gradlang.runtime.numba_target import lean_target

    typing_context = cpu_target.typing_context
    whole = type(typing_context).refresh
    runs = []

    def counted(self):
        runs.append(self)
        whole(self)
    monkeypatch.setattr(type(typing_context), "refresh", counted)

    def only_this_test_declares():
        pass

    with lean_target():
        typing_context.refresh()  # what earlier tests left (it may nest)
        runs.clear()
        typing_context.refresh()
        typing_context.refresh()
        assert runs == []
        templates.builtin_registry.register_global(only_this_test_declares,
                                                   types.float64)
        typing_context.refresh()
        assert typing_context._lookup_global(only_this_test_declares) == types.float64
    assert "refresh" not in vars(typing_context)


MODULE_WITH_A_DECLARATION = """
declare double @elsewhere(double)

define double @through_memory(double %x) {
  %slot = alloca double
  store double %x, ptr %slot
  %y = load double, ptr %slot
  %z = call double @elsewhere(double %y)
  ret double %z
}
"""


def test_a_lean_compile_runs_function_passes_on_each_definition():
    # Numba's function passes, run per function with a pass builder each,
    # declarations too; the lean library runs them on the definitions only
    # (what a definition becomes is unchanged: here its stack slot goes)
    import llvmlite.binding as llvm
    from numba.core.registry import cpu_target

    from gradlang.runtime.numba_target import _NEW_PASS_MANAGER, lean_target

    if not _NEW_PASS_MANAGER:
        pytest.skip("Numba's legacy pass manager: its own libraries are kept")
    codegen = cpu_target.target_context.codegen()
    with lean_target():
        library = codegen.create_library("declaration_and_definition")
    module = llvm.parse_assembly(MODULE_WITH_A_DECLARATION)
    library._optimize_functions(module)
    optimized = str(module.get_function("through_memory"))
    assert "alloca" not in optimized and "call double @elsewhere(double %x)" in optimized
    assert module.get_function("elsewhere").is_declaration
    assert type(codegen.create_library("outside")) is not type(library)
