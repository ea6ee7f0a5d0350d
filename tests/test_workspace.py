"""Row workspaces: sparse results under a reduction assembled row by row.

A COO output written below a reduction loop (SpGEMM, A·Bᵀ, AᵀA) is collected
in a private dense workspace over its innermost variable and flushed, sorted,
at the end of every iteration of the loop over its other variables.  The
oracle is numpy on dense operands; every plan also runs with 2 threads and
element by element, which must give bitwise the same result.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse.runtime import looptree as lt
from spfuse.runtime.looptree import LoopTreeBuilder, run

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def rand_csr(m, n, density, rng, fmt="csr"):
    a = sp.random(m, n, density=density, format=fmt, random_state=rng)
    a.data = rng.standard_normal(a.nnz)
    return a


def same_everywhere(plan):
    """1 thread, 2 threads and element-by-element runs agree bitwise."""
    r1 = run(plan, num_threads=1)
    for other in (run(plan, num_threads=2), run(plan, num_threads=1, blocks=False)):
        for name, a in r1.items():
            b = other[name]
            np.testing.assert_array_equal(a.coords, b.coords)
            np.testing.assert_array_equal(a.values, b.values)
            assert a.order == b.order
    return r1


def sorted_unique(res):
    """Coordinates strictly increasing in the result's own order."""
    keys = np.ravel_multi_index(tuple(res.coords[d] for d in res.order),
                                tuple(res.shape[d] for d in res.order))
    return bool(np.all(np.diff(keys) > 0))


def abt_oracle(A, B, op):
    """C[i,k] = op over j of A[i,j]*B[k,j], over the j stored in both."""
    Ad, Bd = A.toarray(), B.toarray()
    Am, Bm = A.toarray() != 0, B.toarray() != 0
    m, k = Ad.shape[0], Bd.shape[0]
    out = np.zeros((m, k))
    present = np.zeros((m, k), dtype=bool)
    for i in range(m):
        for kk in range(k):
            both = Am[i] & Bm[kk]
            if both.any():
                prods = Ad[i, both] * Bd[kk, both]
                out[i, kk] = {"sum": np.sum, "max": np.max, "min": np.min}[op](prods)
                present[i, kk] = True
    return out, present


def build_abt(A, B, order, op):
    """C[i,k] op= A[i,j]*B[k,j]: Gustavson over the outer operand's rows (CSR)
    and the inner operand's columns (CSC), loops i,j,k or k,j,i."""
    b = LoopTreeBuilder()
    i, j, k = b.var("i", A.shape[0]), b.var("j", A.shape[1]), b.var("k", B.shape[0])
    if order == "ijk":
        Aa, Ba = b.access(sp.csr_matrix(A), (i, j), "A"), b.access(sp.csc_matrix(B), (k, j), "B")
        outer, inner, acc_o, acc_i = i, k, Aa, Ba
    else:
        Aa, Ba = b.access(sp.csc_matrix(A), (i, j), "A"), b.access(sp.csr_matrix(B), (k, j), "B")
        outer, inner, acc_o, acc_i = k, i, Ba, Aa
    C = b.coo_output((i, k), "C")
    with b.loop(outer):
        with b.loop(j, intersect=[acc_o]):
            with b.loop(inner, intersect=[acc_i]):
                b.statement(C, op, Aa * Ba)
    return b.build()


def test_plan_shows_the_workspace_and_flush():
    rng = np.random.default_rng(0)
    plan = build_abt(rand_csr(8, 6, 0.3, rng), rand_csr(7, 6, 0.3, rng), "kji", "sum")
    text = plan.describe()
    assert "buffer C.ws[8] private" in text
    assert "flush C.ws -> C<coo>[i,k] (touched i in order)" in text
    assert plan.coo_orders == ((1, 0),)


