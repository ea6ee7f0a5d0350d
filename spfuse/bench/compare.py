"""Agreement of results from different libraries, whatever type they come in.

Every result is brought to one of two comparable forms: a dense
``numpy.ndarray`` or a 2-D scipy CSR matrix (an N-d sparse result is
flattened to ``(prod(shape[:-1]), shape[-1])``).  Two results agree when
``|a - b| <= atol + rtol * |b|`` everywhere, with ``atol`` a tiny fraction of
the largest reference magnitude.

>>> import numpy as np
>>> agree(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-12]))
(True, '')
>>> agree(np.array([1.0, 2.0]), np.array([1.0, 2.5]))[0]
False
"""
from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

import spfuse

__all__ = ["to_comparable", "agree", "coo_to_comparable"]

_DENSE_LIMIT = 20_000_000  # elements; above this, compare sparsely


def coo_to_comparable(coords: np.ndarray, values: np.ndarray, shape: tuple) -> sp.csr_array:
    """CSR ``(prod(shape[:-1]), shape[-1])`` from N-d coordinates (duplicates summed)."""
    coords = np.asarray(coords, dtype=np.int64).reshape(len(shape), -1)
    if len(shape) == 1:
        rows, cols, shp = np.zeros_like(coords[0]), coords[0], (1, shape[0])
    else:
        rows = np.ravel_multi_index(tuple(coords[:-1]), shape[:-1]) if coords.shape[1] else coords[0]
        cols, shp = coords[-1], (int(np.prod(shape[:-1])), shape[-1])
    return sp.csr_array((np.asarray(values, dtype=np.float64), (rows, cols)), shape=shp)


def to_comparable(x: Any):
    """``x`` (numpy, scipy.sparse, spfuse.Tensor, torch, graphblas, pydata sparse) as ndarray or CSR."""
    if isinstance(x, np.ndarray) or np.isscalar(x):
        return np.asarray(x, dtype=np.float64)
    if sp.issparse(x):
        return coo_to_comparable(np.vstack(x.tocoo().coords), x.tocoo().data, x.shape) if x.ndim != 2 \
            else sp.csr_array(x, dtype=np.float64)
    if isinstance(x, spfuse.Tensor):
        if x.ndim == 2 or x.ndim > 2:
            return coo_to_comparable(x.coords, x.values, x.shape)
        return np.asarray(x.todense(), dtype=np.float64)
    mod = type(x).__module__.split(".")[0]
    if mod == "torch":
        import torch
        if x.layout == torch.sparse_csr:
            return sp.csr_array((x.values().numpy(), x.col_indices().numpy(), x.crow_indices().numpy()),
                                shape=tuple(x.shape))
        if x.layout == torch.sparse_coo:
            x = x.coalesce()
            return coo_to_comparable(x.indices().numpy(), x.values().numpy(), tuple(x.shape))
        return x.numpy().astype(np.float64)
    if mod == "graphblas":
        import graphblas as gb
        if isinstance(x, gb.Vector):
            return x.to_dense(fill_value=0.0).astype(np.float64)
        return sp.csr_array(gb.io.to_scipy_sparse(x, format="csr"), dtype=np.float64)
    if mod == "sparse":
        return coo_to_comparable(x.coords, x.data, tuple(x.shape)) if x.ndim >= 2 \
            else np.asarray(x.todense(), dtype=np.float64)
    raise TypeError(f"cannot compare a result of type {type(x).__name__}")


def _densify(c, shape2d=None):
    return c.toarray() if sp.issparse(c) else c


def agree(a: Any, ref: Any, rtol: float = 1e-6) -> tuple[bool, str]:
    """Whether ``a`` equals the reference ``ref`` to ``rtol``; the second item says how they differ."""
    a, ref = to_comparable(a), to_comparable(ref)
    if sp.issparse(a) or sp.issparse(ref):
        if sp.issparse(a) != sp.issparse(ref):
            dense, other = (a, ref) if not sp.issparse(a) else (ref, a)
            if dense.size > _DENSE_LIMIT:
                dense = sp.csr_array(dense.reshape(-1, other.shape[-1]))
                a, ref = (dense, other) if not sp.issparse(a) else (other, dense)
            else:
                a, ref = _densify(a), _densify(ref)
    if sp.issparse(a):
        if a.shape != ref.shape:
            return False, f"shape {a.shape} != {ref.shape}"
        scale = float(abs(ref).max()) if ref.nnz else 0.0
        err = abs(a - ref) - rtol * abs(ref)
        worst = float(err.max()) if err.nnz else 0.0
        atol = 1e-12 * max(scale, 1.0)
        return (worst <= atol, "" if worst <= atol else f"max excess error {worst:.3g} (scale {scale:.3g})")
    a = np.asarray(a, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if a.size == ref.size and a.shape != ref.shape:
        a = a.reshape(ref.shape)
    if a.shape != ref.shape:
        return False, f"shape {a.shape} != {ref.shape}"
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    ok = np.allclose(a, ref, rtol=rtol, atol=1e-12 * max(scale, 1.0), equal_nan=True)
    if ok:
        return True, ""
    worst = float(np.nanmax(np.abs(a - ref)))
    return False, f"max abs error {worst:.3g} (scale {scale:.3g})"
