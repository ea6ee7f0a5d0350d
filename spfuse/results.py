"""Convert: results back in the caller's world.

scipy.sparse in, scipy.sparse out (array or matrix, as given); pydata
sparse in, pydata out; numpy in, numpy out; an N-d sparse result of scipy
operands as an N-d ``coo_array``, or ``out_format`` when the caller forces
one.  A result never shares writable memory with an operand (:func:`owned`).

>>> import numpy as np
>>> from spfuse.tensor import Tensor
>>> to_callers_world(Tensor.from_numpy(np.eye(2), "csr"), None, "sparray", np.dtype(np.float64)).format
'csr'
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import scipy.sparse as sp

from spfuse.interop import PYDATA_ORIGINS, is_pydata, to_pydata, to_scipy_coo
from spfuse.tensor import CompressedLevel, Tensor

__all__ = ["OUT_FORMATS", "owned", "result_dtype", "result_world", "same_sparse_world", "to_callers_world"]

#: the formats a caller may force a result into (``out_format=``)
OUT_FORMATS = ("csr", "csc", "coo", "dense", "csf")


def result_world(tensors: Mapping[str, Tensor]) -> str | None:
    """The sparse world results go back to: scipy (array before matrix), else pydata (COO before GCXS)."""
    origins = {t.origin for t in tensors.values()}
    for flavour in ("sparray", "spmatrix", *PYDATA_ORIGINS):
        if flavour in origins:
            return flavour
    return None


def same_sparse_world(tensors: Mapping[str, Tensor]) -> bool:
    """Whether every operand came from scipy.sparse, or every operand from pydata sparse."""
    origins = {t.origin for t in tensors.values()}
    return bool(origins) and (origins <= {"sparray", "spmatrix"} or origins <= set(PYDATA_ORIGINS))


def to_callers_world(value: np.ndarray | Tensor, out_format: str | None, flavour: str | None, dtype):
    """A result in the caller's world (or the forced ``out_format``)."""
    if flavour in PYDATA_ORIGINS and out_format is None and isinstance(value, Tensor) and value.ndim >= 1:
        return to_pydata(value.astype(dtype) if value.dtype != dtype else value, flavour.split(".")[1])
    if isinstance(value, np.ndarray):
        value = value.astype(dtype, copy=False)
        if out_format in (None, "dense"):
            return value[()] if value.ndim == 0 else value
        value = Tensor.from_numpy(value, "csf" if value.ndim != 2 else ("csr" if out_format == "coo" else out_format))
    else:
        value = value.astype(dtype) if value.dtype != dtype else value
    if out_format == "dense":
        return value.todense()
    if value.ndim == 2:
        if out_format in ("csr", "csc"):
            return value.asformat(out_format).to_scipy(flavour or "sparray")
        if out_format == "coo":
            return value.asformat("csr").to_scipy(flavour or "sparray").tocoo()
        if out_format == "csf":
            return value.asformat("dcsr")
        if flavour is not None:
            return value.asformat("csr" if value.format.mode_order == (0, 1) else "csc").to_scipy(flavour)
        return value
    if value.ndim <= 1 and out_format is None:
        return value.todense()
    if flavour == "sparray" and out_format is None:
        return to_scipy_coo(value)  # N-d scipy in -> N-d coo_array out
    if out_format in ("csr", "csc", "coo"):
        raise ValueError(f"out_format={out_format!r} needs a 2-D result, got {value.ndim}-D")
    return value.asformat("csf") if out_format == "csf" else value


def result_dtype(tensors: Mapping[str, Tensor]):
    dts = {np.dtype(t.dtype) for t in tensors.values()}
    return np.dtype(np.float32) if dts and dts <= {np.dtype(np.float32)} else np.dtype(np.float64)


def owned(result, tensors: Mapping[str, Tensor]):
    """``result`` with writable arrays of its own: a kernel's fresh output is
    handed over (made writable), an array shared with an operand (SDDMM keeps
    B's pattern) is copied, so changing the result never changes an input."""
    if isinstance(result, np.ndarray):
        return result  # (no sparse container to hand over; as before, without the getattr miss)
    attrs = _ARRAY_ATTRS.get(str(getattr(result, "format", "")))
    if attrs is None or not (sp.issparse(result) or is_pydata(result)):
        return result
    inputs = None
    for attr in attrs:
        arr = getattr(result, attr)
        if not isinstance(arr, np.ndarray) or arr.flags.writeable:  # (scipy's coords: a tuple of fresh arrays)
            continue
        if inputs is None:  # buffers of the sparse operands (dense ones are never shared)
            inputs = {id(_root(a)) for t in tensors.values() if not t.format.is_dense
                      for a in _arrays(t)}
        if id(_root(arr)) in inputs:
            setattr(result, attr, arr.copy())
            continue
        try:
            arr.flags.writeable = True  # a read-only view of a buffer this call allocated
        except ValueError:
            setattr(result, attr, arr.copy())
    return result


#: array attributes of the sparse containers results come back in (scipy and pydata alike)
_ARRAY_ATTRS = {"csr": ("data", "indices", "indptr"), "csc": ("data", "indices", "indptr"),
                "gcxs": ("data", "indices", "indptr"), "coo": ("data", "coords")}


def _root(a: np.ndarray) -> np.ndarray:
    """The array owning ``a``'s buffer (views chain to it through ``.base``)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _arrays(t: Tensor):
    yield t.values
    for lv in t.levels:
        if isinstance(lv, CompressedLevel):
            yield lv.pos
            yield lv.crd
