"""The busy-machine policy (`runtime.parallelism`): its decision from
injected load figures, GRADC_PARALLEL's override, and that a loop gives
the same bits whichever way the policy goes (a full sum's serial variant
adds `_all`'s chunks in the same order).  No timing is asserted and no
result depends on the machine's load."""
import math
import os
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest

import dsl
from gradlang.runtime import cpu, parallelism
from gradlang.runtime.parallelism import BUSY_FACTOR, parallel_from


@pytest.mark.parametrize("others, cores, threads, scale", [
    (0, 2, 2, 1.0),              # idle: from the threshold
    (0.0, 16, 16, 1.0),
    (1, 2, 2, BUSY_FACTOR),      # a core is taken: only long loops
    (3.5, 2, 2, BUSY_FACTOR),    # (the load average, where /proc/loadavg is missing)
    (1, 16, 16, BUSY_FACTOR),
    (2, 8, 4, 1.0),              # fewer threads than cores: free enough
    (5, 8, 4, BUSY_FACTOR),
])
def test_auto_runs_short_loops_in_parallel_only_where_each_thread_finds_a_free_core(
        others, cores, threads, scale):
    assert parallel_from("auto", others, cores, threads) == scale


@pytest.mark.parametrize("others", [0, 1, 7])
def test_always_and_never_ignore_the_load(others):
    assert parallel_from("always", others, 2, 2) == 1.0
    assert parallel_from("never", others, 2, 2) == math.inf


@pytest.mark.parametrize("size, wanted", [(4096, True), (4095, False)])
def test_always_keeps_the_size_threshold(gradc_parallel, size, wanted):
    gradc_parallel("always")
    assert parallelism.parallel_allowed(size, 4096) is wanted


def test_never_runs_no_loop_in_parallel_however_long(gradc_parallel):
    gradc_parallel("never")
    assert not parallelism.parallel_allowed(1 << 40, 4096)


def test_the_load_is_read_again_only_after_the_recheck_interval(gradc_parallel, monkeypatch):
    gradc_parallel("never")
    assert not parallelism.parallel_allowed(4096, 4096)
    monkeypatch.setenv("GRADC_PARALLEL", "always")  # not yet read
    assert not parallelism.parallel_allowed(4096, 4096)
    monkeypatch.setattr(parallelism, "_next_check", 0.0)  # the interval has passed
    assert parallelism.parallel_allowed(4096, 4096)


def test_a_bad_setting_warns_and_means_auto(gradc_parallel, monkeypatch):
    parallelism._setting.cache_clear()
    gradc_parallel("sometimes")
    monkeypatch.setattr(parallelism, "_runnable_others", lambda: 0)
    monkeypatch.setattr(parallelism, "_cores", lambda: 2)
    monkeypatch.setattr(parallelism.numba.config, "NUMBA_NUM_THREADS", 2)
    with pytest.warns(RuntimeWarning, match="GRADC_PARALLEL='sometimes'.*auto"):
        assert parallelism.parallel_allowed(4096, 4096)
    monkeypatch.setattr(parallelism, "_next_check", 0.0)
    monkeypatch.setattr(parallelism, "_runnable_others", lambda: 1)  # now busy
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once
        assert not parallelism.parallel_allowed(4096 * BUSY_FACTOR - 1, 4096)


def test_the_own_threads_are_not_counted_as_others():
    # the caller is running: at least itself
    assert parallelism._own_running() >= 1
    assert parallelism._runnable_others() >= 0


SUMS = """
def total(x):
    return sum(x * x)

def rows(x):
    return sum(x * x, axis=1)
"""


@pytest.fixture(scope="module")
def sums():
    return dsl.loads(SUMS, "sums.grad")


def test_a_long_sum_has_the_same_bits_serial_as_parallel(sums, gradc_parallel):
    """`_all_serial` (busy) adds the chunks `_all` (idle) adds, in order."""
    x = np.random.default_rng(0).uniform(-1, 1, 3 * cpu.REDUCE_CHUNK + 17) * 1e3
    results = {}
    for value in ("always", "never"):
        gradc_parallel(value)
        results[value] = (sums.total(x), sums.rows(x.reshape(1, -1)),
                          cpu.reduce_sum(x, (0,)))
    for parallel, serial in zip(results["always"], results["never"]):
        assert parallel.tobytes() == serial.tobytes()
    np.testing.assert_allclose(results["always"][0], np.sum(x * x), rtol=1e-13)
    np.testing.assert_allclose(results["always"][2], np.sum(x), rtol=1e-12, atol=1e-9)


