"""Malformed operands: every kind is refused with a message naming the operand and the problem.

Inputs are built the way a user could build them (scipy constructors with
``check``-free arrays, raw ``Tensor.from_csr`` / ``from_coo`` arrays), and the
inputs are checksummed to show validation never writes into them.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from spfuse import validation as V
from spfuse.errors import InvalidOperandError, OperandTypeError, SpfuseError
from spfuse.tensor import CompressedLevel, DenseLevel, Tensor, as_tensor


def checksum(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.asarray(a)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def _scipy_unchecked(cls, data, indices, indptr, shape):
    """A scipy object holding arbitrary (possibly malformed) arrays, as user code can produce."""
    m = cls((np.array([0.0]), np.array([0], dtype=np.int32), np.array([0, 1] + [1] * (shape[0] - 1),
                                                                        dtype=np.int32)), shape=shape)
    m.data, m.indices, m.indptr = np.asarray(data), np.asarray(indices), np.asarray(indptr)
    return m


# (id, builder, exception, message fragment)
GOOD_INDPTR = [0, 1, 3]
MALFORMED = [
    ("non-monotone indptr",
     lambda: Tensor.from_csr([1.0, 2.0, 3.0], [0, 1, 2], [0, 3, 2, 3], (3, 3), name="B"),
     InvalidOperandError, "indptr is not monotone"),
    ("indptr jumps past the end, then drops",  # the scan must not read indices[3:10**6]
     lambda: Tensor.from_csr([1.0, 2.0, 3.0], [0, 1, 2], [0, 10**6, 3], (2, 3), name="B"),
     InvalidOperandError, "indptr is not monotone"),
    ("scipy indptr jumps past the end, then drops",
     lambda: Tensor.from_scipy(_scipy_unchecked(sp.csr_array, [1.0, 2.0, 3.0], [0, 1, 2], [0, 10**6, 3], (2, 3)),
                               name="B"),
     InvalidOperandError, "indptr is not monotone"),
    ("wrong indptr length",
     lambda: Tensor.from_csr([1.0, 2.0, 3.0], [0, 1, 2], [0, 1, 3], (3, 3), name="B"),
     InvalidOperandError, "indptr has the wrong length"),
    ("indptr[0] != 0",
     lambda: Tensor.from_csr([1.0, 2.0], [0, 1], [1, 1, 2], (2, 2), name="B"),
     InvalidOperandError, r"indptr\[0\] is not 0"),
    ("indptr end != nnz",
     lambda: Tensor.from_csr([1.0, 2.0, 3.0], [0, 1, 2], [0, 1, 2], (2, 3), name="B"),
     InvalidOperandError, r"indptr\[-1\] does not match"),
    ("scipy indptr end beyond indices",
     lambda: Tensor.from_scipy(_scipy_unchecked(sp.csr_array, [1.0, 2.0], [0, 1], [0, 1, 5], (2, 2)), name="B"),
     InvalidOperandError, r"indptr\[-1\] does not match"),
    ("negative index",
     lambda: Tensor.from_csr([1.0, 2.0], [0, -1], [0, 1, 2], (2, 2), name="B"),
     InvalidOperandError, "out-of-range"),
    ("index >= size",
     lambda: Tensor.from_csr([1.0, 2.0], [0, 2], [0, 1, 2], (2, 2), name="B"),
     InvalidOperandError, "out-of-range"),
    ("scipy index >= size",
     lambda: Tensor.from_scipy(_scipy_unchecked(sp.csc_matrix, [1.0, 2.0], [0, 7], [0, 1, 2], (2, 2)), name="B"),
     InvalidOperandError, r"indices\[1\] == 7"),
    ("float indices",
     lambda: Tensor.from_csr([1.0, 2.0], np.array([0.0, 1.0]), [0, 1, 2], (2, 2), name="B"),
     OperandTypeError, "indices are not integers"),
    ("float indptr",
     lambda: Tensor.from_csr([1.0, 2.0], [0, 1], np.array([0.0, 1.0, 2.0]), (2, 2), name="B"),
     OperandTypeError, "indptr are not integers"),
    ("float coo coords",
     lambda: Tensor.from_coo(np.array([[0.5, 1.0]]), [1.0, 2.0], (3,), name="B"),
     OperandTypeError, "coords are not integers"),
    ("complex values",
     lambda: Tensor.from_csr(np.array([1j, 2.0]), [0, 1], [0, 1, 2], (2, 2), name="B"),
     OperandTypeError, "complex128"),
    ("object values",
     lambda: Tensor.from_coo([[0, 1]], np.array([1.0, "x"], dtype=object), (2,), name="B"),
     OperandTypeError, "object"),
    ("string values",
     lambda: as_tensor(np.array(["1", "2"]), name="B"),
     OperandTypeError, "<U1"),
    ("negative shape",
     lambda: Tensor.from_coo(np.zeros((2, 0), int), [], (3, -1), name="B"),
     InvalidOperandError, "negative extent"),
    ("non-integer shape",
     lambda: Tensor.from_coo(np.zeros((2, 0), int), [], (3, 2.5), name="B"),
     OperandTypeError, "non-integer"),
    ("shape product overflow",
     lambda: Tensor.from_coo(np.zeros((3, 0), int), [], (2**31, 2**31, 4), name="B"),
     InvalidOperandError, "fits in int64"),
    ("data/indices length mismatch",
     lambda: Tensor.from_csr([1.0, 2.0, 3.0], [0, 1], [0, 1, 2], (2, 2), name="B"),
     InvalidOperandError, "data and indices have different lengths"),
    ("scipy data/indices length mismatch",
     lambda: Tensor.from_scipy(_scipy_unchecked(sp.csr_array, [1.0], [0, 1], [0, 1, 2], (2, 2)), name="B"),
     InvalidOperandError, "data and indices have different lengths"),
    ("coords/values length mismatch",
     lambda: Tensor.from_coo([[0, 1]], [1.0], (2,), name="B"),
     InvalidOperandError, "coords and values have different lengths"),
    ("coords rows != ndim",
     lambda: Tensor.from_coo([[0, 1], [1, 0], [0, 0]], [1.0, 2.0], (2, 2), name="B"),
     InvalidOperandError, "coords has the wrong shape"),
    ("coord out of range",
     lambda: Tensor.from_coo([[0, 1], [1, 3]], [1.0, 2.0], (2, 3), name="B"),
     InvalidOperandError, r"coords\[1, 1\] == 3"),
    ("3-d shape for CSR arrays (scipy-like misuse)",
     lambda: Tensor.from_csr([1.0], [0], [0, 1], (1, 2, 3), name="B"),
     InvalidOperandError, "need a 2-d shape"),
    ("2-d indices array",
     lambda: Tensor.from_csr([1.0, 2.0], [[0], [1]], [0, 1, 2], (2, 2), name="B"),
     InvalidOperandError, "indices is not 1-D"),
    ("2-d data array",
     lambda: Tensor.from_csr([[1.0], [2.0]], [0, 1], [0, 1, 2], (2, 2), name="B"),
     InvalidOperandError, "data is not 1-D"),
    ("raw level with non-monotone pos",
     lambda: Tensor((2, 2), "csr", [DenseLevel(2), CompressedLevel(2, [0, 2, 1], [0, 1])], [1.0, 2.0], name="B"),
     InvalidOperandError, r"levels\[1\].pos is not monotone"),
    ("duplicates refused when asked",
     lambda: Tensor.from_coo([[1, 1]], [1.0, 2.0], (2,), sum_duplicates=False, name="B"),
     InvalidOperandError, "duplicate"),
    ("unsupported operand type",
     lambda: as_tensor({"x": 1}, name="B"),
     OperandTypeError, "unsupported operand type"),
]


@pytest.mark.parametrize("builder, exc, fragment", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_operands_are_refused(builder, exc, fragment):
    with pytest.raises(exc, match=fragment) as info:
        builder()
    msg = str(info.value)
    assert msg.startswith("operand 'B':"), msg
    assert "expected:" in msg and "got:" in msg
    assert isinstance(info.value, SpfuseError)
    # callers that do not know spfuse can still catch the builtin
    assert isinstance(info.value, ValueError if exc is InvalidOperandError else TypeError)


def test_at_least_twelve_kinds():
    assert len({m[0] for m in MALFORMED}) >= 12


def test_validation_never_writes_into_inputs():
    data = np.array([1.0, 2.0, 3.0])
    indices = np.array([0, 5, 1])  # 5 out of range
    indptr = np.array([0, 2, 3])
    before = checksum(data, indices, indptr)
    with pytest.raises(InvalidOperandError):
        Tensor.from_csr(data, indices, indptr, (2, 3))
    assert checksum(data, indices, indptr) == before


def test_non_contiguous_inputs_are_copied_not_refused():
    base_idx = np.array([0, 99, 2, 99, 1, 99])
    base_val = np.array([1.0, -1, 2.0, -1, 3.0, -1])
    indices, data = base_idx[::2], base_val[::2]  # strided views
    assert not indices.flags.c_contiguous
    t = Tensor.from_csr(data, indices, np.array([0, 2, 3]), (2, 3))
    np.testing.assert_array_equal(t.todense(), [[1.0, 0, 2.0], [0, 3.0, 0]])
    assert t.values.flags.c_contiguous and t.levels[1].crd.flags.c_contiguous
    # Fortran-ordered and transposed dense inputs
    a = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(as_tensor(a).todense(), a)
    np.testing.assert_array_equal(as_tensor(a.T, format="csr").todense(), a.T)
    # non-contiguous scipy data array
    m = sp.csr_array(np.eye(3))
    m.data = np.repeat(m.data, 2)[::2]
    assert not m.data.flags.c_contiguous
    np.testing.assert_array_equal(Tensor.from_scipy(m).todense(), np.eye(3))


def test_read_only_arrays_accepted():
    data, indices, indptr = np.array([2.0, 1.0]), np.array([1, 0]), np.array([0, 2, 2])
    for arr in (data, indices, indptr):
        arr.flags.writeable = False
    t = Tensor.from_csr(data, indices, indptr, (2, 2))  # unsorted: canonicalised on a copy
    np.testing.assert_array_equal(t.todense(), [[1.0, 2.0], [0, 0]])
    coords = np.array([[1, 0, 1]])
    coords.flags.writeable = False
    vals = np.array([1.0, 2.0, 3.0])
    vals.flags.writeable = False
    np.testing.assert_array_equal(Tensor.from_coo(coords, vals, (2,)).todense(), [2.0, 4.0])


def test_nonfinite_values_are_legal():
    t = Tensor.from_csr([np.nan, np.inf, -np.inf], [0, 1, 0], [0, 2, 3], (2, 2))
    d = t.todense()
    assert np.isnan(d[0, 0]) and d[0, 1] == np.inf and d[1, 0] == -np.inf


def test_unsigned_and_small_index_dtypes_accepted():
    t = Tensor.from_csr([1.0, 2.0], np.array([1, 0], np.uint8), np.array([0, 1, 2], np.uint64), (2, 2))
    assert t.index_dtype == np.int32
    np.testing.assert_array_equal(t.todense(), [[0, 1.0], [2.0, 0]])


def test_bool_shape_entries_refused():
    with pytest.raises(OperandTypeError, match="bool"):
        V.check_shape((True, 2), name="B")


def test_message_for_default_name():
    with pytest.raises(InvalidOperandError) as info:
        Tensor.from_csr([1.0], [3], [0, 1], (1, 2))
    assert str(info.value).startswith("operand: ")


# --------------------------------------------------------------------------- unit level
def test_check_compressed_reports_canonical():
    pos = np.array([0, 2, 2, 4])
    assert V.check_compressed(pos, np.array([0, 3, 1, 2]), 4, 3)
    assert not V.check_compressed(pos, np.array([3, 0, 1, 2]), 4, 3)   # unsorted segment
    assert not V.check_compressed(pos, np.array([0, 3, 2, 2]), 4, 3)   # duplicate in segment
    # decreasing across a segment boundary (even across an empty segment) is fine
    assert V.check_compressed(pos, np.array([2, 3, 0, 1]), 4, 3)
    assert V.check_compressed(np.array([0, 0]), np.array([], dtype=np.int64), 4, 1)


def test_check_compressed_slack():
    # scipy convention: pos[-1] may be smaller than len(crd)
    assert V.check_compressed(np.array([0, 1]), np.array([0, 9]), 2, 1, exact_end=False)
    with pytest.raises(InvalidOperandError):
        V.check_compressed(np.array([0, 1]), np.array([0, 9]), 2, 1, exact_end=True)


@pytest.mark.parametrize("counts, expected", [
    ((), np.int32), ((0,), np.int32), ((2**31 - 1,), np.int32), ((5, 2**31), np.int64)])
def test_index_dtype_rule(counts, expected):
    assert V.index_dtype_for(*counts) == expected


def test_value_dtype_table():
    assert V.value_dtype(np.float64) == np.float64
    assert V.value_dtype(np.float32) == np.float32
    assert V.value_dtype(np.float16) == np.float32
    for dt in (np.int8, np.int64, np.uint32, np.bool_):
        assert V.value_dtype(dt) == np.float64
    for dt in (np.complex64, object, "U3", "S3", np.longdouble, "datetime64[s]"):
        if np.dtype(dt) == np.float64:  # platforms where longdouble is double
            continue
        with pytest.raises(OperandTypeError):
            V.value_dtype(dt)


def test_check_shape_accepts_numpy_ints_and_scalars():
    assert V.check_shape(np.array([2, 3])) == (2, 3)
    assert V.check_shape(4) == (4,)
    assert V.check_shape(()) == ()
    assert V.check_shape((2**61, 2)) == (2**61, 2)
    with pytest.raises(OperandTypeError):
        V.check_shape(None)


@pytest.mark.parametrize("threads", [1, 2, 3, 64, 200])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_the_index_scan_gives_one_verdict_on_any_team(threads, dtype):
    """The scan's fast passes run in one piece per thread; their counts add
    up, so the verdict (and the place the slow pass reports) is the one of
    a single piece -- canonical, unsorted at a piece boundary, a duplicate,
    an out-of-range index, a falling indptr."""
    from spfuse._kernels._validate import scan_compressed
    rng = np.random.default_rng(0)
    n = 1000
    A = sp.random_array((n, n), density=0.01, format="csr", rng=rng)
    pos, crd = A.indptr.astype(dtype), A.indices.astype(dtype)
    cases = {"canonical": (pos, crd)}
    swapped = crd.copy()
    mid = pos[n // 2]   # a row start: swap its first two entries (a row of >= 2 entries)
    row = next(i for i in range(n // 2, n) if pos[i + 1] - pos[i] >= 2)
    swapped[pos[row]], swapped[pos[row] + 1] = swapped[pos[row] + 1], swapped[pos[row]]
    cases["unsorted"] = (pos, swapped)
    dup = crd.copy()
    dup[pos[row] + 1] = dup[pos[row]]
    cases["duplicate"] = (pos, dup)
    out = crd.copy()
    out[mid] = n
    cases["out of range"] = (pos, out)
    falling = pos.copy()
    falling[n // 3] = falling[n // 3 + 1] + 1
    cases["falling indptr"] = (falling, crd)
    for name, (p, c) in cases.items():
        assert scan_compressed(p, c, n, threads) == scan_compressed(p, c, n, 1), name
    assert [scan_compressed(p, c, n, threads)[0] for p, c in cases.values()] == [0, 1, 1, 3, 2]


def _scan_reference(pos: np.ndarray, crd: np.ndarray, size: int) -> int:
    """The scan's status by its definition, row by row: 2 pos falls, 3 a
    coordinate out of ``[0, size)``, 1 unsorted or duplicated, 0 canonical
    (the first of 2 and 3 met in row order wins)."""
    status = 0
    for s in range(len(pos) - 1):
        if pos[s + 1] < pos[s]:
            return 2
        row = crd[pos[s]:pos[s + 1]]
        bad = np.flatnonzero((row < 0) | (row >= size))
        if bad.size:
            return 3
        if np.any(np.diff(row) <= 0):
            status = 1
    return status


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), defect=st.sampled_from(["none", "swap", "duplicate", "outside", "negative",
                                                                "falling"]),
       threads=st.sampled_from([1, 2, 3]), dtype=st.sampled_from([np.int32, np.int64]))
def test_the_index_scan_over_many_chunks_matches_its_definition(seed, defect, threads, dtype):
    """Scans walk pieces of whole rows in chunks of some 16k entries (each
    chunk's segment starts read while its coordinates are in cache): a
    defect anywhere -- in any chunk, at a row start, in a row longer than a
    chunk, after empty rows -- gives the verdict of a row-by-row reading."""
    rng = np.random.default_rng(seed)
    n = 4000
    lengths = rng.integers(0, 25, n)
    lengths[rng.random(n) < 0.2] = 0                      # empty rows
    lengths[rng.integers(0, n)] = 20000                   # a row longer than a chunk
    size = 30000
    crd = np.concatenate([np.sort(rng.choice(size, k, replace=False)) for k in lengths]).astype(dtype)
    pos = np.concatenate([[0], np.cumsum(lengths)]).astype(dtype)
    full = np.flatnonzero(lengths >= 2)
    row = int(full[rng.integers(0, len(full))])
    at = int(pos[row] + rng.integers(0, lengths[row] - 1))   # an entry with a next one in its row
    if defect == "swap":
        crd[at], crd[at + 1] = crd[at + 1], crd[at]
    elif defect == "duplicate":
        crd[at + 1] = crd[at]
    elif defect == "outside":
        crd[at] = size
    elif defect == "negative":
        crd[at] = -1
    elif defect == "falling":
        s = int(rng.integers(1, n))
        pos[s] = pos[s + 1] + 1
    from spfuse._kernels._validate import scan_compressed
    assert scan_compressed(pos, crd, size, threads)[0] == _scan_reference(pos, crd, size)
