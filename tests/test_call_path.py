"""The per-call path: dispatch cache, fast operand wrapping, re-validation.

A cached call skips planning, never validation: every call checks its
operands again (the one-pass scan, or for SpMV/SpMM an ``indptr`` pass and
the kernel's own index checks), so a matrix mutated between calls is refused
(or canonicalised) exactly as on the first call.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse.errors import InvalidOperandError
from spfuse.tensor import Tensor, as_tensor

SPMV = "y[i] = A[i,j] * x[j]"


def _csr(seed=0, shape=(30, 20), density=0.2, dtype=np.float64):
    return sp.random_array(shape, density=density, format="csr", random_state=seed, dtype=dtype)


def test_repeat_calls_hit_the_dispatch_cache_and_stay_correct():
    spfuse.clear_cache()
    A, x = _csr(), np.arange(20.0)
    for seed in range(3):
        A = _csr(seed)
        np.testing.assert_allclose(spfuse.evaluate(SPMV, A=A, x=x), A.toarray() @ x)
    from spfuse import api
    assert len(api._dispatch_cache) == 1  # same formats, shapes, dtypes: one entry


def test_out_of_range_index_written_after_a_cached_call_is_refused():
    A, x = _csr(), np.ones(20)
    spfuse.evaluate(SPMV, A=A, x=x)
    A.indices[0] = 10**6  # the caller mutates its matrix between calls
    with pytest.raises(InvalidOperandError, match="out-of-range"):
        spfuse.evaluate(SPMV, A=A, x=x)


def test_indptr_broken_after_a_cached_call_is_refused():
    A, x = _csr(), np.ones(20)
    k = spfuse.compile(SPMV)
    k(A=A, x=x)
    A.indptr[3] = A.indptr[-1] + 100
    with pytest.raises(InvalidOperandError, match="indptr"):
        k(A=A, x=x)


def test_rows_unsorted_after_a_cached_call_are_canonicalised_on_a_copy():
    A, x = _csr(seed=4), np.arange(20.0)
    expected = A.toarray() @ x
    spfuse.evaluate(SPMV, A=A, x=x)
    row = int(np.argmax(np.diff(A.indptr)))
    lo, hi = A.indptr[row], A.indptr[row + 1]
    assert hi - lo >= 2
    A.indices[lo:hi] = A.indices[lo:hi][::-1].copy()
    A.data[lo:hi] = A.data[lo:hi][::-1].copy()
    before = (A.indices.copy(), A.data.copy())
    np.testing.assert_allclose(spfuse.evaluate(SPMV, A=A, x=x), expected)
    np.testing.assert_array_equal(A.indices, before[0])  # the caller's arrays are untouched
    np.testing.assert_array_equal(A.data, before[1])


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("itype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fast_wrap_equals_the_general_path(fmt, itype, dtype):
    m = _csr(seed=2, dtype=dtype).asformat(fmt)
    m.indptr, m.indices = m.indptr.astype(itype), m.indices.astype(itype)
    fast = as_tensor(m, name="A")
    general = Tensor.from_csr(m.data, m.indices, m.indptr, m.shape) if fmt == "csr" else \
        Tensor.from_csc(m.data, m.indices, m.indptr, m.shape)
    assert fast.format == general.format and fast.shape == general.shape
    assert fast.index_dtype == itype  # int64 input is kept (zero-copy); from_csr narrows
    assert general.index_dtype == np.int32
    np.testing.assert_array_equal(fast.todense(), m.toarray())
    for a, b in zip(fast.levels[1:], general.levels[1:], strict=True):
        np.testing.assert_array_equal(a.pos, b.pos)
        np.testing.assert_array_equal(a.crd, b.crd)
    assert not fast.values.flags.writeable and not fast.levels[1].crd.flags.writeable
    assert m.data.flags.writeable  # the caller's arrays keep their flags


@pytest.mark.parametrize("a", [
    np.arange(12.0).reshape(3, 4), np.arange(12.0).reshape(3, 4).T, np.arange(6, dtype=np.float32),
    np.array(2.5), np.zeros((0, 3)), np.arange(6).reshape(2, 3), np.arange(6.0).astype(">f8"),
])
def test_dense_operands_of_every_layout(a):
    t = as_tensor(a, name="x")
    np.testing.assert_array_equal(t.todense(), np.asarray(a, dtype=t.dtype))
    assert t.format.is_dense and t.origin == "numpy"


def test_empty_and_zero_size_operands_on_the_fast_path():
    for shape in [(0, 5), (5, 0), (0, 0), (4, 6)]:
        A = sp.csr_array(shape)
        x = np.ones(shape[1])
        np.testing.assert_array_equal(spfuse.evaluate(SPMV, A=A, x=x), np.zeros(shape[0]))


def test_dispatch_separates_flavour_and_dtype():
    A, x = _csr(seed=1), np.ones(20)
    r1 = spfuse.evaluate("C[i,j] = A[i,j] * A[i,j]", A=A)
    r2 = spfuse.evaluate("C[i,j] = A[i,j] * A[i,j]", A=sp.csr_matrix(A))
    r3 = spfuse.evaluate("C[i,j] = A[i,j] * A[i,j]", A=A.astype(np.float32))
    assert isinstance(r1, sp.sparray) and isinstance(r2, sp.spmatrix)
    assert r3.dtype == np.float32 and r1.dtype == np.float64
    np.testing.assert_allclose(r2.toarray(), A.toarray() ** 2)
    assert spfuse.evaluate(SPMV, A=A, x=x.astype(np.float32)).dtype == np.float64


def test_diagonal_access_is_rebuilt_per_call():
    for seed in range(2):
        A = sp.random_array((6, 6), density=0.5, format="csr", random_state=seed)
        np.testing.assert_allclose(spfuse.evaluate("y[i] = A[i,i]", A=A), np.diag(A.toarray()))


@pytest.mark.parametrize("program", [
    "C[i,j] = A[i,j] * (X[i,k] * Y[j,k])",  # SDDMM: the result keeps A's pattern
    "C[i,j] = A[i,j] + A[i,j]", "C[i,j] = A[i,j]", "C[i,k] = A[i,j] * A[j,k]",
])
def test_sparse_results_are_writable_and_never_alias_an_input(program):
    A = _csr(seed=3, shape=(20, 20))
    ops = {"A": A, "X": np.ones((20, 3)), "Y": np.ones((20, 3))}
    ops = {n: v for n, v in ops.items() if f"{n}[" in program}
    before = [a.copy() for a in (A.data, A.indices, A.indptr)]
    C = spfuse.evaluate(program, **ops)
    assert isinstance(C, sp.sparray)
    for arr in (C.data, C.indices, C.indptr):
        assert arr.flags.writeable
        for a in (A.data, A.indices, A.indptr):
            assert not np.shares_memory(arr, a)
    C.data *= 2  # the caller owns the result
    for a, b in zip((A.data, A.indices, A.indptr), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_caller_tensor_mutated_after_a_cached_call_is_refused():
    A = _csr(seed=5)
    T = Tensor.from_scipy(A)  # zero-copy: T's index arrays are views of A's
    x = np.arange(20.0)
    np.testing.assert_allclose(spfuse.evaluate(SPMV, A=T, x=x), A.toarray() @ x)
    A.indices[-1] = 10**6  # written through the caller's scipy matrix
    with pytest.raises(InvalidOperandError, match="out-of-range"):
        spfuse.evaluate(SPMV, A=T, x=x)


def test_valid_csf_tensor_is_reused_without_a_rebuild():
    X = Tensor.from_coo([[0, 1, 2], [1, 0, 2], [2, 2, 0]], [1.0, 2.0, 3.0], (3, 3, 3))
    from spfuse.binding import rechecked
    assert rechecked(X, "X") is X
    np.testing.assert_allclose(spfuse.evaluate("Y[i,j] = X[i,j,k] * v[k]", X=X, v=np.ones(3)).todense(),
                               X.todense().sum(axis=2))


# -- indices checked inside SpMV / SpMM ---------------------------------------

SPMM = "C[i,k] = A[i,j] * B[j,k]"


@pytest.fixture
def scans(monkeypatch):
    """Counts the one-pass index scans a call makes."""
    from spfuse import validation
    calls = []
    real = validation._scan_compressed

    def counting(pos, crd, size, num_threads=1):
        calls.append(len(crd))
        return real(pos, crd, size, num_threads)

    monkeypatch.setattr(validation, "_scan_compressed", counting)
    return calls


@pytest.mark.parametrize("program, dense", [(SPMV, lambda n: np.arange(n, dtype=float)),
                                            (SPMM, lambda n: np.ones((n, 3)))])
def test_spmv_and_spmm_check_indices_in_the_kernel_instead_of_a_scan(scans, program, dense):
    A = _csr(seed=2)
    other = dense(A.shape[1])
    out = spfuse.evaluate(program, A=A, **({"x": other} if "x[" in program else {"B": other}))
    np.testing.assert_allclose(out, A.toarray() @ other)
    assert scans == []  # A's indices were read once, by the kernel


def test_spgemm_still_scans_its_operands(scans):
    A = _csr(seed=3, shape=(20, 20))
    np.testing.assert_allclose(spfuse.evaluate("C[i,k] = A[i,j] * B[j,k]", A=A, B=A).toarray(),
                               A.toarray() @ A.toarray())
    assert len(scans) == 2


@pytest.mark.parametrize("program", [SPMV, SPMM])
@pytest.mark.parametrize("bad", [20, 2**31 - 1, -1])
@pytest.mark.parametrize("itype", [np.int32, np.int64])
def test_out_of_range_index_found_by_the_kernel_is_worded(program, bad, itype):
    A = _csr(seed=5)
    A.indices = A.indices.astype(itype)
    A.indptr = A.indptr.astype(itype)
    A.indices[len(A.indices) // 2] = bad
    before = A.indices.copy()
    dense = np.ones(20) if program == SPMV else np.ones((20, 4))
    with pytest.raises(InvalidOperandError, match="out-of-range"):
        spfuse.evaluate(program, A=A, **({"x": dense} if program == SPMV else {"B": dense}))
    np.testing.assert_array_equal(A.indices, before)


def test_out_of_range_index_with_an_empty_dense_dimension_is_refused():
    A = _csr(seed=6)
    A.indices[0] = 99
    with pytest.raises(InvalidOperandError, match="out-of-range"):
        spfuse.evaluate(SPMM, A=A, B=np.ones((20, 0)))


@pytest.mark.parametrize("program", [SPMV, SPMM])
def test_unsorted_and_duplicate_indices_are_summed_by_the_kernel(program):
    # scipy keeps duplicates and row order as given when built from raw arrays
    indptr = np.array([0, 3, 3, 6], dtype=np.int32)
    indices = np.array([4, 0, 4, 2, 1, 0], dtype=np.int32)
    data = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    A = sp.csr_array((data, indices, indptr), shape=(3, 5))
    dense_A = np.zeros((3, 5))
    np.add.at(dense_A, (np.repeat(np.arange(3), np.diff(indptr)), indices), data)
    other = np.arange(5.0) if program == SPMV else np.arange(10.0).reshape(5, 2)
    out = spfuse.evaluate(program, A=A, **({"x": other} if program == SPMV else {"B": other}))
    np.testing.assert_allclose(out, dense_A @ other)
    np.testing.assert_array_equal(A.indices, [4, 0, 4, 2, 1, 0])  # never sorted in place


def test_indptr_checked_before_a_self_checking_kernel_runs():
    A = _csr(seed=7)
    A.indptr[5] = A.indptr[6] + 3  # rises then drops: rows 5 and 6 overlap
    with pytest.raises(InvalidOperandError, match="indptr"):
        spfuse.evaluate(SPMV, A=A, x=np.ones(20))


@pytest.mark.parametrize("program, fmt, shape, dense", [
    ("Y[i,k] = A[i,j] * W[j,k]", "csc", (2**62, 3), np.ones((3, 2))),
    ("y[j] = A[i,j] * W[i]", "csr", (3, 2**62), np.ones(3))])
def test_shape_whose_size_overflows_int64_is_refused_by_name(program, fmt, shape, dense):
    # each extent fits int64, their product does not: the fast wrap must not
    # take it (found by the boundary fuzz, seed 7)
    A = sp.csr_array((np.ones(1), np.array([0]), np.array([0, 1, 1, 1])), shape=(3, 3)).asformat(fmt)
    A.indices = A.indices.astype(np.int64)
    A.indptr = A.indptr.astype(np.int64)
    A._shape = shape  # as the fuzz does: scipy's constructor would refuse it
    with pytest.raises(ValueError, match="'A'.*too large|too large.*'A'|operand 'A'"):
        spfuse.evaluate(program, A=A, W=dense)


def test_zero_d_operand_is_rebound_not_relowered(monkeypatch):
    """A 0-d operand lives in a 0-d buffer set per call: later calls with
    other values reuse the cached lowering and see their own value."""
    import scipy.sparse as sp

    from spfuse.lowering import looptree as LL
    A = sp.random_array((300, 200), density=0.05, format="csr", random_state=0)
    x = np.random.default_rng(0).random(200)
    b = np.random.default_rng(1).random(300)
    k = spfuse.compile("y[i] = sum(j, A[i,j]*x[j]) * s + b[i]")
    k(A=A, x=x, b=b, s=np.float64(1.0))
    calls = []
    original = LL.lower_to_looptree
    monkeypatch.setattr(LL, "lower_to_looptree", lambda *a, **kw: calls.append(1) or original(*a, **kw))
    for s in (2.0, -3.5, 0.0):
        np.testing.assert_allclose(k(A=A, x=x, b=b, s=np.float64(s)), (A @ x) * s + b, rtol=1e-13)
    assert calls == []


def test_an_adjoint_whose_mask_crosses_groups_runs_propagated_once(monkeypatch):
    """An adjoint's ``where()`` under a pattern (found by the autodiff
    property test): the planner finds an exact driver for every propagated
    mask -- the binding of ``pattern_D``'s modes runs through the whole
    program, not only the group -- so the first call plans and lowers
    once, with propagation, and later calls neither plan nor lower."""
    from spfuse import planner
    from spfuse.lowering import looptree as LL
    from spfuse.testing import dense_reference
    program = ("grad_D[k, i] = pattern_D[k, i] * (sum(j, i_2, where(B * C[i_2, j], sum(l, grad_R0[k, l, j]) * A, "
               "0.0)) * where(D[k, i] - R0_r_1[k], 0.0, 1.0) / R0_r_5[k] + sum(i_1, where(B * C[i_1, i], 0.0, "
               "sum(k_1, grad_R0[k_1, k, i]) * A)))")
    rng = np.random.default_rng(5)
    pattern = (rng.random((4, 3)) < 0.5) * 1.0
    ops = {"pattern_D": spfuse.Tensor.from_numpy(pattern, "csr"), "B": 1.5, "C": rng.standard_normal((3, 3)),
           "grad_R0": rng.standard_normal((4, 4, 3)), "A": -0.5,
           "D": spfuse.Tensor.from_numpy(pattern * rng.standard_normal((4, 3)), "csr"),
           "R0_r_1": rng.standard_normal(4), "R0_r_5": rng.random(4) + 1.0}
    lowered, plans = [], []
    original, replan = LL.lower_to_looptree, planner.plan_program
    monkeypatch.setattr(LL, "lower_to_looptree", lambda *a, **kw: lowered.append(1) or original(*a, **kw))
    monkeypatch.setattr(planner, "plan_program", lambda *a, **kw: plans.append(1) or replan(*a, **kw))
    k = spfuse.compile(program)
    want = dense_reference(program, ops)
    np.testing.assert_allclose(spfuse.testing.densify(k(**ops)), want, rtol=1e-12, atol=1e-12)
    assert k.plans(**ops)["auto"].propagated and lowered
    lowered.clear()
    plans.clear()
    for _ in range(2):
        np.testing.assert_allclose(spfuse.testing.densify(k(**ops)), want, rtol=1e-12, atol=1e-12)
    assert lowered == [] and plans == []
    # scipy operands (their indices scanned on the call path): scanned before
    # anything reads them, so a corrupt index is a clear error
    import scipy.sparse as sp
    sci = dict(ops, pattern_D=sp.csr_array(pattern), D=sp.csr_array(ops["D"].todense()))
    np.testing.assert_allclose(spfuse.testing.densify(k(**sci)), want, rtol=1e-12, atol=1e-12)
    bad = sp.csr_array(ops["D"].todense())
    bad.indices[-1] = 7   # column 7 of a 4 x 3 matrix
    with pytest.raises(ValueError, match="D"):
        k(**dict(sci, D=bad))


@pytest.mark.parametrize("num_threads", [1, 2, None])
def test_a_callers_tensor_is_rescanned_with_the_calls_threads(num_threads, monkeypatch):
    """The scan of a caller's sparse Tensor (its indices may have changed
    since it was built) takes the call's ``num_threads``: a large level is
    scanned by a team, never by more threads than the call allows."""
    import spfuse.validation as V
    seen = []
    scan = V.scan_status
    monkeypatch.setattr(V, "scan_status", lambda pos, crd, size, nt=1: seen.append(nt) or scan(pos, crd, size, nt))
    rng = np.random.default_rng(0)
    X = spfuse.Tensor.from_numpy(np.where(rng.random((60, 50, 70)) < 0.7, 1.0, 0.0), "csf")
    assert X.nnz >= V.SCAN_TEAM_MIN_ENTRIES
    C, D = rng.random((50, 3)), rng.random((70, 3))
    got = spfuse.evaluate("A[i,r] = X[i,j,k] * C[j,r] * D[k,r]", X=X, C=C, D=D, num_threads=num_threads)
    np.testing.assert_allclose(got, np.einsum("ijk,jr,kr->ir", X.todense(), C, D), rtol=1e-12)
    assert seen and set(seen) == {num_threads}
