"""Holes found by adversarial testing of the runtime: a broken or unusable
kernel cache, out-of-range integer arguments, bad hvp and pullback
arguments, tapes (nesting, NumPy between recorded calls) and tracebacks."""
import hashlib
import os
import re
import subprocess
import sys
import threading
import traceback
import types
import warnings
from pathlib import Path

import numpy as np
import pytest

import dsl
from dsl.cli import main
from gradlang.runtime import loader

ROOT = Path(__file__).resolve().parent.parent

# A function of its own, so that its kernels are not already loaded.
CUBIC = "def cubic(x):\n    return x * x * x + 2.0 * x\n"


def _cubic_grad(x):
    return dsl.grad(dsl.loads(CUBIC).cubic)(x)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache directory, and a process that has loaded no kernels."""
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(loader, "_modules", {})
    monkeypatch.setattr(loader, "_kernels", {})
    monkeypatch.setattr(loader, "_scratch", None, raising=False)
    return tmp_path / "cache"


def _forget_kernels(monkeypatch):
    """As if a new process started: kernels are imported again."""
    monkeypatch.setattr(loader, "_modules", {})
    monkeypatch.setattr(loader, "_kernels", {})
    for name in [n for n in sys.modules if n.startswith("gradk_")]:
        monkeypatch.delitem(sys.modules, name)


X = np.array([0.5, -2.0])
DCUBIC = 3 * X ** 2 + 2


def test_garbage_kernel_file_is_rewritten(fresh_cache, monkeypatch):
    np.testing.assert_allclose(_cubic_grad(X), DCUBIC)
    files = sorted((fresh_cache / "kernels").glob("gradk_*.py"))
    assert files
    for path in files:
        path.write_bytes(b"\xff\xfe\x00garbage" * 10)
    _forget_kernels(monkeypatch)
    np.testing.assert_allclose(_cubic_grad(X), DCUBIC)
    for path in files:  # the content matches its name (the source's hash) again
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:24]
        assert path.stem == f"gradk_{digest}"


@pytest.mark.parametrize("pattern,garbage", [
    ("*.nbi", b"\x80\x04garbage"),            # the index: UnpicklingError
    ("*.nbc", b"\x80\x04garbage"),            # the machine code: UnpicklingError
    ("*.nbc", None),                          # truncated machine code
])
def test_corrupt_numba_cache_is_purged_and_recompiled(fresh_cache, monkeypatch, pattern,
                                                      garbage):
    np.testing.assert_allclose(_cubic_grad(X), DCUBIC)
    files = sorted((fresh_cache / "kernels" / "__pycache__").glob(pattern))
    assert files
    for path in files:
        data = path.read_bytes()
        path.write_bytes(garbage if garbage is not None else data[:len(data) // 2])
    _forget_kernels(monkeypatch)
    with pytest.warns(RuntimeWarning, match="unreadable Numba cache"):
        np.testing.assert_allclose(_cubic_grad(X), DCUBIC)
    # the purged entries were saved again: a third process reads them silently
    _forget_kernels(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(_cubic_grad(X), DCUBIC)


@pytest.mark.parametrize("where", ["a_file", "a_file/below"])
def test_unusable_cache_dir_runs_uncached_with_one_warning(fresh_cache, monkeypatch, where):
    (fresh_cache.parent / "a_file").write_text("not a directory")
    monkeypatch.setenv("GRADC_CACHE_DIR", str(fresh_cache.parent / where))
    with pytest.warns(RuntimeWarning, match="cannot use the kernel cache") as record:
        np.testing.assert_allclose(_cubic_grad(X), DCUBIC)
        f = dsl.loads("def sq(x):\n    return x * x\n").sq
        np.testing.assert_allclose(dsl.grad(f)(X), 2 * X)
    assert len([w for w in record if "kernel cache" in str(w.message)]) == 1


def test_gradc_run_with_unusable_cache_dir(fresh_cache, monkeypatch, tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("GRADC_CACHE_DIR", str(tmp_path / "a_file" / "cache"))
    # (x * exp(x): the driver computes scalar arithmetic such as the cubic's
    # with no kernel, so no cache)
    source = tmp_path / "xexp.grad"
    source.write_text("def xexp(x):\n    return x * exp(x)\n")
    with pytest.warns(RuntimeWarning, match="cannot use the kernel cache"):
        assert main(["run", str(source), "xexp", "0"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["xexp = 0.0", "d/dx = 1.0"]
    assert "Traceback" not in out.err


def test_corrupt_machine_code_never_reaches_llvm(tmp_path):
    # LLVM aborts the whole process on corrupt object code; so run the
    # reader in a process of its own.
    script = ("import warnings, numpy as np, dsl\n"
              "warnings.simplefilter('always')\n"
              f"f = dsl.loads({CUBIC!r}).cubic\n"
              "print(dsl.grad(f)(np.array([0.5, -2.0])).tolist())\n")
    env = {**os.environ, "GRADC_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    for path in (tmp_path / "kernels" / "__pycache__").glob("*.nbc"):
        data = bytearray(path.read_bytes())
        elf = data.find(b"\x7fELF")
        assert elf > 0
        for k in range(elf + 64, len(data) - 200):
            data[k] ^= 0x5A
        path.write_bytes(bytes(data))
    second = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    assert second.stdout.split("\n")[0] == str(DCUBIC.tolist())
    assert "unreadable Numba cache" in second.stderr


INTS = dsl.loads("def times(x: f64[n], k: const i32):\n    return x * k\n\n"
                 "def scale(x: f64[n], k: i32[n]):\n    return x * k\n\n"
                 "def count(x: f64[n], k: const):\n    return x * k\n\n"
                 "def pick(x: f64[n], b: const bool):\n    return where(b, x, -x)\n")


@pytest.mark.parametrize("call,pattern", [
    (lambda: INTS.times(X, 2 ** 33), r"argument 'k' of times\(\) is out of range for i32"),
    (lambda: INTS.times(X, -2 ** 31 - 1), r"argument 'k' of times\(\) is out of range"),
    (lambda: INTS.times(X, 1e20), r"argument 'k' of times\(\) is out of range for i32"),
    (lambda: INTS.times(X, float("inf")), r"argument 'k' of times\(\) must hold i32"),
    (lambda: INTS.times(X, 2 ** 70), r"argument 'k' of times\(\) is out of range"),
    (lambda: INTS.scale(X, [1, 2 ** 31]), r"argument 'k' of scale\(\) is out of range"),
    (lambda: INTS.count(X, 2 ** 63), r"argument 'k' of count\(\) is out of range for i64"),
    (lambda: INTS.pick(X, 2), r"argument 'b' of pick\(\) must hold bool values"),
])
def test_out_of_range_integers_are_argument_errors(call, pattern):
    with pytest.raises(dsl.ArgumentError, match=pattern):
        call()


def test_integers_at_the_edge_of_their_range_pass_unchanged():
    assert INTS.times(np.array([1.0]), 2 ** 31 - 1)[0] == 2 ** 31 - 1
    assert INTS.times(np.array([1.0]), -2.0 ** 31)[0] == -2 ** 31
    np.testing.assert_array_equal(INTS.scale(X, [3, -2 ** 31]), X * [3, -2 ** 31])
    np.testing.assert_array_equal(INTS.pick(X, 1), X)


SQUARES = dsl.loads("def f(x, y):\n    return x * x * y\n")


@pytest.mark.parametrize("v,pattern", [
    ("abc", r"v of hvp\(f\) is not numeric"),
    ([[1.0, 2.0], [3.0]], r"v of hvp\(f\) is not an array"),
    ([1.0 + 2.0j, 0.0], r"v of hvp\(f\) is complex"),
    (np.array([1.0 + 2.0j, 0.0]), r"v of hvp\(f\) is complex"),
])
def test_bad_hvp_vectors_are_argument_errors(v, pattern):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ComplexWarning instead
        with pytest.raises(dsl.ArgumentError, match=pattern):
            dsl.hvp(SQUARES.f)(X, X, v)


@pytest.mark.parametrize("args,pattern", [
    ((X, X), r"f\(\) is missing argument 'y'\n(?:    .*\n)+note: hvp\(f\) takes the "
             r"arguments of f\(\), then v"),
    ((X, X, X, X), r"f\(\) takes 2 argument\(s\) but 3 were given\n(?:    .*\n)+note: "
                   r"hvp\(f\) takes "),
])
def test_hvp_arity_errors_say_that_v_comes_last(args, pattern):
    # the last argument is v: a call without it reports the last of f's
    # arguments missing, which reads wrong unless it says so
    with pytest.raises(dsl.ArgumentError) as info:
        dsl.hvp(SQUARES.f)(*args)
    assert re.search(pattern, str(info.value)), str(info.value)


def test_hvp_still_takes_lists_and_other_dtypes():
    # d2/dx2 sum(x*x*y) = diag(2y).  v is converted to x's dtype (as a
    # pullback's cotangent is), where jvp refuses a tangent of another dtype
    np.testing.assert_allclose(dsl.hvp(SQUARES.f)(X, X, [1, 3]), 2 * X * [1, 3])
    np.testing.assert_allclose(dsl.hvp(SQUARES.f)(X, X, np.ones(2, np.float32)), 2 * X)
    x32 = X.astype(np.float32)
    hv = dsl.hvp(SQUARES.f)(x32, x32, np.array([1.0, 3.0]))
    assert hv.dtype == np.float32
    np.testing.assert_allclose(hv, 2 * x32 * [1, 3], rtol=1e-6)


def test_an_hvp_of_an_hvp_has_a_v_of_its_own():
    # Both were named "$v": the outer one's binding overwrote the inner's,
    # and lowering raised KeyError: '$v'.
    quartic = dsl.loads("def f(x):\n    return sum(x * x * x * x)\n").f
    x, v, u = np.array([0.5, -1.0]), np.array([2.0, 3.0]), np.array([1.0, -1.0])
    inner = dsl.hvp(quartic)  # H v = 12 x^2 v
    np.testing.assert_allclose(inner(x, v), 12 * x**2 * v, rtol=1e-14)
    # the Hessian of sum(12 x^2 v) w.r.t. x is diag(24 v); w.r.t. v it is 0
    np.testing.assert_allclose(dsl.hvp(inner)(x, v, u), 24 * v * u, rtol=1e-14)
    np.testing.assert_array_equal(dsl.hvp(inner, wrt=1)(x, v, u), [0.0, 0.0])
    with pytest.raises(dsl.ArgumentError, match=r"hvp\(hvp\(f\)\): v has shape \[3\]"):
        dsl.hvp(inner)(x, v, np.ones(3))


@pytest.mark.parametrize("ct,pattern", [
    ("abc", r"cotangent 0 of the pullback of f\(\) is not numeric"),
    ([[1.0, 2.0], [3.0]], r"cotangent 0 of the pullback of f\(\) is not an array"),
    ([1.0 + 2.0j, 0.0], r"cotangent 0 of the pullback of f\(\) is complex"),
])
def test_bad_cotangents_are_argument_errors(ct, pattern):
    _, pullback = dsl.vjp(SQUARES.f, X, X)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(dsl.ArgumentError, match=pattern):
            pullback(ct)
    dx, dy = pullback([1.0, 2.0])
    np.testing.assert_allclose(dx, 2 * X * X * [1, 2])
    np.testing.assert_allclose(dy, X * X * [1, 2])


def test_cotangents_taken_as_they_are_only_when_exact():
    # a plain ndarray of the output's shape and dtype goes to the program as
    # it is; any other (big-endian, f32, 0-d, masked, of another shape)
    # still goes through host_cotangent, converted or refused
    _, pullback = dsl.vjp(SQUARES.f, X, X)
    ct = np.array([1.0, 2.0])
    for given in (ct, ct.astype(">f8"), ct.astype(np.float32), ct[::-1][::-1], ct):
        dx, dy = pullback(given)
        np.testing.assert_allclose(dx, 2 * X * X * [1, 2])
        np.testing.assert_allclose(dy, X * X * [1, 2])
    np.testing.assert_allclose(pullback(np.array(3.0))[1], X * X * 3)
    with pytest.raises(dsl.ArgumentError, match="is a masked array"):
        pullback(np.ma.masked_array(ct, [True, False]))
    with pytest.raises(dsl.ArgumentError, match=r"has shape \[3\]; the output has shape \[2\]"):
        pullback(np.ones(3))


def test_load_of_a_path_with_a_nul_is_a_grad_error():
    with pytest.raises(dsl.GradError, match="cannot read a"):
        dsl.load("a\x00b.grad")


LOG1PEXP = dsl.load(ROOT / "examples" / "log1pexp.grad").log1pexp
BAR = dsl.load(ROOT / "examples" / "bar.grad").bar
SUM_OF_SQUARES = dsl.loads("def squares(y):\n    return sum(y * y)\n").squares


def test_three_nested_tapes_give_the_third_derivative():
    x = np.array([0.5, -1.0, 2.0])
    with dsl.Tape() as t1:
        t1.watch(x)
        with dsl.Tape() as t2:
            t2.watch(x)
            with dsl.Tape() as t3:
                t3.watch(x)
                y = LOG1PEXP(x)
            g1 = t3.gradient(y, x)
        g2 = t2.gradient(g1, x)
    g3 = t1.gradient(g2, x)
    s = 1 / (1 + np.exp(-x))  # d/dx log(1 + e^x)
    np.testing.assert_allclose(g1, s, rtol=1e-12)
    np.testing.assert_allclose(g2, s * (1 - s), rtol=1e-12)
    np.testing.assert_allclose(g3, s * (1 - s) * (1 - 2 * s), rtol=1e-12)


def test_a_tape_entered_while_it_records_is_a_tape_error_not_a_double_gradient():
    # Its calls were recorded once per open `with`: the gradient came out twice as large.
    x = np.array([0.5, -1.0])
    tape = dsl.Tape()
    with tape:
        tape.watch(x)
        with pytest.raises(dsl.GradError, match="already recording"):
            with tape:
                pass
        y = LOG1PEXP(x)
    np.testing.assert_allclose(tape.gradient(y, x), 1 / (1 + np.exp(-x)), rtol=1e-12)


def test_numpy_between_recorded_calls_is_a_tape_error_not_a_partial_gradient():
    x = np.array([0.5, -1.0])
    with dsl.Tape(persistent=True) as tape:
        tape.watch(x)
        y = LOG1PEXP(x)
        for derived in (np.sin(y), y * 2, y[:1], y.sum(), y[0], np.concatenate([y, y])[:2],
                        y.reshape(2, 1)[:, 0]):
            with pytest.raises(dsl.GradError, match="computed with NumPy"):
                BAR(derived, x[:np.size(derived)])
        with pytest.raises(dsl.GradError, match="modified in place"):
            y += 1
        with pytest.raises(dsl.GradError, match="modified in place"):
            y[0] = 0.0
        with pytest.raises(dsl.GradError, match="into a plain array"):
            np.sin(y, out=np.empty(2))
        # through a view, an in-place method or a NumPy function writing its
        # first argument: each changed y without a word, and its gradient
        for write in (lambda: y[:1].__setitem__(0, 0.0), lambda: y.reshape(2, 1).T.__iadd__(1),
                      lambda: y.fill(0.0), lambda: y.sort(), lambda: y.put([0], [1.0]),
                      lambda: y.partition(0), lambda: np.copyto(y, 1.0),
                      lambda: np.place(y, y > 0, 0.0), lambda: np.putmask(y, y > 0, 0.0),
                      lambda: np.put(y, [0], 2.0), lambda: np.fill_diagonal(y[None], 0.0),
                      lambda: np.put_along_axis(y, np.array([0]), 1.0, 0),
                      # views NumPy's functions make: their bases are plain arrays
                      lambda: np.ravel(y).__setitem__(0, 0.0),
                      lambda: np.reshape(y, (2, 1))[0].__iadd__(1),
                      lambda: np.copyto(np.flip(y), 1.0),
                      lambda: np.add(1.0, y, out=np.squeeze(y[None])),
                      # a ufunc's `at`, the flat iterator and the rarer methods
                      # wrote past every check
                      lambda: np.add.at(y, [0], 1.0), lambda: y.flat.__setitem__(0, 0.0),
                      lambda: setattr(y, "flat", 0.0), lambda: y.byteswap(True),
                      lambda: y.setfield(0.0, y.dtype)):
            with pytest.raises(dsl.GradError, match="modified in place"):
                write()
        np.testing.assert_allclose(y, np.logaddexp(0, x))  # each refused before it wrote
        assert y.flat[1] == y[1] and list(y.flat) == list(y)  # (reading it is free)
        # out=None is no out: the result is derived from y, not a constant
        with pytest.raises(dsl.GradError, match="computed with NumPy"):
            BAR(np.clip(y, -9, 9, out=None), x)
        held = y * 0
        assert np.clip(y, -9, 9, out=held) is held  # NumPy's out itself, marked
        with pytest.raises(dsl.GradError, match="computed with NumPy"):
            BAR(held, x)
        with pytest.raises(dsl.GradError, match="into a plain array"):
            np.copyto(np.empty(2), y)
        (y * 2).fill(0.0)   # an array derived from y, which no call was given: free
        z = BAR(np.asarray(np.sin(y)), x)  # a constant on purpose
        w = BAR(y, x)
        total = z + w
    # NumPy's sum of two results as the target: it was "the target was not
    # computed by a call recorded on this tape", which it was, in part
    with pytest.raises(dsl.GradError, match="target was computed with NumPy"):
        tape.gradient(total, x)
    # d/dx (c * x) = c with c = sin(log1pexp(x)) held constant
    np.testing.assert_allclose(tape.gradient(z, x), np.sin(np.logaddexp(0, x)), rtol=1e-12)
    s = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(tape.gradient(w, x), s * x + np.logaddexp(0, x), rtol=1e-12)
    # after the tape: results are arrays like any other
    np.testing.assert_allclose(BAR(np.sin(y), x), np.sin(np.logaddexp(0, x)) * x)
    y[0] = 1.0
    assert float(y.sum()) == pytest.approx(1.0 + np.logaddexp(0, -1.0))



def test_a_view_of_a_watched_array_is_a_tape_error_not_a_partial_gradient():
    """bar(x, x[::-1]) of a watched x recorded x[::-1] as a constant (a
    view of the caller's plain array, which NumPy cannot mark): the
    gradient, x[::-1], silently missed the path through the view."""
    x = np.array([1.0, 2.0, 3.0, 4.0])
    with dsl.Tape(persistent=True) as tape:
        tape.watch(x)
        for view in (x[::-1], x.reshape(2, 2).ravel(), x[:], np.broadcast_to(x, (4,))):
            with pytest.raises(dsl.GradError, match="view of an array this tape watches"):
                BAR(x, view)
        y = LOG1PEXP(x)
        z = BAR(x, np.array(x[::-1]))  # a copy: a constant on purpose
        w = BAR(y, np.asarray(y)[::-1])  # a plain view of a result: so too
    np.testing.assert_array_equal(tape.gradient(z, x), x[::-1])
    np.testing.assert_allclose(tape.gradient(w, x), np.logaddexp(0, x)[::-1] / (1 + np.exp(-x)),
                               rtol=1e-12)


def _central_differences(f, x, h=1e-6):
    return np.array([(f(x + h * e) - f(x - h * e)) / (2 * h) for e in np.eye(x.size)])


def _writes_numpy_makes(a):
    """Writes into `a` that pass no `TapeArray` check: through a plain view
    of it or of its base, NumPy's `out=` of a method, a C routine."""
    n = a.size
    return (lambda: np.ascontiguousarray(a).__setitem__(0, 9.0),
            lambda: np.array(a, copy=False).__setitem__(0, 9.0),
            lambda: np.asarray(a).__setitem__(0, 9.0),
            lambda: a.__array__().__setitem__(0, 9.0),
            lambda: np.frombuffer(a).__setitem__(0, 9.0),
            lambda: (a if a.base is None else a.base).__setitem__(0, 9.0),
            lambda: np.arange(n, dtype=float).take(np.arange(n), out=np.asarray(a)),
            lambda: np.zeros(n, int).choose([np.full(n, 9.0)], out=np.asarray(a)),
            lambda: np.full(n, 9.0).compress(np.ones(n, bool), out=np.asarray(a)),
            lambda: np.eye(n).dot(np.full(n, 9.0), out=np.asarray(a)),
            lambda: np.random.default_rng(0).random(out=np.asarray(a)),
            lambda: np.nditer(np.asarray(a), op_flags=["readwrite"]))


def test_a_write_numpy_makes_into_a_tracked_array_is_refused_not_a_wrong_gradient():
    """np.ascontiguousarray(y)[0] = 9 (a plain view, which no TapeArray
    check sees), y.base[0] = 9, an out= or np.nditer of y or of a watched
    x changed a value a recorded call read or made: the gradient was that
    of the old value ([36, 16, 24] for d sum(2x * 2x) / dx, whose first
    element no longer depended on x).  While the tape records, their
    memory is read-only: NumPy refuses every such write."""
    x = np.array([0.5, -1.0, 2.0])
    with dsl.Tape() as tape:
        tape.watch(x)
        y = LOG1PEXP(x)
        for a in (y, x):
            for write in _writes_numpy_makes(a):
                with pytest.raises(ValueError, match="read-only|writable|not acceptable"):
                    write()
        w = BAR(y, x)
    np.testing.assert_array_equal(x, [0.5, -1.0, 2.0])  # each refused before it wrote
    np.testing.assert_array_equal(y, np.logaddexp(0, x))
    expected = _central_differences(lambda v: float(np.sum(BAR(LOG1PEXP(v), v))), x)
    np.testing.assert_allclose(tape.gradient(w, x), expected, rtol=1e-7)
    # after the tape, as they were: writeable
    assert x.flags.writeable and y.flags.writeable and y.base.flags.writeable
    np.asarray(y)[0] = 1.0
    x[0] = 1.0
    assert y[0] == 1.0 and x[0] == 1.0


def test_a_tape_restores_only_the_writeable_flags_it_changed():
    """A read-only array stays so; a watched view's base (the memory it
    writes) is read-only while the tape records; an inner tape leaves what
    an outer one still records read-only; an exception out of the `with`
    restores the flags and says why NumPy refused the write."""
    frozen = np.array([0.5, -1.0, 3.0])
    frozen.flags.writeable = False
    buffer = np.array([0.0, 0.5, -1.0, 2.0])
    x = buffer[1:]
    with dsl.Tape() as outer:
        outer.watch(frozen, x)
        with pytest.raises(ValueError, match="read-only"):
            buffer[0] = 1.0  # (a write through x's base: PyTorch's views share a version too)
        with pytest.raises(dsl.ArgumentError, match="writeable: it is read-only while a "
                                                    "recording dsl.Tape tracks it"):
            LOG1PEXP(np.ones(3), out=x)  # (no recorded call: the kernel would write x)
        with dsl.Tape() as inner:
            inner.watch(x)
            y = LOG1PEXP(x)
        assert not (x.flags.writeable or buffer.flags.writeable or y.flags.writeable)
        z = BAR(y, frozen)
    assert buffer.flags.writeable and x.flags.writeable and y.flags.writeable
    assert not frozen.flags.writeable
    s = 1 / (1 + np.exp(-x))
    dx, dfrozen = outer.gradient(z, [x, frozen])
    np.testing.assert_allclose(dx, s * frozen, rtol=1e-12)
    np.testing.assert_allclose(dfrozen, np.logaddexp(0, x), rtol=1e-12)
    with pytest.raises(ValueError, match="read-only") as caught:
        with dsl.Tape() as tape:
            tape.watch(x)
            np.asarray(LOG1PEXP(x))[0] = 9.0
    assert x.flags.writeable and buffer.flags.writeable
    assert "while a dsl.Tape records, the arrays it tracks" in "".join(caught.value.__notes__)


def test_an_array_two_tapes_track_stays_read_only_until_the_last_stops():
    """An inner tape watching x first froze it; the outer, watching it
    after, found it read-only and left it, so the inner's exit made x
    writeable while the outer still recorded: x[0] = 9 then went through,
    and the outer's gradient of sum(log1pexp(x)) was taken at the new x
    (sigmoid(9) for sigmoid(0.5)).  The same for a tape in another thread."""
    x = np.array([0.5, -1.0, 2.0])
    with dsl.Tape() as outer:
        with dsl.Tape() as inner:
            inner.watch(x)
            outer.watch(x)
        with pytest.raises(ValueError, match="read-only"):
            np.asarray(x)[0] = 9.0
        y = LOG1PEXP(x)
    assert x.flags.writeable
    np.testing.assert_allclose(outer.gradient(y, x), 1 / (1 + np.exp(-x)), rtol=1e-12)
    entered, done = threading.Event(), threading.Event()

    def other_thread():
        with dsl.Tape() as tape:
            tape.watch(x)
            entered.set()
            done.wait(10)
    worker = threading.Thread(target=other_thread)
    worker.start()
    entered.wait(10)
    with dsl.Tape() as tape:
        tape.watch(x)
        done.set()
        worker.join()
        assert not x.flags.writeable  # (the other thread's tape stopped; this one records)
    assert x.flags.writeable


def test_a_tape_ended_in_another_thread_is_a_tape_error_and_gives_its_arrays_back():
    # its with block begun in one thread and ended in another (by hand):
    # list.remove's ValueError, an internal error, and x read-only for good
    tape, x = dsl.Tape(), np.ones(3)
    worker = threading.Thread(target=lambda: (tape.__enter__(), tape.watch(x)))
    worker.start()
    worker.join()
    assert not x.flags.writeable
    with pytest.raises(dsl.GradError, match="began in another thread"):
        tape.__exit__(None, None, None)
    assert x.flags.writeable


def test_a_large_result_of_a_tape_is_read_only_while_it_records_and_its_block_reused_writeable():
    # a result from the runtime's memory pool (an array over a Lease): a
    # block given back read-only would make the next call's result so
    from gradlang.runtime import memory
    x = np.linspace(-2.0, 2.0, memory.POOL_MIN // 8 + 8)
    with dsl.Tape() as tape:
        tape.watch(x)
        y = LOG1PEXP(x)
        with pytest.raises(ValueError, match="read-only"):
            np.asarray(y)[0] = 9.0
    assert y.flags.writeable and y[0] == pytest.approx(np.logaddexp(0, -2.0), rel=1e-12)
    at = y.__array_interface__["data"][0]
    del y, tape  # (the tape keeps its results alive)
    again = LOG1PEXP(x)
    assert again.__array_interface__["data"][0] == at and again.flags.writeable
    again[0] = 1.0
    with dsl.Tape() as outer:  # such a result watched: it was the array over the
        outer.watch(again)    # lease, left writeable, and a write into it went
        with dsl.Tape() as inner:  # through: 100 for d/dy0 sum(y * y) at y0 = 2
            inner.watch(again)
            z = SUM_OF_SQUARES(again)
            with pytest.raises(ValueError, match="read-only"):
                again[0] = 50.0
        np.testing.assert_allclose(inner.gradient(z, again), 2 * again, rtol=1e-12)
    assert again[0] == 1.0 and again.flags.writeable
    with dsl.Tape() as tape:  # the caller's own read-only base: no error out of the block
        tape.watch(x)
        y = LOG1PEXP(x)
        _over_the_lease(y).flags.writeable = False
    assert not y.flags.writeable


def _over_the_lease(a: np.ndarray) -> np.ndarray:
    """The last array of `a`'s chain of bases (a pooled one's: over its Lease)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def test_a_watched_view_over_memory_numpy_cannot_make_writeable_again_stays_writeable():
    # memory exported only through __array_interface__ (as a torch tensor's
    # .numpy(), or the runtime pool's Lease), its array made read-only after
    # x was taken from it: x, frozen, could not be writeable again
    block = np.array([0.0, 0.5, -1.0])
    exporter = types.SimpleNamespace(__array_interface__=block.__array_interface__,
                                     block=block)
    whole = np.asarray(exporter)
    x = whole[1:]
    whole.flags.writeable = False
    with dsl.Tape() as tape:
        tape.watch(x)
        y = LOG1PEXP(x)
    assert x.flags.writeable and y.flags.writeable
    np.testing.assert_allclose(tape.gradient(y, x), 1 / (1 + np.exp(-x)), rtol=1e-12)


def test_tape_gradient_refuses_sources_that_are_no_array_or_sequence():
    """A dict of sources gave [None] (its keys, which no tape tracks, as
    if z did not depend on x), and None raised Python's TypeError."""
    x = np.array([0.5, -1.0])
    with dsl.Tape() as tape:
        tape.watch(x)
        z = LOG1PEXP(x)
    for sources in ({"x": x}, None, "x"):
        with pytest.raises(dsl.ArgumentError, match="sources as an array or a list or tuple"):
            tape.gradient(z, sources)
    # (refused before the tape counts as used)
    np.testing.assert_allclose(tape.gradient(z, (x,))[0], 1 / (1 + np.exp(-x)), rtol=1e-12)


def test_tape_gradient_of_an_integer_result_says_it_has_none():
    # it said the target "was not computed by a call recorded on this tape"
    m = dsl.loads("def count(x):\n    return sum(where(x > 0, 1, 0))\n"
                  "def half(x):\n    return x * 0.5\n", "<count>")
    x = np.array([0.5, -1.0])
    with dsl.Tape(persistent=True) as tape:
        tape.watch(x)
        n, y = m.count(x), m.half(x)
    assert n == 1
    with pytest.raises(dsl.GradError, match="dtype int64: an integer or bool result has no "
                                            "gradient"):
        tape.gradient(n, x)
    # a target whose dtype NumPy does not know (a torch tensor's) is no
    # result of this tape's (that check raised NumPy's TypeError)
    with pytest.raises(dsl.GradError, match="not computed by a call recorded on this tape"):
        tape.gradient(types.SimpleNamespace(dtype="no dtype of NumPy's"), x)
    np.testing.assert_array_equal(tape.gradient(y, x), [0.5, 0.5])

PACKAGE_DIRS = tuple(str(ROOT / d) for d in ("dsl", "runtime", "compiler", "grammar"))


def _internal_frames(err: BaseException) -> list:
    return [f for f in traceback.extract_tb(err.__traceback__)
            if f.filename.startswith(PACKAGE_DIRS)]


def _numpy_under_a_tape():
    x = np.array([0.5])
    with dsl.Tape() as tape:
        tape.watch(x)
        BAR(np.sin(LOG1PEXP(x)), x)


BAD_CALLS = {
    "tape": _numpy_under_a_tape,
    "call": lambda: INTS.times(X, 2 ** 33),
    "shapes": lambda: SQUARES.f(X, np.ones(3)),
    "grad": lambda: dsl.grad(SQUARES.f)(X, "x"),
    "hvp": lambda: dsl.hvp(SQUARES.f)(X, X, "abc"),
    "pullback": lambda: dsl.vjp(SQUARES.f, X, X)[1]([1.0, 2.0, 3.0]),
    "loads": lambda: dsl.loads("def f(x):\n    return y\n"),
    "load": lambda: dsl.load("/nonexistent/f.grad"),
    "lowering": lambda: dsl.loads("def f(x: f64[n], y: f64[n]):\n    return x @ y\n").f(
        np.ones((2, 2)), np.ones((2, 2))),
}


@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_user_errors_show_the_callers_frame_not_compiler_internals(name, monkeypatch):
    monkeypatch.delenv("GRADC_FULL_TRACEBACK", raising=False)
    with pytest.raises(dsl.GradError) as info:
        BAD_CALLS[name]()
    assert len(_internal_frames(info.value)) <= 1
    assert len(traceback.extract_tb(info.value.__traceback__)) <= 3
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_full_tracebacks_on_request(monkeypatch):
    monkeypatch.setenv("GRADC_FULL_TRACEBACK", "1")
    with pytest.raises(dsl.GradError) as info:
        BAD_CALLS["call"]()
    assert len(_internal_frames(info.value)) > 1


def test_a_cache_that_cannot_be_saved_warns_once(fresh_cache, monkeypatch):
    # a full disk warned once per kernel: each message named its function
    # at its address, which Python's once-per-message filter never repeats
    import errno

    def disk_full(self, name, data):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(loader._CheckedCacheFile, "_save_data", disk_full)
    monkeypatch.setattr(loader, "_said_unsaved", set(), raising=False)
    with pytest.warns(RuntimeWarning, match="cannot save machine code") as record:
        np.testing.assert_allclose(_cubic_grad(X), DCUBIC)
        f = dsl.loads("def quartic(x):\n    return x * x * x * x\n").quartic
        np.testing.assert_allclose(dsl.grad(f)(X), 4 * X ** 3)
    said = [str(w.message) for w in record if "cannot save" in str(w.message)]
    assert len(said) == 1 and str(fresh_cache) in said[0] and "No space left" in said[0]


def _add_seven(x):
    return x + 7.0


def _runtime_helper():
    """A new dispatcher of `_add_seven` with a runtime helper's cache."""
    import numba
    helper = numba.njit(_add_seven)
    loader.cache_in_kernel_cache(helper)
    loader.manage_dispatcher(helper)
    return helper


@pytest.fixture
def read_only(monkeypatch):
    """`read_only(root)`: from now on, no file can be written under `root`,
    as on a read-only file system or a directory of another user (made by
    hand: the tests may run as root, whom a directory's mode does not stop)."""
    from numba.core import caching
    roots = []

    def refused(path) -> bool:
        return path is not None and any(Path(path).resolve().is_relative_to(root)
                                        for root in roots)

    def guard(function, path_of):
        def guarded(*args, **kwargs):
            if refused(path_of(*args)):
                raise PermissionError(13, "Permission denied", str(path_of(*args)))
            return function(*args, **kwargs)
        return guarded
    locator = caching._CacheLocator
    monkeypatch.setattr(locator, "ensure_cache_path",
                        guard(locator.ensure_cache_path, lambda self: self.get_cache_path()))
    index = caching.IndexDataCacheFile
    monkeypatch.setattr(index, "_open_for_write",
                        guard(index._open_for_write, lambda self, path: path))
    # (a kernel file already there, with its text, is not written)
    monkeypatch.setattr(loader, "write_atomic", guard(
        loader.write_atomic,
        lambda path, text: None if path.is_file() and path.read_bytes() == (
            text.encode() if isinstance(text, str) else text) else path))
    return lambda root: roots.append(Path(root).resolve())


def test_a_read_only_cache_is_read(fresh_cache, monkeypatch, tmp_path, read_only):
    # Numba caches only where it can write: a pre-filled cache that could
    # not be written (shipped in an image, shared on a cluster) was never
    # read, and every kernel compiled again, into ~/.cache/numba
    from numba.core import event
    home = tmp_path / "home-cache"  # Numba's ~/.cache
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    np.testing.assert_allclose(_cubic_grad(X), DCUBIC)  # fills the cache
    assert _runtime_helper()(3.0) == 10.0  # a runtime helper's machine code too
    read_only(fresh_cache)
    with event.install_recorder("numba:compile") as compiles:
        assert _runtime_helper()(3.0) == 10.0
    assert compiles.buffer == []
    for home_too in (False, True):  # (with ~/.cache read-only too, a scratch directory's kernels)
        if home_too:
            read_only(home)
        _forget_kernels(monkeypatch)
        with event.install_recorder("numba:compile") as compiles, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (the scratch directory's)
            np.testing.assert_allclose(_cubic_grad(X), DCUBIC)
        assert compiles.buffer == []
        assert not list(home.rglob("*.nbc"))  # nothing compiled, nothing kept
        if not home_too:  # a kernel the cache does not hold compiles, in a scratch directory
            with pytest.warns(RuntimeWarning, match="cannot use the kernel cache"):
                f = dsl.loads("def quintic(x):\n    return x * x * x * x * x\n").quintic
                np.testing.assert_allclose(dsl.grad(f)(X), 5 * X ** 4)


def test_a_loop_calling_another_module_s_kernel_loads_its_machine_code(fresh_cache, monkeypatch):
    # Modules defining one kernel share the dispatcher of the first to load
    # (`loader._share_kernels`): a compiled loop's machine code then calls
    # another loop module's kernel, and unpickling it imports that module
    # by name.  A process that had not loaded it (a gradient's loop run
    # before the function's) discarded the loop's cache with a warning,
    # purged it and compiled the loop and the kernel again.
    from numba.core import event
    from numba.core.environment import Environment
    from gradlang.runtime import cpu
    kname = "k_" + hashlib.sha256(str(fresh_cache).encode()).hexdigest()[:16]
    kernel = cpu.TARGET.render_loop(kname, ["in0", "out0"], [], ["out0[i] = in0[i] * 3.0"])
    # (as codegen renders a loop's module: its kernels' text, then its function)
    loops = [f"{cpu.TARGET.header}\n\n{kernel}\n\n" + cpu.TARGET.render_function(
        f"l_{j}", ["x", "out"], [f"{kname}_serial(x.size, x, out)", "return out"])
        for j in range(2)]
    x = np.array([1.0, -2.5, 4.0])
    first, second = (loader.load_kernels(source) for source in loops)
    assert getattr(second, kname + "_serial") is getattr(first, kname + "_serial")
    np.testing.assert_array_equal(second.l_1(x, np.empty(3)), 3 * x)  # compiled and cached
    _forget_kernels(monkeypatch)
    monkeypatch.setattr(Environment, "_memo", type(Environment._memo)())
    second = loader.load_kernels(loops[1])  # (the first not loaded)
    with event.install_recorder("numba:compile") as compiles, warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(second.l_1(x, np.empty(3)), 3 * x)
    assert compiles.buffer == []


# A tuple nested deeper than Python's recursion limit (whose repr is a
# RecursionError; nested 10**6 deep, its hash overflows C's stack), and an
# integer `str` refuses (over 4300 digits).
DEEP = 0
for _ in range(10 * sys.getrecursionlimit()):
    DEEP = (DEEP,)
HUGE = 10 ** 5000
OPTIONS = dsl.loads("def mul(x, y):\n    return x * y\ndef sq(x):\n    return x * x\n")
MUL = "<string>:1:5: error: "


@pytest.mark.parametrize("call, message", [
    (lambda f: dsl.grad(f, DEEP), "wrt entries are parameter positions or names, got "
                                  "((((...),),),)"),
    (lambda f: dsl.jacrev(f, argnums=DEEP), "argnums entries are parameter positions or names, "
                                             "got ((((...),),),)"),
    (lambda f: dsl.grad(f, 1, argnums=DEEP), "give wrt or argnums (its other name), not both: "
                                             "wrt=1, argnums=((((...),),),)"),
    (lambda f: dsl.hessian(f, HUGE), "wrt=<an integer of 16610 bits> is out of range: mul() "
                                     "has 2 parameter(s)"),
    (lambda f: dsl.grad(f, has_aux=-HUGE), "has_aux is True or False, got <a negative integer "
                                           "of 16610 bits>"),
    (lambda f: dsl.vmap(f, (0, DEEP)), "in_axes entries are integers (the axis to map) or None "
                                       "(not mapped), got ((((...),),),) for argument 'y'"),
    (lambda f: dsl.vmap(f, (0, HUGE)), "in_axes maps axis <an integer of 16610 bits> of "
                                       "argument 'y', but an array has at most 64 axes"),
    (lambda f: dsl.vmap(f, 0, -64), None),  # (the last axis that may be one)
    (lambda f: dsl.vmap(f, 0, 64), "out_axes puts the examples on axis 64, but an array has "
                                   "at most 64 axes"),
    (lambda f: dsl.vmap(f, 0, HUGE), "out_axes puts the examples on axis <an integer of 16610 "
                                     "bits>, but an array has at most 64 axes"),
    (lambda f: dsl.vmap(f, 0, [DEEP]), "out_axes nests more than 64 deep; give it nested as "
                                       "the results of mul() are"),
], ids=["wrt", "argnums", "both", "hessian", "has_aux", "in_axes", "in_axes-huge",
        "out_axes-64", "out_axes64", "out_axes-huge", "out_axes-nested"])
def test_a_deeply_nested_or_huge_option_is_an_argument_error(call, message):
    # Their messages repr'd them: a RecursionError, or str's ValueError for
    # the integer (and out_axes=HUGE reached a program's key, and out_axes
    # nested deep Python's recursion limit as it was checked)
    if message is None:
        call(OPTIONS.mul)
        return
    with pytest.raises(dsl.ArgumentError) as caught:
        call(OPTIONS.mul)
    assert str(caught.value).splitlines()[0] == MUL + message


def test_tape_and_check_gradients_refuse_a_huge_integer_as_an_option():
    with pytest.raises(dsl.ArgumentError, match=re.escape(
            "Tape()'s persistent is True or False, got <an integer of 16610 bits>")):
        dsl.Tape(HUGE)
    with pytest.raises(dsl.ArgumentError, match=re.escape(
            "takes an order from 1 to 8, got <an integer of 16610 bits>")):
        dsl.check_gradients(OPTIONS.mul, 1.0, 2.0, order=HUGE)


def test_a_python_integer_beyond_64_bits_is_a_float_tangent_cotangent_or_v():
    # as it is a float argument (mul(2**70, 1.0)); each was refused as
    # "out of range: it holds an integer beyond 64 bits"
    big = 2 ** 70
    assert dsl.jvp(OPTIONS.mul, (1.5, 2.0), (big, 0))[1] == 2.0 * big
    assert dsl.vjp(OPTIONS.mul, 1.5, 2.0)[1](big) == (2.0 * big, 1.5 * big)
    assert dsl.hvp(OPTIONS.sq)(1.5, big) == 2.0 * big
    with pytest.raises(dsl.ArgumentError, match="out of range for f64"):
        dsl.vjp(OPTIONS.mul, 1.5, 2.0)[1](10 ** 400)


class _HashedIsABug:
    """A key whose hashing fails the test: as a tuple nested 10**6 deep,
    whose hash overflows C's stack (a segfault)."""

    def __hash__(self):
        raise AssertionError("hashed")

    def __repr__(self):
        return "key"


@pytest.mark.parametrize("key, shown", [(DEEP, "((((...),),),)"), (HUGE, "<an integer of 16610 "
                                        "bits>"), (_HashedIsABug(), "key")],
                         ids=["deep", "huge", "unhashable"])
def test_a_param_name_target_or_tangent_key_that_is_no_text_is_refused(key, shown):
    # (repr'd in their messages: RecursionError, str's ValueError; and a
    # name was hashed as it was looked up)
    m = dsl.loads("param w: f64\ndef f(x):\n    return x * w\n")
    declares_none = f"error: <string> declares no param {shown} (params: w)"
    for access in (lambda: m.params.__setitem__(key, 1.0), lambda: m.params[key],
                   lambda: m.params.__delitem__(key)):
        with pytest.raises(dsl.GradError) as caught:
            access()
        assert str(caught.value) == declares_none
    assert key not in m.params and not m.params
    with pytest.raises(dsl.GradError, match=re.escape(f"error: unknown target {shown}; ")):
        dsl.loads("def f(x):\n    return x\n", target=key)
    if isinstance(key, _HashedIsABug):
        return  # (a dict of it cannot be built)
    with pytest.raises(dsl.ArgumentError, match=re.escape(
            f"tangents given as a dict are keyed by argument or param names, got {shown}")):
        dsl.jvp(m.f, (1.0,), {key: 1.0})


def test_a_wrong_tape_target_leaves_a_non_persistent_tape_usable():
    # The tuple of a call's results was "not computed by a call recorded on
    # this tape", and any wrong target used the tape up: the right one
    # after it was refused ("a non-persistent Tape gives one gradient")
    x = np.array([0.5, -1.0])
    with dsl.Tape() as tape:
        tape.watch(x)
        y = OPTIONS.sq(x)
        pair = (y, OPTIONS.sq(y))
    with pytest.raises(dsl.ArgumentError, match=r"^error: Tape.gradient\(\) takes one target, "
                                                r"an array, got a tuple of 2: differentiate"):
        tape.gradient(pair, x)
    for wrong in (np.asarray(y), y + 1.0):
        with pytest.raises(dsl.GradError, match="target was"):
            tape.gradient(wrong, x)
    np.testing.assert_array_equal(tape.gradient(pair[1], x), 4 * x ** 3)


def test_a_list_nested_deeper_than_any_array_is_no_array_with_dask_imported():
    # (looking for Dask arrays in it walked it whole: a RecursionError)
    pytest.importorskip("dask.array")
    nested = [0.0]
    for _ in range(10 * sys.getrecursionlimit()):
        nested = [nested]
    with pytest.raises(dsl.ArgumentError, match=r"^<string>:3:5: error: argument 'x' of sq\(\) "
                                                r"is not an array: .* maximum number of dim"):
        OPTIONS.sq(nested)


def test_a_list_holding_an_array_a_recording_tape_follows_is_a_tape_error():
    # The call took a copy of its values, a constant to the tape: the
    # gradient of mul(sq([y]), y) for y = sq(x) came out 2x**5, not 6x**5
    x = np.array([1.0, 2.0])
    with dsl.Tape() as tape:
        tape.watch(x)
        y = OPTIONS.sq(x)
        for listed in ([y], (x, x), [[y + 1.0]], [x[::-1]]):
            with pytest.raises(dsl.GradError, match=r"^<string>:3:5: error: argument 'x' of "
                                                    r"sq\(\) is a (list|tuple) holding an array "
                                                    "a recording dsl.Tape follows"):
                OPTIONS.sq(listed)
        z = OPTIONS.sq(np.asarray([y]))  # (a constant on purpose)
        w = OPTIONS.mul(z, y)
    np.testing.assert_array_equal(tape.gradient(w, x), z[0] * 2 * x)
    assert OPTIONS.sq([y]).shape == (1, 2)  # (the tape no longer records)


def test_a_param_set_to_an_array_a_recording_tape_follows_is_a_tape_error():
    # The store kept a copy, a constant to the tape: the gradient of
    # lin(x) = x * w with w = sq(x) came out x**2, not 3 x**2
    m = dsl.loads("param w: f64[n]\ndef lin(x):\n    return x * w\n")
    x = np.array([1.0, 2.0])
    with dsl.Tape() as tape:
        tape.watch(x)
        y = OPTIONS.sq(x)
        for value in (y, x, y * 2.0):
            with pytest.raises(dsl.GradError, match=r"^<string>:1:1: error: param 'w' cannot be "
                                                    "set to an array a recording dsl.Tape "
                                                    "follows"):
                m.params["w"] = value
        m.params["w"] = np.array(y)  # (a constant on purpose)
        z = m.lin(x)
    np.testing.assert_array_equal(tape.gradient(z, x), x ** 2)
    m.params["w"] = y  # (the tape no longer records)


class _RefusesNumPy:
    """As a torch tensor that requires grad: reading it raises a
    RuntimeError (torch's: "Can't call numpy() on Tensor that requires
    grad")."""

    def __array__(self, dtype=None, copy=None):
        raise RuntimeError("Can't call numpy() on this")


def test_a_list_holding_an_array_numpy_cannot_read_is_an_argument_error():
    # np.asarray's RuntimeError leaked (only its ValueError and TypeError
    # were said), for an argument, a cotangent, a tangent and a param
    m = dsl.loads("param w: f64[n]\ndef f(x):\n    return x * w\n")
    refused = [_RefusesNumPy()]
    not_an_array = "is not an array: Can't call numpy() on this"
    for call, where in [
            (lambda: OPTIONS.sq(refused), "<string>:3:5: error: argument 'x' of sq()"),
            (lambda: dsl.vjp(OPTIONS.sq, 1.0)[1](refused),
             "<string>:3:5: error: cotangent 0 of the pullback of sq()"),
            (lambda: dsl.jvp(OPTIONS.sq, (1.0,), (refused,)),
             "<string>:3:5: error: the tangent for 'x' of sq()"),
            (lambda: m.params.__setitem__("w", refused), "<string>:1:1: error: param 'w'")]:
        with pytest.raises(dsl.ArgumentError) as caught:
            call()
        assert str(caught.value).splitlines()[0] == f"{where} {not_an_array}"
    da = pytest.importorskip("dask.array")
    # (hvp's v beside a Dask x, split as x is: its RuntimeError leaked there)
    with pytest.raises(dsl.ArgumentError, match=re.escape(f"v of hvp(sq) {not_an_array}")):
        dsl.hvp(OPTIONS.sq)(da.ones(4, chunks=2), refused)


@pytest.mark.parametrize("transform", [dsl.jacfwd, dsl.jacrev])
def test_a_jacobian_of_more_axes_than_an_array_has_is_an_argument_error(transform):
    # (NumPy's ValueError "maximum supported dimension for an ndarray is
    # currently 64, found 66" as it was assembled)
    f = transform(OPTIONS.sq)
    np.testing.assert_array_equal(f(np.full((1,) * 32, 1.5)), np.full((1,) * 64, 3.0))
    with pytest.raises(dsl.ArgumentError) as caught:
        f(np.ones((1,) * 33))
    assert str(caught.value).splitlines()[0] == (
        f"<string>:3:5: error: {f.name}: the Jacobian of its result with respect to 'x' "
        "would have 66 axes (the result's and then the argument's), but an array has at most 64")
