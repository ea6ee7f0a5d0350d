"""spfuse.torch: programs as torch.autograd.Functions (gradcheck in float64,
dense / sparse CSR / sparse COO inputs, sparse results)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spfuse  # noqa: E402
import spfuse.torch as sft  # noqa: E402

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


def dense(shape, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g).requires_grad_(requires_grad)


def sparse_pattern(shape, density=0.4, seed=0, empty_rows=(1,)):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(*shape, generator=g) < density
    for r in empty_rows:
        if r < shape[0]:
            mask[r] = False
    return torch.randn(*shape, dtype=torch.float64, generator=g) * mask


def gradcheck(fn, inputs, **kw):
    sparse = any(t.layout != torch.strided for t in inputs)
    return torch.autograd.gradcheck(fn, inputs, masked=sparse or None, check_undefined_grad=not sparse,
                                    **kw)


def test_dense_gradcheck_gnn_layer():
    f = sft.function("Z[i,j] = relu(A[i,k] * X[k,h] * W[h,j])")
    A, X, W = dense((5, 5), 1), dense((5, 4), 2), dense((4, 3), 3)
    assert gradcheck(f, (A, X, W))


@pytest.mark.parametrize("layout", ["csr", "coo"])
def test_sparse_input_gradcheck_spmm(layout):
    f = sft.function("Y[i,k] = A[i,j] * X[j,k]")
    d = sparse_pattern((6, 5), seed=4)
    A = (d.to_sparse_csr() if layout == "csr" else d.to_sparse_coo()).requires_grad_()
    X = dense((5, 3), 5)
    assert gradcheck(f, (A, X))
    Y = f(A, X)
    Y.sum().backward()
    assert A.grad.layout == A.layout
    ref = d.clone().requires_grad_()
    (ref @ X.detach()).sum().backward()
    np.testing.assert_allclose(A.grad.to_dense().numpy(), (ref.grad * (d != 0)).numpy())


def test_sddmm_returns_sparse_csr_and_differentiates():
    f = sft.function("A[i,j] = B[i,j] * (C[i,k] * D[k,j])")
    B = sparse_pattern((6, 7), seed=6).to_sparse_csr()
    C, D = dense((6, 3), 7), dense((3, 7), 8)
    out = f(B, C, D)
    assert out.layout == torch.sparse_csr
    np.testing.assert_allclose(out.detach().to_dense().numpy(),
                               (B.to_dense() * (C @ D)).detach().numpy(), rtol=1e-12)
    # a loss on the stored values, as a model would write it
    (out.values() ** 2).sum().backward()
    C2, D2 = C.detach().clone().requires_grad_(), D.detach().clone().requires_grad_()
    ((B.to_dense() * (C2 @ D2)) ** 2).sum().backward()
    np.testing.assert_allclose(C.grad.numpy(), C2.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(D.grad.numpy(), D2.grad.numpy(), rtol=1e-10)
    assert gradcheck(lambda c, d: f(B, c, d).values(), (C, D))


def test_sparse_values_gradcheck_through_sddmm():
    f = sft.function("A[i,j] = B[i,j] / (abs(C[i,k] * D[k,j]) + 1)")
    B = sparse_pattern((5, 4), seed=9).to_sparse_csr().requires_grad_()
    C, D = dense((5, 2), 10), dense((2, 4), 11)
    assert gradcheck(lambda b, c, d: f(b, c, d).to_dense(), (B, C, D))


def test_unsorted_csr_input_keeps_its_own_index_order():
    crow = torch.tensor([0, 2, 3])
    col = torch.tensor([2, 0, 1])  # row 0 unsorted
    vals = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    A = torch.sparse_csr_tensor(crow, col, vals, size=(2, 3)).requires_grad_()
    x = torch.tensor([10.0, 20.0, 30.0], dtype=torch.float64)
    y = sft.function("y[i] = A[i,j] * x[j]")(A, x)
    np.testing.assert_allclose(y.detach().numpy(), [1 * 30 + 2 * 10, 3 * 20])
    y.backward(torch.tensor([1.0, 2.0], dtype=torch.float64))
    np.testing.assert_array_equal(A.grad.col_indices().numpy(), [2, 0, 1])
    np.testing.assert_allclose(A.grad.values().numpy(), [30.0, 10.0, 2 * 20.0])


def test_a_csr_input_changed_in_place_between_calls_is_read_again():
    """The converted CSR operand is remembered per tensor and version: a
    value or an index changed in place is seen by the next call, and an
    index made out of range is an error, not a read past the operand."""
    f = sft.function("y[i] = A[i,j] * x[j]")
    A = sparse_pattern((4, 5), seed=12).to_sparse_csr()
    x = torch.arange(1.0, 6.0, dtype=torch.float64)
    np.testing.assert_allclose(f(A, x).numpy(), (A.to_dense() @ x).numpy())
    A.values().mul_(3.0)
    np.testing.assert_allclose(f(A, x).numpy(), (A.to_dense() @ x).numpy())
    A.col_indices()[0] = 4 - int(A.col_indices()[0])   # (another column, still in range)
    np.testing.assert_allclose(f(A, x).numpy(), (A.to_dense() @ x).numpy())
    sddmm = sft.function("S[i,j] = A[i,j] * (C[i,k] * D[k,j])")   # (a kernel that trusts its indices)
    C, D = dense((4, 3), 13, False), dense((3, 5), 14, False)
    assert sddmm(A, C, D).layout == torch.sparse_csr
    A.col_indices()[0] = 99
    for g, args in ((f, (A, x)), (sddmm, (A, C, D))):
        with pytest.raises(ValueError, match="A"):
            g(*args)


def test_the_remembered_transpose_follows_the_csr_input_changed_in_place():
    """A backward pass reads ``Aᵀ``, made once per version of ``A``: the
    gradient after ``A`` changed in place (values, then an index) is the
    new ``A``'s, against torch's dense autograd."""
    f = sft.function("Y[i,k] = A[i,j] * X[j,k]")
    A = sparse_pattern((4, 5), seed=15).to_sparse_csr()
    X = dense((5, 3), 16, True)
    for change in (None, lambda: A.values().mul_(-2.0), lambda: A.col_indices().__setitem__(0, 4)):
        if change is not None:
            change()
        X.grad = None
        (f(A, X) * torch.arange(12.0, dtype=torch.float64).reshape(4, 3)).sum().backward()
        Xd = X.detach().clone().requires_grad_(True)
        (A.to_dense() @ Xd * torch.arange(12.0, dtype=torch.float64).reshape(4, 3)).sum().backward()
        np.testing.assert_allclose(X.grad.numpy(), Xd.grad.numpy(), rtol=1e-12, atol=1e-12)
        assert sft._transposed(A) is sft._transposed(A)   # (once per version)


def test_remembered_csr_conversions_are_bounded_and_leave_with_their_tensors():
    import gc
    sft._converted.clear()
    tensors = [sparse_pattern((3, 3), seed=s).to_sparse_csr() for s in range(sft.MAX_CONVERTED + 8)]
    for t in tensors:
        assert sft._csr_tensor(t) is not None
    assert len(sft._converted) == sft.MAX_CONVERTED
    del t, tensors
    gc.collect()
    assert not sft._converted


@pytest.mark.parametrize("temporaries", ["auto", "keep", "recompute"])
def test_two_layer_program_with_temporaries(temporaries):
    text = "H[i,h] = relu(A[i,j] * X[j,f] * W1[f,h]); Z[i,c] = A[i,j] * H[j,h] * W2[h,c]"
    f = sft.function(text, temporaries=temporaries)
    A = sparse_pattern((6, 6), seed=12).to_sparse_csr()
    X, W1, W2 = dense((6, 4), 13), dense((4, 3), 14), dense((3, 2), 15)
    assert gradcheck(f, (A, X, W1, W2))


def test_several_results_and_scalar_result():
    f = sft.function("y[i] = x[i] * x[i]; s = sum(i, exp(x[i]) * w[i])")
    x, w = dense((4,), 16), dense((4,), 17)
    y, s = f(x, w)
    assert s.shape == () and y.shape == (4,)
    assert gradcheck(f, (x, w))


def test_max_reduction_gradcheck_away_from_ties():
    f = sft.function("m[i] = max(j, X[i,j] * v[j])")
    assert gradcheck(f, (dense((4, 5), 18), dense((5,), 19)))


def test_coo_nd_input():
    X = torch.sparse_coo_tensor(torch.tensor([[0, 1, 1], [0, 2, 0], [1, 0, 1]]),
                                torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), (2, 3, 2))
    X = X.coalesce().requires_grad_()
    c = dense((2,), 20)
    f = sft.function("A[i,j] = X[i,j,k] * c[k]")
    assert f(X, c).layout == torch.sparse_csr  # a sparse matrix result comes back as CSR
    assert gradcheck(lambda x, c: f(x, c).to_dense(), (X, c))


def test_zero_copy_inputs():
    X = torch.randn(3, 2, dtype=torch.float64)
    assert np.shares_memory(sft.to_spfuse(X), X.numpy())
    A = sparse_pattern((4, 4), seed=21).to_sparse_csr()
    m = sft.to_spfuse(A)
    assert np.shares_memory(m.data, A.values().numpy())
    assert np.shares_memory(m.indices, A.col_indices().numpy())


def test_formats_are_applied_and_checked():
    f = sft.function("y[i] = A[i,j] * x[j]", A="csr")
    A = dense((3, 3), 22)
    x = dense((3,), 23, requires_grad=False)
    np.testing.assert_allclose(f(A, x).detach().numpy(), (A @ x).detach().numpy())
    with pytest.raises(ValueError, match="not read by the program"):
        sft.function("y[i] = A[i,j] * x[j]", B="csr")
    with pytest.raises(TypeError, match="missing operand"):
        f(A)
    with pytest.raises(TypeError, match="unexpected operand"):
        f(A, x, q=x)


def test_no_grad_needed_runs_forward_only():
    f = sft.function("y[i] = A[i,j] * x[j]")
    A, x = dense((3, 3), 24, False), dense((3,), 25, False)
    y = f(A, x)
    assert not y.requires_grad
    np.testing.assert_allclose(y.numpy(), spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A.numpy(), x=x.numpy()))
