"""Merge fibers: under a row sweep, a loop co-iterating two compressed
operands (an intersection, as in A∘B or an inner product) lists each row's
matches and runs its statements over them in vectors.

Checked against numpy on dense operands, on 1 and 2 threads (bitwise the
same) and against the per-element walk (to rounding).
"""
import numpy as np
import scipy.sparse as sp
from executor_spy import executor_plans
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.runtime import looptree as lt

#: program -> numpy oracle on dense A, B, x (each product vanishes unless both
#: A and B are stored: the loops intersect the two patterns)
PROGRAMS = {
    "s = A[i,j] * B[i,j]": lambda A, B, x: (A * B).sum(),
    "y[i] = A[i,j] * B[i,j]": lambda A, B, x: (A * B).sum(axis=1),
    "y[i] = A[i,j] * B[i,j] * x[j]": lambda A, B, x: (A * B) @ x,
    "C[i,j] = A[i,j] * B[i,j]": lambda A, B, x: A * B,
    "C[i,j] = 2.0 * A[i,j] * B[i,j] * x[j]": lambda A, B, x: 2.0 * A * B * x[None, :],
    "C[i,j] = A[i,j] * B[i,j] * sigmoid(B[i,j])": lambda A, B, x: A * B / (1 + np.exp(-B)),
    "s = A[i,j] * B[i,j] * x[i] * x[j]": lambda A, B, x: x @ (A * B) @ x,
}


def _matrix(n, m, density, rng, fmt, sorted_=True):
    A = sp.random_array((n, m), density=density, format="csr", rng=rng)
    A.data = rng.standard_normal(A.nnz)
    if n > 3:
        A = sp.csr_array(A.multiply((np.arange(n) % 4 != 2)[:, None]))   # empty rows
    A = A.asformat(fmt)
    if not sorted_ and A.nnz:       # unsorted indices within rows (scipy keeps them as given)
        A = A.copy()
        A.has_sorted_indices = False
        for r in range(A.shape[0] if fmt == "csr" else A.shape[1]):
            a, b = A.indptr[r], A.indptr[r + 1]
            A.indices[a:b] = A.indices[a:b][::-1].copy()
            A.data[a:b] = A.data[a:b][::-1].copy()
    return A


def _dense(r):
    return r.toarray() if hasattr(r, "toarray") else np.asarray(r)


def _run_all(program, ops):
    """Results on 1 and 2 threads and the plans the executor ran."""
    with executor_plans() as plans:
        r1 = spfuse.evaluate(program, **ops, num_threads=1)
    r2 = spfuse.evaluate(program, **ops, num_threads=2)
    return r1, r2, plans


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.sampled_from(sorted(PROGRAMS)), n=st.sampled_from([0, 1, 5, 33, 200]),
       m=st.sampled_from([1, 7, 64]), da=st.sampled_from([0.0, 0.1, 0.6]),
       db=st.sampled_from([0.0, 0.1, 0.6]), overlap=st.booleans(),
       fmt=st.sampled_from(["csr", "csc"]), sorted_=st.booleans(), seed=st.integers(0, 2**16))
def test_merge_fibers_match_numpy(program, n, m, da, db, overlap, fmt, sorted_, seed):
    rng = np.random.default_rng(seed)
    A = _matrix(n, m, da, rng, fmt, sorted_)
    B = _matrix(n, m, db, rng, fmt)
    if overlap and A.nnz:           # B shares some of A's entries, as real masks do
        B = (B + A.multiply(rng.random((n, m)) < 0.5) * 0.5).asformat(fmt)
    x = rng.standard_normal(max(n, m))
    ops = {"A": A, "B": B}
    if "x[" in program:
        ops["x"] = x[:m] if "x[i]" not in program else x[:n]
        if "x[i]" in program and "x[j]" in program:
            if n != m:
                return
            ops["x"] = x[:n]
    r1, r2, plans = _run_all(program, ops)
    np.testing.assert_array_equal(_dense(r1), _dense(r2))
    xs = ops.get("x", np.zeros(m))
    ref = PROGRAMS[program](A.toarray(), B.toarray(), xs)
    np.testing.assert_allclose(_dense(r1), ref, rtol=1e-11, atol=1e-11)
    for plan in plans:   # the per-element walk agrees to rounding
        walk = lt.run(plan, num_threads=1, blocks=False)
        fast = lt.run(plan, num_threads=1)
        for k in fast:
            a, b = fast[k], walk[k]
            if hasattr(a, "values"):
                np.testing.assert_allclose(a.values, b.values, rtol=1e-12, atol=1e-12)
            else:
                np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_inner_product_runs_as_a_merge_fiber_sweep():
    rng = np.random.default_rng(5)
    A, B = _matrix(300, 300, 0.05, rng, "csr"), _matrix(300, 300, 0.05, rng, "csr")
    _, _, plans = _run_all("s = A[i,j] * B[i,j]", {"A": A, "B": B})
    from spfuse._kernels import _looptree as X
    (plan,) = plans
    keep = {f: X._i64(getattr(plan, f)) for f in X._INT_FIELDS}
    keep["loop_fiber"] = X._fiber_loops(keep)
    sweep = X._sweep_loops(keep, [bool(p) for p in plan.buf_private])[0]
    assert list(sweep) == [1, 0]     # the row loop sweeps; its merge loop runs inside it


def test_long_rows_cross_chunk_boundaries():
    # rows of more than a chunk's (512) matches are split across chunks
    n, m = 3, 5000
    A = sp.csr_array(np.where(np.arange(m) % 3 == 0, 1.5, 0.0) * np.ones((n, 1)))
    B = sp.csr_array(np.where(np.arange(m) % 2 == 0, np.arange(m) * 1e-3, 0.0) * np.ones((n, 1)))
    y = spfuse.evaluate("y[i] = A[i,j] * B[i,j]", A=A, B=B, num_threads=2)
    np.testing.assert_allclose(y, (A.toarray() * B.toarray()).sum(axis=1), rtol=1e-12)