CLIPPED = """
def f(m, s, g):
    return g * arctan(s * min(m, axis=0, initial=-0.5))
"""


def test_a_long_sum_fused_with_selects_has_the_same_bits_serial_as_parallel(gradc_parallel):
    """(found by the differential fuzzer at large sizes) The gradient wrt s
    is a full sum in the loop that writes the other gradients through
    selects: `_all` and `_all_serial` each held a copy of the chunk loop,
    which LLVM vectorized in two ways, adding the summands in two orders
    (1.6e-13 apart); both now call one compiled `_chunk`."""
    f = dsl.value_and_grad(dsl.loads(CLIPPED, "clipped.grad").f, wrt=(0, 1, 2))
    rng = np.random.default_rng(0)
    m, s, g = rng.uniform(-2, 2, (3, 21000)), np.array(0.7), rng.uniform(-2, 2, 21000)
    results = {}
    for value in ("always", "never"):
        gradc_parallel(value)
        results[value] = f(m, s, g)[1]
    for parallel, serial in zip(results["always"], results["never"]):
        assert parallel.tobytes() == serial.tobytes()
    low = np.minimum(m.min(axis=0), -0.5)
    np.testing.assert_allclose(results["always"][1], np.sum(g * low / (1 + (s * low) ** 2)),
                               rtol=1e-12)


