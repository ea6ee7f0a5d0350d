"""Operands in another layout: a sparse matrix's transposed CSR, its pattern
remembered across calls; a dense matrix's transposed copy, shared by the
kernels of one call (:class:`SharedCopies`).

An adjoint reads a sparse matrix whose rows are summed as the CSR of its
transpose (``A_T``, see :mod:`spfuse.autodiff.transform`), and a template
group reads ``G[i,j]`` summed over ``i`` as SpMM with ``Gᵀ``
(:mod:`spfuse.lowering.groups`).  A training loop
calls the backward pass with the same pattern every epoch, often with new
values, so the transposition's index work -- the counting sort -- is done
once per pattern: what is remembered is the transposed pattern and the
permutation taking the matrix's values to the transpose's storage order.
Each call then costs one gather of the values.

A cache entry holds *copies* of the pattern it was built from, never the
caller's arrays (nothing kept across calls keeps an operand alive), and a hit compares
the current pattern with them, so an index array changed in place is never
served a stale transpose.

>>> import numpy as np, scipy.sparse as sp
>>> from spfuse.tensor import as_tensor
>>> A = as_tensor(sp.csr_array(np.array([[0.0, 1.0], [2.0, 3.0]])))
>>> transposed_csr(A).todense().tolist()
[[0.0, 2.0], [1.0, 3.0]]
"""
from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from spfuse._kernels._dense_kernels import gather
from spfuse._kernels._result_pool import empty as _result
from spfuse.formats import Format
from spfuse.tensor import CompressedLevel, DenseLevel, Tensor
from spfuse.threads import threads_for_call

__all__ = ["transposed_csr", "stored_as", "clear", "cache_size", "SharedCopies", "shared_copy", "shared_layout_copy",
           "sharing_copies"]

_CSR = Format.csr()

#: patterns remembered (least recently used dropped first)
MAX_PATTERNS = 16

#: a pattern of at most this many entries also remembers the last values it
#: transposed: a call with the same values (compared bit for bit, in order:
#: a sequential pass) reuses their transpose instead of gathering them in
#: the transpose's order (a random pass: 20000 rows, 200k entries, 1.2 ms of
#: a 4.3 ms Aᵀ·X call)
KEEP_VALUES_MAX = 1 << 22


@dataclass(frozen=True)
class _Transposed:
    pos: np.ndarray        # copies of the source pattern (CSR)
    crd: np.ndarray
    t_pos: np.ndarray      # the transpose's pattern (CSR of Aᵀ)
    t_crd: np.ndarray
    order: np.ndarray      # source value positions in the transpose's storage order
    shell: Tensor          # the transpose (its values a placeholder): each call only swaps in values
    #: ``[(source values copied, their transpose read-only)]`` of the last call, when at most
    #: :data:`KEEP_VALUES_MAX` entries: a training loop transposes the same matrix every epoch
    last: list = field(default_factory=list, compare=False)


_cache: OrderedDict = OrderedDict()
_lock = threading.Lock()


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


#: below this many bytes two index arrays are compared as bytes (one memcmp
#: on small copies: 0.4 us where ``np.array_equal`` takes 3-5 us per call --
#: a training loop's backward pass compares its small patterns every epoch)
_BYTES_COMPARE = 1 << 16

#: a compressed level's ``pos`` of at most this many bytes keys the cache by
#: its contents (a few hundred bytes copied cost less than reading the
#: array's address, ~3 us through ``__array_interface__``); a longer one by
#: its address
_KEY_BY_CONTENT = 4096


