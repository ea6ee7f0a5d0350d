"""A sparse-attention layer: queries, keys and values from node features,
softmax over the stored entries of a sparse 0/1 attention pattern, as
``torch.sparse.softmax`` defines it.  The whole layer is one spfuse program::

    Q[i,h] = X[i,f] * Wq[f,h]
    K[j,h] = X[j,f] * Wk[f,h]
    V[j,e] = X[j,f] * Wv[f,e]
    S[i,j] = A[i,j] * Q[i,h] * K[j,h] * s          # SDDMM on the pattern
    m[i] = max(j in A[i,j], S[i,j])                 # max over stored entries
    E[i,j] = A[i,j] * exp(S[i,j] - m[i])
    Y[i,e] = E[i,j] * V[j,e] / sum(j, E[i,j])       # SpMM, normalised

trained to regress a random teacher layer's output (mean squared error).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["PROGRAM", "pattern", "model", "main"]

PROGRAM = """Q[i,h] = X[i,f] * Wq[f,h]
K[j,h] = X[j,f] * Wk[f,h]
V[j,e] = X[j,f] * Wv[f,e]
S[i,j] = A[i,j] * Q[i,h] * K[j,h] * s
m[i] = max(j in A[i,j], S[i,j])
E[i,j] = A[i,j] * exp(S[i,j] - m[i])
Y[i,e] = E[i,j] * V[j,e] / sum(j, E[i,j])"""


def pattern(n: int, per_row: int, seed: int = 0) -> sp.csr_array:
    """A seeded 0/1 attention pattern: a local window plus random long-range
    entries, the diagonal always stored (no empty row).

    >>> A = pattern(10, 3); A.shape, set(A.data.tolist()), bool((A.diagonal() == 1).all())
    ((10, 10), {1.0}, True)
    """
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(n), per_row)
    cols = np.concatenate([rng.integers(0, n, rows.size), np.arange(n), (np.arange(n) + 1) % n])
    rows = np.concatenate([rows, np.arange(n), np.arange(n)])
    A = sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(n, n))
    A.sum_duplicates()
    A.data[:] = 1.0
    A.sort_indices()
    return A


def model(A: sp.csr_array, features: int = 16, head: int = 8, seed: int = 0):
    """The loss of each backend and the seeded initial parameters.

    >>> backends, params = model(pattern(20, 3)); sorted(params)
    ['Wk', 'Wq', 'Wv']
    """
    import torch

    import spfuse.torch

    n = A.shape[0]
    g = torch.Generator().manual_seed(seed)

    def w(a, b):
        return torch.randn(a, b, generator=g, dtype=torch.float64) / np.sqrt(a)

    X = torch.randn(n, features, generator=g, dtype=torch.float64)
    teacher = {"Wq": w(features, head), "Wk": w(features, head), "Wv": w(features, head)}
    params = {"Wq": w(features, head), "Wk": w(features, head), "Wv": w(features, head)}
    scale = 1.0 / np.sqrt(head)
    s = torch.tensor(scale, dtype=torch.float64)
    crow, col = torch.from_numpy(A.indptr.astype(np.int64)), torch.from_numpy(A.indices.astype(np.int64))
    At = torch.sparse_csr_tensor(crow, col, torch.from_numpy(A.data), size=A.shape)
    rows = torch.from_numpy(np.repeat(np.arange(n), np.diff(A.indptr)))
    idx = torch.stack([rows, col])
    mask = torch.from_numpy(A.toarray() != 0)
    layer = spfuse.torch.function(PROGRAM)

    def via_torch_sparse(p):
        Q, K, V = X @ p["Wq"], X @ p["Wk"], X @ p["Wv"]
        scores = (Q[rows] * K[col]).sum(1) * scale
        P = torch.sparse.softmax(torch.sparse_coo_tensor(idx, scores, (n, n)), dim=1)
        return torch.sparse.mm(P, V)

    def via_dense(p):
        Q, K, V = X @ p["Wq"], X @ p["Wk"], X @ p["Wv"]
        S = (Q @ K.T * scale).masked_fill(~mask, float("-inf"))
        return torch.softmax(S, dim=1) @ V

    with torch.no_grad():
        target = via_torch_sparse(teacher)

    def loss(out):
        return ((out - target) ** 2).mean()

    return {"spfuse": lambda p: loss(layer(X, p["Wq"], p["Wk"], p["Wv"], A=At, s=s)),
            "torch.sparse": lambda p: loss(via_torch_sparse(p)),
            "dense": lambda p: loss(via_dense(p))}, params


def main(epochs: int = 100) -> dict:
    """Train through every backend; print and return the comparison."""
    from spfuse.examples.training import compare, report
    A = pattern(1000, 16)
    backends, params = model(A)
    results = compare(backends, params, epochs, lr=0.01)
    print(report(f"sparse attention, {A.shape[0]} nodes nnz(A)={A.nnz}, {epochs} epochs", results))
    return results


if __name__ == "__main__":
    main()
