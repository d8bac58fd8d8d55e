"""Arrays too large to make: refused before any kernel runs, as a GradError
at the expression making them, named by the call (`runtime.errors.
ArrayTooLarge`).  No test allocates much: the arguments are zero-stride
views (np.broadcast_to), whose sizes cost no memory."""
import sys

import numpy as np
import pytest

import dsl
from dsl import AllocationError, SizeOverflowError
from gradlang.runtime import cpu

SOURCE = """\
def outer(x, y):
    return x[:, None] * y[None, :]

def both(x, y):
    return x * 2.0, x[:, None] * y[None, :]

def total(x):
    return sum(x * x)

def plain_sum(x):
    return sum(x)

def pick(x):
    return x[1] * 2.0

def flip(x):
    return transpose(x)[1] * 2.0

def counted(x, n):
    return x * sum(arange(n) * 1.0)

def spread_sum(x, n: i64):
    return sum(broadcast_to(x, (n, n, n)))
"""
M = dsl.loads(SOURCE, file="too_large.grad")
# 2**20 each: a result of 2**40 f64 (8 TiB), beyond any machine that runs this
WIDE = np.broadcast_to(1.0, (2 ** 20,))
# 2**40 each: 2**80 elements, beyond any size an array has
HUGE = np.broadcast_to(1.0, (2 ** 40,))
OUTER_AT = ("too_large.grad", 2, 12)  # x[:, None] * y[None, :]
TOTAL_AT = ("too_large.grad", 7, 5)  # total's definition


def place(err):
    return (err.file, err.line, err.col)


def test_a_result_beyond_memory_is_refused_before_any_kernel_runs():
    small = np.full(2 ** 20, np.nan)  # (8 MiB) the first result's buffer
    with pytest.raises(AllocationError) as caught:
        M.both(WIDE, WIDE, out=(small, None))
    err = caught.value
    assert isinstance(err, MemoryError) and isinstance(err, dsl.GradError)
    assert err.message == ("both(): one of its results would be f64[1048576, 1048576], 8 TiB, "
                           f"which cannot be allocated: {cpu.common.HOST} has "
                           f"{cpu.common.amount(cpu.ALLOCATABLE)}")
    assert place(err) == ("too_large.grad", 5, 21)
    assert str(err).split("\n")[1:] == ["        return x * 2.0, x[:, None] * y[None, :]",
                                        " " * 24 + "^" * 23]
    assert np.isnan(small).all()  # x * 2.0, whose kernel runs first, never ran into it
    # user code's `except MemoryError` still catches it, as NumPy's would have
    with pytest.raises(MemoryError) as caught:
        M.outer(WIDE, WIDE)
    err = caught.value
    assert place(err) == OUTER_AT and "outer(): its result would be" in str(err)
    # the frames shown are the caller's, not the driver's nor the runtime's
    frames, tb = [], err.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    assert frames[0] == __file__ and not any("runtime" in f or "driver" in f for f in frames)


def test_a_full_sum_whose_partial_sums_are_beyond_memory_is_refused_at_the_sum():
    """A sum fused with what it sums stores none of it, but its parallel
    kernel keeps one partial sum per chunk of 4096 elements: for 10**18
    elements its allocation failed in the kernel, an error at the `def`
    that named nothing."""
    with pytest.raises(AllocationError) as caught:
        M.spread_sum(np.ones(1), 10 ** 6)
    assert caught.value.message == (
        "spread_sum(): the partial sums of a sum it computes would be f64[244140625000000], "
        f"1.73 PiB, which cannot be allocated: {cpu.common.HOST} has "
        f"{cpu.common.amount(cpu.ALLOCATABLE)}")
    assert place(caught.value) == ("too_large.grad", 23, 12)
    assert M.spread_sum(np.full(1, 0.5), 3) == 13.5


