"""Repeated calls do not leak: Python-level allocations (tracemalloc) and the whole
process (RSS from ``/proc/self/statm``, which also sees the Cython kernels'
``malloc``/``calloc`` and OpenMP) stay flat after warm-up.

Each test makes 10,000 untraced calls and reads RSS after 2,000 and after
10,000 (growth must stay under ``RSS_BOUND`` -- about 100 bytes a call), then
traces a further window with tracemalloc (a leak of a few bytes a call shows).
Programs: SpMV and SDDMM (template kernels), SpGEMM (sparse output), and
``y[i] = max(j, abs(A[i,j]))`` (generic loop-tree executor); plus calls that raise
half of the time (bad operand, shape mismatch, max over an empty extent).
"""
import gc
import os
import sys
import tracemalloc

import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse.testing import random_sparse

CALLS = int(os.environ.get("SPFUSE_MEMORY_CALLS", 10_000))
TRACED_CALLS = 1_500
RSS_BOUND = 1 << 20           # bytes of RSS growth allowed between call 2,000 and call 10,000
TRACED_BOUND = 48 << 10       # bytes of traced growth allowed over TRACED_CALLS calls

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm")

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * _PAGE


def _bad_csr(shape):
    """A CSR whose last index is out of range (refused by validation, every call)."""
    m = sp.csr_array(np.eye(*shape))
    m.indices = m.indices.copy()
    m.indices[-1] = shape[1] + 5
    return m


def _make(name):
    rng = np.random.default_rng(0)
    A = random_sparse(rng, (30, 20), 0.2, "csr")
    x = rng.standard_normal(20)
    if name == "SpMV":
        return lambda: spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x)
    if name == "SDDMM":
        C, D = rng.standard_normal((30, 4)), rng.standard_normal((4, 20))
        k = spfuse.compile("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", B="csr")
        return lambda: k(B=A, C=C, D=D)
    if name == "SpGEMM":
        B = random_sparse(rng, (20, 15), 0.2, "csr")
        return lambda: spfuse.evaluate("C[i,k] = A[i,j] * B[j,k]", A=A, B=B)
    if name == "generic-max":
        small = random_sparse(rng, (8, 6), 0.3, "csr", canonical=False)
        return lambda: spfuse.evaluate("y[i] = max(j, abs(A[i,j]))", A=small, num_threads=1)
    if name == "raising":
        bad = _bad_csr((30, 20))
        empty = sp.csr_array((4, 0))
        calls = [
            lambda: spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x),
            lambda: spfuse.evaluate("y[i] = A[i,j] * x[j]", A=bad, x=x),            # InvalidOperandError
            lambda: spfuse.evaluate("y[i] = max(j, abs(A[i,j]))", A=A, num_threads=1),
            lambda: spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x[:-1]),         # ProgramError
            lambda: spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x),
            lambda: spfuse.evaluate("y[i] = max(j, abs(A[i,j]))", A=empty, num_threads=1),  # empty max
        ]
        state = [0]

        def call():
            f = calls[state[0] % len(calls)]
            state[0] += 1
            try:
                f()
            except ValueError:  # every spfuse error raised here is a ValueError
                pass
        return call
    raise KeyError(name)


@pytest.mark.parametrize("name", ["SpMV", "SDDMM", "SpGEMM", "generic-max", "raising"])
def test_repeated_calls_do_not_grow_memory(name):
    call = _make(name)
    assert not tracemalloc.is_tracing()
    for _ in range(300):             # warm-up: plans cached, lazy imports done, pools grown
        call()
    gc.collect()
    at = {}
    for n in range(CALLS):
        call()
        if n + 1 in (2_000, CALLS):
            gc.collect()
            at[n + 1] = rss()
    growth = at[CALLS] - at[2_000]
    assert growth < RSS_BOUND, f"{name}: RSS grew by {growth} bytes over {CALLS - 2_000} calls"

    tracemalloc.start()
    try:
        for _ in range(300):          # warm-up under tracing (first traced allocations)
            call()
        gc.collect()
        before = tracemalloc.take_snapshot()
        t0 = tracemalloc.get_traced_memory()[0]
        for _ in range(TRACED_CALLS):
            call()
        gc.collect()
        t1 = tracemalloc.get_traced_memory()[0]
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    if t1 - t0 >= TRACED_BOUND:
        top = "\n".join(str(s) for s in after.compare_to(before, "lineno")[:8])
        pytest.fail(f"{name}: traced memory grew by {t1 - t0} bytes over {TRACED_CALLS} calls:\n{top}")


def test_exceptions_do_not_keep_operands_alive():
    """An operand refused mid-call is not referenced by anything spfuse keeps (a
    traceback held in a cache would pin every operand of every failed call)."""
    import weakref

    class Big(np.ndarray):
        pass

    x = np.ones(20).view(Big)
    ref = weakref.ref(x)
    bad = _bad_csr((30, 20))
    for _ in range(3):
        with pytest.raises(spfuse.InvalidOperandError):
            spfuse.evaluate("y[i] = A[i,j] * x[j]", A=bad, x=x)
    del x
    gc.collect()
    assert ref() is None, gc.get_referrers(ref())


@pytest.mark.skipif(sys.platform != "linux", reason="RSS via /proc")
def test_large_result_memory_is_returned():
    """A big SpGEMM result allocated and dropped 30 times does not ratchet RSS up."""
    rng = np.random.default_rng(1)
    A = random_sparse(rng, (400, 400), 0.05, "csr")
    spfuse.evaluate("C[i,k] = A[i,j] * B[j,k]", A=A, B=A)
    gc.collect()
    start = rss()
    for _ in range(30):
        out = spfuse.evaluate("C[i,k] = A[i,j] * B[j,k]", A=A, B=A)
        del out
    gc.collect()
    assert rss() - start < 16 << 20
