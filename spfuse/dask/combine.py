"""Adding per-block partial results: the combine step of the tree reductions.

Dense partials are added with numpy; sparse partials (scipy matrices or
:class:`spfuse.Tensor`) with spfuse's own n-way SpAdd -- one
``S[i,j] = P0[i,j] + ... + Pn[i,j]`` program, one merge pass over all
inputs instead of ``n - 1`` pairwise additions.  ``None`` stands for a
skipped block (one whose partial is known to be zero).

The signature is the one :func:`dask.array.reduction` gives ``combine`` and
``aggregate`` with ``concatenate=False``: a (possibly nested) list of
partials plus ``axis``/``keepdims``, which are ignored -- the reduced axes
are size-1 dummies that the partials never had.

>>> import numpy as np, scipy.sparse as sp
>>> a = sp.csr_array(np.array([[1.0, 0.0], [0.0, 2.0]]))
>>> add_partials([[a, None], [a]]).toarray()
array([[2., 0.],
       [0., 4.]])
>>> add_partials([np.ones(2), np.ones(2)], axis=(1,), keepdims=False)
array([2., 2.])
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np
import scipy.sparse as sp

import spfuse
from spfuse.tensor import Tensor

__all__ = ["add_partials", "flatten_partials"]

_IDX = "ijklmnopqrstuvwxyz"


def flatten_partials(parts: Any) -> list:
    """The non-``None`` leaves of a nested list of partials, in order.

    >>> flatten_partials([[1, None], [[2]], 3])
    [1, 2, 3]
    """
    if isinstance(parts, (list, tuple)):
        return [leaf for p in parts for leaf in flatten_partials(p)]
    return [] if parts is None else [parts]


@functools.lru_cache(maxsize=64)
def _sum_program(n: int, ndim: int) -> str:
    idx = ",".join(_IDX[:ndim])
    return f"S[{idx}] = " + " + ".join(f"P{k}[{idx}]" for k in range(n))


def _dense(p: Any) -> np.ndarray:
    if isinstance(p, Tensor):
        return p.todense()
    return p.toarray() if sp.issparse(p) else np.asarray(p)


def add_partials(parts: Any, axis: Any = None, keepdims: bool | None = None) -> Any:
    """The sum of the partials in ``parts`` (``None`` when every one was skipped).

    >>> import spfuse
    >>> t = spfuse.Tensor.from_coo([[0], [1], [1]], [1.0], (2, 2, 2))
    >>> add_partials([t, t]).values
    array([2.])
    """
    leaves = flatten_partials(parts)
    if not leaves:
        return None
    if len(leaves) == 1:
        return leaves[0]
    if all(isinstance(p, np.ndarray) or np.isscalar(p) for p in leaves):
        total = np.array(leaves[0], copy=True)
        for p in leaves[1:]:
            total += p
        return total
    if any(isinstance(p, np.ndarray) for p in leaves):  # mixed: the result is dense anyway
        return add_partials([_dense(p) for p in leaves])
    ndim = leaves[0].ndim
    program = _sum_program(len(leaves), ndim)
    # the n-way SpAdd: scipy in -> scipy out, Tensor in -> Tensor out
    out = spfuse.evaluate(program, num_threads=1, **{f"P{k}": p for k, p in enumerate(leaves)})
    if isinstance(leaves[0], Tensor) and isinstance(out, Tensor):
        return out.asformat(leaves[0].format)
    return out
