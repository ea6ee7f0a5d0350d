"""What a cached call still does, and does once.

The generic executor reads int32 and int64 index arrays as they are; a
scipy operand's indices are scanned (valid? canonical?) once per call, just
before the executor reads them.  These tests pin that the scan still catches
every kind of bad input before any kernel runs, that results do not change,
and the small helpers the per-call path is built from.
"""
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import spfuse
from spfuse import validation
from spfuse._kernels import _validate
from spfuse.errors import InvalidOperandError
from spfuse.formats import Format
from spfuse.tensor import _compressed_ready_py
from spfuse.threads import threads_for_call

SPMV_B = "y[i] = sum(j, A[i,j]*x[j]) + b[i]"
RELU_SPMM = "C[i,k] = relu(A[i,j]*B[j,k])"
GENERIC = [SPMV_B, RELU_SPMM]


def _csr(seed=0, shape=(30, 20), density=0.2, itype=np.int32):
    A = sp.random_array(shape, density=density, format="csr", rng=seed)
    A.indptr, A.indices = A.indptr.astype(itype), A.indices.astype(itype)
    return A


def _operands(program, A):
    rng = np.random.default_rng(1)
    n, m = A.shape
    if program == SPMV_B:
        return {"x": rng.random(m), "b": rng.random(n)}
    return {"B": rng.random((m, 4))}


def _oracle(program, A, ops):
    dense = A.toarray()  # scipy sums duplicates and ignores order
    if program == SPMV_B:
        return dense @ ops["x"] + ops["b"]
    return np.maximum(dense @ ops["B"], 0.0)


@pytest.fixture
def passes(monkeypatch):
    """Counts the index scans a call makes, and the index arrays the
    executor is given (their dtypes)."""
    from spfuse.runtime import looptree as lt
    calls = {"scan": 0, "dtypes": set()}
    real_scan, real_run = validation._scan_compressed, lt.run

    def scan(pos, crd, size, num_threads=1):
        calls["scan"] += 1
        return real_scan(pos, crd, size, num_threads)

    def run(plan, *a, **k):
        calls["dtypes"] |= {arr.dtype for arr in plan.index_arrays}
        return real_run(plan, *a, **k)

    monkeypatch.setattr(validation, "_scan_compressed", scan)
    monkeypatch.setattr(lt, "run", run)
    return calls


#: programs the generic executor runs with A's arrays (no template takes them)
GENERIC_READS = {
    "y[i] = sum(j, A[i,j]*x[j]*x[j]) + b[i]": lambda d, o: d @ (o["x"] * o["x"]) + o["b"],
    "C[i,k] = relu(A[i,j]*B[j,k]*B[j,k])": lambda d, o: np.maximum(d @ (o["B"] * o["B"]), 0.0),
}


@pytest.mark.parametrize("itype", [np.int32, np.int64])
@pytest.mark.parametrize("program", sorted(GENERIC_READS))
def test_generic_path_scans_indices_once_and_reads_them_as_they_are(passes, program, itype):
    A = _csr(seed=2, itype=itype)
    ops = _operands(SPMV_B if "x[" in program else RELU_SPMM, A)
    k = spfuse.compile(program, num_threads=1)
    k(A=A, **ops)  # plans and lowers
    passes.update(scan=0, dtypes=set())
    for _ in range(3):
        np.testing.assert_allclose(k(A=A, **ops), GENERIC_READS[program](A.toarray(), ops))
    assert passes == {"scan": 3, "dtypes": {np.dtype(itype)}}


def _unsorted(A):
    row = int(np.argmax(np.diff(A.indptr)))
    lo, hi = A.indptr[row], A.indptr[row + 1]
    A.indices[lo:hi] = A.indices[lo:hi][::-1].copy()
    A.data[lo:hi] = A.data[lo:hi][::-1].copy()


def _duplicate(A):
    row = int(np.argmax(np.diff(A.indptr)))
    lo = A.indptr[row]
    A.indices[lo + 1] = A.indices[lo]


CANONICALISED = {"unsorted row": _unsorted, "duplicate index": _duplicate}


def _set(attr, where, value):
    def corrupt(A):
        getattr(A, attr)[where(A)] = value(A)
    return corrupt


