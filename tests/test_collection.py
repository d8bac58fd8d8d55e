"""`runtime.collection`: the garbage collector is paused while a kernel
compiles and enabled again after, across nesting and threads, and a
collector the user disabled stays disabled."""
import gc
import os
import threading

import numpy as np
import pytest
from numba.core import compiler

import dsl
from gradlang.runtime.collection import collection_paused, imports_unwalked


@pytest.fixture
def collector_states_while_compiling(monkeypatch):
    """gc.isenabled() at each Numba compile of a function."""
    states = []
    compile_extra = compiler.compile_extra

    def recording(*args, **kwargs):
        states.append(gc.isenabled())
        return compile_extra(*args, **kwargs)
    monkeypatch.setattr(compiler, "compile_extra", recording)
    return states


def fresh_function(c: float):
    # a constant of this test's: a kernel no cache holds
    return dsl.grad(dsl.loads(f"def f(x):\n    return x * x * {c!r}\n").f)


def test_a_kernel_compiles_with_the_collector_paused(collector_states_while_compiling):
    assert gc.isenabled()
    c = 1.0 + np.random.default_rng().uniform()
    np.testing.assert_allclose(fresh_function(c)(np.arange(3.0)), 2 * c * np.arange(3.0))
    assert collector_states_while_compiling and not any(collector_states_while_compiling)
    assert gc.isenabled()


def test_a_collector_the_user_disabled_stays_disabled(collector_states_while_compiling):
    gc.disable()
    try:
        c = 3.0 + np.random.default_rng().uniform()
        np.testing.assert_allclose(fresh_function(c)(np.ones(2)), [2 * c, 2 * c])
        assert collector_states_while_compiling and not gc.isenabled()
    finally:
        gc.enable()


def test_the_collector_resumes_when_the_last_pause_ends():
    # two threads' pauses that overlap, one of them nested
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with collection_paused():
            with collection_paused():
                first_in.set()
                second_in.wait(10)
        seen["after first"] = gc.isenabled()
        first_out.set()

    def second():
        first_in.wait(10)
        with collection_paused():
            second_in.set()
            first_out.wait(10)
            seen["inside second"] = gc.isenabled()
        seen["after both"] = gc.isenabled()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert seen == {"after first": False, "inside second": False, "after both": True}
    assert gc.isenabled()


def test_an_exception_inside_still_resumes_it():
    with pytest.raises(ZeroDivisionError):
        with collection_paused():
            assert not gc.isenabled()
            1 / 0
    assert gc.isenabled()


def test_imports_run_paused_and_leave_every_object_in_the_oldest_generation():
    young = [[] for _ in range(100)]  # (gen 0 now)
    with imports_unwalked():
        assert not gc.isenabled()
        made = [[] for _ in range(100)]
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert gc.get_count()[0] < 50  # gen 0 emptied, not walked
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert all(id(o) in oldest for o in young + made)
    # garbage among them is still garbage: a full collection frees it
    cycle = [made]
    made.append(cycle)
    del cycle, made
    assert gc.collect() > 0


def test_objects_the_user_froze_stay_frozen():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with imports_unwalked():
            pass
        assert gc.get_freeze_count() == frozen and gc.isenabled()
    finally:
        gc.unfreeze()


def test_a_process_forked_while_another_thread_compiles_collects():
    # the child has only the forking thread: the compiling thread's pause,
    # copied into it, never ends there (its collector stayed off for good)
    paused, forked = threading.Event(), threading.Event()

    def compiling():
        with collection_paused():
            paused.set()
            forked.wait(10)
    thread = threading.Thread(target=compiling)
    thread.start()
    paused.wait(10)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave at once
        with collection_paused():
            pass
        os.write(write, b"1" if gc.isenabled() else b"0")
        os._exit(0)
    forked.set()
    thread.join(10)
    os.close(write)
    try:
        assert os.read(read, 1) == b"1"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    assert gc.isenabled()