def test_a_size_beyond_what_an_array_can_count_is_an_argument_error():
    with pytest.raises(SizeOverflowError) as caught:
        M.outer(HUGE, HUGE)
    err = caught.value
    assert isinstance(err, dsl.ArgumentError) and not isinstance(err, MemoryError)
    assert err.message == ("outer(): its result would be f64[1099511627776, 1099511627776]: "
                           "1208925819614629174706176 elements of 8 bytes, a byte count beyond "
                           "the 9223372036854775807 an array can have")
    assert place(err) == OUTER_AT
    # and the program is fine for sizes that fit (the checks do not misfire)
    np.testing.assert_array_equal(M.outer(np.arange(3.0), np.arange(2.0)),
                                  np.outer(np.arange(3.0), np.arange(2.0)))


def test_every_transform_names_itself():
    cases = {
        "grad(total): its result would be f64[1099511627776], 8 TiB":
            lambda: dsl.grad(M.total)(HUGE),
        "value_and_grad(total): one of its results would be f64[1099511627776]":
            lambda: dsl.value_and_grad(M.total)(HUGE),
        "total(): one of its results would be f64[1099511627776]":  # its forward pass
            lambda: dsl.vjp(M.total, HUGE),
        # a helper (the sum's) would make a zero-stride argument contiguous first
        "plain_sum(): a contiguous copy of its argument 'x' would be f64[1099511627776]":
            lambda: dsl.vjp(M.plain_sum, HUGE),
        "outer(): one of its results would be f64[1048576, 1048576]":
            lambda: dsl.jvp(M.outer, (WIDE, WIDE), (WIDE, WIDE)),
        "vmap(outer): its result would be f64[3, 1048576, 1048576]":
            lambda: dsl.vmap(M.outer)(np.broadcast_to(1.0, (3, 2 ** 20)),
                                      np.broadcast_to(1.0, (3, 2 ** 20))),
        # a Jacobian is refused before any of its columns is worked out
        "jacfwd(total): the Jacobian of its result with respect to 'x' would be "
        "f64[1099511627776], 8 TiB":
            lambda: dsl.jacfwd(M.total)(HUGE),
        "jacrev(outer): the Jacobian of its result with respect to 'x' would be "
        "f64[1048576, 1, 1048576]":
            lambda: dsl.jacrev(M.outer)(WIDE, np.ones(1)),
        # (also where an integer argument gives a size: it was not checked, and
        # the columns were worked out until the machine ran out of memory)
        "jacrev(counted): the Jacobian of its result with respect to 'x' would be "
        "f64[1048576, 1048576]":
            lambda: dsl.jacrev(M.counted)(WIDE, np.int64(3)),
        "hessian(total): the Jacobian of its result with respect to 'x' would be "
        "f64[1000000, 1000000], 7.28 TiB":
            lambda: dsl.hessian(M.total)(np.broadcast_to(1.0, (10 ** 6,))),
        # taken as a function (its jvp), its one-hot tangents are refused by name
        # before NumPy is asked for them ("Unable to allocate 7.28 TiB")
        "jacfwd(total): the one-hot tangents along 'x' would be f64[1000000, 1000000]":
            lambda: dsl.jvp(dsl.jacfwd(M.total), (np.broadcast_to(1.0, (10 ** 6,)),),
                            (np.broadcast_to(1.0, (10 ** 6,)),)),
    }
    for message, call in cases.items():
        with pytest.raises(AllocationError) as caught:
            call()
        assert caught.value.message.startswith(message), (message, caught.value.message)
        assert caught.value.file == "too_large.grad" and caught.value.source == SOURCE


