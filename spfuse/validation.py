"""Operand validation: one module, two price levels (like scipy's ``check_format``).

* **O(1)** checks run on everything: shapes are non-negative ints whose
  product fits int64, arrays have the right number of dimensions and lengths,
  index arrays are integral, values are real floating point (integers and
  booleans are promoted to float64; complex, object and string dtypes are
  refused).
* **O(nnz)** checks run on every array that did not come from spfuse's own
  constructors: ``pos[0] == 0``, ``pos`` non-decreasing, ``pos[-1]`` equal to
  the number of coordinates, coordinates inside ``[0, size)``; whether the
  coordinates are sorted and unique within every segment is *reported* (the
  caller canonicalises on a copy) rather than refused.

Every problem raises :class:`~spfuse.errors.InvalidOperandError` (a
``ValueError``) or, for an unusable dtype, :class:`~spfuse.errors.OperandTypeError`
(a ``TypeError``), with a message naming the operand and saying what was
expected, what was found, and what to do.  NaN and infinite *values* are
ordinary data (IEEE semantics, as in numpy) and are never an error.

>>> import numpy as np
>>> check_compressed(np.array([0, 2, 3]), np.array([0, 4, 1]), size=5,
...                  parent_positions=2, name="B")
True
>>> check_compressed(np.array([0, 2, 1]), np.array([0, 4]), size=5,
...                  parent_positions=2, name="B")
Traceback (most recent call last):
  ...
spfuse.errors.InvalidOperandError: operand 'B': pos is not monotone non-decreasing
  expected: pos[k] <= pos[k+1] for every k
  got: pos[1] = 2 > pos[2] = 1
  Hint: pos (indptr) holds cumulative counts of stored entries per parent position
"""
from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from spfuse.errors import InvalidOperandError, OperandTypeError

__all__ = [
    "INT32_MAX", "INT64_MAX", "VALUE_DTYPES", "INDEX_DTYPES", "scan_status", "pos_monotone",
    "operand_label", "invalid", "wrong_type",
    "check_shape", "value_dtype", "as_values", "check_index_array",
    "index_dtype_for", "check_compressed", "check_coords",
]

INT32_MAX = int(np.iinfo(np.int32).max)
INT64_MAX = int(np.iinfo(np.int64).max)
#: Value dtypes stored as they are; everything numeric-real else is converted.
VALUE_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: Index dtypes a Tensor may carry.
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


def operand_label(name: str) -> str:
    """How messages refer to an operand.

    >>> operand_label("B"), operand_label("operand")
    ("operand 'B'", 'operand')
    """
    return "operand" if name == "operand" else f"operand {name!r}"


def _message(name: str, problem: str, expected: str, got: str, hint: str | None) -> str:
    text = f"{operand_label(name)}: {problem}\n  expected: {expected}\n  got: {got}"
    if hint:
        text += f"\n  Hint: {hint}"
    return text


def invalid(name: str, problem: str, expected: str, got: str, hint: str | None = None) -> InvalidOperandError:
    """Build (not raise) an :class:`InvalidOperandError` in the house style.

    >>> print(invalid("A", "bad thing", "good thing", "bad thing", "fix it"))
    operand 'A': bad thing
      expected: good thing
      got: bad thing
      Hint: fix it
    """
    return InvalidOperandError(_message(name, problem, expected, got, hint))


def wrong_type(name: str, problem: str, expected: str, got: str, hint: str | None = None) -> OperandTypeError:
    """Build (not raise) an :class:`OperandTypeError` in the house style.

    >>> isinstance(wrong_type("A", "p", "e", "g"), TypeError)
    True
    """
    return OperandTypeError(_message(name, problem, expected, got, hint))


