"""Template routing of fused groups (spfuse/lowering/groups.py): an einsum
head on its template with an element-wise tail on the generic executor,
factors read transposed, 0-d factors, same-pattern CSR factors merged.

Every routed program is checked against numpy on dense operands (so a
route that changes the numbers fails here) and checked to take the route
it is written for (so the test exercises it)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.lowering import templates, transposes
from spfuse.lowering.groups import split_groups
from spfuse.testing import dense_reference


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _relu(x):
    return np.maximum(x, 0.0)


#: (program, route expected in split_groups: (kernel, transposed, out_swapped, scalars, merged, then generic tail),
#:  numpy oracle on dense operands)
CASES = {
    "relu_after_spmm": ("Y[i,h] = relu(A[i,j] * X[j,h])", ("spmm+epilogue",),
                        lambda A, B, X, W, Q, b, s, D: _relu(A @ X)),
    "sigmoid_bias": ("Y[i,h] = sigmoid(A[i,j] * X[j,h] + b[h])", ("spmm", "generic"),
                     lambda A, B, X, W, Q, b, s, D: _sigmoid(A @ X + b)),
    "dense_read_transposed": ("Y[i,h] = sum(j, A[i,j] * W[h,j])", ("spmm",),
                              lambda A, B, X, W, Q, b, s, D: A @ W.T),
    "scatter_over_rows": ("Y[h,j] = sum(i, A[i,j] * Q[i,h])", ("spmm_t",),
                          lambda A, B, X, W, Q, b, s, D: Q.T @ A),
    "merged_and_scaled": ("Y[i,h] = sum(j, A[i,j] * s * X[j,h] * B[i,j])", ("spmm+epilogue",),
                          lambda A, B, X, W, Q, b, s, D: (A * B * s) @ X),
    "pattern_product": ("Y[i,j] = A[i,j] * B[i,j] * s", ("values",),
                        lambda A, B, X, W, Q, b, s, D: A * B * s),
    # a dense factor at the merged factors' indices is no scalar: no "values" route (the
    # values of the one pattern, D gathered at its entries: spfuse/lowering/pattern_values.py)
    "pattern_times_dense": ("Y[i,j] = A[i,j] * B[i,j] * D[i,j]", ("pattern",),
                            lambda A, B, X, W, Q, b, s, D: A * B * D),
    # A/A is A's pattern (checked per call: finite non-zero values), 2.0 a constant factor
    "pattern_ratio": ("Y[i,j] = A[i,j] / A[i,j] * (2.0 * (s * B[i,j]))", ("values",),
                      lambda A, B, X, W, Q, b, s, D: np.where(A != 0, 1.0, 0.0) * 2.0 * s * B),
    "sddmm_scaled": ("Y[i,j] = sum(h, A[i,j] * Q[i,h] * W[h,j]) * s", ("sddmm",),
                     lambda A, B, X, W, Q, b, s, D: A * (Q @ W) * s),
    # the einsum is needed on A's pattern only: SDDMM there, kept sparse for the tail
    "sddmm_on_the_mask": ("Y[i,j] = A[i,j] * (sum(h, Q[i,h] * W[h,j]) - B[i,j])", ("sddmm", "pattern"),
                          lambda A, B, X, W, Q, b, s, D: A * (Q @ W - B)),
    # SpMM's rows and the row sums in one pass: a pattern program with a dense-row leaf, then the division
    "normalised": ("Y[i,h] = sum(j, A[i,j] * X[j,h]) / (sum(j, A[i,j] * A[i,j]) + 1.0)", ("pattern",),
                   lambda A, B, X, W, Q, b, s, D: (A @ X) / ((A * A).sum(1, keepdims=True) + 1.0)),
}


def _operands(rng, n, m, k, density, dtype, same_pattern, fmt):
    A = sp.random_array((n, m), density=density, format="csr", rng=rng, dtype=np.float64)
    A.data = rng.standard_normal(A.nnz)
    if same_pattern:
        B = A.copy()
        B.data = rng.standard_normal(A.nnz)
    else:  # same shape and count, another pattern: the merged route must fall back
        B = sp.random_array((n, m), density=density, format="csr", rng=rng, dtype=np.float64)
        B.data = rng.standard_normal(B.nnz)
    ops = {"A": A, "B": B, "X": rng.standard_normal((m, k)), "W": rng.standard_normal((k, m)),
           "Q": rng.standard_normal((n, k)), "b": rng.standard_normal(k), "s": np.array(rng.uniform(0.5, 2.0)),
           "D": rng.standard_normal((n, m))}
    ops = {name: v.astype(dtype) for name, v in ops.items()}
    if fmt == "csc":
        ops["A"] = ops["A"].tocsc()
    dense = {name: (v.toarray() if sp.issparse(v) else v).astype(np.float64) for name, v in ops.items()}
    return ops, dense


def _dense(x):
    if sp.issparse(x):
        return x.toarray()
    return np.asarray(x.todense() if isinstance(x, spfuse.Tensor) else x)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(sorted(CASES)), n=st.integers(1, 30), m=st.integers(1, 30), k=st.integers(1, 6),
       density=st.sampled_from([0.0, 0.1, 0.5, 1.0]), dtype=st.sampled_from([np.float64, np.float32]),
       same_pattern=st.booleans(), fmt=st.sampled_from(["csr", "csc"]), seed=st.integers(0, 2**16))
def test_routed_programs_match_numpy(case, n, m, k, density, dtype, same_pattern, fmt, seed):
    program, _, oracle = CASES[case]
    ops, dense = _operands(np.random.default_rng(seed), n, m, k, density, dtype, same_pattern, fmt)
    used = spfuse.compile(program).program.inputs
    ops = {name: ops[name] for name in used}
    got = _dense(spfuse.evaluate(program, **ops))
    want = oracle(**dense)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    again = _dense(spfuse.evaluate(program, **ops))
    np.testing.assert_array_equal(got, again)  # a repeat call (cached dispatch) gives the same bits


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_case_takes_its_route(case):
    program, kernels, _ = CASES[case]
    ops, _ = _operands(np.random.default_rng(1), 40, 30, 4, 0.2, np.float64, True, "csr")
    kernel = spfuse.compile(program)
    plan = kernel.plans(**{n: ops[n] for n in kernel.program.inputs})["auto"]
    got = tuple(g.kernel for g in split_groups(plan))
    assert got[:len(kernels)] == kernels[:len(got)] and kernels[0] in got, got


def test_route_details_are_described(monkeypatch):
    # an output past templates.SPMM_T_MAX_OUTPUT_BYTES (lowered here): SpMM of Aᵀ, not the scatter
    monkeypatch.setattr(templates, "SPMM_T_MAX_OUTPUT_BYTES", 1 << 18)
    spfuse.clear_cache()
    A = sp.random_array((40, 3000), density=0.02, format="csr", rng=np.random.default_rng(0))
    plan = spfuse.compile("Y[h,j] = sum(i, A[i,j] * Q[i,h])").plans(A=A, Q=np.ones((40, 16)))["auto"]
    (g,) = split_groups(plan)
    assert g.kernel == "spmm" and g.route.transposed == ("A",) and g.route.out_swapped
    assert "reading Aᵀ into the transposed result" in g.describe()
    A = A[:, :30]
    plan = spfuse.compile("Y[i,h] = sum(j, A[i,j] * s * X[j,h] * B[i,j])").plans(
        A=A, B=A, X=np.ones((30, 4)), s=np.array(2.0))["auto"]
    (g,) = split_groups(plan)
    assert g.route.scalars == ("s",) and g.route.merged == (("A*B", ("A", "B")),)
    assert "on A∘B (one pattern, checked per call)" in g.describe() and "times s" in g.describe()


def test_merged_factors_with_another_pattern_fall_back_to_the_generic_executor():
    """Same shapes, same nnz, one index moved: the per-call pattern check must
    see it (a values product on the first operand's pattern would be wrong)."""
    A = sp.csr_array(np.array([[1.0, 0.0, 2.0], [0.0, 3.0, 0.0]]))
    B = sp.csr_array(np.array([[0.0, 5.0, 7.0], [0.0, 11.0, 0.0]]))
    X = np.arange(6.0).reshape(3, 2)
    program = "Y[i,h] = sum(j, A[i,j] * X[j,h] * B[i,j])"
    np.testing.assert_allclose(spfuse.evaluate(program, A=A, X=X, B=A), (A.toarray() ** 2) @ X)
    np.testing.assert_allclose(spfuse.evaluate(program, A=A, X=X, B=B), (A.toarray() * B.toarray()) @ X)
    got = spfuse.evaluate("Y[i,j] = A[i,j] * B[i,j]", A=A, B=B)
    np.testing.assert_array_equal(_dense(got), A.toarray() * B.toarray())


def test_scatter_route_sees_a_pattern_rewritten_in_place():
    """The transpose of a CSR operand is remembered per pattern: rewriting the
    operand's index array in place must not serve the old transpose."""
    transposes.clear()
    G = sp.csr_array(np.array([[1.0, 2.0, 0.0], [0.0, 3.0, 4.0]]))
    H = np.array([[1.0, 10.0], [100.0, 1000.0]])
    program = "Y[h,j] = sum(i, G[i,j] * H[i,h])"
    np.testing.assert_allclose(spfuse.evaluate(program, G=G, H=H), H.T @ G.toarray())
    G.indices[:] = [0, 2, 0, 1]  # same buffers, another (canonical) pattern
    np.testing.assert_allclose(spfuse.evaluate(program, G=G, H=H), H.T @ G.toarray())


def test_operands_are_not_mutated():
    rng = np.random.default_rng(3)
    A = sp.random_array((20, 10), density=0.3, format="csr", rng=rng)
    B = A.copy()
    before = (A.data.copy(), A.indices.copy(), B.data.copy())
    spfuse.evaluate("Y[i,h] = sum(j, A[i,j] * s * X[j,h] * B[i,j])", A=A, B=B, X=np.ones((10, 3)), s=2.0)
    spfuse.evaluate("Y[i,j] = A[i,j] * B[i,j] * s", A=A, B=B, s=2.0)
    assert all(np.array_equal(x, y) for x, y in zip(before, (A.data, A.indices, B.data), strict=True))


def test_a_pattern_ratio_over_stored_zeros_and_infinities_is_the_generic_executors():
    """X/X is not 1 where X stores 0 or inf: the values route must hand those
    calls back to the generic executor (0 at a stored zero, nan at inf)."""
    A = sp.csr_array((np.array([0.0, 2.0, np.inf]), np.array([0, 1, 2]), np.array([0, 2, 3])), shape=(2, 3))
    B = A.copy()
    B.data = np.array([5.0, 7.0, 11.0])
    program = "Y[i,j] = A[i,j] / A[i,j] * (2.0 * B[i,j])"
    np.testing.assert_array_equal(_dense(spfuse.evaluate(program, A=A, B=B)), [[0.0, 14.0, 0.0], [0.0, 0.0, np.nan]])
    np.testing.assert_array_equal(_dense(spfuse.evaluate(program, A=B, B=B)), [[10.0, 14.0, 0.0], [0.0, 0.0, 22.0]])


def test_a_sparse_operand_is_not_transposed_for_one_multiply_add_per_entry():
    """Aᵀx: handing SpMV a transposed CSR A costs a pass over A's pattern and
    a gather of its values per call, more than the SpMV; the scatter kernel
    ``spmv_t`` reads A as it is instead.  Aᵀ·X (a dense row per stored
    entry) still reaches SpMM through the transpose."""
    A = sp.random_array((300, 200), density=0.05, format="csr", rng=3)
    x, X = np.arange(300.0), np.random.default_rng(0).random((300, 8))
    k = spfuse.compile("y[j] = A[i,j] * x[i]")
    assert "template kernel 'spmv_t'" in k.explain(A=A, x=x)
    np.testing.assert_allclose(k(A=A, x=x), A.toarray().T @ x, rtol=1e-12)
    k = spfuse.compile("C[j,k] = A[i,j] * X[i,k]")
    assert "spmm" in k.explain(A=A, X=X)
    np.testing.assert_allclose(k(A=A, X=X), A.toarray().T @ X, rtol=1e-12)


def _plan_of(text, **infos):
    from spfuse.frontend.parser import parse_program
    from spfuse.planner import plan_program
    plan = plan_program(parse_program(text), infos)
    return plan, [g.kernel for g in split_groups(plan)]


@pytest.mark.parametrize("rows, K, gathers", [(100_000, 64, True), (100_000, 32, True), (100_000, 8, False),
                                              (5_000, 64, False)])
@pytest.mark.parametrize("text, stored", [("C[j,k] = A[i,j] * X[i,k]", (0, 1)),
                                          ("C[i,k] = A[i,j] * X[j,k]", (1, 0))])
def test_rows_scattered_into_a_result_past_the_cache_are_gathered_instead(rows, K, gathers, text, stored):
    """Aᵀ·X of a CSR A (or A·X of a CSC A) scatters a row of X into a row of
    the result per stored entry: read, added to, written back.  Past the
    cache, with rows of at least GATHER_MIN_ROW elements, the plan reads A
    in the other storage order (converted per call) and SpMM gathers rows
    instead; below either, the scatter runs on A as stored."""
    from spfuse.ir.ops import TensorInfo
    A = TensorInfo("A", 2, ("dense", "compressed"), stored, (rows, rows), nnz=10 * rows)
    plan, kernels = _plan_of(text, A=A, X=TensorInfo.dense("X", (rows, K)))
    assert kernels == (["spmm"] if gathers else ["spmm_t"])
    assert (plan.inputs["A"].mode_order != stored) == gathers
    assert any("gathers rows where 'spmm_t' would scatter" in d for d in plan.decisions) == gathers


def test_two_scattered_operands_need_a_larger_result_to_be_gathered():
    """Two operands summed by spmm_t_sum walk their shared pattern once; read
    converted, each costs a conversion and SpMM walks each: a 10 MB result
    keeps the scatter, a 51 MB one is gathered -- and both match numpy."""
    from spfuse.ir.ops import TensorInfo
    text = "C[j,k] = sum(i, A[i,j] * X[i,k]) + sum(i, W[i,j] * G[i,k])"
    for rows, want in ((20_000, "spmm_t_sum"), (100_000, "spmm_sum")):
        csr = {n: TensorInfo(n, 2, ("dense", "compressed"), (0, 1), (rows, rows), nnz=10 * rows) for n in "AW"}
        dense = {n: TensorInfo.dense(n, (rows, 64)) for n in "XG"}
        assert _plan_of(text, **csr, **dense)[1] == [want]
    rng = np.random.default_rng(4)
    A = sp.random_array((50_000, 50_000), density=1e-4, format="csr", rng=rng)
    W = A.copy()
    W.data = rng.random(W.nnz)
    X, G = rng.random((50_000, 48)), rng.random((50_000, 48))
    k = spfuse.compile(text)
    assert "'spmm_sum' gathers rows" in k.explain(A=A, X=X, W=W, G=G)
    for nt in (1, 2):
        with spfuse.threads(nt):
            np.testing.assert_allclose(k(A=A, X=X, W=W, G=G), A.T @ X + W.T @ G, rtol=1e-12)


@pytest.mark.parametrize("mask_rows, b_order, want", [
    (20_000, (1, 0), "masked_spgemm"),      # a mask as dense as A, B as CSC: Gustavson on B converted
    (20_000, (0, 1), "masked_spgemm"),      # ... B as CSR: as stored
    (20, (0, 1), "masked_spgemm"),          # a sparse mask: Gustavson skips the empty mask rows
    (20, (1, 0), "masked_spgemm_dot"),      # ... dot products on B as stored
])
def test_masked_spgemm_reads_b_in_the_order_of_the_cheaper_kernel(mask_rows, b_order, want):
    """Masked SpGEMM by Gustavson (B as CSR) or by a dot product per mask
    entry (B as CSC): a mask with entries in every row makes the dots twice
    the work, and B given as CSC is converted; a mask touching few rows
    keeps B as given.  Both plans match numpy."""
    from spfuse.ir.ops import TensorInfo
    n = 20_000
    def csr(name, order=(0, 1), nnz=10 * n):
        return TensorInfo(name, 2, ("dense", "compressed"), order, (n, n), nnz=nnz)
    text = "C[i,k] = M[i,k] * (A[i,j] * B[j,k])"
    plan, kernels = _plan_of(text, M=csr("M", nnz=10 * mask_rows), A=csr("A"), B=csr("B", b_order))
    assert kernels == [want]
    converted = plan.inputs["B"].mode_order != b_order
    assert converted == (b_order == (1, 0) and want == "masked_spgemm")
    assert any(d.startswith("masked SpGEMM reads B as CSR") for d in plan.decisions) == converted
    rng = np.random.default_rng(5)
    A = sp.random_array((300, 300), density=0.03, format="csr", rng=rng)
    B = sp.random_array((300, 300), density=0.03, format="csr", rng=rng)
    M = sp.random_array((300, 300), density=0.03, format="csr", rng=rng)
    for Bx in (B, B.tocsc()):
        for nt in (1, 2):
            with spfuse.threads(nt):
                got = spfuse.evaluate(text, M=M, A=A, B=Bx)
            np.testing.assert_allclose(got.toarray(), M.multiply(A @ B).toarray(), rtol=1e-12, atol=1e-12)


#: spellings of a matrix-vector product, or sums, over a CSR or CSC operand, and the kernel each runs on
SPMV_SPELLINGS = {
    ("y[i] = A[i,j] * x[j]", "csr"): "spmv",
    ("y[i] = A[i,j] * x[j]", "csc"): "spmv_t",    # CSC arrays are the CSR of Aᵀ: a scatter
    ("y[j] = A[i,j] * x[i]", "csr"): "spmv_t",
    ("y[j] = A[i,j] * x[i]", "csc"): "spmv",      # Aᵀx of a CSC A: a gather over its CSR-of-Aᵀ arrays
    ("y[j] = x[i] * A[i,j]", "csr"): "spmv_t",
    ("y[i] = A[i,j]", "csr"): "row_sums",
    ("y[i] = sum(j, A[i,j])", "csc"): "col_sums",
    ("y[j] = A[i,j]", "csr"): "col_sums",
    ("y[j] = A[i,j]", "csc"): "row_sums",
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spelling=st.sampled_from(sorted(SPMV_SPELLINGS)), n=st.sampled_from([0, 1, 7, 40, 700]),
       m=st.sampled_from([0, 1, 9, 50]), density=st.sampled_from([0.0, 0.05, 0.5, 1.0]),
       dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**16))
