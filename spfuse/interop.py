"""Operands from, and results to, the other sparse libraries of the stack.

* pydata ``sparse.COO`` (any number of modes) becomes a CSF tensor; its
  values are shared when its coordinates are already sorted (pydata keeps
  them sorted).  ``sparse.GCXS`` with 2 modes is CSR (``compressed_axes=(0,)``)
  or CSC (``(1,)``) and is wrapped without copying; GCXS with more modes goes
  through its COO form.  A non-zero ``fill_value`` is refused: spfuse's
  semantics fill with 0.
* Results go back to pydata as the input type (:func:`to_pydata`), sharing
  the result's arrays, and to scipy as an N-d ``coo_array``
  (:func:`to_scipy_coo`).

pydata ``sparse`` is optional: nothing here imports it unless an operand is
one of its arrays.

>>> import numpy as np, sparse, spfuse
>>> X = sparse.COO.from_numpy(np.arange(8.0).reshape(2, 2, 2))
>>> type(spfuse.einsum("ijk->kji", X)).__name__
'COO'
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["is_pydata", "pydata_kind", "from_pydata", "to_pydata", "to_scipy_coo", "PYDATA_ORIGINS"]

#: ``Tensor.origin`` of operands that came from pydata ``sparse``.
PYDATA_ORIGINS = ("pydata.COO", "pydata.GCXS")


def pydata_kind(obj: Any) -> str | None:
    """``"COO"`` or ``"GCXS"`` for a pydata ``sparse`` array, else None (no import of ``sparse``).

    >>> import sparse
    >>> pydata_kind(sparse.zeros((2, 2))), pydata_kind(np.zeros(2))
    ('COO', None)
    """
    module = type(obj).__module__
    if not (module == "sparse" or module.startswith("sparse.")):
        return None
    name = type(obj).__name__
    return name if name in ("COO", "GCXS") else None


def is_pydata(obj: Any) -> bool:
    """Whether ``obj`` is a pydata ``sparse`` COO or GCXS array.

    >>> import sparse
    >>> is_pydata(sparse.zeros(3)), is_pydata([1.0])
    (True, False)
    """
    return pydata_kind(obj) is not None


def from_pydata(obj: Any, name: str = "operand"):
    """A pydata ``sparse`` COO/GCXS array as a :class:`~spfuse.tensor.Tensor`.

    >>> import sparse
    >>> g = sparse.GCXS.from_numpy(np.array([[0.0, 2.0], [3.0, 0.0]]))
    >>> t = from_pydata(g); t.format.name, t.origin, np.shares_memory(t.values, g.data)
    ('csr', 'pydata.GCXS', True)
    """
    from spfuse import validation as V
    from spfuse.tensor import Tensor

    kind = pydata_kind(obj)
    if kind is None:
        raise V.wrong_type(name, "not a pydata sparse array", "a sparse.COO or sparse.GCXS",
                           type(obj).__name__)
    fill = obj.fill_value
    if not (fill == 0 or (isinstance(fill, np.ndarray) and not fill.any())):
        raise V.invalid(name, "non-zero fill_value", "fill_value == 0 (spfuse fills with 0)",
                        f"fill_value == {fill!r}", "densify it, or subtract the fill value first")
    origin = f"pydata.{kind}"
    shape = tuple(int(s) for s in obj.shape)
    if kind == "GCXS" and len(shape) == 2 and tuple(obj.compressed_axes) in ((0,), (1,)):
        fmt = "csr" if tuple(obj.compressed_axes) == (0,) else "csc"
        # the arrays wrapped as they are (int64 indices too) when valid and canonical, as for scipy CSR
        view = SimpleNamespace(data=obj.data, indices=obj.indices, indptr=obj.indptr, shape=shape, format=fmt)
        t = Tensor._fast_compressed(view, origin)
        if t is None:  # unusual dtypes, unsorted or invalid: the validating constructor copies or words it
            make = Tensor.from_csr if fmt == "csr" else Tensor.from_csc
            t = make(obj.data, obj.indices, obj.indptr, shape, name=name)
    else:
        coo = obj if kind == "COO" else obj.tocoo()
        coords = np.asarray(coo.coords).reshape(len(shape), -1)
        t = Tensor.from_coo(coords, coo.data, shape, "csr" if len(shape) == 2 else "csf", name=name)
    t.origin = origin
    return t


def to_pydata(t: Any, kind: str) -> Any:
    """A spfuse :class:`~spfuse.tensor.Tensor` (or dense array) as a pydata ``COO``/``GCXS``.

    A CSR/CSC tensor becomes a 2-d GCXS sharing its arrays; everything else
    goes through coordinates.

    >>> from spfuse.tensor import Tensor
    >>> t = Tensor.from_numpy(np.array([[0.0, 1.0], [2.0, 0.0]]), "csr")
    >>> g = to_pydata(t, "GCXS"); type(g).__name__, np.shares_memory(g.data, t.values)
    ('GCXS', True)
    >>> to_pydata(t, "COO").todense().tolist()
    [[0.0, 1.0], [2.0, 0.0]]
    """
    import sparse

    from spfuse.tensor import CompressedLevel, Tensor

    if isinstance(t, np.ndarray):
        return sparse.COO.from_numpy(t) if kind == "COO" else sparse.GCXS.from_numpy(t)
    if not isinstance(t, Tensor):
        raise TypeError(f"expected a spfuse.Tensor or numpy array, got {type(t).__name__}")
    if kind == "GCXS" and t.ndim == 2 and t.format.name in ("csr", "csc"):
        lv = t.levels[1]
        assert isinstance(lv, CompressedLevel)  # CSR/CSC: (dense, compressed)
        axis = (0,) if t.format.name == "csr" else (1,)
        return sparse.GCXS((t.values, lv.crd, lv.pos), shape=t.shape,
                           compressed_axes=axis)
    if t.format.levels and t.format.levels[-1] == "dense":
        t = t.asformat("csf" if t.ndim != 2 else "csr")
    coo = sparse.COO(np.array(t.coords, dtype=np.int64), t.values, shape=t.shape,
                     has_duplicates=False, sorted=t.format.is_identity_order)
    return coo if kind == "COO" else sparse.GCXS.from_coo(coo)


def to_scipy_coo(t: Any) -> sp.coo_array:
    """A spfuse :class:`~spfuse.tensor.Tensor` of any number of modes as a scipy ``coo_array``.

    >>> from spfuse.tensor import Tensor
    >>> t = Tensor.from_coo([[0, 1], [1, 0], [2, 2]], [1.0, 2.0], (2, 2, 3))
    >>> c = to_scipy_coo(t); c.shape, c.nnz, type(c).__name__
    ((2, 2, 3), 2, 'coo_array')
    """
    if t.format.levels and t.format.levels[-1] == "dense":
        t = t.asformat("csf")
    coords = tuple(np.array(c) for c in t.coords)
    return sp.coo_array((t.values, coords), shape=t.shape, copy=False)