def test_rows_have_the_same_values_serial_as_parallel(sums, gradc_parallel):
    x = np.random.default_rng(1).uniform(-1, 1, (64, cpu.PARALLEL_THRESHOLD // 32))
    results = {}
    for value in ("always", "never"):
        gradc_parallel(value)
        results[value] = (sums.rows(x), cpu.reduce_sum(x, (1,)))
    for parallel, serial in zip(results["always"], results["never"]):
        assert parallel.tobytes() == serial.tobytes()
    np.testing.assert_allclose(results["always"][0], np.sum(x * x, axis=1), rtol=1e-13)


STORED_AND_SUMMED = """
def f(x, y):
    d = x - y
    return 2.0 * d, sum(d * d)
"""


def test_a_sum_has_the_same_bits_wherever_its_arrays_lie():
    """One kernel writes 2 d and sums d * d.  Not told that its arrays do
    not overlap, LLVM checked at run time whether the output began within
    a few vectors after an input, and if so ran a scalar copy of the loop,
    which adds in order where the vector loop adds in lanes: a Dask
    block's partial loss changed by an ulp from call to call under the
    threaded scheduler, as its threads' allocations fell.  Forced here: the
    `out=` buffer right after x in memory, then 512 bytes after it.  The
    data tell the orders apart: in order, each 1 added to 1e16 is lost."""
    f = dsl.loads(STORED_AND_SUMMED, "stored_and_summed.grad").f
    for n in (10, 24):  # a Dask block's rows; past an AVX2 loop's 16
        x, y = np.ones(n), np.zeros(n)
        x[0] = 1e8
        memory = np.empty(2 * n + 64)
        memory[:n] = x
        results = []
        for gap in (0, 64):
            buffer = memory[n + gap:2 * n + gap]
            doubled, total = f(memory[:n], y, out=(buffer, None))
            assert doubled is buffer
            results.append((doubled.copy(), total))
        (adjacent, adjacent_sum), (apart, apart_sum) = results
        assert adjacent_sum.tobytes() == apart_sum.tobytes(), n
        np.testing.assert_array_equal(adjacent, apart)
        np.testing.assert_array_equal(adjacent, 2.0 * x)
        np.testing.assert_allclose(apart_sum, 1e16 + n - 1, rtol=1e-14)


FORKED = """
import multiprocessing, os, sys
import numpy as np
import dsl
from gradlang.runtime import cpu

os.environ["GRADC_PARALLEL"] = "always"
rows = dsl.loads(sys.argv[1], "sums.grad").rows
x = np.random.default_rng(2).uniform(-1, 1, (64, cpu.PARALLEL_THRESHOLD // 32))
expected = rows(x).tobytes()  # in parallel, here


def child(results):
    results.put(rows(x).tobytes())


if __name__ == "__main__":
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    process = context.Process(target=child, args=(results,))
    process.start()
    process.join(60)
    if process.is_alive():
        process.kill()
    assert process.exitcode == 0, process.exitcode
    assert results.get(timeout=5) == expected  # (the serial kernel's bits are the same)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_child_forked_after_a_parallel_kernel_runs_its_loops_serially(tmp_path):
    # GNU OpenMP cannot run in a child forked after its threads ran: Numba
    # terminated the child at its first parallel kernel ("fork() called from
    # a process already using GNU OpenMP"), so a multiprocessing worker died
    # and a Pool waited for it for ever.  (In a process of its own: a fork
    # here could copy other tests' threads, JAX's, mid-lock.)
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    done = subprocess.run([sys.executable, str(script), SUMS], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_after_a_product_loops_run_as_on_a_busy_machine(gradc_parallel, monkeypatch):
    """OpenBLAS's workers spin on a core for a while after a product: a
    loop then takes its parallel kernel only from BUSY_FACTOR times its
    threshold, under auto (always keeps the size threshold alone)."""
    monkeypatch.setattr(parallelism, "_runnable_others", lambda: 0)
    monkeypatch.setattr(parallelism, "_cores", lambda: 2)
    monkeypatch.setattr(parallelism.numba.config, "NUMBA_NUM_THREADS", 2)
    monkeypatch.setattr(parallelism, "_blas_until", 0.0)
    # (a loaded CI machine may pause this thread past the real 0.1 s)
    monkeypatch.setattr(parallelism, "BLAS_SPIN_SECONDS", 600.0)
    gradc_parallel("auto")
    assert parallelism.parallel_allowed(4096, 4096)
    # a product BLAS runs on this thread (small, or of integers) wakes no workers
    for a in (np.arange(6.0).reshape(3, 2), np.arange(2 * 9216).reshape(9216, 2)):
        b = np.arange(2, dtype=a.dtype).reshape(2, 1)
        np.testing.assert_array_equal(cpu.matmul(a, b), a @ b)
        assert parallelism.parallel_allowed(4096, 4096)
    a = np.arange(2.0 * 9216).reshape(9216, 2)
    np.testing.assert_array_equal(cpu.matmul(a, b.astype(float)), a @ b)
    assert not parallelism.parallel_allowed(4096 * BUSY_FACTOR - 1, 4096)
    assert parallelism.parallel_allowed(4096 * BUSY_FACTOR, 4096)
    gradc_parallel("always")
    assert parallelism.parallel_allowed(4096, 4096)
    monkeypatch.setattr(parallelism, "_blas_until", 0.0)  # the workers sleep again
    gradc_parallel("auto")
    assert parallelism.parallel_allowed(4096, 4096)


def test_on_workqueue_only_the_main_thread_launches(gradc_parallel, monkeypatch):
    """Two threads launching at once abort the process on workqueue."""
    gradc_parallel("always")
    monkeypatch.setattr(parallelism, "_launcher", threading.main_thread().ident)
    asked = []
    other = threading.Thread(target=lambda: asked.append(parallelism.parallel_allowed(1 << 20,
                                                                                     4096)))
    other.start()
    other.join()
    assert asked == [False] and parallelism.parallel_allowed(1 << 20, 4096)
    monkeypatch.setattr(parallelism, "_launcher", 0)  # a thread-safe layer: any thread
    other = threading.Thread(target=lambda: asked.append(parallelism.parallel_allowed(1 << 20,
                                                                                     4096)))
    other.start()
    other.join()
    assert asked == [False, True]


ON_WORKQUEUE = """
import sys, threading
import numpy as np, numba, dsl

total = dsl.loads(sys.argv[1], "sums.grad").total
x = np.random.default_rng(3).uniform(-1, 1, 1 << 21)
expected = total(x)  # in parallel, on the main thread
assert numba.threading_layer() == "workqueue", numba.threading_layer()
got = []
def work():
    for _ in range(5):
        got.append(total(x))
threads = [threading.Thread(target=work) for _ in range(3)]
for t in threads:
    t.start()
work()
for t in threads:
    t.join()
assert len(got) == 20 and all(g.tobytes() == expected.tobytes() for g in got)
np.testing.assert_allclose(expected, np.sum(x * x), rtol=1e-12)
"""


def test_on_the_workqueue_layer_threads_call_long_loops_at_once_safely(tmp_path):
    # Numba's workqueue layer (its fallback where no OpenMP loads, or the
    # user's choice) aborted the process ("Concurrent access has been
    # detected") when two threads launched parallel kernels at once, as a
    # Dask threaded scheduler's do; four threads here.
    script = tmp_path / "on_workqueue.py"
    script.write_text(ON_WORKQUEUE)
    done = subprocess.run([sys.executable, str(script), SUMS], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "NUMBA_THREADING_LAYER": "workqueue",
                                            "GRADC_PARALLEL": "always"})
    assert done.returncode == 0, done.stderr[-2000:]