def test_every_spmv_spelling_runs_on_a_kernel_reading_the_operand_as_stored(spelling, n, m, density, dtype, seed):
    """No transpose per call for a matrix-vector product (or row / column
    sums, a product by ones) in any spelling or storage order: the gather
    (``spmv``) or scatter (``spmv_t``) kernel reads the operand's own arrays,
    checks their indices itself (no scan first), and matches numpy."""
    program, fmt = spelling
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, m), density=density, format=fmt, rng=rng, dtype=np.float64).astype(dtype)
    by_rows = program.startswith("y[i]")
    dense = A.toarray().astype(np.float64) if by_rows else A.toarray().T.astype(np.float64)
    ops = {"A": A}
    if "x[" in program:
        ops["x"] = rng.standard_normal(dense.shape[1]).astype(dtype)
    got = spfuse.evaluate(program, **ops)
    want = dense @ ops["x"] if "x" in ops else dense.sum(axis=1)
    tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if n and m:
        assert _checks(program, **ops) == (SPMV_SPELLINGS[spelling], frozenset({"A"}))


def test_a_csc_operand_with_a_bad_index_is_refused_by_the_scatter_kernel():
    rng = np.random.default_rng(4)
    A = sp.random_array((50, 40), density=0.1, format="csc", rng=rng)
    x = rng.standard_normal(40)
    bad = A.copy()
    bad.indices[3] = 50          # a row index past the 50 rows
    with pytest.raises(spfuse.InvalidOperandError, match="out-of-range"):
        spfuse.evaluate("y[i] = A[i,j] * x[j]", A=bad, x=x)
    assert bad.indices[3] == 50  # the input is untouched
    # an int64 index that int32 would wrap into range (-2**62 -> 0): read as stored, never narrowed
    wide = A.copy()
    wide.indices = wide.indices.astype(np.int64)
    wide.indptr = wide.indptr.astype(np.int64)
    wide.indices[3] = -(2**62)
    for program in ("y[i] = A[i,j] * x[j]", "y[i] = A[i,j]"):
        with pytest.raises(spfuse.InvalidOperandError, match="out-of-range"):
            spfuse.evaluate(program, **({"A": wide, "x": x} if "x[" in program else {"A": wide}))
    np.testing.assert_allclose(spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x), A.toarray() @ x, rtol=1e-12)


