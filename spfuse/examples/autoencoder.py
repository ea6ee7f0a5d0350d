"""A sparse autoencoder: a sparse input times a dense encoder, decoded and
scored on the input's stored entries only (a recommender-style loss).

The whole model, loss included, is one spfuse program::

    H[i,h] = sigmoid(X[i,j] * We[j,h] + b[h])
    D[i,j] = P[i,j] * (sum(h, H[i,h] * Wd[h,j]) - X[i,j])
    L = sum(i, j, D[i,j] * D[i,j]) * s

``P`` is ``X``'s pattern (ones), ``s = 1 / nnz(X)``; the decoder is an SDDMM
on the pattern, never a dense ``n x m`` product.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["PROGRAM", "ratings", "model", "main"]

PROGRAM = """H[i,h] = sigmoid(X[i,j] * We[j,h] + b[h])
D[i,j] = P[i,j] * (sum(h, H[i,h] * Wd[h,j]) - X[i,j])
L = sum(i, j, D[i,j] * D[i,j]) * s"""


def ratings(users: int, items: int, per_user: int, seed: int = 0) -> sp.csr_array:
    """A seeded sparse ratings matrix (values in [1, 5], ``per_user`` per row on average).

    >>> X = ratings(50, 40, 4); X.shape, bool(X.data.min() >= 1.0)
    ((50, 40), True)
    """
    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(users), rng.poisson(per_user, users))
    cols = rng.integers(0, items, rows.size)
    taste = rng.standard_normal((users, 3)) @ rng.standard_normal((3, items))
    X = sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(users, items))
    X.sum_duplicates()
    X.sort_indices()
    r, c = np.repeat(np.arange(users), np.diff(X.indptr)), X.indices
    X.data = np.clip(np.rint(3 + taste[r, c]), 1, 5).astype(np.float64)
    return X


def model(X: sp.csr_array, hidden: int = 16, seed: int = 0):
    """The loss of each backend and the seeded initial parameters.

    >>> backends, params = model(ratings(30, 20, 3)); sorted(params)
    ['Wd', 'We', 'b']
    """
    import torch

    import spfuse.torch

    n, m = X.shape
    g = torch.Generator().manual_seed(seed)
    params = {"We": torch.randn(m, hidden, generator=g, dtype=torch.float64) * 0.1,
              "b": torch.zeros(hidden, dtype=torch.float64),
              "Wd": torch.randn(hidden, m, generator=g, dtype=torch.float64) * 0.1}
    scale = 1.0 / max(X.nnz, 1)
    crow, col = torch.from_numpy(X.indptr.astype(np.int64)), torch.from_numpy(X.indices.astype(np.int64))
    Xt = torch.sparse_csr_tensor(crow, col, torch.from_numpy(X.data), size=X.shape)
    Pt = torch.sparse_csr_tensor(crow, col, torch.ones(X.nnz, dtype=torch.float64), size=X.shape)
    s = torch.tensor(scale, dtype=torch.float64)
    rows = torch.from_numpy(np.repeat(np.arange(n), np.diff(X.indptr)))
    vals = torch.from_numpy(X.data)
    X_coo = Xt.to_sparse_coo()
    densified: list = []   # (made on first use: n*m entries each)
    net = spfuse.torch.function(PROGRAM)

    def via_spfuse(p):
        return net(Xt, p["We"], p["b"], P=Pt, Wd=p["Wd"], s=s)

    def via_torch_sparse(p):
        H = torch.sigmoid(torch.sparse.mm(X_coo, p["We"]) + p["b"])
        pred = (H[rows] * p["Wd"].T[col]).sum(1)
        return ((pred - vals) ** 2).sum() * scale

    def via_dense(p):
        if not densified:
            densified.extend((Xt.to_dense(), Pt.to_dense()))
        X_dense, P_dense = densified
        H = torch.sigmoid(X_dense @ p["We"] + p["b"])
        return ((P_dense * (H @ p["Wd"] - X_dense)) ** 2).sum() * scale

    return {"spfuse": via_spfuse, "torch.sparse": via_torch_sparse, "dense": via_dense}, params


def main(epochs: int = 100) -> dict:
    """Train through every backend; print and return the comparison."""
    from spfuse.examples.training import compare, report
    X = ratings(600, 400, 20)
    backends, params = model(X)
    results = compare(backends, params, epochs, lr=0.01)
    print(report(f"sparse autoencoder, ratings {X.shape[0]}x{X.shape[1]} nnz={X.nnz}, {epochs} epochs", results))
    return results


if __name__ == "__main__":
    main()
