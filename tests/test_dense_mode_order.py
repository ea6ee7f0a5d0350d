"""Dense operands stored in another mode order: a Fortran-ordered array (the
``.T`` of a C array) is dense levels in the reversed mode order over the
caller's buffer, never copied on the way in; every program gives numpy's
answer whichever order its dense operands come in."""
import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spfuse
from spfuse.tensor import as_tensor


def test_fortran_array_is_wrapped_without_a_copy():
    X = np.arange(12.0).reshape(3, 4)
    t = as_tensor(X.T)
    assert t.shape == (4, 3) and t.format.mode_order == (1, 0)
    assert np.shares_memory(t.values, X)
    np.testing.assert_array_equal(t.todense(), X.T)
    t3 = as_tensor(np.asfortranarray(np.arange(24.0).reshape(2, 3, 4)))
    assert t3.format.mode_order == (2, 1, 0)
    np.testing.assert_array_equal(t3.todense(), np.arange(24.0).reshape(2, 3, 4))


def test_a_strided_view_is_copied_into_c_order():
    X = np.arange(20.0).reshape(4, 5)[:, ::2]     # neither C nor Fortran contiguous
    t = as_tensor(X)
    assert t.format.mode_order == (0, 1)
    np.testing.assert_array_equal(t.todense(), X)


#: program, sparse operand, dense operands (name -> shape from n, m, K), oracle
PROGRAMS = {
    "sddmm": ("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", {"C": ("n", "K"), "D": ("K", "m")},
              lambda B, d: B * (d["C"] @ d["D"])),
    "spmm": ("Y[i,k] = B[i,j] * X[j,k]", {"X": ("m", "K")}, lambda B, d: B @ d["X"]),
    "gnn2": ("Y[i,h] = B[i,j] * (X[i,k] * Z[j,k]) * Z[j,h]", {"X": ("n", "K"), "Z": ("m", "K")},
             lambda B, d: (B * (d["X"] @ d["Z"].T)) @ d["Z"]),
    "relu-spmm-bias": ("Y[i,k] = relu(B[i,j] * X[j,k] + c[k])", {"X": ("m", "K"), "c": ("K",)},
                       lambda B, d: np.maximum(B @ d["X"] + d["c"], 0)),
    "gemm-after-spmm": ("Y[i,h] = B[i,j] * X[j,k] * W[k,h]", {"X": ("m", "K"), "W": ("K", "K")},
                        lambda B, d: B @ d["X"] @ d["W"]),
    "scaled-rows": ("Y[i,j] = B[i,j] * E[i,j]", {"E": ("n", "m")}, lambda B, d: B * d["E"]),
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(PROGRAMS)), n=st.sampled_from([1, 6, 50]), m=st.sampled_from([1, 7, 40]),
       K=st.sampled_from([1, 3, 16]), fortran=st.lists(st.booleans(), min_size=3, max_size=3),
       fmt=st.sampled_from(["csr", "csc"]), seed=st.integers(0, 2**16))
def test_dense_operands_in_any_mode_order_match_numpy(name, n, m, K, fortran, fmt, seed):
    program, shapes, oracle = PROGRAMS[name]
    rng = np.random.default_rng(seed)
    B = sp.random_array((n, m), density=0.3, format=fmt, rng=rng)
    dims = {"n": n, "m": m, "K": K}
    dense = {d: rng.standard_normal(tuple(dims[s] for s in shp)) for d, shp in shapes.items()}
    given_ = {d: (np.asfortranarray(a) if f and a.ndim == 2 else a)
              for (d, a), f in zip(dense.items(), fortran, strict=False)}
    got = spfuse.evaluate(program, B=B, **given_)
    got = got.toarray() if hasattr(got, "toarray") else np.asarray(got)
    np.testing.assert_allclose(got, oracle(B.toarray(), dense), rtol=1e-11, atol=1e-11)
    for d, a in given_.items():   # inputs untouched
        np.testing.assert_array_equal(a, dense[d])


@pytest.mark.parametrize("view", [False, True])
def test_sddmm_reads_a_transposed_view_like_the_contiguous_factor(view):
    rng = np.random.default_rng(2)
    B = sp.random_array((300, 200), density=0.05, format="csr", rng=rng)
    C, Dt = rng.standard_normal((300, 8)), rng.standard_normal((200, 8))
    D = Dt.T if view else np.ascontiguousarray(Dt.T)
    k = spfuse.compile("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", B=B, C=C, D=D)
    assert "template kernel 'sddmm'" in k.explain()
    np.testing.assert_allclose(k(B=B, C=C, D=D).toarray(), B.toarray() * (C @ Dt.T), rtol=1e-12)