# -- SpGEMM with transposed operands: AᵀA, A·Bᵀ, AᵀB --------------------------

SPGEMM_SPELLINGS = {
    "AtA": ("C[j,k] = A[i,j] * A[i,k]", lambda A, B: A.T @ A),
    "ABt": ("C[i,k] = A[i,j] * B[k,j]", lambda A, B: A @ B.T),
    "AtB": ("C[j,k] = A[i,j] * B[i,k]", lambda A, B: A.T @ B),
    "AB": ("C[i,k] = A[i,j] * B[j,k]", lambda A, B: A @ B),
}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(SPGEMM_SPELLINGS)), n=st.sampled_from([0, 1, 9, 60, 1500]),
       density=st.sampled_from([0.0, 0.01, 0.2]), fa=st.sampled_from(["csr", "csc"]),
       fb=st.sampled_from(["csr", "csc"]), seed=st.integers(0, 2**16))
def test_spgemm_with_transposed_operands_runs_gustavson(name, n, density, fa, fb, seed):
    """Every spelling of a sparse·sparse product runs on the Gustavson
    template -- operands read transposed, or the result computed transposed
    and returned in the other mode order -- and matches numpy."""
    rng = np.random.default_rng(seed)
    density = min(density, 12 / max(n, 1))
    A = sp.random_array((n, n), density=density, format="csr", rng=rng)
    B = sp.random_array((n, n), density=density, format="csr", rng=rng)
    A.data, B.data = rng.standard_normal(A.nnz), rng.standard_normal(B.nnz)
    program, oracle = SPGEMM_SPELLINGS[name]
    ops = {"A": A.asformat(fa)} if "B[" not in program else {"A": A.asformat(fa), "B": B.asformat(fb)}
    k = spfuse.compile(program, **ops)
    got = k(**ops)
    want = oracle(A.toarray(), B.toarray())
    np.testing.assert_allclose(got.toarray(), want, rtol=1e-12, atol=1e-12)
    if n >= 1500 and density > 0:   # (tiny products may be planned as a dense outer product)
        assert "template kernel 'spgemm'" in k.explain()


