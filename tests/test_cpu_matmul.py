"""Large CPU matrix products run in row blocks on a pool of threads, each on
one BLAS thread (`runtime.cpu_matmul`): they equal NumPy's, repeat bit for
bit, and leave BLAS's thread count as they found it."""
import numpy as np
import pytest

from gradlang.runtime import cpu_matmul


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_shared_products_match_numpy_and_repeat_exactly(dtype):
    rng = np.random.default_rng(0)
    a = rng.normal(size=(301, 700)).astype(dtype)
    b = rng.normal(size=(700, 83)).astype(dtype)
    assert a.shape[0] * a.shape[1] * b.shape[1] >= cpu_matmul.SHARED_MIN_WORK
    blas = cpu_matmul._openblas_thread_count()
    before = blas[0]() if blas else None
    rtol = 1e-4 if dtype == np.float32 else 1e-12
    # blocks of the contraction (700 > 301 rows), of rows (700 > 301), an
    # F-ordered operand, and transposed views as the gradient takes them
    for x, y in ((a, b), (a.T, a[:, :83]), (a.T.copy().T, b), (b.T, a.T)):
        got = cpu_matmul.matmul(x, y)
        assert got.dtype == dtype and got.shape == (x.shape[0], y.shape[1])
        np.testing.assert_allclose(got, np.matmul(x, y), rtol=rtol, atol=rtol * 10)
        np.testing.assert_array_equal(cpu_matmul.matmul(x, y), got)
    if blas:
        assert blas[0]() == before


def test_small_and_batched_products_go_to_numpy_whole():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(4, 5)), rng.normal(size=(5, 3))
    np.testing.assert_array_equal(cpu_matmul.matmul(a, b), np.matmul(a, b))
    a3, b3 = rng.normal(size=(2, 4, 5)), rng.normal(size=(2, 5, 3))
    np.testing.assert_array_equal(cpu_matmul.matmul(a3, b3), np.matmul(a3, b3))