def _same_array(kept: np.ndarray, a: np.ndarray) -> bool:
    """Does ``a`` hold exactly ``kept``'s bits (a cache's copy, same dtype;
    a NaN equal to itself, -0.0 not to 0.0)?  (``tobytes`` gives the
    logical order's bytes, for any strides; a view as integers of the same
    size compares floats bit for bit.)"""
    if kept.shape != a.shape or kept.dtype != a.dtype:
        return False
    if a.nbytes <= _BYTES_COMPARE:
        return kept.tobytes() == a.tobytes()
    as_int = np.dtype(f"i{a.dtype.itemsize}")
    k, v = kept.view(as_int), a.view(as_int)
    if a.ndim == 1 and (k[0] != v[0] or k[-1] != v[-1] or k[len(k) // 2] != v[len(v) // 2]):
        return False   # (values new every call -- a backward pass's -- differ at once: no full pass)
    return bool(np.array_equal(k, v))


def _pattern_key(pos: np.ndarray) -> Any:
    """What tells one pattern's ``pos`` from another's of the same shape,
    dtype and nnz in a cache key: its bytes when short, else its address
    (the arrays themselves are compared on a hit either way)."""
    return pos.tobytes() if pos.nbytes <= _KEY_BY_CONTENT else _address(pos)


def _build(pos: np.ndarray, crd: np.ndarray, shape: tuple[int, int]) -> _Transposed:
    nnz = len(crd)
    ranks = sp.csr_array((np.arange(nnz, dtype=np.int64), crd, pos), shape=shape).tocsc()
    idx = crd.dtype
    rows, cols = shape
    t_pos, t_crd = ranks.indptr.astype(idx, copy=False), ranks.indices.astype(idx, copy=False)
    levels = (DenseLevel(cols), CompressedLevel(rows, t_pos, t_crd))
    shell = Tensor._trusted((cols, rows), Format.csr(), levels, np.zeros(nnz))
    return _Transposed(pos.copy(), crd.copy(), t_pos, t_crd, ranks.data, shell)


def transposed_csr(t: Tensor, num_threads: int | None = None) -> Tensor:
    """``t``'s transpose stored as CSR (values in its storage order).

    A CSR ``t`` is transposed through the remembered pattern (see the module
    docstring); any other 2-D format is converted directly (a CSC matrix's
    transpose *is* a CSR one, sharing its arrays).  ``num_threads``: the
    team that gathers the values (None: the setting of :mod:`spfuse.threads`).

    >>> import numpy as np
    >>> t = Tensor.from_numpy(np.array([[1.0, 0.0, 2.0]]), "csr")
    >>> tt = transposed_csr(t); tt.format.name, tt.shape, tt.values.tolist()
    ('csr', (3, 1), [1.0, 2.0])
    """
    if len(t._shape) != 2:
        raise ValueError(f"transposed_csr needs a matrix, got a {t.ndim}-d tensor")
    if t._format is not _CSR and t._format != _CSR:
        return t.transpose().asformat("csr")
    level = t.levels[1]
    assert isinstance(level, CompressedLevel)  # CSR
    pos, crd = level.pos, level.crd
    rows, cols = t.shape
    key = ((rows, cols), pos.dtype, len(crd), _pattern_key(pos))
    with _lock:
        found = _cache.get(key)
        if found is not None:
            _cache.move_to_end(key)
    if found is None or not (_same_array(found.pos, pos) and _same_array(found.crd, crd)):
        found = _build(pos, crd, (rows, cols))
        with _lock:
            _cache[key] = found
            _cache.move_to_end(key)
            while len(_cache) > MAX_PATTERNS:
                _cache.popitem(last=False)
    out = found.shell._with_kernel_values(_transposed_values(found, t.values, num_threads))
    out.origin = t.origin
    return out


def _transposed_values(found: _Transposed, values: np.ndarray, num_threads: int | None = None) -> np.ndarray:
    """``values`` in the transpose's storage order: the last call's when
    they are the same bits, else a gather (C-contiguous, ``values``' dtype)."""
    last = found.last[0] if found.last else None   # (one read: the pair is replaced whole)
    if last is not None and _same_array(last[0], values):
        return last[1]
    # (both arrays from the result pool: a backward pass's values change every
    # call, and fresh pages for them cost a fault per 4 KiB each time)
    gathered = _gathered(values, found.order, num_threads)
    if len(values) <= KEEP_VALUES_MAX:
        gathered.flags.writeable = False   # (shared by later calls' transposes)
        kept = _result(values.shape, values.dtype)
        np.copyto(kept, values)
        found.last[:] = [(kept, gathered)]
    return gathered


@dataclass(frozen=True)
class _Reordered:
    arrays: tuple          # copies of the source's index arrays (pos and crd of each compressed level)
    order: np.ndarray      # source value positions in the result's storage order
    shell: Tensor          # the result (its values a placeholder): each call only swaps in values


_reordered: OrderedDict = OrderedDict()


def _index_arrays(t: Tensor) -> tuple:
    return tuple(a for lv in t.levels if isinstance(lv, CompressedLevel) for a in (lv.pos, lv.crd))


def stored_as(t: Tensor, fmt: Format, num_threads: int | None = None) -> Tensor:
    """``t`` stored as ``fmt``: the same entries in another storage order (a
    CSF read in another mode order, CSR as CSC), for one call.

    As for :func:`transposed_csr`, the reordering is remembered per pattern:
    the first call converts (a sort), later calls with the same index arrays
    gather the values (on ``num_threads``, as there).  A conversion that
    stores another number of entries (to or from dense levels) is made
    directly.

    >>> t = Tensor.from_numpy(np.arange(8.0).reshape(2, 2, 2), "csf")
    >>> u = stored_as(t, Format(("compressed",) * 3, (2, 0, 1)))
    >>> u.format.mode_order, np.array_equal(u.todense(), t.todense())
    ((2, 0, 1), True)
    """
    if t.format == fmt:
        return t
    if fmt == Format.csc() and t.format == Format.csr():
        return transposed_csr(t, num_threads).transpose()
    nnz = len(t.values)
    if t.format.is_dense or fmt.is_dense or "dense" in t.format.levels[1:] or "dense" in fmt.levels[1:]:
        return t.asformat(fmt)
    arrays = _index_arrays(t)
    key = (t.shape, t.format, fmt, nnz, tuple(_pattern_key(a) for a in arrays))
    with _lock:
        found = _reordered.get(key)
        if found is not None:
            _reordered.move_to_end(key)
    if found is None or not all(_same_array(a, b) for a, b in zip(found.arrays, arrays, strict=True)):
        ranks = t.with_values(np.arange(1, nnz + 1, dtype=np.float64))  # (from 1: no stored zero to drop)
        shell = ranks.asformat(fmt)
        if len(shell.values) != nnz:   # pragma: no cover - a conversion keeping every entry, by the test above
            return t.asformat(fmt)
        found = _Reordered(tuple(a.copy() for a in arrays), shell.values.astype(np.int64) - 1, shell)
        with _lock:
            _reordered[key] = found
            _reordered.move_to_end(key)
            while len(_reordered) > MAX_PATTERNS:
                _reordered.popitem(last=False)
    out = found.shell._with_kernel_values(_gathered(t.values, found.order, num_threads))
    out.origin = t.origin
    return out


#: a gather of at least this many values runs on the call's team
GATHER_TEAM_MIN = 1 << 16


def _gathered(values: np.ndarray, order: np.ndarray, num_threads: int | None = None) -> np.ndarray:
    """``values[order]`` (``order`` a permutation this module built) into
    pooled memory, on the call's team (``num_threads``, None: the setting of
    :mod:`spfuse.threads`) when long: a random read per value, 7 ms per
    million on one thread (two CSR operands of an ``Aᵀ·X + Wᵀ·G`` read as
    CSC every call).

    >>> _gathered(np.array([1.0, 2.0, 3.0]), np.array([2, 0, 1], dtype=np.int64)).tolist()
    [3.0, 1.0, 2.0]
    """
    out = _result(values.shape, values.dtype)
    gather(values, order, out, threads_for_call(num_threads, worthwhile=len(order) >= GATHER_TEAM_MIN))
    return out


class SharedCopies:
    """``with SharedCopies():`` -- until the outermost such block of this
    thread ends, a dense operand copied into another layout (a matrix read
    transposed) is copied once and shared by every kernel reading it so
    (:func:`shared_copy`).

    A gradient runs several kernels on the same operands: SDDMM-div's
    recomputed ``C·D`` and ``grad_C`` both read ``D`` (K x n) transposed,
    GNN-2's three SDDMM/SpMM statements all read ``Yᵀ``; each made its own
    copy (5 MB, about 1 ms each at 20000 x 32).  The copies live only as
    long as the block: nothing is remembered across calls, where an
    operand's values may change.

    >>> with SharedCopies():
    ...     a = np.ones((2, 3))
    ...     shared_copy(a, "T", lambda: a.T.copy()) is shared_copy(a, "T", lambda: a.T.copy())
    True
    """

    __slots__ = ("_outer",)

    def __enter__(self) -> SharedCopies:
        self._outer = getattr(_copies, "memo", None)
        if self._outer is None:
            _copies.memo = {}
        return self

    def __exit__(self, *exc: object) -> None:
        if self._outer is None:
            _copies.memo = None


_copies = threading.local()


def shared_copy(source: np.ndarray, how: Any, make: Any) -> np.ndarray:
    """``make()``, a kernel's read-only copy of ``source`` in the layout
    ``how`` names, made once per :class:`SharedCopies` block (outside one:
    made every time).  The block keeps ``source`` alive, so its identity
    cannot be taken by another array meanwhile.

    >>> a = np.arange(6.0).reshape(2, 3)
    >>> shared_copy(a, "T", lambda: np.ascontiguousarray(a.T)).shape
    (3, 2)
    """
    memo = getattr(_copies, "memo", None)
    if memo is None:
        return make()
    key = (id(source), how)
    found = memo.get(key)
    if found is None:
        found = memo[key] = (source, make())
    return found[1]


def shared_layout_copy(view: np.ndarray, make: Any) -> np.ndarray:
    """``make()``, a kernel's read-only copy of ``view``, made once per
    :class:`SharedCopies` block for each memory layout: the copies of two
    views of the same memory with the same shape and strides are one.  The
    same values reached two ways share it -- GNN-2's ``Y`` read transposed
    and ``Yt = Y.T`` passed as an operand of its own (each copied, its rows
    then gathered from two arrays).  The block keeps ``view`` alive, so its
    memory cannot be taken by another array meanwhile.

    >>> a = np.arange(6.0).reshape(2, 3)
    >>> with SharedCopies():
    ...     shared_layout_copy(a.T, lambda: a.T.copy()) is shared_layout_copy(a[:, :].T, lambda: a.T.copy())
    True
    """
    memo = getattr(_copies, "memo", None)
    if memo is None:
        return make()
    key = ("layout", view.__array_interface__["data"][0], view.shape, view.strides, view.dtype.str)
    found = memo.get(key)
    if found is None:
        found = memo[key] = (view, make())
    return found[1]


def sharing_copies(fn: Any) -> Any:
    """``fn`` run inside a :class:`SharedCopies` block (a decorator).

    >>> @sharing_copies
    ... def twice(a):
    ...     return shared_copy(a, "T", lambda: a.T.copy()) is shared_copy(a, "T", lambda: a.T.copy())
    >>> twice(np.ones((2, 2)))
    True
    """
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with SharedCopies():
            return fn(*args, **kwargs)
    return run


def clear() -> None:
    """Forget every remembered pattern.

    >>> clear(); cache_size()
    0
    """
    with _lock:
        _cache.clear()
        _reordered.clear()


def cache_size() -> int:
    """How many patterns are remembered.

    >>> isinstance(cache_size(), int)
    True
    """
    return len(_cache) + len(_reordered)
