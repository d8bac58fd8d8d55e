"""`runtime.interrupts`: a Ctrl-C during a kernel's compile is raised once
the compile has ended, so that the compile is never cut short (Numba's
state after a cut one failed every later compile of the process)."""
import signal

import numpy as np
import pytest

import dsl
from gradlang.runtime import interrupts, loader


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
