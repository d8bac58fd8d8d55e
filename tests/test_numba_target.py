"""gradc's kernels compile against a lean Numba CPU target (no NumPy array
math, linear algebra or SciPy import), and the rest of the process still
sees all of Numba: a user's own jitted function that needs what the lean
target skipped compiles and runs, before or after gradc's kernels."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Compiles (fresh caches) a program with elementwise, reduction, loop and
# indexing kernels, checks its values, then reports what Numba imported;
# "user-first" compiles the user's function first, "user-after" after.
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
