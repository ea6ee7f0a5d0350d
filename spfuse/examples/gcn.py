"""A 2-layer graph convolutional network (Kipf & Welling) on Zachary's karate club.

Both layers are one spfuse program over the normalised adjacency
``Â = D^-1/2 (A + I) D^-1/2`` (CSR)::

    H[i,h] = relu(A[i,j] * X[j,f] * W1[f,h])
    Z[i,c] = A[i,j] * H[j,h] * W2[h,c]

trained semi-supervised (one labelled node per faction) with cross-entropy.
``python -m spfuse.examples.gcn`` trains it through spfuse, torch.sparse and
dense torch from the same seed and prints the loss curves' agreement.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["PROGRAM", "graph", "karate", "planetoid", "model", "main"]

PROGRAM = "H[i,h] = relu(A[i,j] * X[j,f] * W1[f,h]); Z[i,c] = A[i,j] * H[j,h] * W2[h,c]"

#: Zachary's factions (the networkx ``club`` attribute): members who followed Mr. Hi.
MR_HI = (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 16, 17, 19, 21)


def normalised(adjacency: sp.sparray) -> sp.csr_array:
    """``D^-1/2 (A + I) D^-1/2`` as canonical CSR.

    >>> normalised(sp.csr_array(np.array([[0.0, 1.0], [1.0, 0.0]]))).toarray()
    array([[0.5, 0.5],
           [0.5, 0.5]])
    """
    a = sp.csr_array(adjacency, dtype=np.float64)
    a = ((a + a.T) > 0).astype(np.float64) + sp.eye_array(a.shape[0], format="csr")
    d = 1.0 / np.sqrt(np.asarray(a.sum(axis=1)).ravel())
    out = sp.csr_array(sp.diags_array(d) @ a @ sp.diags_array(d))
    out.sort_indices()
    return out


def karate() -> tuple[sp.csr_array, np.ndarray]:
    """The shipped karate club graph (normalised) and the faction labels.

    >>> A, y = karate(); A.shape, int(y.sum())
    ((34, 34), 17)
    """
    import spfuse
    a = spfuse.io.load_builtin("karate").to_scipy("sparray")
    y = np.ones(a.shape[0], dtype=np.int64)
    y[list(MR_HI)] = 0
    return normalised(a), y


def planetoid(name: str, data_dir) -> tuple[sp.csr_array, sp.csr_array, np.ndarray] | None:
    """A Planetoid citation graph (``cora``, ``citeseer``) from a data directory:
    the normalised adjacency, the sparse bag-of-words features (CSR) and
    seeded labels, or None when ``<data_dir>/graphs/<name>_adj.mtx`` or
    ``_features.mtx`` is absent.

    The directory holds no labels, so the labels are drawn uniformly from
    Planetoid's class count (cora 7, citeseer 6), seeded: the graph, the
    features and so the work per epoch are the real ones; the accuracy is
    not meant to be.

    >>> planetoid("cora", "/nonexistent") is None
    True
    """
    from pathlib import Path

    import spfuse
    graphs = Path(data_dir) / "graphs"
    adj, feats = graphs / f"{name}_adj.mtx", graphs / f"{name}_features.mtx"
    if not (adj.is_file() and feats.is_file()):
        return None
    a = spfuse.io.read(adj).to_scipy("sparray")
    x = sp.csr_array(spfuse.io.read(feats).to_scipy("sparray"), dtype=np.float64)
    x.sort_indices()
    classes = {"cora": 7, "citeseer": 6}.get(name, 8)
    return normalised(a), x, np.random.default_rng(0).integers(0, classes, a.shape[0])


def graph(n: int, degree: int, classes: int, seed: int = 0) -> tuple[sp.csr_array, np.ndarray]:
    """A seeded random graph with planted communities (for timing at scale)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    rows = np.repeat(np.arange(n), degree)
    same = rng.random(rows.size) < 0.8
    cols = np.where(same, rng.integers(0, n, rows.size), rng.integers(0, n, rows.size))
    by_class = [np.flatnonzero(y == c) for c in range(classes)]
    pick = [by_class[c][rng.integers(0, len(by_class[c]))] if len(by_class[c]) else 0 for c in y[rows]]
    cols = np.where(same, np.asarray(pick), cols)
    a = sp.csr_array((np.ones(rows.size), (rows, cols)), shape=(n, n))
    return normalised(a), y


