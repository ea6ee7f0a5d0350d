"""Generic loop-tree executor: hand-built plans against numpy oracles.

Every plan also runs with 2 threads and with block mode off; results must be
bitwise identical to the 1-thread block-mode run.
"""
import numpy as np
import pytest
import scipy.sparse as sp

from spfuse.errors import InvalidOperandError, ProgramError
from spfuse.runtime.looptree import (
    PAR_REDUCE,
    LoopTreeBuilder,
    access_from_arrays,
    compare,
    const,
    maximum,
    minimum,
    run,
    unary,
    where,
)

SEED = 1234


def rand_csr(m, n, density, rng, fmt="csr"):
    a = sp.random(m, n, density=density, format=fmt, random_state=rng, dtype=np.float64)
    a.data = rng.standard_normal(a.nnz)
    a.sum_duplicates()
    a.sort_indices()
    return a


def both_threads(plan):
    """Run with 1 and 2 threads; the results must be bitwise identical.  The
    per-element walk (``blocks=False``) must agree to rounding: it adds a dot
    leaf's products in sequence, the leaf in 8 chains."""
    r1 = run(plan, num_threads=1)
    for other, same in ((run(plan, num_threads=2), np.testing.assert_array_equal),
                        (run(plan, num_threads=1, blocks=False), _to_rounding)):
        assert r1.keys() == other.keys()
        for k in r1:
            a, b = r1[k], other[k]
            if hasattr(a, "coords"):   # COOResult or RowsResult
                np.testing.assert_array_equal(a.coords, b.coords)
                same(a.values, b.values)
            else:
                same(a, b)
    return r1


def _to_rounding(a, b):
    a, b = np.asarray(a), np.asarray(b)
    scale = float(np.nanmax(np.abs(np.where(np.isfinite(b), b, 0)), initial=1.0))
    np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13 * scale)


def is_parallel(plan):
    return len(plan.parallel_nodes) > 0


# --------------------------------------------------------------- kernels ---

def test_spmv_csr():
    rng = np.random.default_rng(SEED)
    A = rand_csr(50, 40, 0.1, rng)
    x = rng.standard_normal(40)
    b = LoopTreeBuilder()
    i, j = b.var("i", 50), b.var("j", 40)
    a, xa = b.access(A, (i, j), "A"), b.access(x, (j,), "x")
    y = b.buffer((50,), "y")
    with b.loop(i):
        with b.loop(j, intersect=[a]):
            b.statement(y[i], "sum", a * xa)
    plan = b.build()
    assert is_parallel(plan)
    assert "[parallel]" in plan.describe()
    assert plan.parallel == (("i", "blocks of iterations over the threads"),)
    np.testing.assert_allclose(both_threads(plan)["y"], A @ x, rtol=1e-12, atol=1e-12)


def test_spmm_and_tensor_duck_type():
    rng = np.random.default_rng(SEED)
    A = rand_csr(30, 20, 0.2, rng)
    B = rng.standard_normal((20, 7))
    try:
        from spfuse.tensor import Tensor
        At = Tensor.from_scipy(A)
    except Exception:  # the tensor module is someone else's; fall back
        At = A
    b = LoopTreeBuilder()
    i, j, k = b.var("i", 30), b.var("j", 20), b.var("k", 7)
    a, bb = b.access(At, (i, j), "A"), b.access(B, (j, k), "B")
    C = b.buffer((30, 7), "C")
    with b.loop(i):
        with b.loop(j, intersect=[a]):
            with b.loop(k):
                b.statement(C[i, k], "sum", a * bb)
    np.testing.assert_allclose(both_threads(b.build())["C"], A @ B, rtol=1e-12, atol=1e-12)


