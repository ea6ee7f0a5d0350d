"""The :class:`Tensor` storage contract: levels, positions, values.

A tensor is a tuple of *levels* in storage order (see :mod:`spfuse.formats`)
plus one flat ``values`` array:

* ``DenseLevel(size)`` turns every parent position ``p`` into the positions
  ``p * size + j`` for ``j`` in ``range(size)`` -- ``parent_positions * size``
  positions, no index arrays;
* ``CompressedLevel(size, pos, crd)`` stores, for parent position ``p``, the
  coordinates ``crd[pos[p]:pos[p+1]]`` (strictly increasing); its positions
  are ``0 .. len(crd)-1`` and ``len(pos) == parent_positions + 1`` (the root
  has one position, so a top-level compressed level has ``pos == [0, n]``).

Positions of the last level index ``values``.  CSR is therefore
``(DenseLevel(m), CompressedLevel(n, pos=indptr, crd=indices))`` with
``values = data``.  Every index array of a tensor has the same dtype,
:attr:`Tensor.index_dtype`: int32 when every extent, position count and nnz
fits in int32, int64 otherwise -- except that a canonical scipy CSR/CSC
matrix with int64 index arrays is wrapped as it is (int64, zero-copy):
narrowing would copy both index arrays on every call.  Arrays held by a
tensor are read-only views;
a tensor never writes into arrays it was given.

Tensors built by spfuse's constructors are canonical (sorted, no duplicate
coordinates) and validated; the engine can index them without checks.

>>> import numpy as np, scipy.sparse as sp
>>> A = sp.csr_array(np.array([[1.0, 0, 2], [0, 0, 3]]))
>>> t = Tensor.from_scipy(A)
>>> t
<spfuse.Tensor shape=(2, 3) float64 csr nnz=3 index=int32>
>>> t.levels[1].pos, t.levels[1].crd
(array([0, 2, 3], dtype=int32), array([0, 2, 2], dtype=int32))
>>> np.shares_memory(t.values, A.data)
True
"""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import scipy.sparse as sp

from spfuse import validation as V
from spfuse.formats import COMPRESSED, DENSE, Format, as_format
from spfuse.interop import from_pydata, is_pydata

__all__ = ["DenseLevel", "CompressedLevel", "Level", "Tensor", "as_tensor", "values_at", "same_pattern",
           "shared_patterns", "ORIGINS"]

#: Values of :attr:`Tensor.origin`: the world an operand came from, so results
#: can be returned in the caller's flavour.
ORIGINS = ("sparray", "spmatrix", "numpy", "pydata.COO", "pydata.GCXS", None)

FormatLike = str | Format


try:
    from spfuse._kernels._validate import compressed_ready as _compressed_ready
    from spfuse._kernels._validate import readonly_flat as _readonly_flat
except ImportError:  # a source checkout without built kernels
    _readonly_flat = _compressed_ready = None


def _compressed_ready_py(indptr, indices, data, nouter: int, ninner: int, scan: bool) -> bool:
    """What ``_validate.compressed_ready`` decides, in numpy (kernels not built)."""
    if not (type(indptr) is np.ndarray and type(indices) is np.ndarray and type(data) is np.ndarray):
        return False
    idx = indptr.dtype
    if (idx != indices.dtype or idx not in V.INDEX_DTYPES or data.dtype not in V.VALUE_DTYPES
            or indptr.ndim != 1 or indices.ndim != 1 or data.ndim != 1
            or not (indptr.flags.c_contiguous and indices.flags.c_contiguous and data.flags.c_contiguous)):
        return False
    nnz = len(indices)
    if len(indptr) != nouter + 1 or len(data) != nnz or indptr[0] != 0 or indptr[-1] != nnz:
        return False
    if idx == _INT32 and max(nouter, ninner, nnz) > V.INT32_MAX:
        return False
    return V.scan_status(indptr, indices, ninner) == 0 if scan else V.pos_monotone(indptr)


def _readonly(a: np.ndarray) -> np.ndarray:
    if _readonly_flat is not None and a.ndim == 1 and a.flags.c_contiguous:
        return _readonly_flat(a)
    view = a.view()
    view.flags.writeable = False
    return view


_INT32 = np.dtype(np.int32)
_FLOAT64, _FLOAT32 = np.dtype(np.float64), np.dtype(np.float32)


@functools.lru_cache(maxsize=1024)
def _dense_level(size: int) -> DenseLevel:
    return DenseLevel(size)  # (immutable: one per size, not one per call)


@functools.lru_cache(maxsize=1024)
def _dense_parts(shape: tuple) -> tuple | None:
    """The format and levels of a dense operand of this shape, or None when
    its extents or size need int64 (the general path then decides)."""
    if max((math.prod(shape), *shape)) > V.INT32_MAX:
        return None
    return Format.dense(len(shape)), tuple(DenseLevel(s) for s in shape)


@dataclass(frozen=True)
class DenseLevel:
    """A dense level of extent ``size``: ``parent_positions * size`` positions.

    >>> DenseLevel(4).num_positions(3)
    12
    """

    size: int
    kind: ClassVar[str] = DENSE

    def num_positions(self, parent_positions: int) -> int:
        """Positions of this level given the parent level's position count.

        >>> DenseLevel(5).num_positions(2)
        10
        """
        return parent_positions * self.size


@dataclass(frozen=True, eq=False)
class CompressedLevel:
    """A compressed level of extent ``size`` with segment bounds ``pos`` and coordinates ``crd``.

    Compared by identity (the arrays make value equality ambiguous).

    >>> import numpy as np
    >>> lvl = CompressedLevel(5, np.array([0, 2, 3]), np.array([1, 4, 0]))
    >>> lvl.num_positions(2), lvl
    (3, CompressedLevel(size=5, nnz=3, index=int64))
    """

    size: int
    pos: np.ndarray
    crd: np.ndarray
    kind: ClassVar[str] = COMPRESSED

    def __post_init__(self) -> None:
        object.__setattr__(self, "pos", np.asarray(self.pos))
        object.__setattr__(self, "crd", np.asarray(self.crd))

    @classmethod
    def _wrap(cls, size: int, pos: np.ndarray, crd: np.ndarray) -> CompressedLevel:
        """A level over arrays that are already ndarrays (no coercion): the per-call fast path."""
        obj = cls.__new__(cls)
        obj.__dict__.update(size=size, pos=pos, crd=crd)  # (frozen: no __setattr__)
        return obj

    def num_positions(self, parent_positions: int) -> int:
        """Positions of this level: the number of stored coordinates.

        >>> CompressedLevel(9, [0, 1, 3], [4, 0, 8]).num_positions(2)
        3
        """
        return len(self.crd)

    def __repr__(self) -> str:
        return f"CompressedLevel(size={self.size}, nnz={len(self.crd)}, index={self.crd.dtype})"


