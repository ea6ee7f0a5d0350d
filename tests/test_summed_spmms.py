"""Sums of transposed SpMMs of one pattern run as one walk of it, and sums
of SpMMs as one SpMM per term accumulating into one result
(``spfuse.lowering.summed_spmms``), against numpy on densified operands."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.lowering.groups import split_groups

TWO = "Y[j,k] = sum(i, A[i,j] * X[i,k]) + sum(i, B[i,j] * G[i,k])"
#: the gather form: each row of the result from a row of A and of B
GATHER = "Y[i,k] = sum(j, A[i,j] * X[j,k]) + sum(j, B[i,j] * G[j,k])"


def _matrix(rng, m, n, density=0.2, dtype=np.float64, index=np.int32):
    a = sp.random_array((m, n), density=density, format="csr", random_state=rng, dtype=dtype)
    a.indices, a.indptr = a.indices.astype(index), a.indptr.astype(index)
    return a


def _same_pattern(a, rng):
    return sp.csr_array((rng.standard_normal(a.nnz).astype(a.dtype), a.indices.copy(), a.indptr.copy()),
                        shape=a.shape)


def _kernels(program, fusion="auto", **ops):
    return [g.kernel for g in split_groups(spfuse.compile(program, fusion=fusion).plans(**ops)[fusion])]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("index", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(30, 20), (0, 5), (6, 0), (40, 1)])
@pytest.mark.parametrize("nt", [1, 2])
def test_two_terms_one_walk(dtype, index, shape, nt, rng):
    A = _matrix(rng, *shape, dtype=dtype, index=index)
    B = _same_pattern(A, rng)
    X, G = (rng.standard_normal((shape[0], 3)).astype(dtype) for _ in range(2))
    before = [x.copy() for x in (A.data, A.indices, A.indptr, B.data, X, G)]
    assert _kernels(TWO, A=A, B=B, X=X, G=G) == ["spmm_t_sum"]
    got = spfuse.evaluate(TWO, A=A, B=B, X=X, G=G, num_threads=nt)
    want = A.toarray().T.astype(np.float64) @ X + B.toarray().T.astype(np.float64) @ G
    np.testing.assert_allclose(got, want, **(dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else {}))
    assert got.dtype == dtype
    for a, b in zip(before, (A.data, A.indices, A.indptr, B.data, X, G), strict=True):
        np.testing.assert_array_equal(a, b)   # inputs untouched


def test_terms_on_different_patterns_run_apart(rng):
    A, B = _matrix(rng, 30, 20), _matrix(rng, 30, 20)
    X, G = rng.standard_normal((30, 4)), rng.standard_normal((30, 4))
    np.testing.assert_allclose(spfuse.evaluate(TWO, A=A, B=B, X=X, G=G), A.toarray().T @ X + B.toarray().T @ G)
    # one kernel, called on one pattern, then on operands of equal shape and
    # entry count but other coordinates: found per call
    rows = np.repeat(np.arange(30), np.diff(A.indptr))
    C = sp.csr_array((rng.standard_normal(A.nnz), (rows, (A.indices + 1) % 20)), shape=A.shape)
    assert C.nnz == A.nnz and not np.array_equal(C.indices, A.indices)
    kernel = spfuse.compile(TWO)
    np.testing.assert_allclose(kernel(A=A, B=_same_pattern(A, rng) * 0 + A, X=X, G=G), A.toarray().T @ (X + G))
    np.testing.assert_allclose(kernel(A=A, B=C, X=X, G=G), A.toarray().T @ X + C.toarray().T @ G)


def test_coefficients_scalars_and_transposed_results(rng):
    A = _matrix(rng, 25, 15)
    B = _same_pattern(A, rng)
    X, G = rng.standard_normal((25, 4)), rng.standard_normal((25, 4))
    ops = dict(A=A, B=B, X=X, G=G, s=np.array(3.0))
    Ad, Bd = A.toarray(), B.toarray()
    program = "Y[j,k] = sum(i, s * A[i,j] * X[i,k]) - 2 * sum(i, B[i,j] * G[i,k])"
    assert _kernels(program, **ops) == ["spmm_t_sum"]
    np.testing.assert_allclose(spfuse.evaluate(program, **ops), 3 * Ad.T @ X - 2 * Bd.T @ G)
    del ops["s"]
    flipped = "Y[k,j] = sum(i, A[i,j] * X[i,k]) + sum(i, B[i,j] * G[i,k])"
    assert _kernels(flipped, **ops) == ["spmm_t_sum"]
    np.testing.assert_allclose(spfuse.evaluate(flipped, **ops), (Ad.T @ X + Bd.T @ G).T)
    three = "Y[j,k] = sum(i, A[i,j] * X[i,k]) + sum(i, B[i,j] * G[i,k]) + sum(i, A[i,j] * G[i,k])"
    assert _kernels(three, **ops) == ["spmm_t_sum"]
    np.testing.assert_allclose(spfuse.evaluate(three, **ops), Ad.T @ X + Bd.T @ G + Ad.T @ G)
    negated = "Y[j,k] = -sum(i, A[i,j] * X[i,k]) + sum(i, B[i,j] * G[i,k])"
    assert _kernels(negated, **ops) == ["spmm_t_sum"]
    np.testing.assert_allclose(spfuse.evaluate(negated, **ops), Bd.T @ G - Ad.T @ X)


def test_what_stays_apart(rng):
    A = _matrix(rng, 25, 15)
    B = _same_pattern(A, rng)
    X, G = rng.standard_normal((25, 4)), rng.standard_normal((25, 4))
    ops = dict(A=A, B=B, X=X, G=G)
    # the library approach fuses nothing
    assert "spmm_t_sum" not in _kernels(TWO, fusion="none", **ops)
    np.testing.assert_allclose(spfuse.evaluate(TWO, fusion="none", **ops), A.toarray().T @ X + B.toarray().T @ G)
    # a term read again elsewhere is a temporary the sum does not own
    program = ("T[j,k] = sum(i, A[i,j] * X[i,k]); Y[j,k] = T[j,k] + sum(i, B[i,j] * G[i,k]); "
               "Z[j,k] = T[j,k] * Y[j,k]")
    assert "spmm_t_sum" not in _kernels(program, **ops)
    got = spfuse.evaluate(program, **ops)
    T = A.toarray().T @ X
    np.testing.assert_allclose(got, T * (T + B.toarray().T @ G))
    # a term scaled by a 1-element vector, not a 0-d operand: apart
    program = "Y[j,k] = sum(i, A[i,j] * X[i,k]) * c[k] + sum(i, B[i,j] * G[i,k])"
    c = np.array([2.0, 3.0, 4.0, 5.0])
    assert "spmm_t_sum" not in _kernels(program, c=c, **ops)
    np.testing.assert_allclose(spfuse.evaluate(program, c=c, **ops), (A.toarray().T @ X) * c + B.toarray().T @ G)


def test_gnn2_gradient_runs_one_walk(rng):
    """GNN-2's gradient of Y reaches it twice through A's pattern: one summed walk."""
    from spfuse.autodiff.run import cached_adjoint
    from spfuse.frontend.parser import parse_program
    program = "Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]"
    A = _matrix(rng, 40, 40, density=0.15)
    X, Y = rng.standard_normal((40, 5)), rng.standard_normal((5, 40))
    cot = rng.standard_normal((40, 5))
    adj = cached_adjoint(parse_program(program), ("X", "Y"), ("Z",), frozenset({"A"}), "auto")
    kernels = _kernels(adj.program.text, A=A, X=X, Y=Y, grad_Z=cot)
    assert "spmm_t_sum" in kernels and "spmm_t" not in kernels
    got = spfuse.vjp(program, cot, wrt=("X", "Y"), A=A, X=X, Y=Y)
    Ad = A.toarray()
    S = Ad * (X @ Y)
    dS = cot @ Y
    dT = dS * Ad
    np.testing.assert_allclose(got["Y"], X.T @ dT + (S.T @ cot).T, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got["X"], dT @ Y.T, rtol=1e-10, atol=1e-10)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(0, 12), n=st.integers(0, 9), k=st.integers(1, 12), terms=st.integers(2, 4),
       density=st.floats(0.0, 1.0), coefs=st.lists(st.sampled_from([1.0, -1.0, 0.5, 3.0]), min_size=4, max_size=4),
       flipped=st.booleans(), gather=st.booleans(), shared=st.booleans(), f32=st.booleans(),
       seed=st.integers(0, 2**16))
def test_random_sums_of_spmm(m, n, k, terms, density, coefs, flipped, gather, shared, f32, seed):
    """Random sums of SpMMs, gathers or scatters (orientation, coefficients,
    dtypes, one pattern or several, empty shapes) against numpy."""
    rng = np.random.default_rng(seed)
    dtype = np.float32 if f32 else np.float64
    first = _matrix(rng, m, n, density=density, dtype=dtype)
    mats = [first] + [_same_pattern(first, rng) if shared else _matrix(rng, m, n, density=density, dtype=dtype)
                      for _ in range(terms - 1)]
    dense = [rng.standard_normal((n if gather else m, k)).astype(dtype) for _ in range(terms)]
    out, term = ("Y[i,k]", "sum(j, S{t}[i,j] * X{t}[j,k])") if gather else ("Y[j,k]", "sum(i, S{t}[i,j] * X{t}[i,k])")
    out = f"Y[{out[4]},{out[2]}]" if flipped else out
    program = f"{out} = " + " + ".join(f"{coefs[t]} * " + term.format(t=t) for t in range(terms))
    ops = {**{f"S{t}": a for t, a in enumerate(mats)}, **{f"X{t}": x for t, x in enumerate(dense)}}
    if shared and not gather and m > 2:   # (a reduction over 2 or fewer plans maximal fusion)
        assert _kernels(program, **ops) == ["spmm_t_sum"]
    got = spfuse.evaluate(program, **ops)
    want = sum(coefs[t] * ((mats[t].toarray() if gather else mats[t].toarray().T).astype(np.float64)
                           @ dense[t].astype(np.float64)) for t in range(terms))
    want = want.T if flipped else want
    np.testing.assert_allclose(got, want, **(dict(rtol=2e-4, atol=2e-4) if f32 else dict(rtol=1e-10, atol=1e-10)))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("index", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(30, 20), (0, 5), (6, 0), (40, 1)])
@pytest.mark.parametrize("nt", [1, 2])
def test_gather_sums_accumulate(dtype, index, shape, nt, rng):
    """``A·X + B·G`` (one pattern or two), and the CSC spelling of the
    scatter sum (SpMMs of the transposes): one SpMM per term into one
    result, the later ones accumulating."""
    A = _matrix(rng, *shape, dtype=dtype, index=index)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else {}
    for B in (_same_pattern(A, rng), _matrix(rng, *shape, density=0.3, dtype=dtype, index=index)):
        X, G = (rng.standard_normal((shape[1], 5)).astype(dtype) for _ in range(2))
        before = [x.copy() for x in (A.data, A.indices, A.indptr, B.data, B.indices, X, G)]
        assert _kernels(GATHER, A=A, B=B, X=X, G=G) == ["spmm_sum"]
        got = spfuse.evaluate(GATHER, A=A, B=B, X=X, G=G, num_threads=nt)
        np.testing.assert_allclose(got, A.toarray().astype(np.float64) @ X + B.toarray().astype(np.float64) @ G,
                                   **tol)
        assert got.dtype == dtype
        for a, b in zip(before, (A.data, A.indices, A.indptr, B.data, B.indices, X, G), strict=True):
            np.testing.assert_array_equal(a, b)   # inputs untouched
    Ac = A.tocsc()
    Bc = sp.csc_array((rng.standard_normal(Ac.nnz).astype(dtype), Ac.indices, Ac.indptr), shape=Ac.shape)
    X, G = (rng.standard_normal((shape[0], 5)).astype(dtype) for _ in range(2))
    want = Ac.toarray().T.astype(np.float64) @ X + Bc.toarray().T.astype(np.float64) @ G
    np.testing.assert_allclose(spfuse.evaluate(TWO, A=Ac, B=Bc, X=X, G=G, num_threads=nt), want, **tol)


def test_gather_sum_bit_identical_across_threads_and_to_the_add(rng):
    """The accumulated sum is the add of the separate products, bit for bit
    (each row's sum rounded to the value type, then added), on any team."""
    A, B = _matrix(rng, 300, 200, density=0.05), _matrix(rng, 300, 200, density=0.08)
    X, G = rng.standard_normal((200, 16)), rng.standard_normal((200, 16))
    one = spfuse.evaluate(GATHER, A=A, B=B, X=X, G=G, num_threads=1)
    two = spfuse.evaluate(GATHER, A=A, B=B, X=X, G=G, num_threads=2)
    apart = spfuse.evaluate(GATHER, A=A, B=B, X=X, G=G, fusion="none")
    np.testing.assert_array_equal(one, two)
    np.testing.assert_array_equal(one, apart)


def test_gather_sum_bad_index_is_found(rng):
    """A wrong index in the second term's operand is found by its kernel:
    the call takes the validating path, which words the error."""
    A, B = _matrix(rng, 30, 20), _matrix(rng, 30, 20)
    B.indices[-1] = 25
    X, G = rng.standard_normal((20, 4)), rng.standard_normal((20, 4))
    with pytest.raises(ValueError, match="B"):
        spfuse.evaluate(GATHER, A=A, B=B, X=X, G=G)