def test_spgemm_result_computed_transposed_is_returned_in_the_other_order():
    # A·Bᵀ with A stored CSR: the planner takes the loops k, j, i (a column-major
    # Gustavson); the route computes Cᵀ = B·Aᵀ as CSR, which is C as CSC
    rng = np.random.default_rng(3)
    A = sp.random_array((2000, 2000), density=0.005, format="csr", rng=rng)
    B = sp.random_array((2000, 2000), density=0.005, format="csr", rng=rng)
    k = spfuse.compile("C[i,k] = A[i,j] * B[k,j]", A=A, B=B)
    assert "into the transposed result" in k.explain()
    C = k(A=A, B=B)
    assert C.format == "csc"
    np.testing.assert_allclose(C.toarray(), (A @ B.T).toarray(), rtol=1e-12, atol=1e-12)


# -- index checks left to SpMV / SpMM groups ----------------------------------

def _checks(program, **ops):
    from spfuse.lowering.templates import match_template
    plan = spfuse.compile(program).plans(**ops)["auto"]
    m = match_template(plan)
    return m.kernel, m.checks_indices


def test_spmv_and_spmm_groups_check_their_operand_in_kernel(monkeypatch):
    monkeypatch.setattr(templates, "SPMM_T_MAX_OUTPUT_BYTES", 1 << 18)   # (the large case below past it)
    spfuse.clear_cache()
    rng = np.random.default_rng(8)
    A = sp.random_array((300, 200), density=0.05, format="csr", rng=rng)
    x, b, X = rng.standard_normal(200), rng.standard_normal(300), rng.standard_normal((200, 4))
    Q = rng.standard_normal((300, 4))
    assert _checks("y[i] = A[i,j] * x[j] + b[i]", A=A, x=x, b=b) == ("spmv+epilogue", frozenset({"A"}))
    assert _checks("y[i] = relu(A[i,j] * x[j]) + b[i]", A=A, x=x, b=b) == ("spmv+epilogue", frozenset({"A"}))
    assert _checks("Y[i,k] = relu(A[i,j] * X[j,k])", A=A, X=X)[1] == frozenset({"A"})
    # summed over its rows into a small output: scattered by spmm_t, which checks A's indices too
    assert _checks("Y[h,j] = relu(sum(i, A[i,j] * Q[i,h]))", A=A, Q=Q) == ("spmm_t → numpy", frozenset({"A"}))
    # a large one: read transposed, the pattern gathered before the kernel sees it
    A = sp.random_array((300, 20000), density=0.001, format="csr", rng=rng)
    assert "A" not in _checks("Y[h,j] = relu(sum(i, A[i,j] * Q[i,h]))", A=A, Q=Q)[1]


def test_unscanned_operand_errors_and_unsorted_rows_still_right():
    rng = np.random.default_rng(9)
    A = sp.random_array((300, 200), density=0.05, format="csr", rng=rng)
    x, b = rng.standard_normal(200), rng.standard_normal(300)
    bad = A.copy()
    bad.indices[7] = 250
    with pytest.raises(spfuse.InvalidOperandError, match="out-of-range"):
        spfuse.evaluate("y[i] = A[i,j] * x[j] + b[i]", A=bad, x=x, b=b)
    np.testing.assert_array_equal(bad.indices[7], 250)           # the input is untouched
    rev = A.copy()
    for r in range(A.shape[0]):
        s, e = rev.indptr[r], rev.indptr[r + 1]
        rev.indices[s:e], rev.data[s:e] = rev.indices[s:e][::-1].copy(), rev.data[s:e][::-1].copy()
    rev.has_sorted_indices = False
    k0 = int(A.indptr[1])
    assert k0 > 0
    dup = sp.csr_array((np.r_[A.data[:k0], A.data], np.r_[A.indices[:k0], A.indices],
                        np.r_[0, A.indptr[1:] + k0]), shape=A.shape)   # row 0 stored twice: duplicates
    for M in (rev, dup):
        got = spfuse.evaluate("y[i] = A[i,j] * x[j] + b[i]", A=M, x=x, b=b)
        np.testing.assert_allclose(got, M.toarray() @ x + b, rtol=1e-12, atol=1e-12)


# -- row and column scalings on a sparse operand's pattern --------------------

