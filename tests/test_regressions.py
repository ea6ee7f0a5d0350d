"""Regressions found by the boundary fuzzer and the property tests (shrunk by hand).

Each test is the smallest input that showed the problem.  Tests of bugs that
live in modules this suite's authors may not edit are ``xfail(strict=True)``
with the reason naming the bug; they start failing (XPASS) once it is fixed,
and the marker should then go.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse.testing import dense_reference

SDDMM = "A[i,j] = B[i,j] * (C[i,k] * D[k,j])"


# --------------------------------------------------------------------------- fixed
@pytest.mark.parametrize("dt", [">f8", ">f4", ">i4", ">i8", "<f8"])
def test_non_native_byte_order_values_are_accepted(dt):
    """Big-endian float64 was refused as 'unsupported value dtype' (fixed in validation.value_dtype)."""
    A = sp.csr_array(np.array([[1.0, 0.0], [2.0, 3.0]]))
    A.data = A.data.astype(dt)
    x = np.array([1.0, 2.0], dtype=dt)
    got = spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=x)
    np.testing.assert_allclose(got, [1.0, 8.0])
    assert got.dtype.isnative


def test_big_endian_coo_tensor_values():
    t = spfuse.Tensor.from_coo([[0, 1], [1, 0], [2, 2]], np.array([1.0, 2.0], dtype=">f8"), (2, 2, 3))
    assert t.dtype == np.float64 and t.values.dtype.isnative
    got = spfuse.evaluate("A[i,j] = X[i,j,k] * c[k]", X=t, c=np.array([1.0, 1.0, 2.0]))
    np.testing.assert_allclose(np.asarray(got.todense() if hasattr(got, "todense") else got),
                               [[0.0, 2.0], [4.0, 0.0]])


# --------------------------------------------------------------------------- documented semantics
def test_nan_times_implicit_zero_follows_scipy():
    """A stored NaN/inf meeting an *implicit* zero of another sparse operand is never
    computed (as in scipy and every sparse library); numpy on densified operands gives
    NaN there.  The fuzzer therefore puts non-finite values only where they meet dense
    values or stored entries."""
    A = sp.csr_array(np.array([[np.nan, 0.0], [0.0, 1.0]]))
    B = sp.csr_array(np.array([[1.0, 0.0], [0.0, 0.0]]))
    for fusion in ("auto", "max", "none"):
        got = spfuse.evaluate("C[i,k] = A[i,j] * B[j,k]", A=A, B=B, fusion=fusion).toarray()
        np.testing.assert_array_equal(got, (A @ B).toarray())          # [[nan, 0], [0, 0]]
    assert np.isnan(dense_reference("C[i,k] = A[i,j] * B[j,k]", {"A": A, "B": B})[0, 1])


@pytest.mark.parametrize("fusion", ["auto", "none"])
def test_sddmm_inf_is_ieee(fusion):
    B = sp.csr_array(np.array([[np.inf, -np.inf, np.nan]]))
    C = np.array([[1.0, -1.0, 2.0]])
    D = np.ones((3, 3))
    got = spfuse.evaluate(SDDMM, B=B, C=C, D=D, fusion=fusion).toarray()
    np.testing.assert_array_equal(got, dense_reference(SDDMM, {"B": B, "C": C, "D": D}))


# --------------------------------------------------------------------------- open bugs (not in our modules)
@pytest.mark.xfail(strict=True, reason="fusion='max' distributes B[i,j] over the k-sum of C*D "
                                       "(planner/lowering): inf*(1 - 1 + 1) = inf, but "
                                       "inf*1 + inf*(-1) + inf*1 = nan")
def test_max_fusion_sddmm_inf_is_ieee():
    B = sp.csr_array(np.array([[np.inf]]))
    C = np.array([[1.0, -1.0, 1.0]])
    D = np.ones((3, 1))
    got = spfuse.evaluate(SDDMM, B=B, C=C, D=D, fusion="max").toarray()
    np.testing.assert_array_equal(got, [[np.inf]])


_MUTATED_TENSOR = textwrap.dedent("""
    import numpy as np, scipy.sparse as sp, spfuse
    A = sp.random_array((50, 40), density=0.2, format="csr", rng=0)
    t = spfuse.Tensor.from_scipy(A)          # zero-copy: t shares A.indices / A.indptr
    A.indices[:] = 10**8                     # the caller changes its own array afterwards
    try:
        spfuse.evaluate("y[i] = A[i,j] * x[j]", A=t, x=np.ones(40))
    except ValueError:
        pass
    print("survived")