def _sddmm(div):
    rng = np.random.default_rng(SEED)
    m, n, r = 25, 18, 6
    B = rand_csr(m, n, 0.25, rng)
    C = rng.standard_normal((m, r))
    D = rng.standard_normal((r, n))
    b = LoopTreeBuilder()
    i, j, k = b.var("i", m), b.var("j", n), b.var("k", r)
    Ba = b.access(B, (i, j), "B")
    # D[k,j] is read with k innermost: store it column-major (levels j, k)
    Ca, Da = b.access(C, (i, k), "C"), b.access(np.asfortranarray(D), (k, j), "D")
    t = b.buffer((), "t", private=True)
    out = b.pattern_output(Ba, "A")
    with b.loop(i):
        with b.loop(j, intersect=[Ba]):
            b.reset(t, 0.0)
            with b.loop(k):
                b.statement(t, "sum", Ca * Da)
            b.statement(out, "assign", Ba / t if div else Ba * t)
    plan = b.build()
    assert is_parallel(plan)
    res = both_threads(plan)
    assert "t" not in res   # private temporaries are not results
    dense = C @ D
    coo = B.tocoo()
    expect = coo.data / dense[coo.row, coo.col] if div else coo.data * dense[coo.row, coo.col]
    # B is canonical CSR: positions follow CSR order = coo order
    np.testing.assert_allclose(res["A"], expect, rtol=1e-12, atol=1e-12)
    return plan


def test_sddmm_scalar_temporary_reset():
    plan = _sddmm(False)
    txt = plan.describe()
    assert "reset t = 0.0" in txt and "intersect(B[i,j])" in txt


def test_sddmm_div():
    _sddmm(True)


def test_sparse_division_convention():
    b = LoopTreeBuilder()
    i = b.var("i", 4)
    x = b.access(np.array([0.0, 0.0, 1.0, -2.0]), (i,), "x")
    y = b.access(np.array([0.0, 5.0, 0.0, 4.0]), (i,), "y")
    o = b.buffer((4,), "o")
    with b.loop(i):
        b.statement(o[i], "assign", x / y)
    r = run(b.build())["o"]
    assert r[0] == 0.0 and r[1] == 0.0 and r[2] == np.inf and r[3] == -0.5


def test_spgemm_gustavson_coo():
    rng = np.random.default_rng(SEED)
    A = rand_csr(30, 25, 0.1, rng)
    B = rand_csr(25, 20, 0.1, rng)
    b = LoopTreeBuilder()
    i, j, k = b.var("i", 30), b.var("j", 25), b.var("k", 20)
    Aa, Ba = b.access(A, (i, j), "A"), b.access(B, (j, k), "B")
    C = b.coo_output((i, k), "C")
    with b.loop(i):
        with b.loop(j, intersect=[Aa]):
            with b.loop(k, intersect=[Ba]):
                b.statement(C, "sum", Aa * Ba)
    plan = b.build()
    assert is_parallel(plan)
    res = both_threads(plan)["C"]
    ref = (A @ B).toarray()
    np.testing.assert_allclose(res.todense(), ref, rtol=1e-12, atol=1e-12)
    # canonical: sorted row-major, unique
    lin = res.coords[0] * 20 + res.coords[1]
    assert np.all(np.diff(lin) > 0)