def test_an_empty_value_whose_other_axes_no_size_counts_is_refused_at_its_expression():
    """NumPy counts an empty array's nonzero axes too (np.empty((2**62, 0))
    is 'array is too big'): reshape(x, (2**40, 2**40, 0)) of an empty x,
    which the size check passed (0 elements), raised NumPy's ValueError
    from the driver, and so did segment_sum's count 2**62 of empty rows."""
    m = dsl.loads("def r(x, a: const i64, b: const i64):\n    return reshape(x, (a, b, 0)) * 2.0\n"
                  "def pool(x, seg: i64[n], k: const i64):\n    return segment_sum(x, seg, k)\n",
                  file="empty.grad")
    with pytest.raises(dsl.GradError, match=r"f64\[1099511627776, 1099511627776, 0\] is empty, "
                       r"but the sizes of its other axes multiply beyond") as caught:
        m.r(np.zeros(0), 2 ** 40, 2 ** 40)
    assert place(caught.value) == ("empty.grad", 2, 12)
    assert m.r(np.zeros(0), 2 ** 20, 2 ** 20).shape == (2 ** 20, 2 ** 20, 0)
    with pytest.raises(dsl.ArgumentError, match=r"shape \[4611686018427387904, 0\] and dtype "
                       r"float64 is empty, but the sizes"):
        m.pool(np.zeros((2, 0)), np.array([0, 1]), 2 ** 62)
    assert m.pool(np.zeros((2, 0)), np.array([0, 1]), 3).shape == (3, 0)


@pytest.mark.parametrize("jacobian", [dsl.jacfwd, dsl.jacrev])
def test_an_empty_jacobian_whose_other_axes_no_size_counts_is_refused(jacobian):
    """jacrev of an empty result with respect to a 2**20 x 2**20 argument
    (Jacobian f64[0, 2**20, 2**20, 2**20]) passed the host-room check (0
    bytes) and raised NumPy's ValueError as it assembled the rows."""
    f = dsl.loads("def f(x):\n    return x[:0] * 2.0\n", file="empty.grad").f
    with pytest.raises(SizeOverflowError, match=r"the Jacobian of its result with respect to 'x' "
                       r"would be f64\[0, 1048576, 1048576, 1048576\]: empty, but the sizes"):
        jacobian(f)(np.broadcast_to(1.0, (2 ** 20, 2 ** 20)))
    assert jacobian(f)(np.ones((2, 3))).shape == (0, 3, 2, 3)

def test_a_slice_of_a_zero_stride_argument_is_no_copy_of_it():
    # x[1] is a view of x (a gather of the row alone on a device), as is a
    # transpose here: nothing of x's size is made, whatever its logical size
    assert M.pick(HUGE) == 2.0
    square = np.broadcast_to(np.arange(2.0 ** 20), (2 ** 20, 2 ** 20))
    np.testing.assert_array_equal(M.pick(square), 2 * np.arange(2.0 ** 20))
    np.testing.assert_array_equal(M.flip(square), np.full(2 ** 20, 2.0))
    with pytest.raises(AllocationError, match=r"grad\(pick\): its result would be "
                       r"f64\[1099511627776\]"):  # (its gradient is x's size)
        dsl.grad(M.pick)(HUGE)


def test_a_failed_allocation_is_an_allocation_error(monkeypatch):
    # sizes the checks pass, where the memory is not there when asked for
    def pooled(shape, dtype):
        raise MemoryError("Unable to allocate 7.28 TiB for an array with shape (10**12,)")
    monkeypatch.setattr(cpu, "pooled", pooled)
    with pytest.raises(AllocationError) as caught:
        dsl.grad(M.total)(np.ones(2 ** 16))
    err = caught.value
    assert err.message == ("grad(total): ran out of memory (Unable to allocate 7.28 TiB for an "
                           "array with shape (10**12,))")
    assert place(err) == TOTAL_AT and err.__cause__ is None  # (the boundary's cut)

    def pooled_silently(shape, dtype):
        raise MemoryError
    monkeypatch.setattr(cpu, "pooled", pooled_silently)
    with pytest.raises(AllocationError, match=r"^too_large.grad:7:5: error: "
                       r"value_and_grad\(total\): ran out of memory \(an allocation failed\)"):
        dsl.value_and_grad(M.total)(np.ones(2 ** 16))  # (its gradient's 2**16: pooled)


