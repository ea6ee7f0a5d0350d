"""Per-call operand copies from the result pool: a copy reuses the previous
call's memory once that copy has died, two copies of one call never share
memory, threads never share one, and no result aliases one."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse.lowering import templates


def _sddmm_operands(n: int, K: int, seed: int):
    rng = np.random.default_rng(seed)
    B = sp.random_array((n, n), density=8 / n, format="csr", rng=rng)
    C = rng.standard_normal((n, K))
    D = rng.standard_normal((K, n))   # C-ordered D[k,j]: SDDMM reads it transposed, a copy per call
    return B, C, D


def _sddmm_oracle(B, C, D):
    rows = np.repeat(np.arange(B.shape[0]), np.diff(B.indptr))
    return B.data * np.einsum("pk,pk->p", C[rows], D.T[B.indices])


def test_sddmm_copies_reuse_memory_and_results_never_alias_it(monkeypatch):
    n, K = 9000, 64   # D's copy: 4.6 MB, from the pool
    B, C, D = _sddmm_operands(n, K, 0)
    program = spfuse.compile("A[i,j] = B[i,j] * (C[i,k] * D[k,j])")
    lent: list = []   # (shape, address, bytes) of each pooled array: no reference, which would keep it alive
    real = templates._result

    def spy(*args):
        a = real(*args)
        lent.append((a.shape, a.ctypes.data, a.nbytes))
        return a

    monkeypatch.setattr(templates, "_result", spy)
    first = program(B=B, C=C, D=D)
    np.testing.assert_allclose(first.data, _sddmm_oracle(B, C, D), rtol=1e-12, atol=1e-12)
    kept = first.data.copy()
    D2 = -2.0 * D
    second = program(B=B, C=C, D=D2)
    np.testing.assert_array_equal(first.data, kept)   # the first result is untouched by the second call
    np.testing.assert_allclose(second.data, -2.0 * kept, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(D2, -2.0 * D)       # the operand is never written
    copies = [(address, size) for shape, address, size in lent if shape == (n, K)]
    assert len(copies) == 2 and copies[0] == copies[1]   # the second call's copy took the first's memory
    for r in (first, second):
        start = r.data.ctypes.data
        assert not any(start < a + size and a < start + r.data.nbytes for a, size in copies)


@pytest.mark.parametrize("threads", [1, 2])
def test_gnn2_reads_its_factor_transposed_twice_from_one_copy(monkeypatch, threads):
    """GNN-2 reads its C-ordered Y transposed in two slots of one kernel
    call: Y is copied once per call, and the answer is numpy's, call after call."""
    rng = np.random.default_rng(1)
    n, K = 4000, 64
    A = sp.random_array((n, n), density=8 / n, format="csr", rng=rng)
    X = rng.standard_normal((n, K))
    Y = rng.standard_normal((K, n))
    want = (A.toarray() * (X @ Y)) @ Y.T
    copied: list = []
    real = templates._dense_t
    monkeypatch.setattr(templates, "_dense_t", lambda t, *a: copied.append(t._shape) or real(t, *a))
    program = spfuse.compile("Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]", num_threads=threads)
    for calls, scale in enumerate((1.0, 0.5, 0.5), 1):
        got = program(A=A, X=X, Y=scale * Y)
        np.testing.assert_allclose(got, scale * scale * want, rtol=1e-10, atol=1e-10)
        assert copied == [(K, n)] * calls


@pytest.mark.parametrize("program, wrt, copies", [
    # the recomputed C·D and grad_C both read D (K x n) transposed
    ("A[i,j] = B[i,j] / (C[i,k] * D[k,j])", ("C", "D"), 1),
    # GNN-2's three statements reading Yᵀ (the recomputed SDDMM, grad_Z's and grad_X's)
    ("Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]", ("X", "Y"), 1),
])
def test_a_gradients_statements_share_one_transposed_copy(monkeypatch, program, wrt, copies):
    """The kernels of one vjp copy an operand they read transposed once, and
    the next call copies it again (its values may have changed)."""
    from test_autodiff import check_gradients
    rng = np.random.default_rng(2)
    n, K = 300, 8
    S = sp.random_array((n, n), density=8 / n, format="csr", rng=rng)
    S.data += 0.5   # (no entry near 0: the division's gradient stays tame)
    dense = {"C": rng.standard_normal((n, K)), "D": rng.random((K, n)) + 0.5,
             "X": rng.standard_normal((n, K)), "Y": rng.standard_normal((K, n))}
    ops = {n_: (S if n_ in ("A", "B") else dense[n_]) for n_ in spfuse.compile(program).program.inputs}
    copied: list = []
    real = templates._dense_t
    monkeypatch.setattr(templates, "_dense_t", lambda t, *a: copied.append(t._shape) or real(t, *a))
    result = spfuse.evaluate(program, **ops)
    for calls in (1, 2):
        copied.clear()
        spfuse.vjp(program, result, wrt=wrt, **ops)
        assert copied == [(K, n)] * copies, (calls, copied)
    monkeypatch.undo()
    check_gradients(program, ops, rng, wrt=wrt)


def test_threads_keep_their_own_buffers():
    """Two Python threads running SDDMM with different D at once: each reads
    its own copy (the buffers are per thread)."""
    n, K = 5000, 64
    B, C, D = _sddmm_operands(n, K, 2)
    program = spfuse.compile("A[i,j] = B[i,j] * (C[i,k] * D[k,j])")
    factors = [D, 3.0 * D]
    wants = [_sddmm_oracle(B, C, f) for f in factors]
    errors: list = []

    def work(which: int):
        try:
            for _ in range(6):
                got = program(B=B, C=C, D=factors[which])
                np.testing.assert_allclose(got.data, wants[which], rtol=1e-12, atol=1e-12)
        except Exception as e:   # (reported by the main thread)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("order", ["F", "C"])
def test_spmm_of_a_fortran_factor_matches_numpy(order):
    rng = np.random.default_rng(3)
    n, K = 5000, 64
    A = sp.random_array((n, n), density=8 / n, format="csr", rng=rng)
    Bm = np.asarray(rng.standard_normal((n, K)), order=order)
    for _ in range(2):
        np.testing.assert_allclose(spfuse.evaluate("C[i,k] = A[i,j] * B[j,k]", A=A, B=Bm), A @ Bm, rtol=1e-12)
