"""Template kernels (_csr_kernels, _csf_kernels, _dense_kernels) vs numpy.

Every kernel runs on densified random inputs for float32/float64 values and
int32/int64 indices, with 1 and 2 threads; the two thread counts must give
bit-identical results (``np.array_equal``) and both must match the numpy
oracle (rtol 1e-4 for float32).  Cases include empty rows, nnz = 0,
zero-size dimensions and a power-law row distribution.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp
from kernels import assert_weighted_union

K = pytest.importorskip("spfuse._kernels._csr_kernels")
F = pytest.importorskip("spfuse._kernels._csf_kernels")
D = pytest.importorskip("spfuse._kernels._dense_kernels")

VALUE_DTYPES = [np.float32, np.float64]
INDEX_DTYPES = [np.int32, np.int64]


def tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)


# ---------------------------------------------------------------- operands
def _powerlaw(rng, m, n):
    """Row i has about n / (i + 1) ** 1.1 entries (a few heavy rows, many light)."""
    rows, cols = [], []
    for i in range(m):
        k = min(n, max(0, int(n / (i + 1) ** 1.1)))
        c = rng.choice(n, size=k, replace=False)
        rows.append(np.full(k, i))
        cols.append(c)
    rows = np.concatenate(rows) if rows else np.empty(0, int)
    cols = np.concatenate(cols) if cols else np.empty(0, int)
    perm = rng.permutation(m)  # heavy rows scattered
    return sp.csr_matrix((rng.standard_normal(len(rows)), (perm[rows], cols)), shape=(m, n))


def make_csr(kind, rng, m, n):
    if kind == "uniform":
        A = sp.random(m, n, density=0.08, format="csr", random_state=rng)
    elif kind == "empty_rows":
        A = sp.random(m, n, density=0.2, format="lil", random_state=rng)
        A[::3, :] = 0
        A = A.tocsr()
    elif kind == "nnz0":
        A = sp.csr_matrix((m, n))
    elif kind == "powerlaw":
        A = _powerlaw(rng, m, n)
    else:
        raise ValueError(kind)
    A.sum_duplicates()
    A.sort_indices()
    A.data = rng.standard_normal(A.nnz)
    return A


KINDS = ["uniform", "empty_rows", "nnz0", "powerlaw"]
SHAPES = [(301, 157), (0, 7), (9, 0), (1, 1)]


def arrays(A, it, dt):
    return (np.ascontiguousarray(A.indptr, dtype=it), np.ascontiguousarray(A.indices, dtype=it),
            np.ascontiguousarray(A.data, dtype=dt))


def both_threads(fn):
    """Run ``fn(num_threads)`` with 1 and 2 threads; results must be bit-identical."""
    r1 = fn(1)
    r2 = fn(2)
    if not isinstance(r1, tuple):
        r1, r2 = (r1,), (r2,)
    for a, b in zip(r1, r2, strict=True):
        assert a.dtype == b.dtype
        assert np.array_equal(a, b, equal_nan=True), "result depends on the thread count"
    return r1 if len(r1) > 1 else r1[0]


def case_params():
    out = []
    for kind in KINDS:
        for shape in SHAPES:
            if kind != "uniform" and shape != SHAPES[0]:
                continue
            out.append((kind, shape))
    return out


CASES = case_params()
dtypes = pytest.mark.parametrize("dt", VALUE_DTYPES, ids=["f32", "f64"])
itypes = pytest.mark.parametrize("it", INDEX_DTYPES, ids=["i32", "i64"])
cases = pytest.mark.parametrize("kind,shape", CASES, ids=[f"{k}-{s[0]}x{s[1]}" for k, s in CASES])


# ---------------------------------------------------------------- CSR
@dtypes
@itypes
@cases
def test_spmv(kind, shape, it, dt, rng):
    A = make_csr(kind, rng, *shape)
    ip, ind, val = arrays(A, it, dt)
    x = rng.standard_normal(shape[1]).astype(dt)

    def run(nt):
        out = np.full(shape[0], np.nan, dtype=dt)
        assert K.spmv(ip, ind, val, x, out, nt) == -1  # every index in range
        return out
    got = both_threads(run)
    np.testing.assert_allclose(got, A.toarray() @ x.astype(np.float64), **tol(dt))


@dtypes
@itypes
@cases
@pytest.mark.parametrize("Kdim", [1, 2, 7, 8, 9, 64, 300])
def test_spmm(kind, shape, it, dt, Kdim, rng):
    A = make_csr(kind, rng, *shape)
    ip, ind, val = arrays(A, it, dt)
    B = rng.standard_normal((shape[1], Kdim)).astype(dt)

    def run(nt):
        out = np.full((shape[0], Kdim), np.nan, dtype=dt)
        assert K.spmm(ip, ind, val, B, out, nt) == -1  # every index in range
        return out
    got = both_threads(run)
    np.testing.assert_allclose(got, A.toarray() @ B.astype(np.float64), **tol(dt))


@dtypes
@itypes
@cases
@pytest.mark.parametrize("Kdim", [0, 1, 8, 17, 40])
def test_spmm_t(kind, shape, it, dt, Kdim, rng):
    """Aᵀ·B by scatter: every element is summed in row order (each column
    the same sums as a one-column call); duplicates and unsorted rows taken
    as they are."""
    A = make_csr(kind, rng, *shape)
    ip, ind, val = arrays(A, it, dt)
    if len(ind) >= 2:
        ind[1] = ind[0]
    dense = sp.csr_matrix((val.astype(np.float64), ind, ip), shape=shape).toarray()
    B = rng.standard_normal((shape[0], Kdim)).astype(dt)

    got = np.full((shape[1], Kdim), np.nan, dtype=dt)
    assert K.spmm_t(ip, ind, val, B, got) == -1  # every index in range
    np.testing.assert_allclose(got, dense.T @ B.astype(np.float64), **tol(dt))
    if Kdim:
        one = np.empty((shape[1], 1), dtype=dt)
        K.spmm_t(ip, ind, val, np.ascontiguousarray(B[:, -1:]), one)
        np.testing.assert_array_equal(one[:, 0], got[:, -1])
    # a team (each thread its range of output rows, the team forced on this
    # small output): the same bits as one thread
    old = K._set_spmm_t_team_min_bytes(0)
    try:
        for nt in (2, 3):
            team = np.full((shape[1], Kdim), np.nan, dtype=dt)
            assert K.spmm_t(ip, ind, val, B, team, nt) == -1
            np.testing.assert_array_equal(team, got)
    finally:
        K._set_spmm_t_team_min_bytes(old)


@dtypes
@itypes
@cases
@pytest.mark.parametrize("Kdim", [0, 3, 17])
def test_spmm_t_terms(kind, shape, it, dt, Kdim, rng):
    """More ``(data_t, B_t)`` on the pattern summed in one walk, ``Σ A_tᵀ @ B_t``;
    the same bits on one thread and on a team."""
    A = make_csr(kind, rng, *shape)
    ip, ind, val = arrays(A, it, dt)
    v2, v3 = (rng.standard_normal(len(val)).astype(dt) for _ in range(2))
    B1, B2, B3 = (rng.standard_normal((shape[0], Kdim)).astype(dt) for _ in range(3))

    def dense(v):
        return sp.csr_matrix((v.astype(np.float64), ind, ip), shape=shape).toarray().T

    def run(nt):
        out = np.full((shape[1], Kdim), np.nan, dtype=dt)
        assert K.spmm_t(ip, ind, val, B1, out, nt, ((v2, B2), (v3, B3))) == -1
        return out
    got = run(1)
    want = sum(dense(v) @ b.astype(np.float64) for v, b in ((val, B1), (v2, B2), (v3, B3)))
    np.testing.assert_allclose(got, want, **tol(dt))
    old = K._set_spmm_t_team_min_bytes(0)
    try:
        np.testing.assert_array_equal(run(2), got)
    finally:
        K._set_spmm_t_team_min_bytes(old)


def test_spmm_t_terms_are_checked():
    ip, ind = np.array([0, 2, 3], np.int32), np.array([0, 2, 1], np.int32)
    val, B, out = np.ones(3), np.ones((2, 4)), np.empty((3, 4))

    def call(terms, indices=ind):
        return K.spmm_t(ip, indices, val, B, out, 1, terms)
    with pytest.raises(ValueError, match="dtype or layout"):
        call(((val.astype(np.float32), B),))
    with pytest.raises(ValueError, match="wrong shape"):
        call(((val, np.ones((2, 3))),))
    with pytest.raises(ValueError, match="wrong shape"):
        call(((val[:2], B),))
    with pytest.raises(ValueError, match="at most"):
        call(((val, B),) * K.SUM_TERMS)
    with pytest.raises(ValueError, match="is \\(data, B\\)"):
        call(((val, B, out),))
    bad = ind.copy()
    bad[2] = 7   # an index out of range is found by the walk, whatever the terms
    assert call(((val, B),), bad) == 2


@dtypes
@cases
def test_spmm_rows_in_registers_sum_as_the_workspace_rows(kind, shape, dt, rng):
    # K <= 8 sums each row in registers; wider rows in a workspace: the
    # same sequential sums, so the columns they share are bit-identical
    A = make_csr(kind, rng, *shape)
    ip, ind, val = arrays(A, np.int64, dt)
    B = rng.standard_normal((shape[1], 9)).astype(dt)
    wide = np.empty((shape[0], 9), dt)
    K.spmm(ip, ind, val, B, wide, 1)
    for k in (1, 3, 8):
        narrow = np.empty((shape[0], k), dt)
        K.spmm(ip, ind, val, np.ascontiguousarray(B[:, :k]), narrow, 2)
        assert np.array_equal(narrow, wide[:, :k])


@dtypes
@itypes
@cases
@pytest.mark.parametrize("blocks", [1, 2, 3, 8])
def test_spmv_t(kind, shape, it, dt, blocks, rng):
    """Aᵀx by scatter into fixed blocks: the blocks, not the threads, set the
    rounding (bit-identical on 1 and 2 threads); duplicates are summed."""
    A = make_csr(kind, rng, *shape)
    ip, ind, val = arrays(A, it, dt)
    if len(ind) >= 2:   # unsorted rows and a duplicate entry are taken as they are
        ind[1] = ind[0]
    dense = sp.csr_matrix((val.astype(np.float64), ind, ip), shape=shape).toarray()
    x = rng.standard_normal(shape[0]).astype(dt)

    def run(nt):
        out = np.full(shape[1], np.nan, dtype=dt)
        assert K.spmv_t(ip, ind, val, x, out, blocks, nt) == -1  # every index in range
        return out
    got = both_threads(run)
    np.testing.assert_allclose(got, dense.T @ x.astype(np.float64), **tol(dt))


@dtypes
@itypes
@cases
@pytest.mark.parametrize("blocks", [1, 2, 5])
def test_bilinear(kind, shape, it, dt, blocks, rng):
    """wᵀ·A·x with the rows summed in fixed blocks: one value on 1 and 2
    threads; an out-of-range index is reported, never read."""
    A = make_csr(kind, rng, *shape)
    ip, ind, val = arrays(A, it, dt)
    w, x = rng.standard_normal(shape[0]).astype(dt), rng.standard_normal(shape[1]).astype(dt)
    got = [K.bilinear(ip, ind, val, w, x, blocks, nt) for nt in (1, 2)]
    assert got[0] == got[1] and got[0][1] == -1
    want = w.astype(np.float64) @ A.toarray() @ x.astype(np.float64)
    np.testing.assert_allclose(got[0][0], want, **tol(dt))
    if len(ind):
        ind[len(ind) // 2] = shape[1]
        assert K.bilinear(ip, ind, val, w, x, blocks, 2)[1] == len(ind) // 2


@itypes
@pytest.mark.parametrize("kernel", ["spmv", "spmv_t", "spmm", "spmm_t"])
@pytest.mark.parametrize("bad", [-1, 9, 2**31 - 1])
@pytest.mark.parametrize("nt", [1, 2])
def test_spmv_and_spmm_return_the_position_of_an_out_of_range_index(kernel, bad, nt, it, request):
    """The kernels that check indices as they read them: -1 when all are
    in [0, n), else the position of a bad one (never a read or write out of
    bounds)."""
    ip = np.array([0, 2, 2, 5], dtype=it)
    ind = np.array([0, 8, 1, 4, 3], dtype=it)
    val = np.ones(5)
    dense = np.ones((9, 3)) if kernel == "spmm" else np.ones((3, 2)) if kernel == "spmm_t" else np.ones(
        3 if kernel == "spmv_t" else 9)
    out = np.empty((3, 3)) if kernel == "spmm" else np.empty((9, 2)) if kernel == "spmm_t" else np.empty(
        9 if kernel == "spmv_t" else 3)

    def run(ind, dense, out):
        if kernel == "spmv_t":
            return K.spmv_t(ip, ind, val, dense, out, 2, nt)
        if kernel == "spmm_t":
            return K.spmm_t(ip, ind, val, dense, out, nt)
        return getattr(K, kernel)(ip, ind, val, dense, out, nt)
    old = K._set_spmm_t_team_min_bytes(0)   # spmm_t's team, on this small output too
    request.addfinalizer(lambda: K._set_spmm_t_team_min_bytes(old))
    assert run(ind, dense, out) == -1
    ind[3] = bad
    assert run(ind, dense, out) == 3
    if kernel == "spmv_t":
        assert run(ind, dense, np.empty(0)) in (0, 1)  # n = 0: every index is out of range
    if kernel == "spmm":  # K = 0: nothing gathered, the index is still checked
        assert K.spmm(ip, ind, val, np.ones((9, 0)), np.empty((3, 0)), nt) == 3
    if kernel == "spmm_t":  # K = 0 and n = 0: nothing scattered, the index is still checked
        assert K.spmm_t(ip, ind, val, np.ones((3, 0)), np.empty((9, 0))) == 3
        assert K.spmm_t(ip, ind, val, dense, np.empty((0, 2))) in (0, 1)


@itypes
@pytest.mark.parametrize("bad", [-1, 50, 2**31 - 1, 2**33])
@pytest.mark.parametrize("at", [0, 1700, 2999])
@pytest.mark.parametrize("nt", [1, 2])
def test_runs_of_checked_rows_find_the_bad_index(bad, at, nt, it):
    """SpMV, row sums and the bilinear form check a run of rows' indices in
    one pass before they read through them: the position of a bad one in any
    run (the first, a middle one, the last entry), never a read out of bounds."""
    if bad >= 2**31 and it == np.int32:
        pytest.skip("not an int32 index")
    m, n = 1000, 50
    ip = np.arange(0, 3 * m + 1, 3, dtype=it)
    ind = (np.arange(3 * m) % n).astype(it)
    val, x = np.ones(3 * m), np.ones(n)
    assert K.spmv(ip, ind, val, x, np.empty(m), nt) == -1
    ind[at] = bad
    assert K.spmv(ip, ind, val, x, np.empty(m), nt) == at
    assert K.spmv(ip, ind, val, None, np.empty(m), nt, n) == at
    assert K.bilinear(ip, ind, val, np.ones(m), x, 3, nt)[1] == at
    copy = (np.array([K.EPILOGUE_OPS[None], 1, 0, 1], np.int64), np.array([K.EPILOGUE_ARGS["register"]], np.int64),
            np.zeros(1, np.int64), np.ones(1), 2, 1)
    assert K.spmv(ip, ind, val, x, np.empty(m), nt, -1, copy) == at


@dtypes
@itypes
@cases
@pytest.mark.parametrize("op", ["mul", "div", "dot"])
def test_sddmm(kind, shape, it, dt, op, rng):
    A = make_csr(kind, rng, *shape)
    if A.nnz:
        A.data[::5] = 0.0  # explicit zeros: 0/x must give 0
    ip, ind, val = arrays(A, it, dt)
    Kdim = 13
    C = rng.standard_normal((shape[0], Kdim)).astype(dt)
    Dt = rng.standard_normal((shape[1], Kdim)).astype(dt)

    def run(nt):
        out = np.full(len(val), np.nan, dtype=dt)
        K.sddmm(ip, ind, val, C, Dt, out, K.SDDMM_OPS[op], nt)
        return out
    got = both_threads(run)
    rows = np.repeat(np.arange(shape[0]), np.diff(A.indptr))
    s = np.einsum("ij,ij->i", C[rows].astype(np.float64), Dt[A.indices].astype(np.float64))
    b = val.astype(np.float64)
    want = {"mul": b * s, "div": np.divide(b, s, out=np.zeros_like(s), where=b != 0),
            "dot": s}[op]
    np.testing.assert_allclose(got, want, **tol(dt))


def _rows_sorted_unique(indptr, indices):
    for i in range(len(indptr) - 1):
        r = indices[indptr[i]:indptr[i + 1]]
        assert np.all(np.diff(r.astype(np.int64)) > 0), f"row {i} not sorted/unique"


@dtypes
@itypes
@cases
def test_spgemm(kind, shape, it, dt, rng):
    m, n = shape
    A = make_csr(kind, rng, m, n)
    B = make_csr("uniform" if kind != "nnz0" else kind, rng, n, 211)
    a = arrays(A, it, dt)
    b = arrays(B, it, dt)
    got = both_threads(lambda nt: K.spgemm(*a, *b, 211, nt))
    indptr, indices, data = got
    assert indptr.dtype == it and indices.dtype == it and data.dtype == dt
    _rows_sorted_unique(indptr, indices)
    ref = (A @ B).tocsr()
    ref.sort_indices()
    # structural result: pattern equals scipy's symbolic pattern
    assert np.array_equal(indptr, ref.indptr) and np.array_equal(indices, ref.indices)
    C = sp.csr_matrix((data, indices, indptr), shape=(m, 211))
    np.testing.assert_allclose(C.toarray(), A.toarray() @ B.toarray(), **tol(dt))


@dtypes
@itypes
@cases
@pytest.mark.parametrize("sides", ["rows", "cols", "both"])
def test_scale(kind, shape, it, dt, sides, rng):
    A = make_csr(kind, rng, *shape)
    ip, ind, val = arrays(A, it, dt)
    r = rng.standard_normal(shape[0]).astype(dt) if sides != "cols" else None
    c = rng.standard_normal(shape[1]).astype(dt) if sides != "rows" else None

    def run(nt):
        out = np.full(len(val), np.nan, dt)
        K.scale(ip, ind, val, r, c, out, nt)
        return out
    got = both_threads(run)
    want = A.toarray() * (1.0 if r is None else r[:, None].astype(np.float64)) * (
        1.0 if c is None else c.astype(np.float64))
    np.testing.assert_allclose(sp.csr_matrix((got.astype(np.float64), ind, ip), shape=shape).toarray(), want,
                               **tol(dt))


@dtypes
@itypes
@cases
@pytest.mark.parametrize("kernel", ["masked_spgemm", "masked_spgemm_dot"])
def test_masked_spgemm(kind, shape, it, dt, kernel, rng):
    """M ∘ (A·B) on M's pattern (B as CSR, or as the CSR of Bᵀ for the dot
    kernel): ``hit`` marks the entries some product reaches (the others are
    0 and dropped by the caller)."""
    m, n = shape
    A = make_csr(kind, rng, m, n)
    B = make_csr("uniform" if kind != "nnz0" else kind, rng, n, 97)
    M = make_csr("uniform", rng, m, 97)
    M.data[: len(M.data) // 2] = 0.0   # stored zeros stay stored (value 0)
    mm, a = arrays(M, it, dt), arrays(A, it, dt)
    if kernel == "masked_spgemm":
        b, width = arrays(B, it, dt), 97
    else:
        Bt = B.T.tocsr()
        Bt.sort_indices()
        if Bt.nnz:
            Bt.data[-1] = np.inf   # where A stores nothing, it must not reach any sum
        B = Bt.T
        b, width = arrays(Bt, it, dt), n

    def run(nt):
        out = np.full(M.nnz, np.nan, dt)
        hit = np.full(M.nnz, 7, np.uint8)
        K.masked_spgemm(*mm, *a, *b, width, out, hit, nt, kernel == "masked_spgemm_dot")
        return out, hit
    out, hit = both_threads(run)
    # reached: A's row i and B's column k share a stored j (the product's symbolic pattern)
    rows = np.repeat(np.arange(m), np.diff(M.indptr))
    pattern = (abs(A).sign() @ abs(B).sign()).toarray() != 0
    reached = pattern[rows, M.indices]
    np.testing.assert_array_equal(hit, reached.astype(np.uint8))
    stored = (abs(A).sign().toarray().astype(bool)[:, :, None] & abs(B).sign().toarray().astype(bool)[None, :, :])
    products = np.where(stored, A.toarray()[:, :, None] * B.toarray()[None, :, :], 0.0).sum(axis=1)
    want = M.toarray() * products
    np.testing.assert_allclose(out, want[rows, M.indices] * reached, **tol(dt))


def test_spgemm_keeps_cancellation_zeros_and_numeric_phase_alone(rng):
    A = sp.csr_matrix(np.array([[1.0, 1.0], [0.0, 2.0]]))
    B = sp.csr_matrix(np.array([[1.0, 3.0], [-1.0, 5.0]]))
    ip, ind, val = K.spgemm(A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, 2, 2)
    assert list(ip) == [0, 2, 4] and list(ind) == [0, 1, 0, 1]
    assert val[0] == 0.0  # 1*1 + 1*(-1) kept as a structural zero
    # the numeric phase on its own, into a caller's arrays: rows come out sorted
    A = make_csr("uniform", rng, 200, 150)
    B = make_csr("uniform", rng, 150, 170)
    row_nnz = np.empty(200, np.int64)
    K.spgemm_symbolic(A.indptr, A.indices, B.indptr, B.indices, 170, row_nnz, 2)
    indptr = np.concatenate([[0], np.cumsum(row_nnz)]).astype(np.int32)
    ind = np.empty(indptr[-1], np.int32)
    val = np.empty(indptr[-1])
    K.spgemm_numeric(A.indptr, A.indices, A.data, B.indptr, B.indices, B.data, 170,
                     indptr, ind, val, 2)
    _rows_sorted_unique(indptr, ind)
    C = sp.csr_matrix((val, ind, indptr), shape=(200, 170))
    np.testing.assert_allclose(C.toarray(), (A @ B).toarray(), rtol=1e-12, atol=1e-12)


def test_spgemm_dense_rows_scan_path(rng):
    # rows dense enough for the marker-scan compaction
    A = sp.random(40, 30, density=0.6, format="csr", random_state=rng)
    B = sp.random(30, 50, density=0.5, format="csr", random_state=rng)
    got = both_threads(lambda nt: K.spgemm(A.indptr, A.indices, A.data, B.indptr, B.indices,
                                           B.data, 50, nt))
    _rows_sorted_unique(got[0], got[1])
    C = sp.csr_matrix((got[2], got[1], got[0]), shape=(40, 50))
    np.testing.assert_allclose(C.toarray(), A.toarray() @ B.toarray(), rtol=1e-12, atol=1e-12)


@dtypes
@itypes
@pytest.mark.parametrize("n_ops", [0, 1, 2, 7])
@pytest.mark.parametrize("kind", KINDS)
def test_spadd(kind, n_ops, it, dt, rng):
    m, n = 257, 131
    mats = [make_csr(kind if t % 2 == 0 else "uniform", rng, m, n) for t in range(n_ops)]
    coef = rng.choice([1.0, -1.0, 0.5], size=n_ops)
    if n_ops >= 2:
        mats[1] = mats[0].copy()  # B0 - B0 style cancellation: entries kept
        coef[:2] = [1.0, -1.0]
    ips = [np.ascontiguousarray(M.indptr, dtype=it) for M in mats]
    inds = [np.ascontiguousarray(M.indices, dtype=it) for M in mats]
    vals = [np.ascontiguousarray(M.data, dtype=dt) for M in mats]
    got = both_threads(lambda nt: K.spadd(ips, inds, vals, coef, m, n, nt))
    indptr, indices, data = got
    _rows_sorted_unique(indptr, indices)
    assert_weighted_union(indptr, indices, data, mats, coef, m, n, dt, tol(dt))
    if n_ops:
        assert indptr.dtype == it and data.dtype == dt


def test_spadd_rejects_mixed_dtypes():
    A = sp.random(5, 5, density=0.5, format="csr")
    with pytest.raises(TypeError):
        K.spadd([A.indptr, A.indptr.astype(np.int64)], [A.indices, A.indices],
                [A.data, A.data], [1.0, 1.0], 5, 5, 1)


# ---------------------------------------------------------------- fused CSR
def _sddmm_vals(A, C, Dt, op):
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    s = np.einsum("ij,ij->i", C[rows].astype(np.float64), Dt[A.indices].astype(np.float64))
    b = A.data.astype(np.float64)
    return {0: b * s, 1: np.divide(b, s, out=np.zeros_like(s), where=b != 0), 2: s}[op]


@dtypes
@itypes
@cases
@pytest.mark.parametrize("op", [0, 1, 2])
def test_sddmm_spmm(kind, shape, it, dt, op, rng):
    m, n = shape
    A = make_csr(kind, rng, m, n)
    A.data = A.data.astype(dt)
    ip, ind, val = arrays(A, it, dt)
    C = rng.standard_normal((m, 9)).astype(dt)
    Dt = rng.standard_normal((n, 9)).astype(dt)
    E = rng.standard_normal((n, 17)).astype(dt)

    def run(nt):
        out = np.full((m, 17), np.nan, dtype=dt)
        K.sddmm_spmm(ip, ind, val, C, Dt, E, out, op, nt)
        return out
    got = both_threads(run)
    S = sp.csr_matrix((_sddmm_vals(A, C, Dt, op), A.indices, A.indptr), shape=(m, n))
    np.testing.assert_allclose(got, S @ E.astype(np.float64), **tol(dt))


def test_gnn2_through_sddmm_spmm(rng):
    # Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]: C = X, Dt = Y.T, E = Y.T
    A = make_csr("powerlaw", rng, 120, 40)
    X = rng.standard_normal((120, 8))
    Y = rng.standard_normal((8, 40))
    Yt = np.ascontiguousarray(Y.T)
    out = np.empty((120, 8))
    K.sddmm_spmm(A.indptr, A.indices, A.data, X, Yt, Yt, out, 0, 2)
    want = (A.toarray() * (X @ Y)) @ Y.T
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-10)


@dtypes
@itypes
@cases
@pytest.mark.parametrize("KL", [(5, 3), (16, 33), (1, 1)])
def test_spmm_gemm(kind, shape, it, dt, KL, rng):
    m, n = shape
    Kd, L = KL
    A = make_csr(kind, rng, m, n)
    ip, ind, val = arrays(A, it, dt)
    C = rng.standard_normal((n, Kd)).astype(dt)
    Dm = rng.standard_normal((Kd, L)).astype(dt)

    def run(nt):
        out = np.full((m, L), np.nan, dtype=dt)
        K.spmm_gemm(ip, ind, val, C, Dm, out, nt)
        return out
    got = both_threads(run)
    want = (A.toarray() @ C.astype(np.float64)) @ Dm.astype(np.float64)
    np.testing.assert_allclose(got, want, **tol(dt))


@dtypes
@itypes
@cases
@pytest.mark.parametrize("op", [0, 1])
def test_sddmm_spmm_gemm(kind, shape, it, dt, op, rng):
    m, n = shape
    A = make_csr(kind, rng, m, n)
    A.data = A.data.astype(dt)
    ip, ind, val = arrays(A, it, dt)
    C = rng.standard_normal((m, 6)).astype(dt)
    Dt = rng.standard_normal((n, 6)).astype(dt)
    Fm = rng.standard_normal((n, 10)).astype(dt)
    W = rng.standard_normal((10, 7)).astype(dt)

    def run(nt):
        out = np.full((m, 7), np.nan, dtype=dt)
        K.sddmm_spmm_gemm(ip, ind, val, C, Dt, Fm, W, out, nt, op)
        return out
    got = both_threads(run)
    S = sp.csr_matrix((_sddmm_vals(A, C, Dt, op), A.indices, A.indptr), shape=(m, n))
    want = (S @ Fm.astype(np.float64)) @ W.astype(np.float64)
    np.testing.assert_allclose(got, want, **tol(dt))


# ---------------------------------------------------------------- CSF
def make_csf(X, it):
    """CSF arrays (all levels compressed, mode order 0,1,2) of a dense 3-d array."""
    i, j, k = np.nonzero(X)  # lexicographic (C order)
    vals = X[i, j, k]
    if len(i):
        new_i = np.r_[True, i[1:] != i[:-1]]
        new_f = np.r_[True, (i[1:] != i[:-1]) | (j[1:] != j[:-1])]
    else:
        new_i = new_f = np.zeros(0, bool)
    crd0 = i[new_i]
    fib_i = i[new_f]
    crd1 = j[new_f]
    pos1 = np.r_[0, np.cumsum(np.bincount(np.searchsorted(crd0, fib_i), minlength=len(crd0)))]
    fib_id = np.cumsum(new_f) - 1
    pos2 = np.r_[0, np.cumsum(np.bincount(fib_id, minlength=len(crd1)))]
    pos0 = np.array([0, len(crd0)])

    def c(a):
        return np.ascontiguousarray(a, dtype=it)

    return (c(pos0), c(crd0), c(pos1), c(crd1), c(pos2), c(k)), vals


def make_tensor(kind, rng, shape):
    X = rng.standard_normal(shape)
    if kind == "nnz0" or 0 in shape:
        return np.zeros(shape)
    mask = rng.random(shape) < 0.1
    if kind == "empty_slices":
        mask[::2] = False
        if shape[1] > 1:
            mask[:, ::3] = False
    return np.where(mask, X, 0.0)


TKINDS = [("random", (23, 17, 19)), ("empty_slices", (40, 11, 13)), ("nnz0", (5, 4, 3)),
          ("random", (0, 4, 3)), ("random", (6, 0, 2))]
tcases = pytest.mark.parametrize("kind,shape", TKINDS, ids=[f"{k}-{s}" for k, s in TKINDS])


@dtypes
@itypes
@tcases
def test_ttv(kind, shape, it, dt, rng):
    X = make_tensor(kind, rng, shape).astype(dt)
    idx, vals = make_csf(X, it)
    c = rng.standard_normal(shape[2]).astype(dt)
    n_fib = len(idx[3])

    def run(nt):
        out = np.full(n_fib, np.nan, dtype=dt)
        F.ttv(*idx, vals, c, out, nt)
        return out
    got = both_threads(run)
    want = np.einsum("ijk,k->ij", X.astype(np.float64), c.astype(np.float64))
    dense = np.zeros(shape[:2])
    fib_rows = np.repeat(idx[1], np.diff(idx[2]))
    dense[fib_rows, idx[3]] = got
    np.testing.assert_allclose(dense, want, **tol(dt))


@dtypes
@itypes
@tcases
def test_ttv_mid(kind, shape, it, dt, rng):
    X = make_tensor(kind, rng, shape).astype(dt)
    idx, vals = make_csf(X, it)
    c = rng.standard_normal(shape[1]).astype(dt)

    def run(nt):
        out = np.full((shape[0], shape[2]), np.nan, dtype=dt)
        F.ttv_mid(*idx, vals, c, out, nt)
        return out
    got = both_threads(run)
    want = np.einsum("ijk,j->ik", X.astype(np.float64), c.astype(np.float64))
    np.testing.assert_allclose(got, want, **tol(dt))


def _check_mttkrp(kernel, factors: str, kind, shape, it, dt, rng, *extra):
    """MTTKRP of a CSF X (modes ijk) by ``kernel`` against einsum: ``factors``
    names the two factor modes, in the kernel's argument order; the result
    is indexed by the third (both thread counts give the same bits)."""
    X = make_tensor(kind, rng, shape).astype(dt)
    idx, vals = make_csf(X, it)
    R = 6
    modes = "ijk"
    out_mode = next(m for m in modes if m not in factors)
    C, Dm = (rng.standard_normal((shape[modes.index(m)], R)).astype(dt) for m in factors)

    def run(nt):
        out = np.full((shape[modes.index(out_mode)], R), np.nan, dtype=dt)
        kernel(*idx, vals, C, Dm, out, *extra, nt)
        return out
    got = both_threads(run)
    want = np.einsum(f"ijk,{factors[0]}r,{factors[1]}r->{out_mode}r", *(a.astype(np.float64) for a in (X, C, Dm)))
    np.testing.assert_allclose(got, want, **tol(dt))


@dtypes
@itypes
@tcases
def test_mttkrp(kind, shape, it, dt, rng):
    _check_mttkrp(F.mttkrp, "jk", kind, shape, it, dt, rng)


@pytest.mark.parametrize("density", [0.05, 0.3, 0.9])
def test_mttkrp_sums_in_its_documented_order(density, rng):
    """Per fiber ``t = 0 + sum_k X*D[k]`` in storage order, ``acc += t * C[j]``:
    the same bits as numpy doing exactly that, whether a fiber holds one
    entry (summed in registers, never stored) or several."""
    X = rng.standard_normal((6, 7, 8)) * (rng.random((6, 7, 8)) < density)
    idx, vals = make_csf(X, np.int64)
    R = 11
    C, D = rng.standard_normal((7, R)), rng.standard_normal((8, R))
    _, crd0, pos1, crd1, pos2, crd2 = idx
    want = np.zeros((6, R))
    for q, i in enumerate(crd0):
        acc = np.zeros(R)
        for f in range(pos1[q], pos1[q + 1]):
            t = np.zeros(R)
            for p in range(pos2[f], pos2[f + 1]):
                t = t + vals[p] * D[crd2[p]]
            acc = acc + t * C[crd1[f]]
        want[i] = acc
    lengths = np.diff(pos2)
    assert density < 0.5 or (lengths > 1).any()

    def run(nt):
        out = np.full((6, R), np.nan)
        F.mttkrp(*idx, vals, C, D, out, nt)
        return out
    np.testing.assert_array_equal(both_threads(run), want)


@dtypes
@itypes
@tcases
def test_mttkrp_mid(kind, shape, it, dt, rng):
    _check_mttkrp(F.mttkrp_mid, "ik", kind, shape, it, dt, rng)


@dtypes
@itypes
@tcases
@pytest.mark.parametrize("nblocks", [1, 2, 5])
def test_mttkrp_inner(kind, shape, it, dt, nblocks, rng):
    """The inner stored mode: fixed blocks' partials added in block order,
    the same bits on one and two threads for each block count."""
    _check_mttkrp(F.mttkrp_inner, "ij", kind, shape, it, dt, rng, nblocks)


def test_mttkrp_inner_rejects_no_blocks(rng):
    X = make_tensor("random", rng, (3, 4, 5))
    idx, vals = make_csf(X, np.int32)
    with pytest.raises(ValueError, match="nblocks"):
        F.mttkrp_inner(*idx, vals, np.ones((3, 2)), np.ones((4, 2)), np.empty((5, 2)), 0, 1)


@dtypes
@itypes
@tcases
def test_mttkrp_gemm(kind, shape, it, dt, rng):
    B = make_tensor(kind, rng, shape).astype(dt)  # modes (i, k, l)
    idx, vals = make_csf(B, it)
    J, M = 5, 9
    C = rng.standard_normal((shape[2], J)).astype(dt)
    Dm = rng.standard_normal((shape[1], J)).astype(dt)
    E = rng.standard_normal((J, M)).astype(dt)

    def run(nt):
        out = np.full((shape[0], M), np.nan, dtype=dt)
        F.mttkrp_gemm(*idx, vals, C, Dm, E, out, nt)
        return out
    got = both_threads(run)
    want = np.einsum("ikl,lj,kj,jm->im", *(a.astype(np.float64) for a in (B, C, Dm, E)))
    np.testing.assert_allclose(got, want, **tol(dt))


@dtypes
@itypes
@tcases
def test_spttm_spttm(kind, shape, it, dt, rng):
    B = make_tensor(kind, rng, shape).astype(dt)
    idx, vals = make_csf(B, it)
    L, M = 4, 6
    C = rng.standard_normal((shape[2], L)).astype(dt)
    Dm = rng.standard_normal((L, M)).astype(dt)
    n_fib = len(idx[3])

    def run(nt):
        out = np.full((n_fib, M), np.nan, dtype=dt)
        F.spttm_spttm(*idx, vals, C, Dm, out, nt)
        return out
    got = both_threads(run)
    want = np.einsum("ijk,kl,lm->ijm", *(a.astype(np.float64) for a in (B, C, Dm)))
    dense = np.zeros(shape[:2] + (M,))
    fib_rows = np.repeat(idx[1], np.diff(idx[2]))
    dense[fib_rows, idx[3]] = got
    np.testing.assert_allclose(dense, want, **tol(dt))


# ---------------------------------------------------------------- dense
@dtypes
@pytest.mark.parametrize("mkn", [(7, 5, 3), (64, 33, 17), (0, 3, 4), (3, 0, 4), (3, 4, 0), (1, 1, 1)])
def test_gemm(mkn, dt, rng):
    m, k, n = mkn
    A = rng.standard_normal((m, k)).astype(dt)
    B = rng.standard_normal((k, n)).astype(dt)
    out = np.full((m, n), np.nan, dtype=dt)
    D.gemm(A, B, out)
    np.testing.assert_allclose(out, A.astype(np.float64) @ B.astype(np.float64), **tol(dt))


@dtypes
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("mkn", [
    # thin: fixed row blocks small enough for BLAS to run each serially
    (1000, 32, 16), (8193, 64, 64), (300, 2, 1), (5000, 65, 64),
    # wide, with BLAS held to one thread: blocks of the longer side of out
    # (rows, or columns when n > m)
    (700, 90, 80), (80, 90, 700), (33, 500, 31), (2000, 64, 130)])
def test_gemm_in_blocks_on_our_team(mkn, trans_a, trans_b, dt, rng):
    # the blocks run on our own team (a tail block included): the same bits
    # on 1 and 2 threads, and numpy's answer
    from spfuse.runtime.blas_pool import hold_blas_once
    hold_blas_once()
    m, k, n = mkn
    A = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dt)
    B = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dt)

    def run(nt):
        out = np.full((m, n), np.nan, dtype=dt)
        D.gemm(A, B, out, nt, trans_a=trans_a, trans_b=trans_b)
        return out
    got = both_threads(run)
    want = (A.T if trans_a else A).astype(np.float64) @ (B.T if trans_b else B).astype(np.float64)
    np.testing.assert_allclose(got, want, **tol(dt))


ORACLE = {
    "relu": lambda x: np.maximum(x, 0), "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh, "exp": np.exp, "log": np.log, "abs": np.abs, "sqrt": np.sqrt,
    "neg": np.negative,
}


@dtypes
@pytest.mark.parametrize("name", sorted(ORACLE))
def test_map_unary(name, dt, rng):
    x = (rng.standard_normal(1001) * 3).astype(dt)
    x[:3] = [0.0, -0.0, 1.0]
    if name in ("log", "sqrt"):
        x = np.abs(x)

    def run(nt):
        out = np.empty_like(x)
        D.map_unary(x, D.UNARY_OPS[name], out, nt)
        return out
    got = both_threads(run)
    with np.errstate(all="ignore"):
        want = ORACLE[name](x.astype(np.float64))
    np.testing.assert_allclose(got, want, **tol(dt))
    # in place and empty
    y = x.copy()
    D.map_unary(y, D.UNARY_OPS[name], y, 2)
    assert np.array_equal(y, got)
    D.map_unary(np.empty(0, dt), 0, np.empty(0, dt), 2)


def test_exp_is_within_one_ulp_of_libm_over_its_whole_range(rng):
    """spfuse's vectorised exp (``spfuse_exp``): within 1 ulp of numpy's
    over the finite range and past both ends (overflow to inf, underflow
    through the subnormals to 0), exact at the special values, the same
    bits on a team and element by element in a pattern program."""
    x = np.concatenate([rng.uniform(-750.0, 712.0, 200_000), rng.uniform(-20.0, 20.0, 100_000),
                        rng.uniform(-1e-3, 1e-3, 10_000), np.linspace(-745.2, -707.0, 5_000),
                        np.linspace(705.0, 709.9, 5_000),
                        [0.0, -0.0, 1.0, -1.0, 709.782712893384, 709.79, -745.1332191019411, -745.2,
                         1e-300, -1e-300, np.inf, -np.inf, np.nan]])
    out = np.empty_like(x)
    D.map_unary(x, D.UNARY_OPS["exp"], out, 2)

    def libm_exp(v: float) -> float:   # (glibc's, as spfuse called before; numpy's may use its own SIMD exp)
        try:
            return math.exp(v)
        except OverflowError:
            return math.inf
    want = np.array([libm_exp(v) for v in x.tolist()])
    assert np.array_equal(np.isnan(out), np.isnan(want))
    finite = ~np.isnan(want)
    ulps = np.abs(out[finite].view(np.int64) - want[finite].view(np.int64))
    assert ulps.max() <= 1
    one = np.empty_like(x)
    D.map_unary(x, D.UNARY_OPS["exp"], one, 1)
    assert np.array_equal(one.view(np.int64), out.view(np.int64))


def test_map_unary_negative_domain():
    x = np.array([-1.0, 0.0, -np.inf])
    out = np.empty(3)
    D.map_unary(x, D.UNARY_OPS["log"], out)
    assert np.isnan(out[0]) and out[1] == -np.inf and np.isnan(out[2])
    D.map_unary(x, D.UNARY_OPS["relu"], out)
    assert list(out) == [0.0, 0.0, 0.0]


@dtypes
@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (1, 1), (31, 33), (33, 31), (64, 64), (200, 37), (3, 1000),
                                   (70, 1000),    # (a wide one: written a row of the transpose at a time)
                                   (1000, 33)])   # (a tall matrix: its tiles shared in bands of columns)
def test_transpose(shape, dt, rng):
    a = rng.standard_normal(shape).astype(dt)
    a.setflags(write=False)   # read-only input, as operands are

    def run(nt):
        out = np.full(shape[::-1], np.nan, dt)
        D.transpose(a, out, nt)
        return out
    got = both_threads(run)
    assert np.array_equal(got, a.T)
    if shape[0] != shape[1]:
        with pytest.raises(ValueError, match="transpose: out has shape"):
            D.transpose(a, np.empty(shape, dt))


@pytest.mark.parametrize("view", ["c", "transposed", "strided", "3-d", "int"])
def test_c_ordered(view, rng):
    from spfuse.lowering.templates import c_ordered
    a = {"c": rng.standard_normal((40, 50)), "transposed": rng.standard_normal((50, 40)).T,
         "strided": rng.standard_normal((80, 50))[::2], "3-d": rng.standard_normal((4, 5, 6)).transpose(2, 0, 1),
         "int": np.arange(2000).reshape(50, 40).T}[view]
    got = c_ordered(a, 2)
    assert got.flags.c_contiguous and got.dtype == a.dtype and np.array_equal(got, a)
    assert (got is a) == (view == "c")


def test_read_only_inputs(rng):
    A = make_csr("uniform", rng, 50, 40)
    for a in (A.indptr, A.indices, A.data):
        a.flags.writeable = False
    x = rng.standard_normal(40)
    x.flags.writeable = False
    out = np.empty(50)
    K.spmv(A.indptr, A.indices, A.data, x, out, 2)
    np.testing.assert_allclose(out, A @ x)


def test_indptr_with_offset(rng):
    # a row slice sharing the parent's indices/data: indptr[0] != 0
    A = make_csr("powerlaw", rng, 120, 90)
    B = make_csr("uniform", rng, 90, 70)
    ip = np.ascontiguousarray(A.indptr[30:81])
    sub = A[30:80]
    x = rng.standard_normal(90)
    out = np.empty(50)
    K.spmv(ip, A.indices, A.data, x, out, 2)
    np.testing.assert_allclose(out, sub @ x, rtol=1e-12, atol=1e-12)
    Bd = rng.standard_normal((90, 5))
    out2 = np.empty((50, 5))
    K.spmm(ip, A.indices, A.data, Bd, out2, 2)
    np.testing.assert_allclose(out2, sub @ Bd, rtol=1e-12, atol=1e-12)
    got = both_threads(lambda nt: K.spgemm(ip, A.indices, A.data, B.indptr, B.indices,
                                           B.data, 70, nt))
    C = sp.csr_matrix((got[2], got[1], got[0]), shape=(50, 70))
    np.testing.assert_allclose(C.toarray(), (sub @ B).toarray(), rtol=1e-12, atol=1e-12)