REFUSED = {
    "index == ncols": (_set("indices", lambda A: 3, lambda A: A.shape[1]), "out-of-range"),
    "index -1": (_set("indices", lambda A: -1, lambda A: -1), "out-of-range"),
    "index 2**31-1": (_set("indices", lambda A: 0, lambda A: 2**31 - 1), "out-of-range"),
    "indptr decreases": (_set("indptr", lambda A: 5, lambda A: A.indptr[7] + 1), "indptr|monotone"),
    "indptr[0] != 0": (_set("indptr", lambda A: 0, lambda A: 1), r"\[0\]"),
    "indptr[-1] > nnz": (_set("indptr", lambda A: -1, lambda A: A.nnz + 3), "indptr|stored entries"),
}


@pytest.mark.parametrize("program", GENERIC)
@pytest.mark.parametrize("itype", [np.int32, np.int64])
@pytest.mark.parametrize("kind", sorted(CANONICALISED) + sorted(REFUSED))
@pytest.mark.parametrize("cached", [False, True])
def test_bad_indices_on_the_generic_path_are_canonicalised_or_refused(program, itype, kind, cached):
    """Unsorted or duplicated: canonicalised on a copy (the caller's arrays
    untouched); out of range or a broken indptr: refused by name.  On the
    first call and after a cached one (the caller mutated its matrix)."""
    A = _csr(seed=4, itype=itype)
    ops = _operands(program, A)
    k = spfuse.compile(program, num_threads=1)
    if cached:
        k(A=A, **ops)
    if kind in REFUSED:
        corrupt, words = REFUSED[kind]
        corrupt(A)
        with pytest.raises(InvalidOperandError, match=words) as info:
            k(A=A, **ops)
        assert "operand 'A'" in str(info.value)
        return
    CANONICALISED[kind](A)
    before = (A.indptr.copy(), A.indices.copy(), A.data.copy())
    np.testing.assert_allclose(k(A=A, **ops), _oracle(program, A, ops))
    for now, then in zip((A.indptr, A.indices, A.data), before, strict=True):
        np.testing.assert_array_equal(now, then)  # never mutated


@pytest.mark.parametrize("program", GENERIC)
def test_cached_generic_call_follows_each_calls_matrix(program):
    """Rebinding never reuses arrays of an earlier call: same signature, new contents."""
    k = spfuse.compile(program, num_threads=1)
    for seed in range(4):
        A = _csr(seed=seed, itype=np.int32 if seed % 2 else np.int64)
        ops = _operands(program, A)
        np.testing.assert_allclose(k(A=A, **ops), _oracle(program, A, ops))
    A = _csr(seed=9)
    ops = _operands(program, A)
    k(A=A, **ops)
    A.data *= -2.0  # contents change in place, identity does not
    np.testing.assert_allclose(k(A=A, **ops), _oracle(program, A, ops))


def test_operand_read_in_another_order_is_scanned_once(passes):
    """``y[j] = A[i,j]*|x[i]| + c[j]``, CSR A, on the generic executor: one
    scan of A's indices per call, whichever order the lowering reads A in;
    none when the scatter kernel, which checks them as it reads them, runs
    the plain ``Aᵀx + c``."""
    A = _csr(seed=6, shape=(40, 25))
    x, c = np.arange(40.0), np.ones(25)
    program = "y[j] = sum(i, A[i,j]*abs(x[i])) + c[j]"
    np.testing.assert_allclose(spfuse.evaluate(program, A=A, x=x, c=c), A.toarray().T @ x + c)
    passes.update(scan=0)
    np.testing.assert_allclose(spfuse.evaluate(program, A=A, x=x, c=c), A.toarray().T @ x + c)
    assert passes["scan"] == 1
    program = "y[j] = sum(i, A[i,j]*x[i]) + c[j]"
    np.testing.assert_allclose(spfuse.evaluate(program, A=A, x=x, c=c), A.toarray().T @ x + c)
    passes.update(scan=0)
    np.testing.assert_allclose(spfuse.evaluate(program, A=A, x=x, c=c), A.toarray().T @ x + c)
    assert passes["scan"] == 0


def test_tiny_call_does_not_look_at_the_machine_for_a_thread_count(monkeypatch):
    """Too little work for a team: one thread, without reading /proc."""
    from spfuse._kernels import _config

    def unavailable(*args):
        raise AssertionError("a tiny call read /proc")

    monkeypatch.setattr(_config, "runnable_threads", unavailable)
    monkeypatch.setenv("SPFUSE_ADAPTIVE_THREADS", "1")
    A = _csr(seed=7)
    ops = _operands(SPMV_B, A)
    np.testing.assert_allclose(spfuse.evaluate(SPMV_B, A=A, num_threads=2, **ops), _oracle(SPMV_B, A, ops))
    np.testing.assert_allclose(spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=ops["x"], num_threads=2),
                               A.toarray() @ ops["x"])


