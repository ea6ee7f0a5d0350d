"""SpAdd-n: the one-pass kernel (merge / scatter / per-row auto), its run-time
variant choice (spfuse.passes.statistics) and the API path, against numpy.

Every variant sums in operand order in double and rounds once, so the three
variants and 1 vs 2 threads must agree bit for bit; all must match the
dense numpy oracle (rtol 1e-4 for float32).
"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from kernels import assert_weighted_union

import spfuse
from spfuse.passes.statistics import SPADD_COSTS, choose_spadd, spadd_stats

K = pytest.importorskip("spfuse._kernels._csr_kernels")

VARIANTS = ["merge", "chain", "scatter", "auto"]
dtypes = pytest.mark.parametrize("dt", [np.float32, np.float64], ids=["f32", "f64"])
itypes = pytest.mark.parametrize("it", [np.int32, np.int64], ids=["i32", "i64"])


def tol(dt):
    return dict(rtol=1e-4, atol=1e-4) if dt == np.float32 else dict(rtol=1e-12, atol=1e-12)


def make(kind, rng, m, n):
    """A canonical CSR matrix (scipy) of one of several row-length profiles."""
    if m == 0 or n == 0 or kind == "nnz0":
        A = sp.csr_matrix((m, n))
    elif kind == "uniform":
        A = sp.random(m, n, density=0.1, format="csr", random_state=rng)
    elif kind == "empty_rows":
        A = sp.random(m, n, density=0.3, format="lil", random_state=rng)
        A[::2, :] = 0
        A = A.tocsr()
    elif kind == "powerlaw":  # a few full-width rows, many short ones
        lens = np.minimum(n, (n / (1.0 + rng.permutation(m)) ** 1.2).astype(int))
        rows = np.repeat(np.arange(m), lens)
        cols = np.concatenate([rng.choice(n, size=k, replace=False) for k in lens]) if lens.sum() else \
            np.empty(0, int)
        A = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(m, n))
    else:
        raise ValueError(kind)
    A.sum_duplicates()
    A.sort_indices()
    A.data = rng.standard_normal(A.nnz)
    return A


def run(mats, coef, it, dt, m, n, nt, variant):
    ips = [np.ascontiguousarray(M.indptr, dtype=it) for M in mats]
    inds = [np.ascontiguousarray(M.indices, dtype=it) for M in mats]
    vals = [np.ascontiguousarray(M.data, dtype=dt) for M in mats]
    return K.spadd(ips, inds, vals, np.asarray(coef, dtype=np.float64), m, n, nt, variant)


def check_all_ways(mats, coef, it, dt, m, n):
    """Every variant x {1, 2} threads: bit-identical, canonical, equal to numpy."""
    first = None
    for variant in VARIANTS:
        for nt in (1, 2):
            got = run(mats, coef, it, dt, m, n, nt, variant)
            if first is None:
                first = got
                continue
            for a, b in zip(first, got, strict=True):
                assert a.dtype == b.dtype and np.array_equal(a, b), f"{variant} with {nt} threads differs"
    indptr, indices, data = first
    assert indptr.dtype == it and indices.dtype == it and data.dtype == dt
    assert len(indptr) == m + 1 and indptr[0] == 0 and indptr[-1] == len(indices) == len(data)
    for i in range(m):
        assert np.all(np.diff(indices[indptr[i]:indptr[i + 1]].astype(np.int64)) > 0), f"row {i}"
    assert_weighted_union(indptr, indices, data, mats, coef, m, n, dt, tol(dt))
    return first


@dtypes
@itypes
@pytest.mark.parametrize("n_ops", [2, 3, 5, 7, 9])
@pytest.mark.parametrize("kind", ["uniform", "empty_rows", "powerlaw", "nnz0"])
def test_spadd_variants_threads_and_numpy_agree(kind, n_ops, it, dt, rng):
    m, n = 131, 97
    mats = [make(kind if t % 2 == 0 else "uniform", rng, m, n) for t in range(n_ops)]
    coef = rng.choice([1.0, -1.0, 0.5, 2.0], size=n_ops)
    check_all_ways(mats, coef, it, dt, m, n)


@pytest.mark.parametrize("shape", [(0, 5), (6, 0), (0, 0), (1, 1), (3, 1)])
def test_spadd_zero_size_and_tiny(shape, rng):
    m, n = shape
    mats = [make("uniform", rng, m, n) for _ in range(3)]
    check_all_ways(mats, [1.0, -2.0, 0.5], np.int32, np.float64, m, n)


def test_spadd_subtraction_keeps_cancelled_entries(rng):
    A = make("uniform", rng, 40, 30)
    ip, ix, v = check_all_ways([A, A.copy(), A.copy()], [1.0, -1.0, 0.0], np.int64, np.float64, 40, 30)
    assert len(ix) == A.nnz and not np.any(v)


def test_spadd_disjoint_patterns_need_no_gather(rng):
    # no column shared: every row is exactly its upper bound (the compact path with 2 threads)
    A = make("uniform", rng, 300, 40)
    left = A.copy()
    left.data[A.indices >= 20] = 0
    left.eliminate_zeros()
    right = (A - left).tocsr()
    right.sort_indices()
    ip, _, _ = check_all_ways([left, right], [1.0, 1.0], np.int32, np.float32, 300, 40)
    assert ip[-1] == left.nnz + right.nnz


def test_spadd_wide_rows_and_long_operand_lists(rng):
    # full-width rows (scatter's read-back crosses many summary words) and 12 operands
    m, n = 9, 9000
    mats = [make("powerlaw", rng, m, n) for _ in range(12)]
    check_all_ways(mats, rng.standard_normal(12), np.int64, np.float64, m, n)


def test_spadd_rows_beyond_the_tournament_take_the_chain(rng):
    # 70 operands with entries in most rows: rows of more than 64 runs fall back to the
    # merge chain inside "merge", rows of 4-64 runs use the tournament, 2-3 runs the chain
    m, n = 7, 50
    mats = [sp.random(m, n, density=0.6 if t % 3 else 0.05, format="csr", random_state=rng)
            for t in range(70)]
    for A in mats:
        A.sort_indices()
    check_all_ways(mats, rng.choice([1.0, -1.0, 0.5], size=70), np.int32, np.float64, m, n)


def test_spadd_tournament_sums_in_operand_order_bit_for_bit():
    # one column in every operand, magnitudes that make the sum order visible in float64
    vals = [1e16, 1.0, -1e16, 1.0, 3.0, -2.0, 1e-3, 7.0]
    mats = [sp.csr_matrix((np.array([v]), (np.array([0]), np.array([1]))), shape=(1, 3)) for v in vals]
    coef = np.ones(len(vals))
    expected = vals[0]
    for v in vals[1:]:      # left to right, as a chain of additions would
        expected += v
    for variant in VARIANTS:
        for nt in (1, 2):
            ip, ix, data = run(mats, coef, np.int32, np.float64, 1, 3, nt, variant)
            assert ix.tolist() == [1] and data[0] == expected, (variant, nt, data)


@dtypes
@pytest.mark.parametrize("it,ot", [(np.int64, np.int32), (np.int32, np.int64)], ids=["i64>i32", "i32>i64"])
def test_spadd_output_index_dtype_is_written_directly(it, ot, dt, rng):
    # the output index dtype may differ from the operands' (int64 operands whose sum fits
    # int32 are written as int32): same entries, every variant and thread count, bit for bit
    m, n = 97, 61
    mats = [make(kind, rng, m, n) for kind in ("uniform", "powerlaw", "empty_rows", "uniform", "powerlaw")]
    coef = rng.choice([1.0, -1.0, 0.5], size=len(mats))
    ref = run(mats, coef, it, dt, m, n, 1, "merge")
    ips = [np.ascontiguousarray(M.indptr, dtype=it) for M in mats]
    inds = [np.ascontiguousarray(M.indices, dtype=it) for M in mats]
    vals = [np.ascontiguousarray(M.data, dtype=dt) for M in mats]
    for variant in VARIANTS:
        for nt in (1, 2):
            ip, ix, v = K.spadd(ips, inds, vals, coef, m, n, nt, variant, None, ot)
            assert ip.dtype == ot and ix.dtype == ot and v.dtype == dt
            assert np.array_equal(ip, ref[0]) and np.array_equal(ix, ref[1]) and np.array_equal(v, ref[2])


def test_spadd_output_index_dtype_rejects_what_it_cannot_hold():
    A = sp.csr_matrix(np.eye(2))
    args = ([A.indptr], [A.indices], [A.data], [1.0], 2, 2, 1)
    with pytest.raises(TypeError, match="index_dtype"):
        K.spadd(*args, "auto", None, np.float64)
    with pytest.raises(ValueError, match="do not fit"):
        K.spadd([A.indptr], [A.indices], [A.data], [1.0], 2, 2**31, 1, "auto", None, np.int32)


def test_spadd_chunking_does_not_change_results(rng):
    mats = [make("uniform", rng, 400, 300) for _ in range(4)]
    ref = run(mats, [1.0, -1.0, 2.0, 0.5], np.int32, np.float64, 400, 300, 2, "auto")
    old = K._set_chunk_work(500.0)
    try:
        for variant in VARIANTS:
            for nt in (1, 2):
                got = run(mats, [1.0, -1.0, 2.0, 0.5], np.int32, np.float64, 400, 300, nt, variant)
                assert all(np.array_equal(a, b) for a, b in zip(ref, got, strict=True))
    finally:
        K._set_chunk_work(old)


def test_spadd_scatter_accepts_unsorted_rows_with_duplicates():
    # raw arrays that are not canonical: only the scatter variant promises a canonical sum
    ip = np.array([0, 3, 4], dtype=np.int32)
    ix = np.array([2, 0, 2, 1], dtype=np.int32)
    v = np.array([1.0, 2.0, 3.0, 4.0])
    for nt in (1, 2):
        oip, oix, ov = K.spadd([ip, ip], [ix, ix], [v, v], [1.0, -0.5], 2, 3, nt, "scatter")
        C = sp.csr_matrix((ov, oix, oip), shape=(2, 3))
        assert C.has_sorted_indices and oix.tolist() == [0, 2, 1]
        np.testing.assert_array_equal(C.toarray(), [[1.0, 0.0, 2.0], [0.0, 2.0, 0.0]])


def test_spadd_rejects_bad_arguments():
    A = sp.random(5, 5, density=0.5, format="csr", random_state=0)
    ok = ([A.indptr, A.indptr], [A.indices, A.indices], [A.data, A.data])
    with pytest.raises(ValueError, match="variant"):
        K.spadd(*ok, [1.0, 1.0], 5, 5, 1, "heap")
    with pytest.raises(ValueError):
        K.spadd(*ok, [1.0], 5, 5, 1)
    with pytest.raises(ValueError):
        K.spadd([A.indptr, A.indptr[:-1]], ok[1], ok[2], [1.0, 1.0], 5, 5, 1)
    with pytest.raises(TypeError):
        K.spadd([A.indptr, A.indptr.astype(np.int64)], ok[1], ok[2], [1.0, 1.0], 5, 5, 1)


def test_spadd_no_operands_is_an_empty_matrix():
    ip, ix, v = K.spadd([], [], [], [], 3, 4, 1)
    assert ip.tolist() == [0, 0, 0, 0] and len(ix) == len(v) == 0


# ---------------------------------------------------------------- API path
def _program(k, signs):
    body = "B1[i,j]" + "".join(f" {s} B{t}[i,j]" for t, s in zip(range(2, k + 1), signs, strict=True))
    return "A[i,j] = " + body


@pytest.mark.parametrize("k", [2, 4, 7])
def test_api_spadd_scipy_in_scipy_out(k, rng):
    ops = {f"B{t}": sp.csr_array(make("uniform", rng, 60, 45)) for t in range(1, k + 1)}
    signs = rng.choice(["+", "-"], size=k - 1)
    got = spfuse.evaluate(_program(k, signs), **ops)
    want = ops["B1"].toarray()
    for t, s in zip(range(2, k + 1), signs, strict=True):
        want = want + ops[f"B{t}"].toarray() if s == "+" else want - ops[f"B{t}"].toarray()
    assert isinstance(got, sp.csr_array) and got.has_sorted_indices
    np.testing.assert_allclose(got.toarray(), want, rtol=1e-12, atol=1e-12)


def test_api_spadd_canonicalises_unsorted_duplicate_inputs_on_a_copy():
    data = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    indices = np.array([3, 1, 3, 0, 2], dtype=np.int32)
    indptr = np.array([0, 3, 5], dtype=np.int32)
    B = sp.csr_matrix((data.copy(), indices.copy(), indptr.copy()), shape=(2, 4))
    assert not B.has_canonical_format
    C = sp.csr_matrix(np.arange(8.0).reshape(2, 4))
    got = spfuse.evaluate("A[i,j] = B[i,j] + C[i,j] - B[i,j] + B[i,j]", B=B, C=C)
    np.testing.assert_allclose(got.toarray(), B.toarray() + C.toarray())
    assert np.array_equal(B.indices, indices) and np.array_equal(B.data, data)  # caller's arrays untouched


def test_api_spadd_explain_shows_the_statistics_and_choice(rng):
    ops = {f"B{t}": make("uniform", rng, 50, 40) for t in range(1, 8)}
    text = spfuse.compile(_program(7, ["+"] * 6)).explain(**ops)
    line = next(ln for ln in text.splitlines() if ln.startswith("execution:"))
    assert "template kernel 'spadd'" in line and "rows by " in line and "merge" in line
    assert "row upper bound mean" in line and "est. density" in line


# ---------------------------------------------------------------- statistics
def test_costs_are_the_kernels():
    assert dict(SPADD_COSTS) == dict(K.SPADD_COSTS)


def test_choose_spadd_decisions():
    # short rows over a wide output (accumulator beyond L2): merge (no workspace)
    assert choose_spadd(spadd_stats([2_000_000] * 7, 200_000, 200_000)).variant == "merge"
    # long rows over a narrow output: scatter
    assert choose_spadd(spadd_stats([600_000] * 7, 20_000, 20_000)).variant == "scatter"
    # two operands: merging is always cheaper than a scatter of the same entries
    assert choose_spadd(spadd_stats([10**6] * 2, 10**4, 10**4)).variant == "merge"
    # skewed rows: decided per row (9 runs: a 4-level tournament; the longest row scatters)
    c = choose_spadd(spadd_stats([350_000] * 9, 200_000, 200_000, max_row=9_000))
    assert c.variant == "auto" and c.costs["scatter_max"] < c.costs["merge_max"]
    # 7 runs over a wide output: the tournament beats the scatter even on a 9000-entry row
    c = choose_spadd(spadd_stats([350_000] * 7, 200_000, 200_000, max_row=9_000))
    assert c.variant == "merge" and c.costs["merge_max"] < c.costs["scatter_max"]
    # one operand with entries: a scaled copy
    assert choose_spadd(spadd_stats([0, 5, 0], 3, 3)).variant == "merge"


def test_choose_spadd_reports_dense_outputs_but_stays_sparse():
    c = choose_spadd(spadd_stats([5000] * 7, 100, 100))
    assert c.costs["est_density"] > 1 / 3 and "stays" in c.reason and c.variant in ("merge", "scatter", "auto")


def test_spadd_stats_density_and_rows():
    s = spadd_stats([50, 50], 10, 10, max_row=7)
    assert s.n_operands == 2 and s.nnz == 100 and s.mean_row == 10.0 and s.max_row == 7
    assert s.est_density == pytest.approx(0.75)


# ---------------------------------------------------------------- property
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 12), st.integers(1, 40), st.integers(2, 12), st.integers(0, 2**32 - 1),
       st.sampled_from([np.float32, np.float64]), st.sampled_from([np.int32, np.int64]))
def test_spadd_property(m, n, k, seed, dt, it):
    rng = np.random.default_rng(seed)
    mats = []
    for _ in range(k):
        A = sp.random(m, n, density=float(rng.uniform(0, 1)), format="csr", random_state=rng)
        A.sort_indices()
        mats.append(A)
    check_all_ways(mats, rng.choice([1.0, -1.0, 0.25, 3.0], size=k), it, dt, m, n)
