"""Matrix products on the CPU: NumPy's BLAS, large ones shared out in
blocks (of the product's rows, or of the contraction when it is longer,
whose partial products are then added in order) that a pool of threads
takes in turn, each block on one BLAS thread.

Contract: `matmul(a, b)` is `np.matmul(a, b)` up to the order of the
additions of a contraction in blocks, and the same bits on every run (the
blocks are fixed by the shapes, whichever thread runs each).

Why: OpenBLAS splits a product among its threads in equal parts fixed in
advance and waits for the last; when another process holds a core, the
part waiting for it holds up the whole product.  Measured on 2 cores at
load average 7 (the dense benchmark's products, f32): (4096x512)^T @
(4096x512) took 260 ms on two BLAS threads and 107 ms on one; in 8 row
blocks on two threads of one BLAS thread each 97 ms, in 8 blocks of the
contraction 69 ms (4096x512 @ 512x512: 87, 116 and 76 ms in row blocks).
Blocks taken in turn let a thread that has its core do more of them.
Where NumPy's BLAS is not a bundled OpenBLAS whose thread count can be
set, or it has one thread, products go to NumPy whole.
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

import numpy as np

# Below this many multiply-adds a product goes to NumPy whole: handing out
# blocks costs tens of microseconds.
SHARED_MIN_WORK = 1 << 24
BLOCKS_PER_THREAD = 4


def _openblas_thread_count() -> Optional[tuple[Callable[[], int], Callable[[int], None]]]:
    """The get and set functions of the thread count of the OpenBLAS that
    NumPy bundles, or None."""
    names = (("scipy_openblas_get_num_threads64_", "scipy_openblas_set_num_threads64_"),
             ("openblas_get_num_threads64_", "openblas_set_num_threads64_"),
             ("openblas_get_num_threads", "openblas_set_num_threads"))
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for get, put in names:
            if hasattr(lib, get) and hasattr(lib, put):
                getter, setter = getattr(lib, get), getattr(lib, put)
                getter.restype, setter.restype = ctypes.c_int, None
                setter.argtypes = [ctypes.c_int]
                return getter, setter
    return None


class _SharedProducts:
    """The pool and the BLAS switch, made at the first large product."""

    def __init__(self) -> None:
        self.blas = _openblas_thread_count()
        self.threads = self.blas[0]() if self.blas else 1
        self.pool = ThreadPoolExecutor(self.threads) if self.threads > 1 else None
        # One shared product at a time: each sets BLAS's (process-wide)
        # thread count to 1 while it runs and back after.
        self.lock = threading.Lock()

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        rows, depth = a.shape
        along = rows if rows >= depth else depth
        blocks = min(along, self.threads * BLOCKS_PER_THREAD)
        bounds = [along * k // blocks for k in range(blocks + 1)]
        if rows >= depth:  # blocks of rows of the product
            out = np.empty((rows, b.shape[1]), np.result_type(a, b))

            def block(k: int) -> None:
                lo, hi = bounds[k], bounds[k + 1]
                np.matmul(a[lo:hi], b, out=out[lo:hi])
        else:  # blocks of the contraction (x.T @ dz), then added in order
            parts: list = [None] * blocks

            def block(k: int) -> None:
                lo, hi = bounds[k], bounds[k + 1]
                parts[k] = np.matmul(a[:, lo:hi], b[lo:hi])

        get, put = self.blas
        with self.lock:
            threads = get()
            put(1)
            try:
                list(self.pool.map(block, range(blocks)))
            finally:
                put(threads)
        if rows < depth:
            out = parts[0]
            for part in parts[1:]:
                out += part
        return out


_shared: Optional[_SharedProducts] = None
_shared_lock = threading.Lock()


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    global _shared
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] * a.shape[1] * b.shape[1] < SHARED_MIN_WORK:
        return np.matmul(a, b)
    with _shared_lock:
        if _shared is None:
            _shared = _SharedProducts()
    if _shared.pool is None:
        return np.matmul(a, b)
    return _shared.matmul(a, b)