Level = DenseLevel | CompressedLevel


# ---------------------------------------------------------------------------
# vectorised assembly helpers (no Python loop over nnz anywhere)
# ---------------------------------------------------------------------------
def _linear_keys(sc: np.ndarray, sshape: Sequence[int]) -> np.ndarray:
    """Row-major linear index of each column of storage-order coordinates ``sc``."""
    key = np.zeros(sc.shape[1], dtype=np.int64)
    for level, size in enumerate(sshape):
        if level:
            key *= size
        key += sc[level]
    return key


def _sort_dedupe(sc: np.ndarray, vals: np.ndarray, sshape: Sequence[int],
                 sum_duplicates: bool, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Sort storage coordinates lexicographically and sum (or refuse) duplicates."""
    nnz = vals.shape[0]
    if nnz <= 1:
        return sc, vals
    key = _linear_keys(sc, sshape)
    if bool(np.all(key[1:] > key[:-1])):
        return sc, vals
    order = np.argsort(key, kind="stable")
    k = key[order]
    first = np.empty(nnz, dtype=bool)
    first[0] = True
    np.not_equal(k[1:], k[:-1], out=first[1:])
    if bool(first.all()):
        return sc[:, order], vals[order]
    if not sum_duplicates:
        dup = int(np.flatnonzero(~first)[0])
        coord = tuple(int(x) for x in sc[:, order[dup]])
        raise V.invalid(name, "duplicate coordinates", "each coordinate stored at most once",
                        f"storage coordinate {coord} appears more than once",
                        "pass sum_duplicates=True to add duplicate entries together")
    starts = np.flatnonzero(first)
    return sc[:, order[starts]], np.add.reduceat(vals[order], starts)


def _build_levels(sc: np.ndarray, vals: np.ndarray, sshape: Sequence[int],
                  kinds: Sequence[str]) -> tuple[tuple[Level, ...], np.ndarray]:
    """Levels and values from sorted, unique storage-order coordinates.

    Dense levels expand: the returned values hold explicit zeros wherever a
    dense level creates a position no entry occupies.
    """
    ndim = len(kinds)
    nnz = vals.shape[0]
    if ndim == 0:
        out = np.zeros(1, dtype=vals.dtype)
        if nnz:
            out[0] = vals.sum()
        return (), out
    levels: list[Level] = []
    parent: np.ndarray | None = None  # position of each entry at the previous level
    nparent = 1
    for level, (kind, size) in enumerate(zip(kinds, sshape, strict=True)):
        c = sc[level]
        if kind == DENSE:
            parent = c.astype(np.int64, copy=True) if parent is None else parent * size + c
            nparent *= size
            levels.append(DenseLevel(size))
            continue
        if level == ndim - 1:
            # entries are unique, so every entry is a new position of the last level
            new = None
            crd = c
            cur = np.arange(nnz, dtype=np.int64)
        else:
            new = np.empty(nnz, dtype=bool)
            if nnz:
                new[0] = True
                np.not_equal(c[1:], c[:-1], out=new[1:])
                if parent is not None:
                    new[1:] |= parent[1:] != parent[:-1]
            crd = c[new]
            cur = np.cumsum(new, dtype=np.int64) - 1
        pos = np.zeros(nparent + 1, dtype=np.int64)
        if parent is None:
            pos[1] = len(crd)
        else:
            owners = parent if new is None else parent[new]
            np.cumsum(np.bincount(owners, minlength=nparent), out=pos[1:])
        levels.append(CompressedLevel(size, pos, crd))
        parent = cur
        nparent = len(crd)
    if kinds[-1] == DENSE:
        out = np.zeros(nparent, dtype=vals.dtype)
        out[parent] = vals
        vals = out
    return tuple(levels), vals


def _walk_coords(levels: Sequence[Level], dtype: np.dtype) -> np.ndarray:
    """Storage-order coordinates of every value position, shape (ndim, positions)."""
    cols: list[np.ndarray] = []
    npos = 1
    for lvl in levels:
        if isinstance(lvl, DenseLevel):
            s = lvl.size
            cols = [np.repeat(c, s) for c in cols]
            cols.append(np.tile(np.arange(s, dtype=dtype), npos))
            npos *= s
        else:
            if cols:
                parent = np.repeat(np.arange(npos, dtype=dtype), np.diff(lvl.pos))
                cols = [c[parent] for c in cols]
            cols.append(np.asarray(lvl.crd, dtype=dtype))
            npos = len(lvl.crd)
    if not cols:
        return np.empty((0, npos), dtype=dtype)
    return np.stack(cols)


class Tensor:
    """An N-d tensor stored level by level (TACO formats), float32 or float64.

    The constructor takes raw parts and validates them fully (O(nnz));
    non-canonical compressed levels (unsorted or duplicate coordinates) are
    canonicalised on a copy.  Prefer the ``from_*`` constructors and
    :func:`as_tensor`.

    Attributes: :attr:`shape`, :attr:`dtype`, :attr:`format`, :attr:`levels`,
    :attr:`values`, :attr:`index_dtype`, :attr:`ndim`, :attr:`nnz`,
    :attr:`coords`, :attr:`origin`.

    >>> import numpy as np
    >>> t = Tensor((2, 3), "csr",
    ...            [DenseLevel(2), CompressedLevel(3, [0, 1, 3], [2, 1, 0])],
    ...            [1.0, 2.0, 3.0])
    >>> t.levels[1].crd, t.values          # row 1 was unsorted: canonicalised
    (array([2, 0, 1], dtype=int32), array([1., 3., 2.]))
    >>> t.todense()
    array([[0., 0., 1.],
           [3., 2., 0.]])
    """

    __slots__ = ("_shape", "_format", "_levels", "_values", "_index_dtype", "_coords", "origin")

    def __init__(self, shape: Sequence[int], format: FormatLike, levels: Sequence[Level],
                 values: Any, *, origin: str | None = None, name: str = "operand") -> None:
        shape = V.check_shape(shape, name)
        try:
            fmt = as_format(format, len(shape))
        except ValueError as exc:
            raise V.invalid(name, "format does not fit the shape", f"a format for {len(shape)} modes",
                            str(exc).splitlines()[0]) from None
        levels = tuple(levels)
        if len(levels) != fmt.ndim:
            raise V.invalid(name, "wrong number of levels", f"{fmt.ndim} levels (one per mode)",
                            f"{len(levels)} levels")
        sshape = fmt.storage_shape(shape)
        npos = 1
        canonical = True
        checked: list[Level] = []
        for level, (kind, lvl, size) in enumerate(zip(fmt.levels, levels, sshape, strict=True)):
            cls = DenseLevel if kind == DENSE else CompressedLevel
            if not isinstance(lvl, cls):
                raise V.invalid(name, f"levels[{level}] has the wrong kind",
                                f"a {cls.__name__} (format {fmt.name!r} has {kind!r} at level {level})",
                                type(lvl).__name__)
            if lvl.size != size:
                raise V.invalid(name, f"levels[{level}] has the wrong size",
                                f"size {size} (extent of mode {fmt.mode_order[level]})", f"size {lvl.size}")
            if isinstance(lvl, DenseLevel):
                checked.append(lvl)
                npos *= size
                continue
            pos = V.check_index_array(lvl.pos, name, f"levels[{level}].pos")
            crd = V.check_index_array(lvl.crd, name, f"levels[{level}].crd")
            canonical &= V.check_compressed(pos, crd, size, npos, name,
                                            f"levels[{level}].pos", f"levels[{level}].crd")
            checked.append(CompressedLevel(size, pos, crd))
            npos = len(crd)
        vals = V.as_values(values, name)
        if len(vals) != npos:
            raise V.invalid(name, "values has the wrong length",
                            f"len(values) == {npos} (the number of positions of the last level)",
                            f"len(values) == {len(vals)}")
        if origin not in ORIGINS:
            raise ValueError(f"origin must be one of {ORIGINS}, got {origin!r}")
        if not canonical:
            sc = _walk_coords(checked, np.dtype(np.int64))
            sc, vals = _sort_dedupe(sc, vals, sshape, True, name)
            checked, vals = _build_levels(sc, vals, sshape, fmt.levels)  # type: ignore[assignment]
        self._init(shape, fmt, tuple(checked), vals, origin)

    # -- trusted construction -------------------------------------------------
    def _init(self, shape: tuple[int, ...], fmt: Format, levels: tuple[Level, ...],
              values: np.ndarray, origin: str | None) -> None:
        counts = list(shape)
        counts.append(len(values))
        npos = 1
        for lvl in levels:
            npos = lvl.num_positions(npos)
            counts.append(npos)
        idx = V.index_dtype_for(*counts)
        fixed: list[Level] = []
        for lvl in levels:
            if isinstance(lvl, CompressedLevel):
                lvl = CompressedLevel(lvl.size, _readonly(lvl.pos.astype(idx, copy=False)),
                                      _readonly(lvl.crd.astype(idx, copy=False)))
            fixed.append(lvl)
        self._shape = shape
        self._format = fmt
        self._levels = tuple(fixed)
        self._values = _readonly(np.ascontiguousarray(values))
        self._index_dtype = idx
        self._coords: np.ndarray | None = None
        self.origin = origin

    @classmethod
    def _fast_dense(cls, arr: np.ndarray) -> Tensor | None:
        """The common dense operand (C- or Fortran-contiguous native
        float32/float64 ndarray) wrapped in a few microseconds, or None: the
        general path decides.  A Fortran-ordered array (``D.T`` of a C
        array, ``np.asfortranarray``) is dense levels in the reversed mode
        order over the same buffer: no transposing copy."""
        dt = arr.dtype
        if not (dt is _FLOAT64 or dt is _FLOAT32 or dt in V.VALUE_DTYPES):
            return None
        fortran = not arr.flags.c_contiguous
        if fortran and not arr.flags.f_contiguous:
            return None
        shape = arr.shape
        parts = _dense_parts(shape)
        if parts is None:
            return None
        obj = cls.__new__(cls)
        obj._shape = shape
        obj._format, obj._levels = parts
        if fortran:
            order = tuple(range(arr.ndim))[::-1]
            obj._format = Format(obj._format.levels, order)
            obj._levels = tuple(DenseLevel(shape[m]) for m in order)
            arr = arr.T
        # a new read-only view of the caller's buffer
        obj._values = _readonly_flat(arr) if _readonly_flat is not None else _readonly(arr.reshape(-1))
        obj._index_dtype = _INT32
        obj._coords = None
        obj.origin = "numpy"
        return obj

    @classmethod
    def _fast_compressed(cls, m: Any, origin: str, scan: bool = True) -> Tensor | None:
        """A canonical scipy CSR/CSC matrix wrapped zero-copy after the one-pass
        scan, or None when anything is unusual (dtypes, slack, unsorted rows,
        an error to word): the general path then handles it.

        ``scan=False`` checks ``indptr`` only and leaves ``indices`` unread:
        for the call path alone, which hands such a tensor only to a kernel
        that checks the indices as it reads them (or scans it first)."""
        shape = m.shape
        if not (len(shape) == 2 and type(shape[0]) is int and type(shape[1]) is int
                and shape[0] >= 0 and shape[1] >= 0 and shape[0] * shape[1] <= V.INT64_MAX):
            return None  # a hand-edited or huge shape: check_shape words the error
        if m.format == "csr":
            fmt, nouter, ninner = Format.csr(), shape[0], shape[1]
        else:
            fmt, nouter, ninner = Format.csc(), shape[1], shape[0]
        indptr, indices, data = m.indptr, m.indices, m.data
        if _compressed_ready is not None:
            if not _compressed_ready(indptr, indices, data, nouter, ninner, scan):
                return None
        elif not _compressed_ready_py(indptr, indices, data, nouter, ninner, scan):
            return None
        obj = cls.__new__(cls)
        obj._shape = shape
        obj._format = fmt
        ro = _readonly_flat or _readonly  # (the arrays are 1-D and contiguous here)
        obj._levels = (_dense_level(nouter), CompressedLevel._wrap(ninner, ro(indptr), ro(indices)))
        obj._values = ro(data)
        obj._index_dtype = indptr.dtype
        obj._coords = None
        obj.origin = origin
        return obj

    @classmethod
    def _trusted(cls, shape: Sequence[int], fmt: Format, levels: Sequence[Level], values: np.ndarray,
                 origin: str | None = None) -> Tensor:
        """Wrap parts known to be valid and canonical (no O(nnz) checks).

        For spfuse's own code (constructors, kernels producing results).
        Index arrays are cast to the tensor's index dtype if needed.
        """
        obj = cls.__new__(cls)
        obj._init(tuple(int(s) for s in shape), fmt, tuple(levels), values, origin)
        return obj

    @classmethod
    def _assemble(cls, sc: np.ndarray, vals: np.ndarray, shape: tuple[int, ...], fmt: Format,
                  origin: str | None, sum_duplicates: bool = True, name: str = "operand",
                  presorted: bool = False) -> Tensor:
        sshape = fmt.storage_shape(shape)
        if not presorted:
            sc, vals = _sort_dedupe(sc, vals, sshape, sum_duplicates, name)
        levels, vals = _build_levels(sc, vals, sshape, fmt.levels)
        return cls._trusted(shape, fmt, levels, vals, origin)

    # -- constructors ---------------------------------------------------------
    @classmethod
    def from_numpy(cls, a: Any, format: FormatLike = "dense", *, name: str = "operand") -> Tensor:
        """A tensor from a numpy array (or anything ``np.asarray`` accepts).

        ``format="dense"`` stores the array itself (no copy when it is already
        C-contiguous float32/float64); sparse formats store its nonzeros
        (NaN counts as nonzero).  Integer and boolean arrays become float64.

        >>> import numpy as np
        >>> a = np.array([[0.0, 1.5], [2.0, 0.0]])
        >>> Tensor.from_numpy(a)
        <spfuse.Tensor shape=(2, 2) float64 dense nnz=4 index=int32>
        >>> t = Tensor.from_numpy(a, "csc"); t.nnz, t.coords.tolist()
        (2, [[1, 0], [0, 1]])
        """
        arr = np.asarray(a)
        dt = V.value_dtype(arr.dtype, name)
        shape = V.check_shape(arr.shape, name)
        fmt = as_format(format, arr.ndim)
        sshape = fmt.storage_shape(shape)
        st = arr if fmt.is_identity_order else arr.transpose(fmt.mode_order)
        if fmt.is_dense:
            vals = np.ascontiguousarray(st, dtype=dt).reshape(-1)
            return cls._trusted(shape, fmt, tuple(DenseLevel(s) for s in sshape), vals, "numpy")
        nz = np.nonzero(st)
        vals = np.ascontiguousarray(st[nz], dtype=dt)
        sc = np.stack(nz) if nz else np.empty((0, 0), dtype=np.int64)
        return cls._assemble(sc, vals, shape, fmt, "numpy", presorted=True)

    @classmethod
    def from_coo(cls, coords: Any, values: Any, shape: Sequence[int], format: FormatLike = "csf", *,
                 sum_duplicates: bool = True, name: str = "operand") -> Tensor:
        """A tensor from coordinates ``coords`` (an ``(ndim, nnz)`` int array) and ``values``.

        Entries may come in any order; they are sorted in the format's mode
        order and duplicates are summed (``sum_duplicates=False`` makes a
        duplicate an error).  The inputs are never modified.

        >>> import numpy as np
        >>> t = Tensor.from_coo([[1, 0, 1], [0, 2, 0], [3, 1, 3]], [1.0, 2.0, 4.0], (2, 3, 4))
        >>> t
        <spfuse.Tensor shape=(2, 3, 4) float64 csf nnz=2 index=int32>
        >>> t.coords.tolist(), t.values.tolist()
        ([[0, 1], [2, 0], [1, 3]], [2.0, 5.0])
        """
        shape = V.check_shape(shape, name)
        c = V.check_coords(coords, shape, name)
        vals = V.as_values(values, name)
        if vals.shape[0] != c.shape[1]:
            raise V.invalid(name, "coords and values have different lengths",
                            "one value per coordinate column (coords.shape[1] == len(values))",
                            f"coords.shape[1] == {c.shape[1]}, len(values) == {vals.shape[0]}")
        fmt = as_format(format, len(shape), default="csf")
        sc = c[list(fmt.mode_order)] if len(shape) else c
        return cls._assemble(sc.astype(np.int64, copy=False), vals, shape, fmt, None,
                             sum_duplicates=sum_duplicates, name=name)

    @classmethod
    def from_scipy(cls, m: Any, format: FormatLike | None = None, *, name: str = "operand") -> Tensor:
        """A tensor from a ``scipy.sparse`` array or matrix (any scipy format).

        Canonical CSR/CSC (sorted indices, no duplicates) with float32/float64
        data is wrapped **without copying** the values (index arrays are
        shared too unless they must change dtype to follow the index-dtype
        rule).  Non-canonical input is canonicalised on a copy; COO, BSR, LIL,
        DOK and DIA are converted (to CSR, or CSF when not 2-D).  The caller's
        arrays are never written.  ``origin`` records ``"sparray"`` or
        ``"spmatrix"``.  ``format`` converts afterwards.

        >>> import scipy.sparse as sp
        >>> m = sp.coo_matrix(([1.0, 2.0, 3.0], ([0, 0, 1], [1, 1, 0])), shape=(2, 2))
        >>> t = Tensor.from_scipy(m); t.format.name, t.origin, t.values.tolist()
        ('csr', 'spmatrix', [3.0, 3.0])
        """
        if not sp.issparse(m):
            raise V.wrong_type(name, "not a scipy.sparse object", "a scipy.sparse array or matrix",
                               type(m).__name__, "use Tensor.from_numpy for dense arrays, or as_tensor")
        origin = "sparray" if isinstance(m, sp.sparray) else "spmatrix"
        if format is None and m.format in ("csr", "csc") and len(m.shape) == 2:
            t = cls._fast_compressed(m, origin)
            if t is not None:
                return t
        shape = V.check_shape(m.shape, name)
        if len(shape) == 2 and m.format in ("csr", "csc"):
            t = cls._from_compressed(m.data, m.indices, m.indptr, shape, m.format, name, origin, slack=True)
        else:
            coo = m if m.format == "coo" else m.tocoo()
            coords = getattr(coo, "coords", None)
            if coords is None:  # very old scipy
                coords = (coo.row, coo.col)
            c = np.stack([np.asarray(x) for x in coords]) if len(coords) else np.empty((0, len(coo.data)), np.int64)
            t = cls.from_coo(c, coo.data, shape, "csr" if len(shape) == 2 else "csf", name=name)
            t.origin = origin
        if format is not None:
            t = t.asformat(format)
        return t

    @classmethod
    def from_csr(cls, data: Any, indices: Any, indptr: Any, shape: Sequence[int], *,
                 name: str = "operand") -> Tensor:
        """A CSR tensor from scipy-style ``(data, indices, indptr)`` arrays (validated).

        >>> Tensor.from_csr([5.0, 6.0], [2, 0], [0, 1, 2], (2, 3)).todense()
        array([[0., 0., 5.],
               [6., 0., 0.]])
        """
        return cls._from_compressed(data, indices, indptr, shape, "csr", name, None, slack=False)

    @classmethod
    def from_csc(cls, data: Any, indices: Any, indptr: Any, shape: Sequence[int], *,
                 name: str = "operand") -> Tensor:
        """A CSC tensor from scipy-style ``(data, indices, indptr)`` arrays (validated).

        >>> Tensor.from_csc([5.0, 6.0], [1, 0], [0, 1, 1, 2], (2, 3)).todense()
        array([[0., 0., 6.],
               [5., 0., 0.]])
        """
        return cls._from_compressed(data, indices, indptr, shape, "csc", name, None, slack=False)

    @classmethod
    def _from_compressed(cls, data: Any, indices: Any, indptr: Any, shape: Any, kind: str, name: str,
                         origin: str | None, slack: bool) -> Tensor:
        shape = V.check_shape(shape, name)
        if len(shape) != 2:
            raise V.invalid(name, f"{kind.upper()} arrays need a 2-d shape", "shape == (n_rows, n_cols)",
                            f"shape {shape}",
                            "for N-d sparse data use Tensor.from_coo(coords, values, shape, 'csf')")
        fmt = Format.csr() if kind == "csr" else Format.csc()
        nouter, ninner = fmt.storage_shape(shape)
        indptr = V.check_index_array(indptr, name, "indptr")
        indices = V.check_index_array(indices, name, "indices")
        data = np.asarray(data)
        dt = V.value_dtype(data.dtype, name)
        if data.ndim != 1:
            raise V.invalid(name, "data is not 1-D", "a 1-D array of values", f"an array with shape {data.shape}")
        if len(data) != len(indices):
            raise V.invalid(name, "data and indices have different lengths",
                            "len(data) == len(indices)",
                            f"len(data) == {len(data)}, len(indices) == {len(indices)}")
        canonical = V.check_compressed(indptr, indices, ninner, nouter, name, "indptr", "indices",
                                       exact_end=not slack)
        nnz = int(indptr[-1])
        if nnz != len(indices):  # scipy ignores entries past indptr[-1]
            indices = indices[:nnz]
            data = data[:nnz]
        values = np.ascontiguousarray(data, dtype=dt)
        if not canonical:
            outer = np.repeat(np.arange(nouter, dtype=np.int64), np.diff(indptr))
            sc = np.stack([outer, indices.astype(np.int64)])
            return cls._assemble(sc, values.copy(), shape, fmt, origin, name=name)
        levels = (DenseLevel(nouter), CompressedLevel(ninner, indptr, indices))
        return cls._trusted(shape, fmt, levels, values, origin)

    # -- attributes -----------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        """Extent of every mode, in mode order.

        >>> Tensor.from_numpy(np.zeros((2, 3))).shape
        (2, 3)
        """
        return self._shape

    @property
    def ndim(self) -> int:
        """Number of modes.

        >>> Tensor.from_numpy(np.zeros((2, 3, 4))).ndim
        3
        """
        return len(self._shape)

    @property
    def dtype(self) -> np.dtype:
        """Value dtype: float32 or float64.

        >>> Tensor.from_numpy(np.zeros(2, np.float32)).dtype
        dtype('float32')
        """
        return self._values.dtype

    @property
    def format(self) -> Format:
        """The storage :class:`~spfuse.formats.Format`.

        >>> Tensor.from_numpy(np.eye(2), "csc").format
        Format(levels=('dense', 'compressed'), mode_order=(1, 0))
        """
        return self._format

    @property
    def levels(self) -> tuple[Level, ...]:
        """Levels in storage order (read-only arrays).

        >>> Tensor.from_numpy(np.eye(2), "csr").levels
        (DenseLevel(size=2), CompressedLevel(size=2, nnz=2, index=int32))
        """
        return self._levels

    @property
    def values(self) -> np.ndarray:
        """Stored values, 1-D, C-contiguous, read-only; indexed by last-level positions.

        >>> Tensor.from_numpy([[0.0, 2.0], [3.0, 0.0]], "csr").values
        array([2., 3.])
        """
        return self._values

    @property
    def index_dtype(self) -> np.dtype:
        """int32 or int64, shared by every index array of this tensor.

        >>> Tensor.from_coo([[0], [2**31]], [1.0], (1, 2**31 + 1), "dcsr").index_dtype
        dtype('int64')
        """
        return self._index_dtype

    @property
    def nnz(self) -> int:
        """Number of stored entries (``len(values)``; dense levels store their zeros).

        >>> a = np.eye(3); Tensor.from_numpy(a, "csr").nnz, Tensor.from_numpy(a).nnz
        (3, 9)
        """
        return int(self._values.shape[0])

    @property
    def size(self) -> int:
        """Number of elements of the dense tensor (product of the shape).

        >>> Tensor.from_numpy(np.eye(3), "csr").size
        9
        """
        return math.prod(self._shape)

    @property
    def coords(self) -> np.ndarray:
        """``(ndim, nnz)`` coordinates of the stored entries, in *mode* order (computed, cached).

        >>> Tensor.from_numpy([[0, 1], [2, 0]], "csc").coords.tolist()
        [[1, 0], [0, 1]]
        """
        if self._coords is None:
            st = _walk_coords(self._levels, self._index_dtype)
            c = st[list(self._format.inverse_order)] if self.ndim else st
            self._coords = _readonly(np.ascontiguousarray(c))
        return self._coords

    def __repr__(self) -> str:
        return (f"<spfuse.Tensor shape={self._shape} {self.dtype} {self._format.name} "
                f"nnz={self.nnz} index={self._index_dtype}>")

    # -- conversions ----------------------------------------------------------
    def asformat(self, format: FormatLike) -> Tensor:
        """This tensor in another format (returns ``self`` when it already matches).

        Any conversion works, including mode-order permutations (CSR↔CSC,
        CSF permutations).  Converting away from a format whose last level is
        dense drops the zeros those dense levels stored.

        >>> import numpy as np
        >>> t = Tensor.from_numpy(np.eye(3))
        >>> t.asformat("csr"), t.asformat("csr").asformat("csc").format.name
        (<spfuse.Tensor shape=(3, 3) float64 csr nnz=3 index=int32>, 'csc')
        """
        fmt = as_format(format, self.ndim)
        if fmt == self._format:
            return self
        if fmt.is_dense:
            # a dense tensor is viewed in logical order, not copied first:
            # one transposed copy is the whole conversion
            arr = self._dense_view() if self._format.is_dense else self.todense()
            st = arr if fmt.is_identity_order else arr.transpose(fmt.mode_order)
            vals = np.ascontiguousarray(st).reshape(-1)
            return Tensor._trusted(self._shape, fmt, tuple(DenseLevel(s) for s in fmt.storage_shape(self._shape)),
                                   vals, self.origin)
        if self._format.is_dense:
            t = Tensor.from_numpy(self.todense(), fmt)
            t.origin = self.origin
            return t
        names = {self._format.name, fmt.name}
        if names == {"csr", "csc"}:
            # counting-sort transpose in scipy's C++ (O(nnz + n)), then wrap
            src = self._scipy_compressed(sp.csr_array if self._format.name == "csr" else sp.csc_array)
            dst = src.tocsc() if fmt.name == "csc" else src.tocsr()
            levels = (DenseLevel(fmt.storage_shape(self._shape)[0]),
                      CompressedLevel(fmt.storage_shape(self._shape)[1], dst.indptr, dst.indices))
            return Tensor._trusted(self._shape, fmt, levels, dst.data, self.origin)
        c = self.coords
        vals = self._values
        if self._format.levels[-1] == DENSE:
            keep = vals != 0
            c = c[:, keep]
            vals = vals[keep]
        sc = c[list(fmt.mode_order)].astype(np.int64)
        presorted = fmt.mode_order == self._format.mode_order  # walk order is lexicographic
        return Tensor._assemble(sc, np.array(vals), self._shape, fmt, self.origin, presorted=presorted)

    def astype(self, dtype: Any) -> Tensor:
        """Same pattern with values cast to ``dtype`` (float32 or float64).

        >>> Tensor.from_numpy([1.0, 2.0]).astype("float32").dtype
        dtype('float32')
        """
        dt = V.value_dtype(dtype)
        if dt == self.dtype:
            return self
        return Tensor._trusted(self._shape, self._format, self._levels, self._values.astype(dt), self.origin)

    def with_values(self, values: Any) -> Tensor:
        """Same shape, format and index arrays with new ``values`` (same length).

        >>> t = Tensor.from_numpy([[0.0, 2.0], [3.0, 0.0]], "csr")
        >>> t.with_values([10.0, 20.0]).todense().tolist()
        [[0.0, 10.0], [20.0, 0.0]]
        """
        vals = V.as_values(values, what="values")
        if vals.shape[0] != self.nnz:
            raise V.invalid("operand", "values has the wrong length", f"len(values) == {self.nnz}",
                            f"len(values) == {vals.shape[0]}")
        return Tensor._trusted(self._shape, self._format, self._levels, vals, self.origin)

    def _with_kernel_values(self, values: np.ndarray) -> Tensor:
        """``with_values`` for a kernel's fresh output: ``values`` is already a
        C-contiguous array of ``nnz`` entries of a value dtype, so nothing is
        checked or cast (the levels are this tensor's, already valid)."""
        obj = Tensor.__new__(Tensor)
        obj._shape, obj._format, obj._levels = self._shape, self._format, self._levels
        obj._values = _readonly(values)
        obj._index_dtype, obj._coords, obj.origin = self._index_dtype, None, None
        return obj

    def transpose(self, axes: Sequence[int] | None = None) -> Tensor:
        """Permute the modes without moving data (only the format's mode order changes).

        ``axes`` as in ``numpy.transpose`` (default: reverse). A CSR matrix
        transposes to a CSC matrix sharing the same arrays.

        >>> t = Tensor.from_numpy([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]], "csr").transpose()
        >>> t.format.name, t.shape, t.todense().tolist()
        ('csc', (3, 2), [[0.0, 2.0], [1.0, 0.0], [0.0, 0.0]])
        """
        axes = tuple(range(self.ndim))[::-1] if axes is None else tuple(int(a) for a in axes)
        if sorted(axes) != list(range(self.ndim)):
            raise ValueError(f"axes {axes} is not a permutation of range({self.ndim})")
        inv = [0] * self.ndim
        for new, old in enumerate(axes):
            inv[old] = new
        obj = Tensor.__new__(Tensor)
        obj._format = Format(self._format.levels, tuple(inv[m] for m in self._format.mode_order))
        obj._shape = tuple(self._shape[a] for a in axes)
        # the same arrays, index dtype included: never narrowed here (an
        # operand whose indices the kernel checks is not scanned yet)
        obj._levels, obj._values, obj._index_dtype = self._levels, self._values, self._index_dtype
        obj._coords = None
        obj.origin = self.origin
        return obj

    @property
    def T(self) -> Tensor:
        """``transpose()`` (all modes reversed).

        >>> Tensor.from_numpy(np.zeros((2, 5)), "csr").T.shape
        (5, 2)
        """
        return self.transpose()

    def copy(self) -> Tensor:
        """A deep copy (new arrays).

        >>> t = Tensor.from_numpy([[1.0, 0.0]], "csr"); c = t.copy()
        >>> np.shares_memory(c.values, t.values)
        False
        """
        levels = tuple(CompressedLevel(lev.size, lev.pos.copy(), lev.crd.copy()) if isinstance(lev, CompressedLevel)
                       else lev for lev in self._levels)
        return Tensor._trusted(self._shape, self._format, levels, self._values.copy(), self.origin)

    def _dense_view(self) -> np.ndarray:
        """A dense tensor's values as a (read-only) view in logical mode order."""
        st = self._values.reshape(self._format.storage_shape(self._shape))
        return st if self._format.is_identity_order else st.transpose(self._format.inverse_order)

    def todense(self) -> np.ndarray:
        """A new C-ordered numpy array with the tensor's values (fill 0).

        >>> Tensor.from_coo([[0, 2]], [1.0, 3.0], (4,)).todense()
        array([1., 0., 3., 0.])
        """
        if self._format.is_dense:
            return self._dense_view().copy(order="C")
        out = np.zeros(self._shape, dtype=self.dtype)
        if self.nnz:
            out[tuple(self.coords)] = self._values
        return out

    def __dask_tokenize__(self) -> tuple:
        """A deterministic token for Dask: equal contents give equal tokens (Dask hashes the arrays).

        >>> import numpy as np
        >>> t = Tensor.from_numpy(np.eye(2), "csr")
        >>> t.__dask_tokenize__()[:3]
        ('spfuse.Tensor', (2, 2), 'csr')
        """
        arrays = [a for lv in self._levels if isinstance(lv, CompressedLevel) for a in (lv.pos, lv.crd)]
        return ("spfuse.Tensor", self._shape, self._format.name, self._format.mode_order, self.origin,
                self._values, *arrays)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """``np.asarray(tensor)``: dense formats give a (read-only) view unless a copy is asked.

        Honours numpy 2's ``copy`` keyword: ``copy=False`` raises ``ValueError``
        when a copy cannot be avoided (sparse formats, dtype changes).

        >>> t = Tensor.from_numpy(np.eye(2))
        >>> np.shares_memory(np.asarray(t), t.values), np.array(t, copy=True).flags.writeable
        (True, True)
        """
        if self._format.is_dense:
            st = self._values.reshape(self._format.storage_shape(self._shape))
            view = st.transpose(self._format.inverse_order) if not self._format.is_identity_order else st
            if copy:
                return np.array(view, dtype=dtype, copy=True)
            if dtype is not None and np.dtype(dtype) != view.dtype:
                if copy is False:
                    raise ValueError("converting the dtype of a spfuse.Tensor requires a copy")
                return view.astype(dtype)
            return view
        if copy is False:
            raise ValueError(f"a {self._format.name} spfuse.Tensor cannot become a numpy array without a copy")
        out = self.todense()
        return out if dtype is None else out.astype(dtype, copy=False)

    # -- the numpy protocols ----------------------------------------------------
    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """numpy functions on a Tensor: ``np.einsum`` runs :func:`spfuse.einsum`; ``np.shape``,
        ``np.ndim``, ``np.size`` and ``np.transpose`` answer from the tensor; any other numpy
        function raises ``TypeError`` naming what to call instead (numpy's functions would
        otherwise densify a sparse tensor silently).

        >>> t = Tensor.from_numpy([[0.0, 2.0], [3.0, 0.0]], "csr")
        >>> np.einsum("ij,j->i", t, np.ones(2)), np.shape(t), np.transpose(t).format.name
        (array([2., 3.]), (2, 2), 'csc')
        >>> np.sum(t)
        Traceback (most recent call last):
          ...
        TypeError: numpy.sum is not implemented for spfuse.Tensor (it would densify the tensor silently)
          Hint: use spfuse.einsum / spfuse.evaluate (e.g. spfuse.evaluate("s = A[i,j]", A=t)), or densify \
explicitly: numpy.sum(t.todense(), ...)
        """
        if func is np.einsum:
            from spfuse.api import einsum
            return einsum(*args, **kwargs)
        if func in _ARRAY_FUNCTION_ATTRS and len(args) == 1 and not kwargs:
            return getattr(args[0], _ARRAY_FUNCTION_ATTRS[func])
        if func is np.transpose and isinstance(args[0], Tensor):
            return args[0].transpose(*args[1:], **kwargs)
        raise TypeError(f"numpy.{func.__name__} is not implemented for spfuse.Tensor (it would densify the tensor "
                        "silently)\n  Hint: use spfuse.einsum / spfuse.evaluate (e.g. spfuse.evaluate(\"s = A[i,j]\", "
                        f"A=t)), or densify explicitly: numpy.{func.__name__}(t.todense(), ...)")

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """numpy ufuncs (``np.add``, ``t * 2`` with an ndarray, ...) are refused with a ``TypeError``:
        element-wise arithmetic is written as a program, which keeps sparsity.

        >>> t = Tensor.from_numpy([[0.0, 2.0]], "csr")
        >>> np.exp(t)
        Traceback (most recent call last):
          ...
        TypeError: numpy ufunc exp is not implemented for spfuse.Tensor
          Hint: write it as a program, e.g. spfuse.evaluate("C[i,j] = exp(A[i,j])", A=t), or densify \
explicitly: numpy.exp(t.todense())
        """
        example = {"add": "A[i,j] + B[i,j]", "multiply": "A[i,j] * B[i,j]", "subtract": "A[i,j] - B[i,j]",
                   "divide": "A[i,j] / B[i,j]", "true_divide": "A[i,j] / B[i,j]"}.get(
            ufunc.__name__, f"{ufunc.__name__}(A[i,j])")
        raise TypeError(f"numpy ufunc {ufunc.__name__} is not implemented for spfuse.Tensor\n  Hint: write it as "
                        f"a program, e.g. spfuse.evaluate(\"C[i,j] = {example}\", A=t), or densify explicitly: "
                        f"numpy.{ufunc.__name__}(t.todense())")

    def _scipy_compressed(self, cls: Any) -> Any:
        rows = cast(CompressedLevel, self._levels[1])  # csr/csc: the second level is compressed
        data, indices, indptr = self._values, rows.crd, rows.pos
        attrs = _scipy_direct_attrs(cls)
        if attrs is None:
            m = cls((data, indices, indptr), shape=self._shape, copy=False)
            m.has_sorted_indices = True
            m.has_canonical_format = True
            return m
        m = cls.__new__(cls)
        m.__dict__.update(attrs, _shape=self._shape, data=data, indices=indices, indptr=indptr)
        return m

    def to_scipy(self, flavour: str | None = None) -> Any:
        """A scipy.sparse object: ``csr``/``csc`` formats share memory (zero-copy).

        ``flavour`` is ``"sparray"`` (``csr_array`` ...) or ``"spmatrix"``
        (``csr_matrix`` ...); by default the flavour the data came in with
        (``sparray`` when it did not come from scipy).  Matrices in other
        formats become CSR (row-major mode order) or CSC (column-major);
        1-D tensors become a 1-D ``coo_array``.

        >>> t = Tensor.from_numpy([[0.0, 1.0], [2.0, 0.0]], "csc")
        >>> type(t.to_scipy()).__name__, type(t.to_scipy("spmatrix")).__name__
        ('csc_array', 'csc_matrix')
        """
        if flavour is None:
            flavour = self.origin if self.origin in ("sparray", "spmatrix") else "sparray"
        if flavour not in ("sparray", "spmatrix"):
            raise ValueError(f"flavour must be 'sparray' or 'spmatrix', got {flavour!r}")
        if self.ndim == 1:
            if flavour == "spmatrix":
                raise ValueError("scipy sparse matrices are 2-d; use flavour='sparray' for a 1-d tensor")
            t = self.asformat("csf")
            coords = cast(CompressedLevel, t.levels[0]).crd  # 1-d csf: one compressed level
            return sp.coo_array((np.array(t.values), (np.array(coords),)), shape=self._shape)
        if self.ndim != 2:
            raise ValueError(f"scipy.sparse holds 2-d matrices; this tensor has shape {self._shape}\n"
                             "  Hint: use .todense() or keep it as a spfuse.Tensor")
        name = self._format.name
        if name not in ("csr", "csc"):
            name = "csc" if self._format.mode_order == (1, 0) else "csr"
        t = self.asformat(name)
        if flavour == "sparray":
            cls = sp.csr_array if name == "csr" else sp.csc_array
        else:
            cls = sp.csr_matrix if name == "csr" else sp.csc_matrix
        return t._scipy_compressed(cls)


#: numpy functions a Tensor answers from its own attributes
_ARRAY_FUNCTION_ATTRS = {np.shape: "shape", np.ndim: "ndim", np.size: "size"}


@functools.cache
def _scipy_direct_attrs(cls: Any) -> dict | None:
    """The instance attributes a canonical ``cls`` (scipy CSR/CSC) object
    holds besides its shape and arrays, or None when this scipy stores
    anything else.

    scipy's constructor re-derives the index dtype (an O(nnz) min/max of
    int64 arrays) and re-checks the arrays: tens of microseconds that a
    kernel's result, valid and canonical by construction, need not pay.  The
    shortcut fills ``__dict__`` exactly as the constructor does, which is
    verified once per class on a small example; any difference (another
    scipy version) falls back to the constructor.
    """
    arrays = (np.ones(2), np.array([0, 1], np.int32), np.array([0, 1, 2], np.int32))
    ref = cls(arrays, shape=(2, 2), copy=False)
    ref.has_sorted_indices = True
    ref.has_canonical_format = True
    attrs = {k: v for k, v in vars(ref).items() if k not in ("_shape", "data", "indices", "indptr")}
    if set(vars(ref)) != {"_shape", "data", "indices", "indptr", *attrs} or not all(
            isinstance(v, (bool, int)) for v in attrs.values()):
        return None
    m = cls.__new__(cls)
    m.__dict__.update(attrs, _shape=(2, 2), data=arrays[0], indices=arrays[1], indptr=arrays[2])
    try:
        same = (vars(m).keys() == vars(ref).keys() and m.format == ref.format and m.nnz == 2
                and (m != ref).nnz == 0 and m.has_canonical_format)
    except Exception:  # noqa: BLE001 - any surprise means: use the constructor
        return None
    return attrs if same else None


def as_tensor(obj: Any, name: str = "operand", format: FormatLike | None = None) -> Tensor:
    """The engine's single entry point: anything an operand may be → a validated canonical Tensor.

    Accepts a :class:`Tensor`, a ``scipy.sparse`` array/matrix (N-d
    ``coo_array`` too), a pydata ``sparse`` COO/GCXS array, a numpy array, a
    Python/numpy scalar or nested lists.  ``format`` converts the
    result; errors name the operand.

    >>> import numpy as np, scipy.sparse as sp
    >>> as_tensor(2.5)
    <spfuse.Tensor shape=() float64 dense nnz=1 index=int32>
    >>> as_tensor(sp.eye(3, format="csc"), format="csr").format.name
    'csr'
    >>> as_tensor("abc", name="B")
    Traceback (most recent call last):
      ...
    spfuse.errors.OperandTypeError: operand 'B': unsupported operand type
      expected: a numpy array, scipy.sparse array/matrix, spfuse.Tensor or real scalar
      got: str
    """
    if isinstance(obj, Tensor):
        t = obj
    elif type(obj) is np.ndarray and (fast := Tensor._fast_dense(obj)) is not None:
        t = fast
    elif sp.issparse(obj):
        t = Tensor.from_scipy(obj, name=name)
    elif is_pydata(obj):
        t = from_pydata(obj, name=name)
    elif obj is None or isinstance(obj, (str, bytes, dict, set)):
        raise V.wrong_type(name, "unsupported operand type",
                           "a numpy array, scipy.sparse array/matrix, spfuse.Tensor or real scalar",
                           type(obj).__name__)
    else:
        try:
            arr = np.asarray(obj)
        except (TypeError, ValueError) as exc:
            raise V.wrong_type(name, "unsupported operand type",
                               "a numpy array, scipy.sparse array/matrix, spfuse.Tensor or real scalar",
                               f"{type(obj).__name__} ({exc})") from None
        t = Tensor.from_numpy(arr, name=name)
    if format is not None:
        t = t.asformat(format)
    return t


def same_pattern(a: Tensor, b: Tensor) -> bool:
    """Do two CSR (or two CSC) tensors store the same coordinates, in the
    same order?  The index arrays themselves first (an operand and a value
    array made on its pattern share them), then their contents.  Any other
    format: False.

    >>> import scipy.sparse as sp
    >>> A = as_tensor(sp.csr_array(np.eye(3)))
    >>> same_pattern(A, A.with_values(A.values * 2)), same_pattern(A, as_tensor(sp.csr_array(np.ones((3, 3)))))
    (True, False)
    """
    if a.shape != b.shape or a.nnz != b.nnz or a.format != b.format or a.format.levels != (DENSE, COMPRESSED):
        return False
    la, lb = cast(CompressedLevel, a.levels[1]), cast(CompressedLevel, b.levels[1])
    return (la.pos is lb.pos or np.array_equal(la.pos, lb.pos)) and (
        la.crd is lb.crd or np.array_equal(la.crd, lb.crd))


def shared_patterns(tensors: Mapping[str, Tensor]) -> tuple[tuple[str, str], ...]:
    """``(name, first)`` for each CSR operand storing the same pattern as an
    earlier one, ``first`` (the earliest such): what a plan may rely on when
    it runs several sparse operands as one pattern's value arrays (a
    gradient's cotangent and the operand it lives on).  It costs a pass over
    the index arrays only when two operands have the same shape and number
    of entries but not the same index arrays.

    >>> import scipy.sparse as sp
    >>> A = as_tensor(sp.csr_array(np.eye(3)))
    >>> shared_patterns({"A": A, "x": as_tensor(np.ones(3)), "G": A.with_values(A.values + 1)})
    (('G', 'A'),)
    """
    csr_format = Format.csr()
    csr = [(n, t) for n, t in tensors.items() if t._format == csr_format]   # (per call: kept cheap)
    if len(csr) < 2:
        return ()
    out: list[tuple[str, str]] = []
    # operands compared only within a bucket of equal shapes, entry counts and
    # a few sampled coordinates: n operands of one shape and size but other
    # patterns cost n fingerprints, not n^2/2 comparisons (SpAdd-7: 70 us a call)
    firsts: dict[tuple, list[tuple[str, Tensor]]] = {}
    for name, t in csr:
        bucket = firsts.setdefault(_fingerprint(t), [])
        first = next((f for f, ft in bucket if same_pattern(ft, t)), None)
        if first is None:
            bucket.append((name, t))
        else:
            out.append((name, first))
    return tuple(out)


def _fingerprint(t: Tensor) -> tuple:
    """Equal for two CSR tensors storing one pattern (their shape, entry
    count and the column indices at three fixed positions); different
    patterns almost always differ here."""
    crd = cast(CompressedLevel, t.levels[1]).crd
    n = len(crd)
    return (t._shape, n) if n == 0 else (t._shape, n, int(crd[n >> 2]), int(crd[n >> 1]), int(crd[n - 1]))


def values_at(result: Any, coords: np.ndarray, shape: tuple) -> np.ndarray:
    """The values of ``result`` at the ``(ndim, n)`` coordinates ``coords``
    (any order, repeats allowed); zero where a sparse ``result`` stores nothing.

    >>> import scipy.sparse as sp
    >>> values_at(sp.csr_array([[0.0, 2.0], [3.0, 0.0]]), np.array([[1, 0, 0], [0, 0, 1]]), (2, 2))
    array([3., 0., 2.])
    """
    t = as_tensor(result, name="values")
    coords = np.asarray(coords)
    if t.format.is_dense:
        dense = t.todense()
        return np.ascontiguousarray(dense[tuple(coords)]) if len(shape) else dense.reshape(1)
    want = np.ravel_multi_index(tuple(coords.astype(np.int64)), shape)
    have = np.ravel_multi_index(tuple(t.coords.astype(np.int64)), shape)
    out = np.zeros(len(want), dtype=t.values.dtype)
    if not len(have):
        return out
    order = np.argsort(have, kind="stable")
    have_sorted = have[order]
    at = np.minimum(np.searchsorted(have_sorted, want), len(have_sorted) - 1)
    found = have_sorted[at] == want
    out[found] = t.values[order[at[found]]]
    return out