""")


def test_tensor_whose_borrowed_indices_were_mutated_does_not_crash():
    proc = subprocess.run([sys.executable, "-c", _MUTATED_TENSOR], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "survived" in proc.stdout, (proc.returncode, proc.stderr[-2000:])


@pytest.mark.xfail(strict=True, reason="fusion='auto' switches to maximal fusion when every reduction "
                                       "is tiny (input-sensitive rule, k <= 2) and then distributes "
                                       "B[i,j] over the k-sum like fusion='max'")
@pytest.mark.parametrize("K", [0, 2])
def test_auto_fusion_tiny_k_sddmm_inf_is_ieee(K):
    # DCSR: the generic executor (a CSC B now reaches the SDDMM template, read
    # as the CSR of Bᵀ, which keeps the k-sum whole and gives IEEE results)
    B = spfuse.Tensor.from_scipy(sp.csr_array(np.array([[np.inf, 1.0]]))).asformat("dcsr")
    C = np.array([[1.0, -1.0]])[:, :K]
    D = np.array([[2.0, 2.0], [1.0, 1.0]])[:K]
    want = dense_reference(SDDMM, {"B": B, "C": C, "D": D})   # K=0: [[nan, 0]]; K=2: [[inf, 1]]
    got = np.asarray(spfuse.evaluate(SDDMM, B=B, C=C, D=D, fusion="auto"))
    np.testing.assert_array_equal(got, want)


def _survives(code: str):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "survived" in proc.stdout, (proc.returncode, proc.stderr[-2000:])


_HYPERSPARSE = """
    import numpy as np, scipy.sparse as sp, spfuse
    N = 2**61            # a legal extent: 1 * N fits in int64
    row = sp.csr_array((np.array([1.0]), np.array([N - 1]), np.array([0, 1])), shape=(1, N))
    try:
        r = spfuse.evaluate({program!r}, **{operands})
        assert r.nnz == 1, r
    except MemoryError:   # refusing to allocate an N-wide workspace is fine; corrupting the heap is not
        pass
    print("survived")