@pytest.mark.parametrize("order", ["ijk", "kji"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_abt_orders_and_ops_match_numpy(order, op):
    rng = np.random.default_rng(1)
    A, B = rand_csr(40, 30, 0.15, rng), rand_csr(35, 30, 0.15, rng)
    res = same_everywhere(build_abt(A, B, order, op))["C"]
    assert res.order == ((0, 1) if order == "ijk" else (1, 0))
    assert sorted_unique(res)
    want, present = abt_oracle(A, B, op)
    got = np.zeros_like(want)
    got[tuple(res.coords)] = res.values
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    # exactly the coordinates some product reached (max/min of negatives too)
    got_present = np.zeros_like(present)
    got_present[tuple(res.coords)] = True
    np.testing.assert_array_equal(got_present, present)


def test_workspace_not_used_above_the_cap(monkeypatch):
    rng = np.random.default_rng(2)
    A, B = rand_csr(20, 15, 0.2, rng), rand_csr(25, 15, 0.2, rng)
    with_ws = same_everywhere(build_abt(A, B, "kji", "sum"))["C"]
    monkeypatch.setattr(lt, "WORKSPACE_MAX", 5)
    plan = build_abt(A, B, "kji", "sum")
    assert "flush" not in plan.describe()
    without = same_everywhere(plan)["C"]
    np.testing.assert_allclose(with_ws.todense(), without.todense(), rtol=1e-14, atol=0)


def test_empty_rows_and_zero_extents():
    rng = np.random.default_rng(3)
    A = rand_csr(12, 9, 0.2, rng).tolil()
    A[3:7, :] = 0
    A = A.tocsr()
    A.eliminate_zeros()
    for m, n, kk in ((12, 9, 10), (0, 9, 10), (12, 0, 10), (12, 9, 0)):
        Am = A[:m, :n] if m and n else sp.csr_matrix((m, n))
        Bm = rand_csr(kk, n, 0.3, rng) if kk and n else sp.csr_matrix((kk, n))
        res = same_everywhere(build_abt(Am, Bm, "kji", "sum"))["C"]
        np.testing.assert_allclose(res.todense(), Am.toarray() @ Bm.toarray().T, atol=1e-13)


@settings(max_examples=40, deadline=None)
@given(m=st.integers(0, 12), n=st.integers(0, 10), kk=st.integers(0, 12),
       density=st.floats(0.0, 0.8), order=st.sampled_from(["ijk", "kji"]),
       op=st.sampled_from(["sum", "max", "min"]), seed=st.integers(0, 2 ** 31 - 1))
def test_hypothesis_random_abt(m, n, kk, density, order, op, seed):
    rng = np.random.default_rng(seed)
    A = rand_csr(m, n, density, rng) if m and n else sp.csr_matrix((m, n))
    B = rand_csr(kk, n, density, rng) if kk and n else sp.csr_matrix((kk, n))
    res = same_everywhere(build_abt(A, B, order, op))["C"]
    assert sorted_unique(res) or len(res.values) <= 1
    want, present = abt_oracle(A, B, op) if m and kk else (np.zeros((m, kk)), np.zeros((m, kk), bool))
    got = np.zeros((m, kk))
    if len(res.values):
        got[tuple(res.coords)] = res.values
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("program, make", [
    ("C[i,k] = A[i,j]*B[k,j]", lambda A, B: A @ B.T),
    ("C[j,k] = A[i,j]*A[i,k]", lambda A, B: A.T @ A),
    ("C[i,k] = A[i,j]*B[j,k]", lambda A, B: A @ B.T.T),
])
def test_end_to_end_sparse_products_match_scipy(program, make):
    rng = np.random.default_rng(4)
    # wide enough that results stay sparse (not scattered into a dense result)
    A = sp.random_array((3000, 2000), density=0.002, format="csr", random_state=rng)
    B = sp.random_array((2000, 2000), density=0.002, format="csr", random_state=rng)
    ops = {"A": A, "B": B} if "B" in program else {"A": A}
    got = spfuse.evaluate(program, **ops)
    want = make(A, B)
    assert sp.issparse(got)
    np.testing.assert_allclose(got.toarray(), want.toarray(), rtol=1e-12, atol=1e-14)


# ---------------------------------------------- one operand, two storage orders ---

def _csr_info(name, n, nnz):
    from spfuse.ir.ops import TensorInfo
    return TensorInfo(name, 2, ("dense", "compressed"), (0, 1), (n, n), nnz=nnz)


def test_planner_reads_one_access_of_ata_by_columns():
    """Aᵀ·A: one read of A through a CSC copy (an alias) makes the result's
    leading index an outer loop, so rows are assembled in a workspace."""
    from spfuse.planner import plan_program
    program = spfuse.compile("C[j,k] = A[i,j]*A[i,k]").program
    plan = plan_program(program, {"A": _csr_info("A", 100_000, 1_000_000)})
    assert dict(plan.aliases) == {"A_2": "A"}
    assert plan.inputs["A_2"].mode_order == (1, 0) and plan.inputs["A"].mode_order == (0, 1)
    assert plan.orders[0][0] == "j"
    assert any("a copy named A_2" in d for d in plan.decisions)


def test_planner_keeps_small_programs_unaliased():
    from spfuse.planner import plan_program
    program = spfuse.compile("C[j,k] = A[i,j]*A[i,k]").program
    plan = plan_program(program, {"A": _csr_info("A", 50, 200)})
    assert not plan.aliases


def test_aliased_ata_end_to_end_matches_scipy_and_keeps_input():
    rng = np.random.default_rng(5)
    n = 6000
    rows, cols = rng.integers(0, n, 10 * n), rng.integers(0, n, 10 * n)
    A = sp.coo_array((rng.standard_normal(10 * n), (rows, cols)), shape=(n, n)).tocsr()
    before = (A.data.copy(), A.indices.copy(), A.indptr.copy())
    k = spfuse.compile("C[j,k] = A[i,j]*A[i,k]", A="csr")
    assert "a copy named A_2" in k.explain(A=A)
    got = k(A=A)
    np.testing.assert_allclose(got.toarray(), (A.T @ A).toarray(), rtol=1e-12, atol=1e-12)
    for a, b in zip(before, (A.data, A.indices, A.indptr), strict=True):
        np.testing.assert_array_equal(a, b)
    again = k(A=A * 2.0)   # the cached plan, other values
    np.testing.assert_allclose(again.toarray(), 4 * (A.T @ A).toarray(), rtol=1e-12, atol=1e-12)


# ------------------------------------------------ sums of products, distributed ---

def test_sum_of_two_spmms_is_two_sums_not_a_union():
    """sum(j, A·X − B·Y) runs as two sums over each operand's own pattern, not
    as a union of both patterns with a temporary per (i, j, k)."""
    rng = np.random.default_rng(6)
    A, B = rand_csr(300, 200, 0.05, rng), rand_csr(300, 200, 0.05, rng)
    X, Y = rng.standard_normal((200, 8)), rng.standard_normal((200, 8))
    k = spfuse.compile("C[i,k] = A[i,j]*X[j,k] - 2*B[i,j]*Y[j,k]")
    text = k.explain(A=A, B=B, X=X, Y=Y)
    assert "T0[i,k] = sum(j, A[i,j] * X[j,k])" in text
    assert "T0[i,j,k]" not in text
    got = k(A=A, B=B, X=X, Y=Y)
    np.testing.assert_allclose(got, A @ X - 2 * (B @ Y), rtol=1e-12, atol=1e-12)


def test_sum_with_a_term_free_of_the_index_is_not_distributed():
    """sum(j, A[i,j] + x[i]) adds x[i] once per j: it stays one sum."""
    rng = np.random.default_rng(7)
    A = rand_csr(20, 15, 0.3, rng)
    x = rng.standard_normal(20)
    got = spfuse.evaluate("y[i] = sum(j, A[i,j] + x[i])", A=A, x=x)
    np.testing.assert_allclose(got, A.toarray().sum(1) + 15 * x, rtol=1e-12)