# --------------------------------------------------------------------------- O(1)
def check_shape(shape: Any, name: str = "operand") -> tuple[int, ...]:
    """Validate a shape: a sequence of non-negative ints whose product fits int64.

    >>> check_shape((3, np.int64(4)))
    (3, 4)
    >>> check_shape((2**40, 2**40), name="X")
    Traceback (most recent call last):
      ...
    spfuse.errors.InvalidOperandError: operand 'X': shape is too large
      expected: a shape whose number of elements fits in int64 (<= 9223372036854775807)
      got: shape (1099511627776, 1099511627776) with 1208925819614629174706176 elements
      Hint: spfuse linearises coordinates into int64 keys; split the tensor
    """
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)):
        shape = (shape,)
    try:
        items = tuple(shape)
    except TypeError:
        raise wrong_type(name, "shape is not a sequence", "a tuple of non-negative ints",
                         repr(shape)) from None
    dims = []
    for d in items:
        if isinstance(d, (bool, np.bool_)):
            raise wrong_type(name, "shape holds a bool", "a tuple of non-negative ints", repr(items))
        try:
            v = operator.index(d)
        except TypeError:
            raise wrong_type(name, "shape holds a non-integer", "a tuple of non-negative ints",
                             f"shape {items!r} ({type(d).__name__} entry)") from None
        if v < 0:
            raise invalid(name, "shape has a negative extent", "a tuple of non-negative ints",
                          f"shape {items!r}")
        dims.append(v)
    total = 1
    for v in dims:
        total *= v
    if total > INT64_MAX:
        raise invalid(name, "shape is too large",
                      f"a shape whose number of elements fits in int64 (<= {INT64_MAX})",
                      f"shape {tuple(dims)} with {total} elements",
                      "spfuse linearises coordinates into int64 keys; split the tensor")
    return tuple(dims)


def value_dtype(dtype: Any, name: str = "operand") -> np.dtype:
    """The value dtype a Tensor stores for input ``dtype``.

    float32/float64 are kept (in native byte order: ``>f8`` becomes
    ``float64``), float16 becomes float32, integers and booleans become
    float64; complex, object, string and other dtypes are refused.

    >>> value_dtype(np.int32), value_dtype(np.float32), value_dtype(bool)
    (dtype('float64'), dtype('float32'), dtype('float64'))
    >>> value_dtype(">f4")
    dtype('float32')
    >>> value_dtype(np.complex128, name="B")
    Traceback (most recent call last):
      ...
    spfuse.errors.OperandTypeError: operand 'B': unsupported value dtype
      expected: real numbers (float32 or float64; ints and bools are converted to float64)
      got: complex128
      Hint: spfuse computes in real arithmetic; pass a.real / a.imag separately
    """
    dt = np.dtype(dtype)
    if dt in VALUE_DTYPES:
        return dt
    if not dt.isnative and dt.kind in "biuf":  # big-endian data on a little-endian machine (or vice versa)
        dt = dt.newbyteorder("=")
        if dt in VALUE_DTYPES:
            return dt
    if dt == np.float16:
        return np.dtype(np.float32)
    if dt.kind in "biu":
        return np.dtype(np.float64)
    hint = {"c": "spfuse computes in real arithmetic; pass a.real / a.imag separately",
            "O": "convert to a numeric array first, e.g. np.asarray(x, dtype=float)",
            "U": "strings are not numbers; parse them first",
            "S": "strings are not numbers; parse them first",
            "f": "cast to float64 explicitly (a.astype(np.float64)) if the precision loss is acceptable",
            }.get(dt.kind)
    raise wrong_type(name, "unsupported value dtype",
                     "real numbers (float32 or float64; ints and bools are converted to float64)",
                     str(dt), hint)


