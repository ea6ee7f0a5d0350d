"""Large results from the pool (spfuse._kernels._result_pool): memory is
reused only once nothing reads it any more -- no live result, view, torch
tensor or sparse array ever shares memory with a newer result."""
from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse._kernels import _result_pool as pool

F64 = np.dtype(np.float64)
BIG = (1024, 1024)   # 8 MiB: pooled


def test_small_results_are_plain_arrays():
    a = pool.empty((10, 10), F64)
    assert a.flags.owndata and a.shape == (10, 10)


def test_memory_returns_when_the_last_view_dies():
    pool.release()
    a = pool.empty(BIG, F64)
    assert a.flags.writeable and a.flags.c_contiguous and a.flags.aligned
    a[:] = 1.0
    view, address = a[3:5], a.ctypes.data
    del a
    gc.collect()
    b = pool.empty(BIG, F64)
    assert not np.shares_memory(b, view)            # a view still reads the first block
    np.testing.assert_array_equal(view, 1.0)
    del view
    assert pool.kept() == (1, BIG[0] * BIG[1] * 8)
    c = pool.empty(BIG, F64)
    assert c.ctypes.data == address and pool.kept() == (0, 0)


def test_the_pool_keeps_at_most_its_limits(monkeypatch):
    pool.release()
    monkeypatch.setattr(pool, "MAX_BLOCKS", 2)
    arrays = [pool.empty(BIG, F64) for _ in range(4)]
    del arrays
    assert pool.kept()[0] == 2
    other = pool.empty((2048, 1024), F64)   # a size not asked for before
    del other
    assert pool.kept() == (2, (BIG[0] * BIG[1] + 2048 * 1024) * 8)   # the oldest block went
    pool.release()
    assert pool.kept() == (0, 0)


@pytest.mark.parametrize("shape", [7 << 20, (4096, 512), (2, 1024, 1024)])
def test_any_shape_and_dtype(shape):
    for dtype in (np.float32, np.float64, np.int64):
        a = pool.empty(shape, dtype)
        assert a.shape == (shape if isinstance(shape, tuple) else (shape,)) and a.dtype == dtype


def test_results_of_repeated_calls_never_share_memory_while_alive():
    rng = np.random.default_rng(0)
    n, K = 20_000, 64   # a 10 MB SpMM result
    A = sp.random_array((n, n), density=5 / n, format="csr", rng=rng)
    B = rng.standard_normal((n, K))
    want = A @ B
    program = spfuse.compile("C[i,k] = A[i,j] * B[j,k]")
    kept = [program(A=A, B=B) for _ in range(3)]
    for i in range(3):
        for j in range(i):
            assert not np.shares_memory(kept[i], kept[j])
        np.testing.assert_allclose(kept[i], want, rtol=1e-12, atol=1e-12)
    # dropped one by one: the next results reuse the memory, the kept ones keep their values
    address = kept[0].ctypes.data
    kept.pop(0)
    again = program(A=A, B=2.0 * B)
    assert again.ctypes.data == address
    np.testing.assert_allclose(again, 2.0 * want, rtol=1e-12, atol=1e-12)
    for k in kept:
        np.testing.assert_allclose(k, want, rtol=1e-12, atol=1e-12)


def test_a_torch_tensor_keeps_its_memory():
    torch = pytest.importorskip("torch")
    a = pool.empty(BIG, F64)
    a[:] = 3.0
    t = torch.from_numpy(a)
    del a
    b = pool.empty(BIG, F64)
    b[:] = -1.0
    assert float(t.sum()) == 3.0 * BIG[0] * BIG[1]


def test_threads_take_and_give_back_safely():
    errors: list = []

    def work(value: float):
        try:
            for _ in range(50):
                a = pool.empty(BIG, F64)
                a.fill(value)
                assert float(a[0, 0]) == value and float(a[-1, -1]) == value
                del a
        except Exception as e:   # (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(v,)) for v in (1.0, 2.0, 3.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool.kept()[0] <= pool.MAX_BLOCKS