def test_spadd_union_three_csr():
    rng = np.random.default_rng(SEED)
    mats = [rand_csr(20, 15, 0.15, rng) for _ in range(3)]
    b = LoopTreeBuilder()
    i, j = b.var("i", 20), b.var("j", 15)
    acc = [b.access(M, (i, j), f"B{n}") for n, M in enumerate(mats)]
    C = b.coo_output((i, j), "C")
    D = b.buffer((20, 15), "D")
    with b.loop(i):
        with b.loop(j, union=acc):
            b.statement(C, "assign", acc[0] + acc[1] + acc[2])
            b.statement(D[i, j], "assign", acc[0] + acc[1] + acc[2])
    plan = b.build()
    res = both_threads(plan)
    ref = sum(M.toarray() for M in mats)
    np.testing.assert_allclose(res["C"].todense(), ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(res["D"], ref, rtol=1e-12, atol=1e-12)
    # the pattern is exactly the union of the patterns
    pattern = sum((M != 0).astype(int) for M in mats).toarray() > 0
    assert res["C"].coords.shape[1] == pattern.sum()


def test_union_mixed_with_absent_parent():
    """Union at j under a union at i: absent rows propagate as absent."""
    A = sp.csr_matrix(np.array([[1.0, 0, 2], [0, 0, 0], [0, 3, 0], [0, 0, 0]]))
    Bm = sp.csr_matrix(np.array([[0.0, 4, 0], [0, 0, 0], [0, 0, 0], [5, 0, 6]]))
    # DCSR-like: compressed rows too
    def dcsr(M):
        rows = np.flatnonzero(np.diff(M.indptr))
        pos1 = np.concatenate([[0], M.indptr[rows + 1]])
        return access_from_arrays([("compressed", M.shape[0], [0, len(rows)], rows),
                                   ("compressed", M.shape[1], pos1, M.indices)], M.data)
    b = LoopTreeBuilder()
    i, j = b.var("i", 4), b.var("j", 3)
    a, bb = b.access(dcsr(A), (i, j), "A"), b.access(dcsr(Bm), (i, j), "B")
    out = b.buffer((4, 3), "out", init=-1.0)
    with b.loop(i, union=[a, bb]):
        with b.loop(j, union=[a, bb]):
            b.statement(out[i, j], "assign", a - bb)
    plan = b.build()
    assert plan.parallel == (("i", "serial (union loop)"),)   # what explain() reports
    res = run(plan)["out"]
    ref = np.where((A + Bm).toarray() != 0, (A - Bm).toarray(), -1.0)
    np.testing.assert_array_equal(res, ref)


def test_max_min_reductions_dense():
    rng = np.random.default_rng(SEED)
    C = rng.standard_normal((9, 6))
    d = rng.standard_normal(6)
    b = LoopTreeBuilder()
    i, k = b.var("i", 9), b.var("k", 6)
    Ca, da = b.access(C, (i, k)), b.access(d, (k,))
    ymax, ymin = b.buffer((9,), "ymax"), b.buffer((9,), "ymin")
    with b.loop(i):
        b.reset(ymax[i], -np.inf)
        b.reset(ymin[i], np.inf)
        with b.loop(k):
            b.statement(ymax[i], "max", Ca * da)
            b.statement(ymin[i], "min", Ca * da)
    res = both_threads(b.build())
    np.testing.assert_array_equal(res["ymax"], (C * d).max(axis=1))
    np.testing.assert_array_equal(res["ymin"], (C * d).min(axis=1))


def test_where_unary_ops():
    rng = np.random.default_rng(SEED)
    X = rng.standard_normal((5, 7))
    Y = np.abs(rng.standard_normal((5, 7))) + 0.1
    b = LoopTreeBuilder()
    i, j = b.var("i", 5), b.var("j", 7)
    x, y = b.access(X, (i, j)), b.access(Y, (i, j))
    names = ["relu", "sigmoid", "tanh", "exp", "abs", "neg"]
    outs = {n: b.buffer((5, 7), n) for n in names}
    more = {n: b.buffer((5, 7), n) for n in ["log", "sqrt", "where", "mx", "mn", "cmp", "poly"]}
    with b.loop(i):
        with b.loop(j):
            for n in names:
                b.statement(outs[n][i, j], "assign", unary(n, x))
            b.statement(more["log"][i, j], "assign", unary("log", y))
            b.statement(more["sqrt"][i, j], "assign", unary("sqrt", y))
            b.statement(more["where"][i, j], "assign", where(compare(">", x, 0), x * 2, y))
            b.statement(more["mx"][i, j], "assign", maximum(x, y))
            b.statement(more["mn"][i, j], "assign", minimum(x, y))
            b.statement(more["cmp"][i, j], "assign", compare("<=", x, y))
            b.statement(more["poly"][i, j], "assign", 3 - x * x / 2 + const(1.5) * (y - 1) - (-x))
    res = both_threads(b.build())
    ref = {"relu": np.maximum(X, 0), "sigmoid": 1 / (1 + np.exp(-X)), "tanh": np.tanh(X),
           "exp": np.exp(X), "abs": np.abs(X), "neg": -X, "log": np.log(Y), "sqrt": np.sqrt(Y),
           "where": np.where(X > 0, X * 2, Y), "mx": np.maximum(X, Y), "mn": np.minimum(X, Y),
           "cmp": (X <= Y).astype(float), "poly": 3 - X * X / 2 + 1.5 * (Y - 1) + X}
    for n, r in ref.items():
        np.testing.assert_allclose(res[n], r, rtol=1e-14, atol=1e-15, err_msg=n)


def _csf(X):
    """3-d CSF (compressed, compressed, compressed) of a dense array."""
    nz = np.argwhere(X != 0)
    vals = X[tuple(nz.T)]
    I, J, K = X.shape
    i_u, i_first = np.unique(nz[:, 0], return_index=True)
    pos0 = [0, len(i_u)]
    ij = nz[:, 0] * J + nz[:, 1]
    ij_u, ij_first = np.unique(ij, return_index=True)
    pos1 = np.concatenate([np.searchsorted(ij_u // J, i_u), [len(ij_u)]])
    pos2 = np.concatenate([ij_first, [len(nz)]])
    return access_from_arrays([("compressed", I, pos0, i_u), ("compressed", J, pos1, ij_u % J),
                               ("compressed", K, pos2, nz[:, 2])], vals)


def test_mttkrp_csf_hoisted_row_temporary():
    rng = np.random.default_rng(SEED)
    I, J, K, R = 6, 5, 7, 4
    X = rng.standard_normal((I, J, K)) * (rng.random((I, J, K)) < 0.2)
    X[2] = 0.0                      # an empty slice
    C = rng.standard_normal((J, R))
    D = rng.standard_normal((K, R))
    b = LoopTreeBuilder()
    i, j, k, r = b.var("i", I), b.var("j", J), b.var("k", K), b.var("r", R)
    Xa = b.access(_csf(X), (i, j, k), "X")
    Ca, Da = b.access(C, (j, r), "C"), b.access(D, (k, r), "D")
    t = b.buffer((R,), "t", private=True)
    A = b.buffer((I, R), "A")
    with b.loop(i, intersect=[Xa]):
        with b.loop(j, intersect=[Xa]):
            b.reset(t[r], 0.0)
            with b.loop(k, intersect=[Xa]):
                with b.loop(r):
                    b.statement(t[r], "sum", Xa * Da)
            with b.loop(r):
                b.statement(A[i, r], "sum", t[r] * Ca)
    plan = b.build()
    assert is_parallel(plan)
    res = both_threads(plan)
    np.testing.assert_allclose(res["A"], np.einsum("ijk,jr,kr->ir", X, C, D), rtol=1e-12, atol=1e-12)


def test_gnn2_two_branch_fused_tree():
    """Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]: sibling loops under i."""
    rng = np.random.default_rng(SEED)
    n, f = 12, 5
    A = rand_csr(n, f, 0.4, rng)        # i,h
    X = rng.standard_normal((n, n))     # i,k
    Y = rng.standard_normal((n, f))     # k,h and j,h
    b = LoopTreeBuilder()
    i, k, h, j = b.var("i", n), b.var("k", n), b.var("h", f), b.var("j", n)
    Aa, Xa = b.access(A, (i, h), "A"), b.access(X, (i, k), "X")
    Ykh, Yjh = b.access(Y, (k, h), "Y"), b.access(Y, (j, h), "Yt")
    t = b.buffer((f,), "t", private=True)
    Z = b.buffer((n, n), "Z")
    with b.loop(i):
        b.reset(t[h], 0.0)
        with b.loop(k):                       # branch 1: producer row
            with b.loop(h):
                b.statement(t[h], "sum", Xa * Ykh)
        with b.loop(j):                       # branch 2: consumer
            with b.loop(h, intersect=[Aa]):
                b.statement(Z[i, j], "sum", Aa * t[h] * Yjh)
    plan = b.build()
    assert is_parallel(plan)
    assert len(plan.value_arrays) == 3      # Y shared by both accesses
    res = both_threads(plan)
    ref = (A.toarray() * (X @ Y)) @ Y.T
    np.testing.assert_allclose(res["Z"], ref, rtol=1e-11, atol=1e-11)


def test_csc_access_mode_order_loops():
    rng = np.random.default_rng(SEED)
    A = rand_csr(30, 20, 0.2, rng, fmt="csc")
    x = rng.standard_normal(20)
    b = LoopTreeBuilder()
    i, j = b.var("i", 30), b.var("j", 20)
    a, xa = b.access(A, (i, j), "A"), b.access(x, (j,), "x")
    y = b.buffer((30,), "y")
    with b.loop(j):
        with b.loop(i, intersect=[a]):
            b.statement(y[i], "sum", a * xa)
    plan = b.build()
    # y is not split by j: summed per fixed block of j, the blocks added in order
    assert list(plan.top_parallel[plan.top_parallel > 0]) == [PAR_REDUCE]
    assert "reduction blocks" in plan.describe()
    np.testing.assert_allclose(both_threads(plan)["y"], A @ x, rtol=1e-12, atol=1e-12)
    # the wrong loop order is rejected (not concordant)
    b2 = LoopTreeBuilder()
    i2, j2 = b2.var("i", 30), b2.var("j", 20)
    a2 = b2.access(A, (i2, j2))
    y2 = b2.buffer((30,), "y")
    with b2.loop(i2):
        with b2.loop(j2, intersect=[a2]):
            b2.statement(y2[i2], "sum", a2)
    with pytest.raises(ProgramError, match="driver|concordant"):
        b2.build()


def test_empty_tensors_and_zero_extents():
    empty = sp.csr_matrix((6, 4))
    x = np.ones(4)
    b = LoopTreeBuilder()
    i, j = b.var("i", 6), b.var("j", 4)
    a, xa = b.access(empty, (i, j)), b.access(x, (j,))
    y = b.buffer((6,), "y", init=7.0)
    C = b.coo_output((i, j), "C")
    P = b.pattern_output(a, "P")
    with b.loop(i):
        with b.loop(j, intersect=[a]):
            b.statement(y[i], "sum", a * xa)
            b.statement(C, "sum", a)
            b.statement(P, "assign", a)
    res = both_threads(b.build())
    np.testing.assert_array_equal(res["y"], np.full(6, 7.0))
    assert res["C"].coords.shape == (2, 0) and res["P"].shape == (0,)

    b = LoopTreeBuilder()
    i, j = b.var("i", 0), b.var("j", 3)
    Z = b.access(np.zeros((0, 3)), (i, j))
    out = b.buffer((0, 3), "out")
    s = b.buffer((), "s", init=1.0)
    with b.loop(i):
        with b.loop(j):
            b.statement(out[i, j], "assign", Z)
            b.statement(s, "sum", Z + 1)
    res = both_threads(b.build())
    assert res["out"].shape == (0, 3) and res["s"] == 1.0


def test_reset_region_rule_and_top_level_statements():
    """reset(buf[i,k]) under loop i fills row i only; top-level statements run."""
    b = LoopTreeBuilder()
    i, k = b.var("i", 3), b.var("k", 4)
    M = b.buffer((3, 4), "M", init=5.0)
    s = b.buffer((), "s")
    b.statement(s, "assign", const(2.0))
    with b.loop(i):
        with b.loop(k):
            b.statement(M[i, k], "sum", const(1.0))   # 6 everywhere
        b.reset(M[i, k], float(-1))                   # row i := -1 (k unbound)
        with b.loop(k):
            b.statement(M[i, k], "sum", s)            # row i := 1
    res = both_threads(b.build())
    np.testing.assert_array_equal(res["M"], np.ones((3, 4)))
    assert res["s"] == 2.0


def test_errors():
    b = LoopTreeBuilder()
    i, j = b.var("i", 3), b.var("j", 4)
    A = b.access(np.ones((3, 4)), (i, j))
    y = b.buffer((3,), "y")
    with b.loop(i):
        b.statement(y[i], "sum", A)        # j not bound
    with pytest.raises(ProgramError, match="levels are bound"):
        b.build()
    with pytest.raises(ProgramError, match="extent"):
        b.access(np.ones((4, 4)), (i, j))
    with pytest.raises(InvalidOperandError, match="increasing"):
        access_from_arrays([("dense", 2), ("compressed", 3, [0, 2, 2], [1, 0])], [1.0, 2.0])
    with pytest.raises(InvalidOperandError, match="pos"):
        access_from_arrays([("dense", 2), ("compressed", 3, [0, 2], [1, 0])], [1.0, 2.0])
    with pytest.raises(ProgramError, match="already bound"):
        with b.loop(i):
            with b.loop(i):
                pass


def test_noncanonical_scipy_is_canonicalised_on_copy():
    A = sp.csr_matrix((np.array([1.0, 2.0, 3.0]), np.array([2, 0, 2]), np.array([0, 3, 3])), shape=(2, 3))
    assert not A.has_canonical_format
    b = LoopTreeBuilder()
    i, j = b.var("i", 2), b.var("j", 3)
    a = b.access(A, (i, j))
    out = b.buffer((2, 3), "out")
    with b.loop(i):
        with b.loop(j, intersect=[a]):
            b.statement(out[i, j], "assign", a)
    np.testing.assert_array_equal(run(b.build())["out"], A.toarray())
    assert list(A.indices) == [2, 0, 2]     # caller's matrix untouched


def test_parallel_bigger_identical():
    """Enough rows that both threads get work; bitwise equality 1 vs 2 threads."""
    rng = np.random.default_rng(SEED)
    A = rand_csr(3000, 500, 0.01, rng)
    B = rand_csr(500, 400, 0.01, rng)
    b = LoopTreeBuilder()
    i, j, k = b.var("i", 3000), b.var("j", 500), b.var("k", 400)
    Aa, Ba = b.access(A, (i, j)), b.access(B, (j, k))
    C = b.coo_output((i, k), "C")
    with b.loop(i, intersect=[Aa]):
        with b.loop(j, intersect=[Aa]):
            with b.loop(k, intersect=[Ba]):
                b.statement(C, "sum", Aa * Ba)
    res = both_threads(b.build())["C"]
    np.testing.assert_allclose(res.todense(), (A @ B).toarray(), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------ hypothesis ---

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@st.composite
def programs(draw):
    seed = draw(st.integers(0, 2 ** 31 - 1))
    rng = np.random.default_rng(seed)
    I, J = draw(st.integers(0, 5)), draw(st.integers(0, 5))
    with_k = draw(st.booleans())
    K = draw(st.integers(1, 4)) if with_k else 1
    nops = draw(st.integers(1, 3))
    ops = []
    for _ in range(nops):
        sparse = draw(st.booleans())
        modes = draw(st.sampled_from(["ij", "ij", "i", "j"] + (["ik", "kj"] if with_k else [])))
        shape = tuple({"i": I, "j": J, "k": K}[c] for c in modes)
        dens = rng.standard_normal(shape) * (rng.random(shape) < 0.5)
        ops.append((modes, dens, sparse and modes == "ij"))
    combine = [draw(st.sampled_from(["*", "+", "-"])) for _ in range(nops - 1)]
    try_intersect = draw(st.booleans())
    return I, J, K, with_k, ops, combine, try_intersect


@settings(max_examples=80, deadline=None)
@given(programs())
def test_hypothesis_random_elementwise_product(prog):
    I, J, K, with_k, ops, combine, try_intersect = prog
    b = LoopTreeBuilder()
    v = {"i": b.var("i", I), "j": b.var("j", J), "k": b.var("k", K)}
    accs = []
    for modes, dens, sparse in ops:
        if sparse:
            t = sp.csr_matrix(dens)
        elif modes == "kj":   # k is bound last: store column-major (levels j, k)
            t = access_from_arrays([("dense", J), ("dense", K)], dens.T.copy(), (1, 0))
        else:
            t = np.ascontiguousarray(dens)
        accs.append(b.access(t, tuple(v[c] for c in modes)))
    expr = accs[0]
    env = []
    for (modes, dens, _), a, c in zip(ops[1:], accs[1:], combine, strict=True):
        expr = expr + a if c == "+" else expr - a if c == "-" else expr * a
        env.append((c, modes, dens))

    def full(modes, d):
        shp = [1, 1, 1]
        for c, s in zip(modes, d.shape, strict=True):
            shp["ijk".index(c)] = s
        order = sorted(range(len(modes)), key=lambda n: "ijk".index(modes[n]))
        return np.transpose(d, order).reshape(shp)

    tot = full(ops[0][0], ops[0][1])
    for c, modes, d in env:
        f = full(modes, d)
        tot = tot * f if c == "*" else tot + f if c == "+" else tot - f
    tot = np.broadcast_to(tot, (I, J, K))
    ref = tot.sum(axis=2)
    # intersecting on a sparse operand is legal only when the whole expression
    # is a product (zero outside the operand's pattern)
    sparse_ij = [a for a, (m, _, s) in zip(accs, ops, strict=True) if s]
    legal = try_intersect and sparse_ij and all(c == "*" for c in combine)
    out = b.buffer((I, J), "out")
    with b.loop(v["i"]):
        with b.loop(v["j"], intersect=[sparse_ij[0]] if legal else None):
            if with_k:
                with b.loop(v["k"]):
                    b.statement(out[v["i"], v["j"]], "sum", expr)
            else:
                b.statement(out[v["i"], v["j"]], "sum", expr)
    res = both_threads(b.build())["out"]
    np.testing.assert_allclose(res, ref, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 50), n=st.integers(1, 80), density=st.sampled_from([0.0, 0.05, 0.4]),
       seed=st.integers(0, 2**31 - 1), widths=st.sampled_from([(32, 32), (64, 64), (32, 64)]))
def test_int32_and_int64_index_arrays_give_the_same_answer(m, n, density, seed, widths):
    """int32 index arrays (scipy's default) run on the int32 executor as they
    are; int64 ones, or a mix, on the int64 executor: the same results
    bitwise.  Programs: Aᵀx + B·x (scatter and gather leaves of a sweep) and
    an element-wise product kept on A's pattern."""
    from spfuse._kernels import _looptree, _looptree32
    from spfuse.runtime.looptree import _executor

    rng = np.random.default_rng(seed)
    A, B = rand_csr(m, n, density, rng), rand_csr(m, n, density, rng)
    x, z = rng.standard_normal(m), rng.standard_normal(n)

    def arrays(M, w):
        t = np.int32 if w == 32 else np.int64
        return [("dense", M.shape[0]), ("compressed", M.shape[1], M.indptr.astype(t), M.indices.astype(t))], M.data

    results = []
    for wa, wb in (widths, (64, 64)):
        b = LoopTreeBuilder()
        i, j = b.var("i", m), b.var("j", n)
        a = b.access(access_from_arrays(*arrays(A, wa)), (i, j))
        bb = b.access(access_from_arrays(*arrays(B, wb)), (i, j))
        xx, zz = b.access(x, (i,)), b.access(z, (j,))
        y, w = b.buffer((n,), "y"), b.buffer((m,), "w")
        out = b.pattern_output(a, name="out")
        with b.loop(i):
            with b.loop(j, intersect=[a]):
                b.statement(y[j], "sum", a * xx)
                b.statement(out, "assign", a * zz)
            with b.loop(j, intersect=[bb]):
                b.statement(w[i], "sum", bb * zz)
        plan = b.build()
        assert _executor(plan) is (_looptree32 if (wa, wb) == (32, 32) else _looptree)
        results.append(both_threads(plan))
    for k in ("y", "w", "out"):
        np.testing.assert_array_equal(results[0][k], results[1][k])
    np.testing.assert_allclose(results[0]["y"], A.toarray().T @ x, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(results[0]["w"], B.toarray() @ z, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("levels", [("compressed",) * 3, ("dense", "compressed", "compressed"),
                                    ("dense", "dense", "compressed")])
@pytest.mark.parametrize("target", ["scalar", "by_j", "by_i"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_sparse_vector_intersected_under_outer_fibers(levels, target, threads):
    """``sum(j, i, l, B[j,i,l] * a[l])`` with ``a`` a sparse vector: the l
    loop intersects a's only fiber with B's fiber under each (j, i).  The
    sweeps' sparse∩sparse dot leaf read a's root level as if it moved with
    the sweep's positions (garbage positions: a wrong 0 and a corrupted
    heap); such a loop now runs element by element.  Found by the random
    program property test (program seed 1757, fusion='max')."""
    from spfuse.formats import Format
    from spfuse.tensor import Tensor
    rng = np.random.default_rng(3)
    a = np.array([0.0, 0.0, 0.0, 1.5, 0.0, -2.0])
    B = rng.standard_normal((4, 3, 6)) * (rng.random((4, 3, 6)) < 0.6)
    B[:, :, 3] = 1.0
    tb = Tensor.from_numpy(B).asformat(Format(levels, (0, 1, 2)))
    b = LoopTreeBuilder()
    j, i, l = b.var("j", 4), b.var("i", 3), b.var("l", 6)
    bb, aa = b.access(tb, (j, i, l), "B"), b.access(Tensor.from_numpy(a).asformat("csf"), (l,), "a")
    out = b.buffer({"scalar": (), "by_j": (4,), "by_i": (3,)}[target], name="out")
    ref = out[()] if target == "scalar" else out[j] if target == "by_j" else out[i]
    with (b.loop(j) if levels[0] == "dense" else b.loop(j, intersect=[bb])):
        with (b.loop(i) if levels[1] == "dense" else b.loop(i, intersect=[bb])):
            with b.loop(l, intersect=[aa, bb]):
                b.statement(ref, "sum", bb * aa)
    want = np.einsum("jil,l->" + {"scalar": "", "by_j": "j", "by_i": "i"}[target], B, a)
    np.testing.assert_allclose(run(b.build(), num_threads=threads)["out"], want, rtol=1e-12)


@pytest.mark.parametrize("extent", [1, 2, 3])
@pytest.mark.parametrize("b_format", ["csr", "dense"])
def test_a_leaf_into_a_result_whose_loop_has_extent_one(extent, b_format):
    """``R[i] = sum(k, j, A[k,i,j] * B[k,j])`` with A a CSF tensor: the j
    loop is a sparse∩sparse (B CSR) or dense (B dense) leaf under A's fibers.
    With ``I == 1`` the result has one element, which the leaf detectors took
    for a sweep temporary; it had no sweep slot, so the leaf's sums went
    before the slot vector -- R stayed 0 and the heap was overwritten (a
    segfault later).  Found through the complex-values property test (seed
    383, pydata COO A of shape (4, 1, 4)); every extent now matches numpy."""
    from spfuse.tensor import Tensor
    rng = np.random.default_rng(11)
    A = rng.standard_normal((5, extent, 6)) * (rng.random((5, extent, 6)) < 0.5)
    B = rng.standard_normal((5, 6)) * (rng.random((5, 6)) < 0.7)
    ta, tb = Tensor.from_numpy(A, "csf"), Tensor.from_numpy(B, b_format)
    b = LoopTreeBuilder()
    k, i, j = b.var("k", 5), b.var("i", extent), b.var("j", 6)
    aa, bb = b.access(ta, (k, i, j), "A"), b.access(tb, (k, j), "B")
    out = b.buffer((extent,), name="R")
    with b.loop(k, intersect=[aa]):
        with b.loop(i, intersect=[aa]):
            with b.loop(j, intersect=[aa, bb] if b_format == "csr" else [aa]):
                b.statement(out[i], "sum", aa * bb)
    got = both_threads(b.build())["R"]
    np.testing.assert_allclose(got, np.einsum("kij,kj->i", A, B), rtol=1e-12, atol=1e-12)
    import spfuse
    np.testing.assert_allclose(spfuse.evaluate("R[i] = A[k,i,j] * B[k,j]", A=ta, B=tb),
                               np.einsum("kij,kj->i", A, B), rtol=1e-12, atol=1e-12)