#: spelling -> (kernel, numpy oracle on dense A and vectors r (rows), c (columns))
SCALINGS = {
    "Y[i,j] = r[i] * A[i,j] * c[j]": ("scale", lambda A, r, c: r[:, None] * A * c),
    "Y[i,j] = A[i,j] * c[j] * r[i]": ("scale", lambda A, r, c: r[:, None] * A * c),
    "Y[i,j] = A[i,j] * r[i]": ("scale_rows", lambda A, r, c: r[:, None] * A),
    "Y[i,j] = c[j] * A[i,j]": ("scale_cols", lambda A, r, c: A * c),
    "Y[i,j] = 2.0 * r[i] * A[i,j] * c[j]": ("scale", lambda A, r, c: 2.0 * r[:, None] * A * c),
}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.sampled_from(sorted(SCALINGS)), n=st.sampled_from([0, 1, 6, 45]), m=st.sampled_from([0, 1, 7, 30]),
       density=st.sampled_from([0.0, 0.1, 0.6, 1.0]), fmt=st.sampled_from(["csr", "csc"]),
       dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**16))
def test_scalings_run_on_the_operands_pattern_in_its_storage_order(program, n, m, density, fmt, dtype, seed):
    """``D1·A·D2``: one kernel pass over A's values; the result keeps A's
    pattern and storage order (a CSC A is read through its own arrays as
    the CSR of Aᵀ, the result computed transposed), and matches numpy."""
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, m), density=density, format=fmt, rng=rng, dtype=np.float64).astype(dtype)
    r, c = rng.standard_normal(n).astype(dtype), rng.standard_normal(m).astype(dtype)
    ops = {k: v for k, v in {"A": A, "r": r, "c": c}.items() if f"{k}[" in program}
    kernel, oracle = SCALINGS[program]
    got = spfuse.evaluate(program, **ops)
    assert got.format == fmt
    tol = 1e-5 if dtype == np.float32 else 1e-12
    want = oracle(A.toarray().astype(np.float64), r.astype(np.float64), c.astype(np.float64))
    np.testing.assert_allclose(got.toarray(), want, rtol=tol, atol=tol)
    np.testing.assert_array_equal(got.indices, A.indices)   # A's own pattern
    if n >= 6 and m >= 7:   # (a 1 x 1 product may be planned otherwise)
        if fmt == "csc":   # read as the CSR of Aᵀ: rows and columns trade places
            kernel = {"scale_rows": "scale_cols", "scale_cols": "scale_rows"}.get(kernel, kernel)
        assert kernel in _checks(program, **ops)[0].split(" → ")


# -- masked SpGEMM -------------------------------------------------------------

@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.sampled_from(["C[i,k] = M[i,k] * (A[i,j] * B[j,k])", "C[i,k] = A[i,j] * B[j,k] * M[i,k]"]),
       n=st.sampled_from([0, 1, 8, 60, 400]), density=st.sampled_from([0.0, 0.02, 0.2, 1.0]),
       dtype=st.sampled_from([np.float64, np.float32]), fmt=st.sampled_from(["csr", "csc"]),
       seed=st.integers(0, 2**16))
def test_masked_spgemm_runs_masked_gustavson_on_the_masks_pattern(program, n, density, dtype, fmt, seed):
    """``M ∘ (A·B)`` never assembles ``A·B`` (masked Gustavson; B given as CSC
    is converted when a gather-dot per mask entry would be dearer); the result stores
    the entries of M that some product reaches (as the generic executor
    does) and matches numpy."""
    rng = np.random.default_rng(seed)
    density = min(density, 15 / max(n, 1))
    M, A, B = (sp.random_array((n, n), density=density, format="csr", rng=rng, dtype=np.float64).astype(dtype)
               for _ in range(3))
    B = B.asformat(fmt)
    got = spfuse.evaluate(program, M=M, A=A, B=B)
    want = M.toarray().astype(np.float64) * (A.toarray().astype(np.float64) @ B.toarray().astype(np.float64))
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got.toarray(), want, rtol=tol, atol=tol)
    reached = (M.toarray() != 0) & ((A.toarray() != 0).astype(int) @ (B.toarray() != 0).astype(int) != 0)
    assert got.nnz == int(reached.sum())
    if n >= 400 and density > 0:
        # (a mask as dense as A: B given as CSC is converted for Gustavson, see the test below)
        assert _checks(program, M=M, A=A, B=B)[0] == "masked_spgemm"


def test_masked_spgemm_keeps_its_operands_in_their_storage_order():
    """The storage-order search prices the generic executor; when a template
    runs the program on the operands as stored, none is converted (B as CSC,
    a merge per mask entry, was estimated cheaper than the generic
    Gustavson's whole-row resets, and ran 2x slower than the kernel)."""
    rng = np.random.default_rng(5)
    n = 100_000
    M, A, B = (sp.random_array((n, n), density=10 / n, format="csr", rng=rng) for _ in range(3))
    plan = spfuse.compile("C[i,k] = M[i,k] * (A[i,j] * B[j,k])").plans(M=M, A=A, B=B)["auto"]
    assert not any("converted per call" in d for d in plan.decisions)
    assert _checks("C[i,k] = M[i,k] * (A[i,j] * B[j,k])", M=M, A=A, B=B)[0] == "masked_spgemm"


# -- row and column maxima / minima --------------------------------------------

@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.sampled_from(["y[i] = max(j, A[i,j])", "y[j] = max(i, A[i,j])", "y[i] = min(j, A[i,j])",
                                "y[j] = min(i, A[i,j])"]),
       n=st.sampled_from([1, 2, 9, 60]), m=st.sampled_from([1, 3, 40]), density=st.sampled_from([0.0, 0.2, 1.0]),
       fmt=st.sampled_from(["csr", "csc"]), dtype=st.sampled_from([np.float64, np.float32]),
       specials=st.booleans(), blocks=st.sampled_from([1, 2, 3]), seed=st.integers(0, 2**16))
def test_extrema_kernels_give_the_executors_bits(program, n, m, density, fmt, dtype, specials, blocks, seed):
    """Row / column maxima and minima (implicit zeros included) on the row
    kernel or the fixed-block column scatter, in both storage orders: the
    generic executor's result bit for bit -- NaN kept once met, the first of
    equal values (signed zeros) kept -- on 1 and 2 threads, and numpy's
    values."""
    from spfuse.lowering import templates
    from spfuse.runtime import looptree as lt
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, m), density=density, format="csr", rng=rng, dtype=np.float64)
    A.data = rng.standard_normal(A.nnz)
    if specials and A.nnz:
        A.data[rng.random(A.nnz) < 0.3] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0])
    A = A.astype(dtype).asformat(fmt)
    with pytest.MonkeyPatch.context() as patch:   # (undone after each example)
        patch.setattr(lt, "reduction_block_count", lambda entries, cells: blocks)
        got = [spfuse.evaluate(program, A=A, num_threads=t) for t in (1, 2)]
    np.testing.assert_array_equal(got[0].view(np.uint8), got[1].view(np.uint8))
    if n >= 60 and m >= 40:   # (a tiny reduction may be planned otherwise)
        assert _checks(program, A=A)[0].split("_")[0] in ("row", "col")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(templates, "_match_extremum", lambda plan, infos: None)
        generic = spfuse.evaluate(program, A=A)
    np.testing.assert_array_equal(got[0].view(np.uint8), np.asarray(generic, dtype=got[0].dtype).view(np.uint8))
    dense = A.toarray().astype(np.float64)
    want = (np.max if "max" in program else np.min)(dense, axis=1 if program.startswith("y[i]") else 0)
    np.testing.assert_allclose(got[0], want, rtol=1e-6)