def model(A: sp.csr_array, y: np.ndarray, features: int | sp.sparray | None = None, hidden: int = 16,
          seed: int = 0, labelled: np.ndarray | None = None):
    """The loss of each backend, and the initial parameters (Glorot-uniform, seeded).

    ``features``: None for one-hot node features (the identity), a count
    for seeded Gaussian dense features, or a sparse matrix (one row per
    node) passed as sparse CSR to spfuse and as sparse COO to torch.sparse.

    >>> A, y = karate(); backends, params = model(A, y)
    >>> sorted(backends), tuple(params["W1"].shape)
    (['dense', 'spfuse', 'torch.sparse'], (34, 16))
    """
    import torch
    import torch.nn.functional as F

    import spfuse.torch

    n = A.shape[0]
    classes = int(y.max()) + 1
    g = torch.Generator().manual_seed(seed)
    X_sparse = None
    if features is None:
        X = torch.eye(n, dtype=torch.float64)
    elif sp.issparse(features):
        X = X_sparse = _torch_csr(sp.csr_array(features, dtype=np.float64))
    else:
        X = torch.randn(n, features, generator=g, dtype=torch.float64)
    f = X.shape[1]

    def glorot(a, b):
        limit = np.sqrt(6.0 / (a + b))
        return (torch.rand(a, b, generator=g, dtype=torch.float64) * 2 - 1) * limit

    params = {"W1": glorot(f, hidden), "W2": glorot(hidden, classes)}
    if labelled is None:
        labelled = np.array([int(np.flatnonzero(y == c)[0]) for c in range(classes)])
    idx, target = torch.from_numpy(labelled), torch.from_numpy(y[labelled])
    A_csr = _torch_csr(A)
    A_coo = A_csr.to_sparse_coo()
    X_coo = X_sparse.to_sparse_coo() if X_sparse is not None else None

    def features_times(W):
        return torch.sparse.mm(X_coo, W) if X_coo is not None else X @ W
    densified: list = []   # (made on first use: n^2 entries, and the features dense)
    layer = spfuse.torch.function(PROGRAM)

    def via_spfuse(p):
        return F.cross_entropy(layer(A_csr, X, p["W1"], p["W2"])[idx], target)

    def via_torch_sparse(p):
        H = torch.relu(torch.sparse.mm(A_coo, features_times(p["W1"])))
        return F.cross_entropy(torch.sparse.mm(A_coo, H @ p["W2"])[idx], target)

    def via_dense(p):
        if not densified:
            densified.extend((torch.from_numpy(A.toarray()), X.to_dense() if X_sparse is not None else X))
        A_dense, X_dense = densified
        H = torch.relu(A_dense @ (X_dense @ p["W1"]))
        return F.cross_entropy((A_dense @ (H @ p["W2"]))[idx], target)

    return {"spfuse": via_spfuse, "torch.sparse": via_torch_sparse, "dense": via_dense}, params


def _torch_csr(m: sp.csr_array):
    import warnings

    import torch
    data = m.data if m.data.flags.writeable else m.data.copy()   # (torch warns of read-only arrays)
    with warnings.catch_warnings():   # (torch's notes on sparse CSR support, once per model)
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
        return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(np.int64)),
                                       torch.from_numpy(m.indices.astype(np.int64)),
                                       torch.from_numpy(data), size=m.shape)


def main(epochs: int = 100) -> dict:
    """Train on karate through every backend; print and return the comparison."""
    from spfuse.examples.training import compare, report
    A, y = karate()
    backends, params = model(A, y)
    results = compare(backends, params, epochs, lr=0.01)
    print(report(f"2-layer GCN, karate club ({A.shape[0]} nodes, nnz(Â)={A.nnz}), {epochs} epochs", results))
    return results


if __name__ == "__main__":
    main()