GROW = ("def grow(x, n: i64):\n"
        "    for i in range(n):\n"
        "        x = sin(x) * 0.9\n"
        "    return sum(x)\n")


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_loops_stacks_beyond_memory_are_refused_before_they_are_made(monkeypatch, target):
    """What a loop keeps of its trips for the gradient was checked only
    against what an array can count: past the machine's memory its
    allocation was left to fail, which under a container's limit it does
    not (the process is killed filling it), and a pool's block made the
    error say 80 TiB for 72.8."""
    from gradlang.runtime import cuda as rcuda
    module = cpu if target == "cpu" else rcuda
    monkeypatch.setattr(module, "ALLOCATABLE", 2 ** 20, raising=False)
    grad = dsl.grad(dsl.loads(GROW, file="grow.grad", target=target, host_results=True).grow)
    with pytest.raises(AllocationError) as caught:
        grad(np.ones(100), 2000)
    assert caught.value.message == (
        "grad(grow): the loop runs 2000 trips and keeps 800 bytes of each for its gradient, "
        f"1.53 MiB, which cannot be allocated: {module.common.HOST} has 1 MiB")
    assert place(caught.value) == ("grow.grad", 2, 5)
    x, want = np.array([0.5, -1.0]), np.ones(2)
    for _ in range(4):  # (100 trips, 1600 bytes: kept)
        want, x = want * np.cos(x) * 0.9, np.sin(x) * 0.9
    np.testing.assert_allclose(grad(np.array([0.5, -1.0]), 4), want, rtol=1e-14)
    assert grad(np.ones(2), 100).shape == (2,)


def test_the_fast_paths_driver_checks_only_what_no_argument_holds():
    # the driver for C-contiguous arguments: log1pexp-like programs, whose
    # arrays are no larger than an argument, pay for no check
    grad_total = dsl.grad(M.total)
    program = grad_total.program(grad_total.bind((np.ones(3),), {}))
    assert "R.too_large" in program.generated.driver_source  # (a view may be zero-stride)
    assert "R.too_large" not in program.generated.contiguous_driver_source
    program = M.outer.program(M.outer.bind((np.ones(3), np.ones(2)), {}))
    assert program.generated.contiguous_driver_source.count("R.too_large") == 1


def test_cuda_refuses_on_the_device_and_before_copying():
    m = dsl.loads(SOURCE, file="too_large.grad", target="cuda")
    with pytest.raises(AllocationError) as caught:
        m.outer(WIDE, WIDE)  # x and y copied over (8 MiB each): the result is refused
    assert caught.value.message.startswith("outer(): its result would be "
                                           "f64[1048576, 1048576], 8 TiB")
    assert place(caught.value) == OUTER_AT
    with pytest.raises(AllocationError) as caught:
        m.outer(HUGE, np.ones(1))
    assert caught.value.message.startswith(
        "argument 'x' of outer(), copied to the device, would be f64[1099511627776], 8 TiB")
    assert place(caught.value) == ("too_large.grad", 1, 5)


def test_the_bridges_name_themselves():
    torch = pytest.importorskip("torch")
    wide = torch.ones(1, dtype=torch.float64).expand(2 ** 20)
    with pytest.raises(AllocationError) as caught:
        dsl.to_torch(M.outer)(wide, wide)
    assert caught.value.message.startswith("to_torch(outer): its result would be "
                                           "f64[1048576, 1048576], 8 TiB")
    assert place(caught.value) == OUTER_AT
    # under jax.jit XLA makes the results: refused as it traces the call
    # (it was NumPy's MemoryError, planning the call's FFI handler)
    jax = pytest.importorskip("jax")
    wide = jax.numpy.ones(2 ** 20, np.float32)
    with pytest.raises(AllocationError) as caught:
        jax.jit(dsl.to_jax(M.outer))(wide, wide)
    assert caught.value.message.startswith("to_jax(outer): its result would be "
                                           "f32[1048576, 1048576], 4 TiB")
    assert place(caught.value) == ("too_large.grad", 1, 5)  # (outer's definition)