@pytest.mark.parametrize("empty_row", [False, True])
@pytest.mark.parametrize("is_min", [False, True])
def test_column_extrema_count_only_when_a_column_can_be_full(empty_row, is_min):
    """The column scatter keeps counts only when every row stores something
    (else no column is full): with a full column of negatives (max) no
    implicit zero may enter it; with an empty row every column sees one.
    Blocks and threads never change the bits; a NaN met is kept."""
    from spfuse._kernels import _csr_kernels as csr
    rng = np.random.default_rng(3)
    m, n = 300, 50
    dense = np.where(rng.random((m, n)) < 0.1, rng.standard_normal((m, n)), 0.0)
    dense[:, 7] = -np.abs(rng.standard_normal(m)) - 1.0 if not is_min else np.abs(rng.standard_normal(m)) + 1.0
    dense[5, 11] = np.nan
    if empty_row:
        dense[42, :] = 0.0
    A = sp.csr_array(dense)
    want = np.nanmin(dense, axis=0) if is_min else np.nanmax(dense, axis=0)
    want[11] = np.nan
    outs = []
    for blocks, threads in ((1, 1), (2, 2), (3, 2), (2, 1)):
        out = np.empty(n)
        csr.col_extremum(A.indptr, A.indices, A.data, out, is_min, blocks, threads)
        outs.append(out)
    for out in outs[1:]:
        np.testing.assert_array_equal(out.view(np.uint8), outs[0].view(np.uint8))
    np.testing.assert_array_equal(outs[0], want)
    if empty_row:   # the full column is full no more: its implicit zero wins
        assert outs[0][7] == 0.0
    else:
        assert (outs[0][7] < -0.5) if not is_min else (outs[0][7] > 0.5)


@pytest.mark.parametrize("program", ["y[i] = min(j, 0.25 * A[i,j])", "y[i] = max(j, A[i,j] * 2.0)",
                                     "y[j] = max(i, -1.0 * A[i,j])", "y[i] = max(j, A[i,j]) * 2.0"])
@pytest.mark.parametrize("n", [1, 2, 40])
@pytest.mark.parametrize("fmt", ["csr", "csc", "coo"])
def test_extrema_of_a_scaled_operand(program, n, fmt):
    """The extremum kernels read the operand itself: a scaled access (a
    maximal-fusion statement op when the reduction is tiny, a unit op with
    a coefficient otherwise) is not theirs.  ``min(k, 0.25 * B[j,k])`` with
    one column ran the kernel on B and dropped the 0.25 (found through the
    min's gradient in the autodiff property test, seed 1828165)."""
    rng = np.random.default_rng(n)
    A = sp.random_array((7, n), density=0.5, format=fmt, rng=rng)
    A.data[:] = rng.standard_normal(A.nnz)
    dense = A.toarray()
    want = {"y[i] = min(j, 0.25 * A[i,j])": (0.25 * dense).min(axis=1),
            "y[i] = max(j, A[i,j] * 2.0)": (2.0 * dense).max(axis=1),
            "y[j] = max(i, -1.0 * A[i,j])": (-dense).max(axis=0),
            "y[i] = max(j, A[i,j]) * 2.0": 2.0 * dense.max(axis=1)}[program]
    np.testing.assert_allclose(spfuse.evaluate(program, A=A), want, rtol=1e-12)


@pytest.mark.parametrize("program", ["y[i] = max(j, A[i,j])", "y[j] = min(i, A[i,j])"])
def test_extrema_keep_their_operand_in_its_storage_order(program):
    """Row maxima of a CSC matrix are the column maxima of its arrays: the
    planner keeps A as stored (converting it to CSR was estimated cheaper
    than the generic executor, and ran 2.3x slower than the kernel)."""
    A = sp.random_array((100_000, 100_000), density=10 / 100_000, format="csc", rng=np.random.default_rng(2))
    plan = spfuse.compile(program).plans(A=A)["auto"]
    assert not any("converted per call" in d for d in plan.decisions)
    assert _checks(program, A=A)[0] in ("col_max", "row_min")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.sampled_from(["s = x[i] * A[i,j] * x[j]", "s = A[i,j] * x[i] * x[j]", "s = w[i] * A[i,j] * x[j]"]),
       n=st.sampled_from([0, 1, 7, 300]), density=st.sampled_from([0.0, 0.05, 1.0]),
       fmt=st.sampled_from(["csr", "csc"]), dtype=st.sampled_from([np.float64, np.float32]),
       seed=st.integers(0, 2**16))
def test_quadratic_forms_sum_the_spmv_rows_as_they_are_made(program, n, density, fmt, dtype, seed):
    """``wᵀ·A·x`` in any spelling or storage order runs on the ``bilinear``
    kernel (no temporary, no scan), the same bits on 1 and 2 threads, and
    matches numpy."""
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, n), density=density, format=fmt, rng=rng, dtype=np.float64).astype(dtype)
    x, w = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    ops = {k: v for k, v in {"A": A, "x": x, "w": w}.items() if f"{k}[" in program}
    got = [spfuse.evaluate(program, **ops, num_threads=t) for t in (1, 2)]
    assert np.asarray(got[0]).tobytes() == np.asarray(got[1]).tobytes()
    dense = A.toarray().astype(np.float64)
    want = (w if "w" in ops else x).astype(np.float64) @ dense @ x.astype(np.float64)
    tol = 1e-3 if dtype == np.float32 else 1e-9
    np.testing.assert_allclose(got[0], want, rtol=tol, atol=tol * max(1.0, float(abs(dense).sum())))
    if n >= 300 and density > 0:
        assert _checks(program, **ops) == ("bilinear", frozenset({"A"}))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(program=st.sampled_from(["y[i] = A[i,j] * x[j] + b[i]", "y[i] = b[i] + A[i,j] * x[j]",
                                "y[i] = b[i] + x[j] * A[i,j]"]),
       n=st.sampled_from([0, 1, 7, 300]), m=st.sampled_from([0, 1, 40]), density=st.sampled_from([0.0, 0.05, 1.0]),
       dtype=st.sampled_from([np.float64, np.float32]), seed=st.integers(0, 2**16))
