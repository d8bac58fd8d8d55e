"""`runtime.forking`: a process forked while other threads compile can
compile at once (its locks free, Numba's compiler lock waited for)."""
import os
import threading
import time

import numpy as np
import pytest
from numba.core.compiler_lock import global_compiler_lock

import dsl
from gradlang.runtime import loader

_FORK_HOOK_ON, _FORK_BEGUN = threading.Event(), threading.Event()
if hasattr(os, "register_at_fork"):  # registered after gradlang's: it runs before theirs
    os.register_at_fork(before=lambda: _FORK_HOOK_ON.is_set() and _FORK_BEGUN.set())


def _wait_for_child(pid: int, read: int, seconds: float = 30) -> bytes:
    """What the child wrote before it exited; a failure if it hung."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        finished, status = os.waitpid(pid, os.WNOHANG)
        if finished:
            assert os.waitstatus_to_exitcode(status) == 0
            return os.read(read, 1000)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung at its first call (a lock held by a thread it lacks)")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_child_forked_while_threads_compile_calls_the_same_function(monkeypatch):
    # one thread inside the build of f's program (f's lock and the kernel
    # loader's held), another inside a Numba compile (its compiler lock),
    # as a DataLoader's workers fork while a thread warms a function up
    m = dsl.loads("def f(x):\n    return x * 3.25 + 0.125\n")
    x = np.linspace(0.0, 1.0, 5)
    importing, forked, compiling = threading.Event(), threading.Event(), threading.Event()
    import_source = loader._import_source

    def blocking_in_the_builder(name, source):
        if threading.current_thread() is builder:
            importing.set()
            forked.wait(60)
        return import_source(name, source)
    monkeypatch.setattr(loader, "_import_source", blocking_in_the_builder)

    def compile_a_while() -> None:
        with global_compiler_lock:
            compiling.set()
            _FORK_BEGUN.wait(60)
            time.sleep(0.2)  # the fork waits, or forks while this holds the lock

    builder = threading.Thread(target=m.f, args=(x,))
    compiler = threading.Thread(target=compile_a_while)
    builder.start()
    assert importing.wait(60)
    compiler.start()
    assert compiling.wait(60)
    read, write = os.pipe()
    _FORK_BEGUN.clear()
    _FORK_HOOK_ON.set()
    pid = os.fork()
    if pid == 0:  # the child: f's value, then leave at once
        try:
            os.write(write, m.f(x).tobytes())
        finally:
            os._exit(0)
    _FORK_HOOK_ON.clear()
    forked.set()
    os.close(write)
    try:
        got = np.frombuffer(_wait_for_child(pid, read), np.float64)
    finally:
        os.close(read)
        builder.join(60)
        compiler.join(60)
    np.testing.assert_array_equal(got, x * 3.25 + 0.125)
    np.testing.assert_array_equal(m.f(x), x * 3.25 + 0.125)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork")
def test_a_child_forked_while_a_thread_works_out_a_programs_ir_reads_another(monkeypatch):
    # functools.cached_property (3.10, 3.11) holds one lock per property for
    # every instance while it works a value out: a child forked meanwhile
    # waited for ever at its first `Program.ir`, of any program
    m = dsl.loads("def f(x):\n    return x * 2.0\n\ndef g(x):\n    return exp(x) + 1.0\n")
    x = np.linspace(0.0, 1.0, 3)
    slow, other = (fn.program(fn.bind((x,), {})) for fn in (m.f, m.g))
    inside, forked = threading.Event(), threading.Event()
    optimized = slow.optimized

    def optimized_slowly():
        inside.set()
        forked.wait(60)
        return optimized()
    monkeypatch.setattr(slow, "optimized", optimized_slowly)
    for program in (slow, other):
        program.__dict__.pop("ir", None)  # (worked out by the build: out again)
    worker = threading.Thread(target=lambda: slow.ir)
    worker.start()
    assert inside.wait(60)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the other program's IR, then leave at once
        try:
            os.write(write, " ".join(e.op for e in other.ir.eqns).encode())
        finally:
            os._exit(0)
    forked.set()
    os.close(write)
    try:
        got = _wait_for_child(pid, read, seconds=10).decode()
    finally:
        os.close(read)
        worker.join(60)
    assert got == " ".join(e.op for e in other.ir.eqns) and "exp" in got
    assert slow.ir.eqns[0].op == "mul"
