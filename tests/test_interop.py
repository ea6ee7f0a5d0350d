"""scipy N-d coo_array and pydata sparse COO/GCXS in and out; the numpy protocols of Tensor."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import spfuse
from spfuse.interop import from_pydata, to_pydata, to_scipy_coo
from spfuse.tensor import Tensor, as_tensor

sparse = pytest.importorskip("sparse")


def _random(rng, shape, density=0.4):
    x = rng.standard_normal(shape)
    x[rng.random(shape) > density] = 0
    return x


# ------------------------------------------------------------- scipy N-d --
def test_scipy_nd_coo_in_and_out(rng):
    x = _random(rng, (3, 4, 5))
    c = sp.coo_array(x)
    t = as_tensor(c)
    assert t.format.name == "csf" and t.origin == "sparray"
    np.testing.assert_array_equal(t.todense(), x)
    r = spfuse.einsum("ijk->kji", c)
    assert isinstance(r, sp.coo_array) and r.shape == (5, 4, 3)
    np.testing.assert_allclose(r.toarray(), x.transpose(2, 1, 0))
    r = spfuse.einsum("ijk,jl->ilk", c, rng.standard_normal((4, 2)))  # dense factor: result stays N-d sparse-world
    assert r.shape == (3, 2, 5)
    r2 = spfuse.evaluate("Y[i,j] = X[i,j,k] * c[k]", X=c, c=np.ones(5))
    assert isinstance(r2, sp.csr_array)
    np.testing.assert_allclose(r2.toarray(), x.sum(2))


def test_scipy_nd_coo_values_shared_when_sorted(rng):
    c = sp.coo_array(_random(rng, (3, 4, 5)))  # built from a dense array: sorted, no duplicates
    assert np.shares_memory(as_tensor(c).values, c.data)


def test_scipy_nd_coo_unsorted_with_duplicates(rng):
    coords = (np.array([2, 0, 2, 1]), np.array([1, 0, 1, 3]), np.array([0, 4, 0, 2]))
    c = sp.coo_array((np.array([1.0, 2.0, 3.0, 4.0]), coords), shape=(3, 4, 5))
    data0 = c.data.copy()
    r = spfuse.einsum("ijk->ijk", c)
    np.testing.assert_allclose(r.toarray(), c.toarray())  # duplicates summed
    np.testing.assert_array_equal(c.data, data0)          # input untouched


def test_to_scipy_coo_roundtrip(rng):
    x = _random(rng, (2, 3, 4, 2))
    t = Tensor.from_numpy(x, "csf")
    np.testing.assert_array_equal(to_scipy_coo(t).toarray(), x)
    np.testing.assert_array_equal(to_scipy_coo(Tensor.from_numpy(x)).toarray(), x)  # dense format too


# ---------------------------------------------------------------- pydata --
@pytest.mark.parametrize("kind", ["COO", "GCXS"])
def test_pydata_in_same_type_out(kind, rng):
    cls = getattr(sparse, kind)
    a, b = _random(rng, (4, 5)), _random(rng, (5, 3))
    A, B = cls.from_numpy(a), cls.from_numpy(b)
    r = spfuse.einsum("ij,jk->ik", A, B)
    assert type(r) is cls
    np.testing.assert_allclose(r.todense(), a @ b)
    y = spfuse.einsum("ij,j->i", A, np.ones(5))  # 1-d result: dense, like numpy
    np.testing.assert_allclose(y, a.sum(1))
    x = _random(rng, (3, 4, 5))
    X = cls.from_numpy(x)
    r = spfuse.einsum("ijk,k->ij", X, np.arange(5.0))
    np.testing.assert_allclose(r.todense(), x @ np.arange(5.0))
    r = spfuse.einsum("ijk->kij", X)
    assert type(r) is cls
    np.testing.assert_allclose(r.todense(), x.transpose(2, 0, 1))


def test_pydata_zero_copy_in(rng):
    a = _random(rng, (4, 5))
    g = sparse.GCXS.from_numpy(a)  # compressed_axes=(0,): CSR
    t = from_pydata(g)
    assert t.format.name == "csr"
    for mine, theirs in ((t.values, g.data), (t.levels[1].crd, g.indices), (t.levels[1].pos, g.indptr)):
        assert np.shares_memory(mine, theirs)
    gc = sparse.GCXS.from_numpy(a, compressed_axes=(1,))
    tc = from_pydata(gc)
    assert tc.format.name == "csc" and np.shares_memory(tc.values, gc.data)
    np.testing.assert_array_equal(tc.todense(), a)
    c = sparse.COO.from_numpy(_random(rng, (3, 4, 5)))
    assert np.shares_memory(from_pydata(c).values, c.data)


def test_pydata_zero_copy_out(rng):
    t = Tensor.from_numpy(_random(rng, (4, 5)), "csr")
    g = to_pydata(t, "GCXS")
    assert np.shares_memory(g.data, t.values) and np.shares_memory(g.indices, t.levels[1].crd)
    np.testing.assert_array_equal(g.todense(), t.todense())


def test_pydata_results_are_the_callers(rng):
    """A result that shares an input's arrays is copied; a kernel's fresh arrays are handed over writable."""
    a = _random(rng, (4, 5))
    g = sparse.GCXS.from_numpy(a)
    r = spfuse.evaluate("C[i,j] = A[i,j] * (U[i,k] * V[k,j])", A=g, U=np.ones((4, 2)), V=np.ones((2, 5)))
    assert type(r) is sparse.GCXS
    for attr in ("data", "indices", "indptr"):
        assert getattr(r, attr).flags.writeable
        assert not np.shares_memory(getattr(r, attr), getattr(g, attr))
    np.testing.assert_allclose(r.todense(), 2 * a)


def test_pydata_nonzero_fill_value_refused():
    x = sparse.COO.from_numpy(np.ones((2, 2)), fill_value=1.0)
    with pytest.raises(ValueError, match="fill_value"):
        spfuse.einsum("ij->", x)


def test_mixed_scipy_and_pydata_prefers_scipy(rng):
    a = _random(rng, (3, 3))
    r = spfuse.einsum("ij,jk->ik", sp.csr_array(a), sparse.COO.from_numpy(a))
    assert isinstance(r, sp.csr_array)
    np.testing.assert_allclose(r.toarray(), a @ a)


# ------------------------------------------------------- numpy protocols --
def test_numpy_einsum_on_a_tensor_runs_spfuse(rng):
    a = _random(rng, (4, 5))
    t = Tensor.from_numpy(a, "csr")
    np.testing.assert_allclose(np.einsum("ij,j->i", t, np.ones(5)), a.sum(1))
    assert np.shape(t) == (4, 5) and np.ndim(t) == 2 and np.size(t) == 20
    assert np.transpose(t).shape == (5, 4)


@pytest.mark.parametrize("call", [lambda t: np.sum(t), lambda t: np.dot(t, t), lambda t: np.concatenate([t, t]),
                                  lambda t: np.add(t, 1.0), lambda t: np.ones((2, 2)) + t, lambda t: np.exp(t)])
def test_other_numpy_calls_raise_a_clear_type_error(call):
    t = Tensor.from_numpy(np.eye(2), "csr")
    with pytest.raises(TypeError, match="spfuse.Tensor") as e:
        call(t)
    assert "Hint" in str(e.value) and "todense()" in str(e.value)


def test_asarray_still_densifies_explicitly():
    t = Tensor.from_numpy(np.eye(2), "csr")
    np.testing.assert_array_equal(np.asarray(t), np.eye(2))


def test_forced_out_format_keeps_its_rules(rng):
    """out_format wins over the operands' world: 'coo' on a 1-d result is an error, as before."""
    A = sp.csr_array(_random(rng, (3, 4)))
    with pytest.raises(ValueError, match="needs a 2-D result"):
        spfuse.evaluate("y[i] = A[i,j]", A=A, out_format="coo")
    X = sp.coo_array(_random(rng, (2, 3, 4)))
    assert isinstance(spfuse.evaluate("Y[i,j,k] = X[i,j,k] * 2", X=X, out_format="csf"), Tensor)