@pytest.mark.parametrize("bad, error", [(0, ValueError), (-2, ValueError), ("2", TypeError), (True, TypeError)])
def test_thread_count_is_checked_even_when_the_call_is_too_small_for_a_team(bad, error):
    assert threads_for_call(2, worthwhile=False) == 1
    with pytest.raises(error):
        threads_for_call(bad, worthwhile=False)
    A = _csr(seed=8)
    with pytest.raises(error):
        spfuse.evaluate(SPMV_B, A=A, num_threads=bad, **_operands(SPMV_B, A))


# -- the pieces ---------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(itype=st.sampled_from([np.int32, np.int64, np.int16, np.uint32]),
       ctype=st.sampled_from([np.int32, np.int64]),
       vtype=st.sampled_from([np.float64, np.float32, np.int64, np.complex128]),
       strided=st.booleans(), nouter=st.integers(0, 6), ninner=st.integers(0, 6),
       shift=st.sampled_from([0, 0, 0, 1, -1]), scan=st.booleans(), seed=st.integers(0, 99))
def test_compressed_ready_agrees_with_its_numpy_statement(itype, ctype, vtype, strided, nouter, ninner, shift,
                                                          scan, seed):
    A = sp.random_array((nouter, ninner), density=0.5, format="csr", rng=seed)
    indptr = A.indptr.astype(itype)
    indices = A.indices.astype(ctype)
    data = A.data.astype(vtype)
    if strided and len(data):
        data = np.repeat(data, 2)[::2]
    got = _validate.compressed_ready(indptr, indices, data, nouter + shift, ninner, scan)
    assert got == _compressed_ready_py(indptr, indices, data, nouter + shift, ninner, scan)


def test_pos_drops_reads_both_index_dtypes_only():
    for itype in (np.int32, np.int64):
        assert _validate.pos_drops(np.array([0, 2, 2, 5], itype)) == 0
        assert _validate.pos_drops(np.array([0, 3, 1, 4, 2], itype)) == 2
        assert _validate.pos_drops(np.array([0], itype)) == 0
    with pytest.raises(ValueError, match="int32 or int64"):
        _validate.pos_drops(np.array([0.0, 1.0]))


def test_readonly_flat_is_a_read_only_view_that_leaves_the_caller_writable():
    a = np.arange(12.0).reshape(3, 4)
    v = _validate.readonly_flat(a)
    assert v.shape == (12,) and not v.flags.writeable and np.shares_memory(a, v)
    assert a.flags.writeable
    a[0, 0] = 7.0
    assert v[0] == 7.0  # a view, not a copy
    with pytest.raises(ValueError, match="C-contiguous"):
        _validate.readonly_flat(a.T)


def test_format_hash_is_cached_and_survives_pickling():
    f = Format(("dense", "compressed"), (1, 0))
    assert hash(f) == hash(Format.csc()) and f == Format.csc()
    g = pickle.loads(pickle.dumps(f))
    assert g == f and hash(g) == hash(f)
    assert {f: 1}[Format(("dense", "compressed"), (1, 0))] == 1


def test_declared_format_already_held_is_not_converted_first(passes):
    """``compile(..., A="csr")`` called with a CSR matrix takes the same
    path as an undeclared one: one scan of A's indices per call."""
    A = _csr(seed=10)
    ops = _operands(SPMV_B, A)
    program = "y[i] = sum(j, A[i,j]*x[j]*x[j]) + b[i]"
    k = spfuse.compile(program, num_threads=1, A="csr")
    k(A=A, **ops)
    passes.update(scan=0, dtypes=set())
    np.testing.assert_allclose(k(A=A, **ops), GENERIC_READS[program](A.toarray(), ops))
    assert passes == {"scan": 1, "dtypes": {np.dtype(np.int32)}}
    A.indices[2] = A.shape[1]  # still refused after a cached call
    with pytest.raises(InvalidOperandError, match="out-of-range"):
        k(A=A, **ops)


@pytest.mark.parametrize("declared", ["csc", "csr", "dense"])
def test_declared_format_still_converts_what_is_not_in_it(declared):
    A = _csr(seed=11)
    ops = _operands(SPMV_B, A)
    k = spfuse.compile(SPMV_B, num_threads=1, A=declared)
    for operand in (A, A.tocsc(), A.toarray()):
        np.testing.assert_allclose(k(A=operand, **ops), _oracle(SPMV_B, A, ops))