def test_spmv_plus_a_vector_adds_it_as_each_row_is_stored(program, n, m, density, dtype, seed):
    """``A·x + b`` is one SpMV pass (no temporary, no tail call), its index
    check in the kernel; it matches numpy, the same bits on 1 and 2 threads,
    and refuses an out-of-range index."""
    rng = np.random.default_rng(seed)
    A = sp.random_array((n, m), density=density, format="csr", rng=rng, dtype=np.float64).astype(dtype)
    x, b = rng.standard_normal(m).astype(dtype), rng.standard_normal(n).astype(dtype)
    got = [spfuse.evaluate(program, A=A, x=x, b=b, num_threads=t) for t in (1, 2)]
    np.testing.assert_array_equal(got[0], got[1])
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[0], A.toarray().astype(np.float64) @ x + b, rtol=tol, atol=tol)
    if n >= 300 and m >= 40:
        assert _checks(program, A=A, x=x, b=b) == ("spmv+epilogue", frozenset({"A"}))
        if A.nnz:
            bad = A.copy()
            bad.indices[0] = m
            with pytest.raises(spfuse.InvalidOperandError, match="out-of-range"):
                spfuse.evaluate(program, A=bad, x=x, b=b)


def test_ops_fused_only_through_a_shared_input_are_split_when_one_reaches_a_template():
    """A shared GCN adjoint's grad_W2 = grad_Z_cᵀ·H is trie-fused with
    where(H, grad_H, 0) through H alone; the group is split so that the GEMM
    runs on BLAS (fused, the generic executor ran it: 7 ms against 1 ms)."""
    rng = np.random.default_rng(0)
    n = 300
    A_T = sp.random_array((n, n), density=0.05, format="csr", rng=rng)
    ops = {"A_T": A_T, "grad_Z": rng.standard_normal((n, 8)), "W2": rng.standard_normal((16, 8)),
           "X": rng.standard_normal((n, 32)), "H": np.maximum(rng.standard_normal((n, 16)), 0)}
    text = ("grad_Z_c[j, c] = sum(i, A_T[j, i] * grad_Z[i, c])\n"
            "grad_H[i, h] = sum(c, grad_Z_c[i, c] * W2[h, c])\n"
            "grad_W1[f, h] = sum(j, X[j, f] * sum(i, A_T[j, i] * where(H[i, h], grad_H[i, h], 0.0)))\n"
            "grad_W2[h, c] = sum(j, grad_Z_c[j, c] * H[j, h])")
    k = spfuse.compile(text)
    groups = split_groups(k.plans(**ops)["auto"])
    kernels = [(g.kernel, g.outputs) for g in groups]
    assert ("gemm", ("grad_W2",)) in kernels, kernels
    got = k(**ops)
    A = A_T.toarray()
    Z = A @ ops["grad_Z"]
    gH = Z @ ops["W2"].T
    np.testing.assert_allclose(got["grad_W2"], ops["H"].T @ Z, rtol=1e-12)
    np.testing.assert_allclose(got["grad_W1"], ops["X"].T @ (A @ np.where(ops["H"] != 0, gH, 0.0)), rtol=1e-12)


def test_connected_or_untemplated_groups_are_not_split():
    from spfuse.lowering.groups import _independent_parts
    rng = np.random.default_rng(1)
    H, G = rng.standard_normal((50, 4)), rng.standard_normal((50, 4))
    # two element-wise ops sharing H: no template either way, one group
    k = spfuse.compile("P[i,h] = where(H[i,h], G[i,h], 0.0); Q[i,h] = H[i,h] * 2.0")
    plan = k.plans(H=H, G=G)["auto"]
    assert _independent_parts(plan, list(plan.ops), set(plan.inputs)) is None


@pytest.mark.parametrize("cols,width,kernel", [(30, 4, "spmm_t"), (3000, 16, "spmm")])
@pytest.mark.parametrize("csc", [False, True])
def test_rows_summed_scatter_when_the_output_is_small(cols, width, kernel, csc, monkeypatch):
    """``sum(i, A[i,j] * Q[i,h])`` (and ``A·X`` of a CSC ``A``) scatters
    each row into the output (``spmm_t``, no transpose) when the output
    fits templates.SPMM_T_MAX_OUTPUT_BYTES (lowered here to 256 KiB), else
    runs SpMM of the transpose; the same values either way."""
    monkeypatch.setattr(templates, "SPMM_T_MAX_OUTPUT_BYTES", 1 << 18)
    spfuse.clear_cache()
    rng = np.random.default_rng(4)
    A = sp.random_array((40, cols), density=0.05, format="csr", rng=rng)
    A.data[:] = rng.standard_normal(A.nnz)
    Q = rng.standard_normal((40, width))
    if csc:
        program, ops, want = "Y[j,h] = A[j,i] * Q[i,h]", {"A": A.T.tocsc(), "Q": Q}, A.T @ Q
    else:
        program, ops, want = "Y[j,h] = sum(i, A[i,j] * Q[i,h])", {"A": A, "Q": Q}, A.T @ Q
    how = spfuse.compile(program).explain(**ops).split("execution:")[1].splitlines()[0]
    if kernel == "spmm_t" or not csc:   # (a large CSC one: the planner's storage order decides)
        assert f"template kernel '{kernel}" in how, how
    for nt in (1, 2):
        np.testing.assert_allclose(spfuse.evaluate(program, num_threads=nt, **ops), want, rtol=1e-12, atol=1e-12)


def test_csc_spmm_scatters_its_own_arrays_instead_of_converting():
    """``A·X`` of a CSC ``A`` is ``spmm_t`` on A's arrays (the CSR of Aᵀ):
    the planner keeps the storage order a template reads through a free
    transpose, where converting to CSR cost a gather and an SpMM per call;
    past SPMM_T_MAX_OUTPUT_BYTES the conversion stays."""
    rng = np.random.default_rng(12)
    A = sp.random_array((5000, 5000), density=0.002, format="csc", rng=rng)
    X = rng.standard_normal((5000, 16))
    program = "C[i,k] = A[i,j] * X[j,k]"
    how = spfuse.compile(program).explain(A=A, X=X).split("execution:")[1].splitlines()[0]
    assert "template kernel 'spmm_t'" in how and "A.T=csr" in how, how
    np.testing.assert_allclose(spfuse.evaluate(program, A=A, X=X), A @ X, rtol=1e-12, atol=1e-12)
    wide = rng.standard_normal((5000, 16))
    big = {"A": A, "X": wide}
    old = templates.SPMM_T_MAX_OUTPUT_BYTES
    try:
        templates.SPMM_T_MAX_OUTPUT_BYTES = 1 << 10
        spfuse.clear_cache()
        how = spfuse.compile(program).explain(**big).split("execution:")[1].splitlines()[0]
        assert "spmm_t" not in how, how
        np.testing.assert_allclose(spfuse.evaluate(program, **big), A @ wide, rtol=1e-12, atol=1e-12)
    finally:
        templates.SPMM_T_MAX_OUTPUT_BYTES = old
        spfuse.clear_cache()


