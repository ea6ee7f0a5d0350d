"""Teach Dask about scipy sparse arrays and :class:`spfuse.Tensor`.

* ``sizeof``: Dask registers scipy's ``spmatrix`` but not the ``sparray``
  classes, so a ``csr_array`` block counted as ~56 bytes (``sys.getsizeof``)
  and the scheduler's memory accounting and transfer-cost estimates were
  blind to it.  Here both count their index and value buffers; a Tensor
  counts its values and every compressed level's ``pos``/``crd``.
* ``concatenate``: Tensor blocks concatenate along any axis (coordinates
  shifted), so ``dask.array.Array.compute()`` of Tensor slabs gives one Tensor.
* tokenize: :meth:`spfuse.Tensor.__dask_tokenize__` (in :mod:`spfuse.tensor`).
* serialisation: a Tensor pickles (its numpy buffers go out of band with
  pickle protocol 5, which ``distributed`` uses), so nothing to register.

>>> import numpy as np, scipy.sparse as sp
>>> from dask.sizeof import sizeof
>>> A = sp.csr_array(np.eye(1000))
>>> sizeof(A) >= A.data.nbytes + A.indices.nbytes + A.indptr.nbytes
True
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp
from dask.array.dispatch import concatenate_lookup
from dask.sizeof import sizeof

from spfuse.tensor import Tensor

__all__ = ["sizeof_sparse", "sizeof_tensor", "concatenate_tensors"]

_OVERHEAD = 64  # the Python objects around the buffers


@sizeof.register(sp.sparray)
def sizeof_sparse(a: Any) -> int:
    """Bytes held by a scipy sparse array: its buffers (any format).

    >>> sizeof_sparse(sp.coo_array(np.eye(3))) >= 3 * 8
    True
    """
    buffers = [v for v in vars(a).values() if isinstance(v, np.ndarray)]
    coords = getattr(a, "coords", None)
    if isinstance(coords, tuple):
        buffers += [c for c in coords if isinstance(c, np.ndarray)]
    if not buffers:  # dok/lil keep Python containers
        return int(sum(sizeof(v) for v in vars(a).values())) + _OVERHEAD
    return int(sum(b.nbytes for b in buffers)) + _OVERHEAD


@sizeof.register(Tensor)
def sizeof_tensor(t: Tensor) -> int:
    """Bytes held by a Tensor: values plus every compressed level's index arrays.

    >>> t = Tensor.from_numpy(np.eye(4), "csr")
    >>> sizeof_tensor(t) >= t.values.nbytes + t.levels[1].pos.nbytes + t.levels[1].crd.nbytes
    True
    """
    total = t.values.nbytes + _OVERHEAD
    for lv in t.levels:
        if lv.kind == "compressed":
            total += lv.pos.nbytes + lv.crd.nbytes
    return int(total)


def concatenate_tensors(blocks: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Tensors joined along ``axis`` (they agree on every other extent).

    >>> a = Tensor.from_coo([[0], [1]], [1.0], (1, 2), format="csr")
    >>> concatenate_tensors([a, a], axis=0).todense()
    array([[0., 1.],
           [0., 1.]])
    """
    blocks = list(blocks)
    if not blocks:
        raise ValueError("nothing to concatenate")
    first = blocks[0]
    if any(b.ndim != first.ndim for b in blocks):
        raise ValueError("Tensors to concatenate must have the same number of modes")
    offsets = np.cumsum([0] + [b.shape[axis] for b in blocks])
    coords = []
    for off, b in zip(offsets[:-1], blocks, strict=True):  # offsets[-1]: the total extent
        c = b.coords.astype(np.int64)
        c[axis] += off
        coords.append(c)
    shape = list(first.shape)
    shape[axis] = int(offsets[-1])
    values = np.concatenate([b.values for b in blocks]) if blocks else first.values
    out = Tensor.from_coo(np.concatenate(coords, axis=1), values, tuple(shape), format=first.format)
    out.origin = first.origin
    return out


concatenate_lookup.register(Tensor, concatenate_tensors)