def test_a_compiled_module_refuses_as_dsl_does(tmp_path, monkeypatch):
    from dsl.aot import compile_module
    (tmp_path / "big_outer.grad").write_text(SOURCE)
    compile_module(str(tmp_path / "big_outer.grad"), str(tmp_path / "out"),
                   ["outer(f64[:], f64[:])"])
    monkeypatch.syspath_prepend(str(tmp_path / "out"))
    monkeypatch.delitem(sys.modules, "big_outer", raising=False)
    import importlib
    compiled = importlib.import_module("big_outer")
    with pytest.raises(AllocationError, match=r"/big_outer.grad:2:12: error: outer\(\): its "
                       r"result would be f64\[1048576, 1048576\], 8 TiB"):
        compiled.outer(WIDE, WIDE)
    with pytest.raises(SizeOverflowError, match="1208925819614629174706176 elements"):
        compiled.outer(HUGE, HUGE)


def write_cgroup(tmp_path, membership, files):
    """A fake /sys/fs/cgroup under tmp_path and a /proc/self/cgroup for it."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text + "\n")
    (tmp_path / "self_cgroup").write_text(membership)
    return dict(root=str(tmp_path), membership=str(tmp_path / "self_cgroup"))


GIB = 2 ** 30


@pytest.mark.parametrize("membership, files, expected", [
    # v2: memory.max plus the swap it allows (less than the machine's 4 GiB)
    ("0::/job\n", {"job/memory.max": str(8 * GIB), "job/memory.swap.max": str(GIB)}, 9 * GIB),
    # v2: an ancestor's limit is tighter; swap unlimited counts the machine's
    ("0::/batch/job\n", {"batch/job/memory.max": str(8 * GIB), "batch/memory.max": str(2 * GIB),
                         "batch/job/memory.swap.max": "max"}, 6 * GIB),
    # v2 in a container (its own cgroup seen as the root)
    ("0::/\n", {"memory.max": str(3 * GIB)}, 7 * GIB),
    # v2 without a limit
    ("0::/job\n", {"job/memory.max": "max"}, None),
    # v1: memsw is memory and swap together
    ("4:memory:/job\n0::/\n", {"memory/job/memory.limit_in_bytes": str(2 * GIB),
                                "memory/job/memory.memsw.limit_in_bytes": str(3 * GIB)}, 3 * GIB),
    # v1 without memsw accounting, beside other controllers; "unlimited" is near 2**63
    ("5:cpu:/x\n4:memory,hugetlb:/job\n", {"memory/job/memory.limit_in_bytes": str(2 * GIB),
                                            "memory/memory.limit_in_bytes": "9223372036854771712"},
     6 * GIB),
    ("4:memory:/job\n", {"memory/memory.limit_in_bytes": "9223372036854771712"}, None),
    ("", {}, None),
])
def test_a_cgroups_memory_limit_bounds_what_an_array_may_take(tmp_path, membership, files,
                                                               expected):
    """A container's or batch job's limit is the most a process may have
    (past it the kernel kills the process, no MemoryError): arrays beyond it
    are refused as beyond the machine's memory are."""
    where = write_cgroup(tmp_path, membership, files)
    assert cpu.common.cgroup_memory_limit(4 * GIB, **where) == expected


def test_no_cgroup_file_means_no_limit(tmp_path):
    assert cpu.common.cgroup_memory_limit(0, root=str(tmp_path),
                                          membership=str(tmp_path / "absent")) is None


def test_a_result_of_slices_lengths_beyond_memory_is_refused_at_its_expression():
    # (n - 1)**2 elements of x[1:]'s outer product: the length max(0, n - 1)
    # was no argument's size, so nothing checked it, and the call ran until
    # the allocation failed ("ran out of memory", at the `def`)
    m = dsl.loads("def outer(x):\n    return x[1:, None] * x[None, 1:]\n", file="slices.grad")
    with pytest.raises(AllocationError) as caught:
        m.outer(WIDE)
    assert caught.value.message.startswith(
        "outer(): its result would be f64[1048575, 1048575], 8 TiB, which cannot be allocated")
    assert place(caught.value) == ("slices.grad", 2, 12)