@pytest.mark.parametrize("divisor, routed", [(8.0, True), (0.25, True), (-4.0, True), (3.0, False)])
def test_division_by_a_power_of_two_is_a_scalar_factor_of_the_template(divisor, routed):
    """``B ∘ (Q·Kᵀ) / 8`` (attention's scale) is SDDMM times 1/8 -- the same
    bits, as x / 2^e is x * 2^-e; another divisor is left to the pattern
    program after the SDDMM (1/3 is not exact)."""
    rng = np.random.default_rng(5)
    B = sp.random_array((60, 50), density=0.1, format="csr", rng=rng)
    B.data = rng.standard_normal(B.nnz)
    Q, K = rng.standard_normal((60, 16)), rng.standard_normal((50, 16))
    prog = f"A[i,j] = B[i,j] * (Q[i,k] * K[j,k]) / {divisor!r}"
    k = spfuse.compile(prog)
    line = k.explain(B=B, Q=Q, K=K).split("execution:")[1].splitlines()[0]
    assert ("pattern program" not in line) == routed, line
    assert (f"times {1.0 / divisor!r}" in line) == routed, line
    got = k(B=B, Q=Q, K=K)
    want = B.toarray() * (Q @ K.T) / divisor
    np.testing.assert_allclose(got.toarray(), want, rtol=1e-12, atol=1e-12)
    if routed:   # bit for bit the product then the division, as written
        plain = spfuse.evaluate("A[i,j] = B[i,j] * (Q[i,k] * K[j,k])", B=B, Q=Q, K=K)
        np.testing.assert_array_equal(got.toarray(), plain.toarray() / divisor)


# -- fusion="none" runs on the kernels auto's groups use ------------------------

NONE_PROGRAMS = {
    "y[i] = A[i,j] * x[j] + b[i]": "spmv → numpy",
    "Z[i,c] = relu(A[i,j] * X[j,h] * W[h,c])": "spmm → gemm → numpy",
    "C[i,j] = A[i,j] * (P[i,k] * Q[j,k])": "gemm → pattern",
}


@pytest.mark.parametrize("program", sorted(NONE_PROGRAMS))
def test_unfused_plans_run_each_operation_on_a_kernel(program):
    """``fusion="none"`` stores every temporary whole and runs each operation
    as its own group, on the template kernels, BLAS, numpy and pattern
    programs ``auto``'s groups use (the fusion study compares strategies on
    one engine), and answers as numpy does."""
    rng = np.random.default_rng(4)
    A = sp.random_array((60, 40), density=0.1, format="csr", rng=rng)
    ops = {"A": A, "x": rng.standard_normal(40), "b": rng.standard_normal(60), "X": rng.standard_normal((40, 8)),
           "W": rng.standard_normal((8, 3)), "P": rng.standard_normal((60, 4)), "Q": rng.standard_normal((40, 4))}
    kernel = spfuse.compile(program, fusion="none")
    ops = {n: ops[n] for n in kernel.program.inputs}
    assert f"template kernel '{NONE_PROGRAMS[program]}'" in kernel.explain(**ops)
    got = kernel(**ops)
    np.testing.assert_allclose(got.toarray() if sp.issparse(got) else got, dense_reference(program, ops),
                               rtol=1e-12, atol=1e-12)


def test_one_copy_of_values_reached_two_ways():
    """An operand read transposed and another operand that is its transposed
    view (GNN-2's Y and Yt = Y.T) are copied once per call, into one array
    the kernel gathers both roles from; an operand with equal values in its
    own memory is copied on its own.  Answers are numpy's either way."""
    from spfuse.lowering.templates import _dense, dense_transposed
    from spfuse.lowering.transposes import SharedCopies
    rng = np.random.default_rng(8)
    Y = rng.standard_normal((6, 40))
    y, yt = spfuse.as_tensor(Y), spfuse.as_tensor(Y.T)
    own = spfuse.as_tensor(np.asfortranarray(Y.T.copy()))   # (Y.T's values, column-ordered, in memory of their own)
    with SharedCopies():
        copy = dense_transposed(y, np.float64)
        assert _dense(yt, np.float64) is copy
        other = _dense(own, np.float64)
        assert other is not copy and np.array_equal(other, copy)
    A = sp.random_array((30, 40), density=0.2, format="csr", rng=rng)
    X = rng.standard_normal((30, 6))
    program = "Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Yt[h,j]"
    for Yt in (Y.T, np.ascontiguousarray(Y.T)):
        ops = {"A": A, "X": X, "Y": Y, "Yt": Yt}
        np.testing.assert_allclose(spfuse.evaluate(program, **ops), dense_reference(program, ops),
                                   rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(Y.T, yt.todense())   # operands untouched


#: an SDDMM-SpMM-GEMM gradient (the adjoint's shared-contractions form): two
#: sampled products on B, one of them of ``grad_A·Wᵀ``, a dense product
SAMPLED_AFTER_GEMM = ("A_r[i,j] = sum(k, B[i,j] * C[i,k] * D[j,k]); "
                      "P[i,j] = sum(l, sum(m, G[i,m] * W[l,m]) * F[j,l]) * B[i,j]; "
                      "gC[i,k] = sum(j, P[i,j] * D[j,k]); gD[j,k] = sum(i, P[i,j] * C[i,k]); "
                      "gA[j,m] = sum(i, G[i,m] * A_r[i,j])")


@pytest.mark.parametrize("seed", [0, 1])
def test_a_dense_product_is_split_off_first_and_the_sampled_products_run_in_one_pass(seed):
    """The dense product heads the groups, the two sampled products and the
    row axpy run as one pattern program (not an ``sddmm_t`` pass, then the
    product, then the program), and the answers are numpy's."""
    rng = np.random.default_rng(seed)
    n, m, k = 40, 30, 6
    B = sp.random_array((n, m), density=0.2, format="csr", rng=rng)
    ops = {"B": B, "C": rng.standard_normal((n, k)), "D": rng.standard_normal((m, k)),
           "G": rng.standard_normal((n, k)), "W": rng.standard_normal((k, k)), "F": rng.standard_normal((m, k))}
    plan = spfuse.compile(SAMPLED_AFTER_GEMM).plans(**ops)["auto"]
    kernels = [g.kernel for g in split_groups(plan)]
    assert kernels[:2] == ["gemm", "pattern"] and "sddmm_t" not in kernels
    got, want = spfuse.evaluate(SAMPLED_AFTER_GEMM, **ops), dense_reference(SAMPLED_AFTER_GEMM, ops)
    for name in ("gC", "gD", "gA"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-10)
