"""`runtime.interrupts`: a Ctrl-C during a kernel's compile is raised once
the compile has ended, so that the compile is never cut short (Numba's
state after a cut one failed every later compile of the process)."""
import signal
import sys
import threading

import numpy as np
import pytest

import dsl
from gradlang.runtime import forking, interrupts, loader


@pytest.fixture
def python_handles_ctrl_c():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_during_a_compile_is_raised_after_it(python_handles_ctrl_c, monkeypatch):
    m = dsl.loads("def f(x):\n    return x * 6.5 - 0.375\n")  # a kernel no test loads
    x = np.linspace(-1.0, 1.0, 5)
    compiles = []
    initialize = loader._initialize_runtime

    def pressing_ctrl_c_once(context):  # what a kernel's compile (or cached load) runs first
        compiles.append(context)
        if len(compiles) == 1:
            signal.raise_signal(signal.SIGINT)
        return initialize(context)
    monkeypatch.setattr(loader, "_initialize_runtime", pressing_ctrl_c_once)
    with pytest.raises(KeyboardInterrupt):
        m.f(x)
    pressed = len(compiles)
    np.testing.assert_array_equal(m.f(x), x * 6.5 - 0.375)
    assert len(compiles) == pressed  # the interrupted compile ran to its end
    # and a Ctrl-C outside a compile interrupts at once, as Python's does
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_pressed_again_as_a_compile_ends_is_raised_once(python_handles_ctrl_c,
                                                                monkeypatch):
    # a Ctrl-C during the compile, and another just as Python's handler is
    # back: the second interrupts, and no later compile's end raises the first
    restore = signal.signal

    def pressed_again(signum, handler):
        restore(signum, handler)
        if handler is signal.default_int_handler:
            raise KeyboardInterrupt  # (as the handler would, at the next line)
    with pytest.raises(KeyboardInterrupt):
        with interrupts.interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            monkeypatch.setattr(signal, "signal", pressed_again)
    monkeypatch.setattr(signal, "signal", restore)
    try:
        with interrupts.interrupts_deferred():
            pass
    except KeyboardInterrupt:
        pytest.fail("a later block's end raised the first Ctrl-C again")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def _interrupting_at(n: int, code_file: str, raised: list):
    """A trace function raising KeyboardInterrupt at the n-th line run in
    `code_file`'s functions (as a Ctrl-C's handler does at whichever line
    the eval loop delivers it), `raised` told so."""
    lines = [0]

    def at_line(frame, event, arg):
        if event == "line":
            lines[0] += 1
            if lines[0] == n:
                raised.append(n)
                raise KeyboardInterrupt
        return at_line
    return lambda frame, event, arg: at_line if frame.f_code.co_filename == code_file else None


def _taken_by_another_thread(lock) -> bool:
    taken = []

    def take():
        with lock:
            taken.append(True)
    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    thread.join(2)
    return bool(taken)


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_ctrl_c_at_any_line_of_taking_a_child_safe_lock_leaves_it_free(reentrant):
    # a Ctrl-C delivered just after `__enter__` took the lock, before it
    # returned: `with` never ran `__exit__`, and every other thread's next
    # call of the function (whose programs it guards) waited for ever
    lock = forking.ChildSafeLock(reentrant=reentrant)
    for n in range(1, 10):
        raised: list = []
        sys.settrace(_interrupting_at(n, forking.__file__, raised))
        try:
            with lock:
                sys.settrace(None)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        assert _taken_by_another_thread(lock), f"held after a Ctrl-C at line {n} of entering"
        if not raised:
            break


def test_a_function_interrupted_as_it_takes_its_lock_is_called_by_another_thread():
    m = dsl.loads("def f(x):\n    return x * 2.5 - 0.75\n")
    x = np.linspace(-1.0, 1.0, 4)
    finished = []

    def interrupted_calls():  # (in a thread: where a lock is left held, it waits for ever)
        for n in range(1, 60):  # at each line of gradlang's lock code that a call runs
            raised: list = []
            sys.settrace(_interrupting_at(n, forking.__file__, raised))
            try:
                m.f(x)
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(None)
            if not raised:
                finished.append(n)
                return
    caller = threading.Thread(target=interrupted_calls, daemon=True)
    caller.start()
    caller.join(20)
    assert finished, "a call waited for a lock that an interrupted call left held"
    assert _taken_by_another_thread(m.f._lock)
    np.testing.assert_array_equal(m.f(x[:, None]), x[:, None] * 2.5 - 0.75)