def as_values(values: Any, name: str = "operand", what: str = "values") -> np.ndarray:
    """``values`` as a 1-D C-contiguous float32/float64 array (copy only if needed).

    >>> as_values([1, 2]).dtype
    dtype('float64')
    >>> v = np.arange(4.0)[::2]; as_values(v).flags.c_contiguous
    True
    """
    arr = np.asarray(values)
    target = value_dtype(arr.dtype, name)
    if arr.ndim != 1:
        raise invalid(name, f"{what} is not 1-D", f"a 1-D array of {what}",
                      f"an array with shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=target)


def check_index_array(arr: Any, name: str = "operand", what: str = "indices") -> np.ndarray:
    """An index array: 1-D, integral dtype, C-contiguous (copied only if not).

    The dtype is *not* changed here (range checks must see the original
    values first); see :func:`index_dtype_for`.

    >>> check_index_array(np.array([1, 2], dtype=np.int16)).dtype
    dtype('int16')
    >>> check_index_array(np.array([0.0, 1.0]), name="B", what="indices")
    Traceback (most recent call last):
      ...
    spfuse.errors.OperandTypeError: operand 'B': indices are not integers
      expected: an integer array (int32 or int64)
      got: float64 array
      Hint: cast with .astype(np.int64) after checking the values are whole numbers
    """
    a = np.asarray(arr)
    if a.dtype.kind not in "iu":
        raise wrong_type(name, f"{what} are not integers", "an integer array (int32 or int64)",
                         f"{a.dtype} array",
                         "cast with .astype(np.int64) after checking the values are whole numbers")
    if a.ndim != 1:
        raise invalid(name, f"{what} is not 1-D", f"a 1-D array of {what}",
                      f"an array with shape {a.shape}")
    return np.ascontiguousarray(a)


def index_dtype_for(*counts: int) -> np.dtype:
    """int32 when every size / count fits in int32, else int64.

    >>> index_dtype_for(10, 2**31 - 1), index_dtype_for(5, 2**31)
    (dtype('int32'), dtype('int64'))
    """
    return np.dtype(np.int32) if max(counts, default=0) <= INT32_MAX else np.dtype(np.int64)


# --------------------------------------------------------------------------- O(nnz)
def check_compressed(pos: np.ndarray, crd: np.ndarray, size: int, parent_positions: int,
                     name: str = "operand", pos_name: str = "pos", crd_name: str = "crd",
                     exact_end: bool = True) -> bool:
    """Check one compressed level; return whether it is canonical.

    ``pos`` must have ``parent_positions + 1`` entries, start at 0, never
    decrease and end at ``len(crd)`` (or at most ``len(crd)`` when
    ``exact_end`` is false, scipy's convention of ignoring trailing slack);
    every coordinate in ``crd[:pos[-1]]`` must lie in ``[0, size)``.
    The return value says whether coordinates are strictly increasing inside
    every segment (sorted, no duplicates); a ``False`` asks the caller to
    canonicalise, it is not an error.  Cost: a handful of vectorised passes.

    >>> check_compressed(np.array([0, 2]), np.array([3, 1]), 4, 1)
    False
    """
    npos = len(pos)
    if npos != parent_positions + 1:
        raise invalid(name, f"{pos_name} has the wrong length",
                      f"len({pos_name}) == {parent_positions + 1} (number of parent positions + 1)",
                      f"len({pos_name}) == {npos}",
                      "for CSR, indptr has n_rows + 1 entries; for CSC, n_cols + 1")
    p0 = int(pos[0])
    if p0 != 0:
        raise invalid(name, f"{pos_name}[0] is not 0", f"{pos_name}[0] == 0", f"{pos_name}[0] == {p0}")
    end = int(pos[-1])
    ncrd = len(crd)
    if 0 <= end <= ncrd and (end == ncrd or not exact_end):
        # The one-pass scan checks monotonicity and ranges too; numpy only
        # runs below, to word the error, when the scan finds one.
        fast = _scan(pos, crd, size)
        if fast is not None and fast < 2:
            return fast == 0
    if npos > 1:
        drops = np.flatnonzero(pos[1:] < pos[:-1])
        if drops.size:
            k = int(drops[0])
            raise invalid(name, f"{pos_name} is not monotone non-decreasing",
                          f"{pos_name}[k] <= {pos_name}[k+1] for every k",
                          f"{pos_name}[{k}] = {int(pos[k])} > {pos_name}[{k + 1}] = {int(pos[k + 1])}",
                          f"{pos_name} (indptr) holds cumulative counts of stored entries per parent position")
    if end > ncrd or (exact_end and end != ncrd):
        raise invalid(name, f"{pos_name}[-1] does not match the number of stored entries",
                      f"{pos_name}[-1] == len({crd_name}) == {ncrd}" if exact_end
                      else f"{pos_name}[-1] <= len({crd_name}) == {ncrd}",
                      f"{pos_name}[-1] == {end}",
                      "the last indptr entry is nnz, the number of stored entries")
    c = crd[:end] if end != ncrd else crd
    if end:
        lo = int(c.min())
        hi = int(c.max())
        if lo < 0 or hi >= size:
            bad = lo if lo < 0 else hi
            where = int(np.flatnonzero(c == bad)[0])
            raise invalid(name, f"{crd_name} holds an out-of-range coordinate",
                          f"0 <= {crd_name}[k] < {size} (the extent of this level)",
                          f"{crd_name}[{where}] == {bad}",
                          "negative indices are not wrapped; check the shape or the index arrays")
    if end < 2:
        return True
    not_increasing = c[1:] <= c[:-1]
    starts = pos[1:-1]
    if starts.size:
        starts = starts[(starts > 0) & (starts < end)]
        not_increasing[starts - 1] = False
    return not bool(not_increasing.any())


try:
    from spfuse._kernels._validate import pos_drops as _pos_drops
    from spfuse._kernels._validate import scan_compressed as _scan_compressed
except ImportError:  # a source checkout without built kernels: the numpy checks run instead
    _scan_compressed = _pos_drops = None


#: stored entries from which :func:`scan_status` scans on a team (waking
#: one costs microseconds; the scan reads ~0.4 ns per entry on one thread)
SCAN_TEAM_MIN_ENTRIES = 1 << 17


def scan_status(pos: np.ndarray, crd: np.ndarray, size: int, num_threads: int | None = 1) -> int:
    """The one-pass scan's verdict on a compressed level whose ``pos`` and
    ``crd`` share an int32/int64 dtype, ``pos[0] == 0`` and ``pos[-1] ==
    len(crd)``: 0 valid and canonical, 1 valid but not canonical, 2 or more
    invalid (``check_compressed`` words the error); -1 when the kernels are
    not built (a source checkout): the caller takes the general path.
    ``num_threads`` (None: the call's setting, :mod:`spfuse.threads`) scans
    a level of :data:`SCAN_TEAM_MIN_ENTRIES` or more in that many pieces
    (1M entries: 0.40 -> 0.22 ms on 2 threads); the verdict is the same.

    >>> scan_status(np.array([0, 2, 3]), np.array([0, 4, 1]), 5)
    0
    """
    if _scan_compressed is None:
        return -1
    nt = 1
    if num_threads != 1 and len(crd) >= SCAN_TEAM_MIN_ENTRIES:
        from spfuse.threads import threads_for_call
        nt = threads_for_call(num_threads)
    return _scan_compressed(pos, crd, size, nt)[0]


def pos_monotone(pos: np.ndarray) -> bool:
    """Whether an int32/int64 ``pos`` array never decreases (False when the
    kernels are not built: the caller then takes the general path).

    >>> pos_monotone(np.array([0, 2, 2, 5])), pos_monotone(np.array([0, 3, 1]))
    (True, False)
    """
    return _pos_drops is not None and _pos_drops(pos) == 0


def _scan(pos: np.ndarray, crd: np.ndarray, size: int):
    """Status of the one-pass Cython scan (0 canonical, 1 non-canonical, >= 2
    invalid: the numpy checks then word the error), or None when the arrays
    do not suit it (mixed or unusual integer dtypes)."""
    if (pos.dtype != crd.dtype or pos.dtype not in (np.int32, np.int64) or pos.ndim != 1
            or _scan_compressed is None):
        return None
    return _scan_compressed(np.ascontiguousarray(pos), np.ascontiguousarray(crd), int(size))[0]


def check_coords(coords: Any, shape: Sequence[int], name: str = "operand") -> np.ndarray:
    """Validate an ``(ndim, nnz)`` coordinate array against ``shape``.

    A 1-D array is accepted for a 1-D shape.  Returns the array (C-contiguous,
    original integer dtype).

    >>> check_coords(np.array([[0, 1], [2, 0]]), (2, 3)).shape
    (2, 2)
    >>> check_coords(np.array([[0, 5]]), (4,), name="x")
    Traceback (most recent call last):
      ...
    spfuse.errors.InvalidOperandError: operand 'x': coords holds an out-of-range coordinate
      expected: 0 <= coords[0, k] < 4 (the extent of mode 0)
      got: coords[0, 1] == 5
      Hint: coordinates are 0-based; check the shape or the coordinate arrays
    """
    ndim = len(shape)
    c = np.asarray(coords)
    if c.dtype.kind not in "iu":
        if c.size == 0 and c.dtype.kind == "f":  # np.array([]) is float64
            c = c.astype(np.int64)
        else:
            raise wrong_type(name, "coords are not integers", "an integer (ndim, nnz) array",
                             f"{c.dtype} array",
                             "cast with .astype(np.int64) after checking the values are whole numbers")
    if c.ndim == 1 and ndim == 1:
        c = c.reshape(1, -1)
    if c.ndim == 1 and c.size == 0:
        c = c.reshape(ndim, 0)
    if c.ndim != 2 or c.shape[0] != ndim:
        raise invalid(name, "coords has the wrong shape",
                      f"an (ndim, nnz) array with ndim == {ndim}",
                      f"an array with shape {c.shape}",
                      "pass one row per mode (np.nonzero order), e.g. np.vstack([rows, cols])")
    c = np.ascontiguousarray(c)
    if c.shape[1]:
        lo = c.min(axis=1)
        hi = c.max(axis=1)
        for m in range(ndim):
            if int(lo[m]) < 0 or int(hi[m]) >= shape[m]:
                bad = int(lo[m]) if int(lo[m]) < 0 else int(hi[m])
                k = int(np.flatnonzero(c[m] == bad)[0])
                raise invalid(name, "coords holds an out-of-range coordinate",
                              f"0 <= coords[{m}, k] < {shape[m]} (the extent of mode {m})",
                              f"coords[{m}, {k}] == {bad}",
                              "coordinates are 0-based; check the shape or the coordinate arrays")
    return c