"""


def test_spadd_hypersparse_huge_extent_does_not_corrupt_the_heap():
    _survives(_HYPERSPARSE.format(program="C[i,j] = A[i,j] + B[i,j]", operands="dict(A=row, B=row)"))


def test_spgemm_hypersparse_huge_extent_does_not_corrupt_the_heap():
    _survives(_HYPERSPARSE.format(program="C[i,k] = A[i,j] * B[j,k]",
                                  operands="dict(A=sp.csr_array(np.ones((1, 1))), B=row)"))


def test_hypersparse_huge_extent_generic_and_template_paths_that_work():
    """The same huge-but-legal shapes through kernels that do not need an n-wide workspace."""
    _survives("""
        import numpy as np, scipy.sparse as sp, spfuse
        N = 2**61
        row = sp.csr_array((np.array([2.0]), np.array([N - 1]), np.array([0, 1])), shape=(1, N))
        assert spfuse.evaluate("C[i,j] = A[i,j] + B[i,j]", A=row, B=row, fusion="none").sum() == 4.0
        x = sp.coo_array((np.array([3.0]), (np.array([N - 1]),)), shape=(N,))
        assert spfuse.evaluate("y[i] = A[i,j] * x[j]", A=row, x=x).tolist() == [6.0]
        X = spfuse.Tensor.from_coo([[0], [0], [N - 1]], [2.0], (1, 1, N))
        assert spfuse.evaluate("A[i,j] = X[i,j,k] * c[k]", X=X, c=x).sum() == 6.0
        print("survived")
    """)


def test_all_sparse_inputs_give_a_scipy_result():
    A = sp.random_array((3, 4), density=0.5, format="csr", rng=0)
    B = sp.random_array((4, 2), density=0.5, format="csc", rng=1)
    got = spfuse.evaluate("C[i,k] = A[i,j] * B[j,k]", A=A, B=B)
    np.testing.assert_allclose(got.toarray() if sp.issparse(got) else got, (A @ B).toarray())
    assert sp.issparse(got)


@pytest.mark.parametrize("fusion", ["auto", "none"])
def test_shadowed_reduction_index(fusion):
    A = np.zeros((1, 2, 4))
    A[0, 0, 2] = 1.0
    B = np.zeros((4, 2, 1))
    B[3, 0, 0] = -1.0
    shadow = "R[j,i] = (A[i,j,k] - 1.0) * where(B[k,j,i], sum(k, A[i,j,k]), A[i,j,k])"
    renamed = "R[j,i] = (A[i,j,k] - 1.0) * where(B[k,j,i], sum(l, A[i,j,l]), A[i,j,k])"
    ops = {"A": sp.coo_array(A), "B": sp.coo_array(B)}
    want = dense_reference(shadow, {"A": A, "B": B})                       # [[-1], [0]]
    np.testing.assert_allclose(spfuse.evaluate(renamed, fusion=fusion, **ops).toarray(), want)
    np.testing.assert_allclose(spfuse.evaluate(shadow, fusion=fusion, **ops).toarray(), want)


# Fixed: a propagated mask was "iterated" through a transposed copy of the
# tensor, which walks a projection of the mask (a superset) -- readers then saw
# stale elements of a sparsely reset temporary.  Such drivers are no longer
# exact, so the plan falls back to forward masks and whole-buffer resets.
def test_auto_fusion_permuted_reads_of_one_sparse_tensor():
    from spfuse.testing import random_operands
    P = "R0[j,k,m] = tanh(A[m,i,k] + A[l,i,m]) + B[k,m,j] * A[l,i,k]"
    ops = random_operands(2, {"A": (4, 2, 4), "B": (4, 4, 3)}, density=0.4, canonical=False,
                          index_dtype=np.int64, empty_rows=0.2, formats=("coo",))
    want = dense_reference(P, ops)
    np.testing.assert_allclose(spfuse.evaluate(P, fusion="none", **ops).todense(), want, atol=1e-12)
    np.testing.assert_allclose(spfuse.evaluate(P, fusion="auto", **ops).todense(), want, atol=1e-12)


def test_mask_of_a_consumer_index_the_producer_lacks_is_not_propagated():
    """R = P ∘ (x ∘ sel + (Σ_n1 Y ∘ sel) ⊗ o): the inner sum T4[j] is read as
    T4[j]*o[n] under P[n,j]'s pattern; P's row-n pattern must not restrict
    T4's j loop (fused into the loop over n it saw only n1 = n: 3, not 23).
    Found by the autodiff property test (seed 888)."""
    P = sp.csr_array(np.array([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    Y = np.array([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0]])
    o = np.ones(2)
    x = np.arange(8.0).reshape(2, 4)
    w = (Y > 1.5).astype(float)
    text = ("R[n, j] = P[n, j] * (x[n, j] * where(w[n, j], 1.0, 0.0)"
            " + sum(n_1, Y[n_1, j] * where(w[n_1, j], 1.0, 0.0)) * o[n])")
    sel = np.where(w != 0, 1.0, 0.0)
    want = P.toarray() * (x * sel + (Y * sel).sum(axis=0)[None, :] * o[:, None])
    for fusion in ("none", "auto"):
        got = spfuse.evaluate(text, P=P, Y=Y, o=o, x=x, w=w, fusion=fusion)
        np.testing.assert_allclose(got.toarray(), want, rtol=1e-14)


def test_tiny_reduction_of_a_function_of_a_product_is_not_a_template_spmv():
    """sum(k, tanh(A[i,k]*B[k])) with k of extent 1 is fused whole (tiny
    reduction); the fused statement's leaves A, B are not an SpMV's factors:
    the template used to drop the tanh (found by test_random_programs_match_numpy)."""
    A = sp.csr_array(np.array([[0.0], [-0.58185598], [0.36417188], [0.104343]]))
    B = np.array([-0.32633475])
    got = spfuse.evaluate("R0[i] = sum(k, tanh(A[i, k] * B[k]))", A=A, B=B)
    np.testing.assert_allclose(got, np.tanh(A.toarray() * B).sum(axis=1), rtol=1e-14)
    # a plain product under the same tiny reduction still runs on the template
    k = spfuse.compile("y[i] = sum(k, A[i, k] * B[k])")
    assert "template kernel 'spmv'" in k.explain(A=A, B=B)
    np.testing.assert_allclose(k(A=A, B=B), A.toarray() @ B, rtol=1e-14)


def test_a_temporary_stored_whole_is_cleared_whole_under_an_empty_row():
    """T1[i,n] = I[l,i]*T2[n] is written under row l of I (i ∈ I_i) but read
    densely over i, so it is stored whole and reset per l: the reset must
    clear every i, not only row l's pattern -- under I's empty row 1 it
    cleared nothing and row 0's products leaked into R[:, 1]
    (found by test_random_programs_match_numpy, hypothesis seed 1709429099)."""
    I = sp.coo_array(np.array([[0.8, 0.0, 0.0, -0.3], [0.0, 0.0, 0.0, 0.0]]))
    J = np.arange(9.0).reshape(3, 3) / 10
    K = sp.coo_array(np.array([0.0, -0.6, 0.0]))
    H = np.array(0.0)
    text = "R[i, l] = (H - I[l, i] * J[n, k]) * tanh(K[n])"
    want = -(J.sum(axis=1) @ np.tanh(K.toarray())) * I.toarray().T
    for fusion in ("auto", "none", "max"):
        for nt in (1, 2):
            got = spfuse.evaluate(text, H=H, I=I, J=J, K=K, fusion=fusion, num_threads=nt)
            np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
