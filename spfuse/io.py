"""Reading and writing tensors: Matrix Market, FROSTT ``.tns``, SuiteSparse ``.mat``.

* :func:`read_mtx` / :func:`write_mtx` go through ``scipy.io.mmread`` /
  ``mmwrite`` (symmetric, skew-symmetric and Hermitian files are expanded;
  pattern files get values 1.0).
* :func:`read_tns` / :func:`write_tns` handle FROSTT text: one stored entry per
  line, 1-based integer coordinates then the value; ``#`` comments and blank
  lines are allowed; a ``.gz`` suffix means gzip.  Parsing is vectorised
  (``numpy.loadtxt``); a malformed line raises ``ValueError`` naming its line
  number.
* :func:`read` dispatches on the suffix; :func:`load_builtin` loads the small
  real data sets shipped in ``spfuse/data`` (see its README for sources).

>>> t = load_builtin("karate")
>>> t
<spfuse.Tensor shape=(34, 34) float64 csr nnz=156 index=int32>
"""
from __future__ import annotations

import gzip
import io as _io
import os
import re
import warnings
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Union

import numpy as np
import scipy.io
import scipy.sparse as sp

from spfuse.formats import Format
from spfuse.tensor import Tensor, as_tensor

__all__ = ["read", "read_mtx", "write_mtx", "read_tns", "write_tns", "read_mat",
           "load_builtin", "builtin_names"]

PathLike = Union[str, "os.PathLike[str]"]
_SHAPE_COMMENT = re.compile(r"^#\s*shape\s*:?\s*([\d\s,x()]*)$", re.IGNORECASE)


# --------------------------------------------------------------------------- .mtx
def read_mtx(path: PathLike) -> Tensor:
    """Read a Matrix Market file (``.mtx``, optionally ``.gz``/``.bz2``) as a Tensor.

    Coordinate files become CSR tensors (symmetric storage expanded), array
    files dense tensors.

    >>> import tempfile, os, numpy as np
    >>> d = tempfile.mkdtemp(); p = os.path.join(d, "a.mtx")
    >>> write_mtx(p, np.array([[0.0, 1.5], [2.0, 0.0]]))
    >>> read_mtx(p).todense()
    array([[0. , 1.5],
           [2. , 0. ]])
    """
    m = scipy.io.mmread(os.fspath(path))
    if sp.issparse(m):
        t = Tensor.from_scipy(m, name=os.fspath(path))
    else:
        t = Tensor.from_numpy(np.asarray(m), name=os.fspath(path))
    t.origin = None
    return t


def write_mtx(path: PathLike, obj: Any, *, comment: str = "", precision: int | None = None) -> None:
    """Write a 2-D Tensor, scipy sparse matrix/array or numpy array as Matrix Market.

    Sparse formats are written as ``coordinate``, dense tensors and numpy
    arrays as ``array`` (scipy's behaviour).

    >>> import tempfile, os, scipy.sparse as sp
    >>> p = os.path.join(tempfile.mkdtemp(), "eye.mtx")
    >>> write_mtx(p, sp.eye(3, format="csr"))
    >>> read_mtx(p).nnz
    3
    """
    if isinstance(obj, Tensor):
        if obj.ndim != 2:
            raise ValueError(f"Matrix Market holds 2-d matrices; got a tensor of shape {obj.shape}\n"
                             "  Hint: use write_tns for N-d tensors")
        data = obj.todense() if obj.format.is_dense else obj.to_scipy("sparray")
    elif sp.issparse(obj):
        data = obj
    else:
        data = np.asarray(obj)
        if data.ndim != 2:
            raise ValueError(f"Matrix Market holds 2-d matrices; got an array of shape {data.shape}")
    scipy.io.mmwrite(os.fspath(path), data, comment=comment, precision=precision)


# --------------------------------------------------------------------------- .tns
def _open_text(path: PathLike, mode: str):
    p = os.fspath(path)
    if p.endswith(".gz"):
        return gzip.open(p, mode + "t", encoding="utf-8")
    return open(p, mode, encoding="utf-8")


def _data_lines(text: str) -> list[tuple[int, list[str]]]:
    """(1-based line number, fields) of every data line; slow path for error reports."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        body = line.split("#", 1)[0].strip()
        if body:
            out.append((number, body.split()))
    return out


def _diagnose(text: str, path: str, ncols: int | None) -> ValueError | None:
    """Find the first malformed line of a .tns text; ``None`` if every line is fine."""
    for number, fields in _data_lines(text):
        if ncols is None:
            ncols = len(fields)
            if ncols < 2:
                return ValueError(f"{path}, line {number}: expected at least 2 columns "
                                  f"(coordinates then a value), got {ncols}")
        if len(fields) != ncols:
            return ValueError(f"{path}, line {number}: expected {ncols} columns "
                              f"({ncols - 1} coordinates and a value), got {len(fields)}: {' '.join(fields)!r}")
        for col, field in enumerate(fields[:-1]):
            try:
                value = int(field)
            except ValueError:
                return ValueError(f"{path}, line {number}: coordinate {col + 1} is not an integer: {field!r}")
            if value < 1:
                return ValueError(f"{path}, line {number}: coordinate {col + 1} is {value}; "
                                  "FROSTT coordinates are 1-based (>= 1)")
        try:
            float(fields[-1])
        except ValueError:
            return ValueError(f"{path}, line {number}: value is not a number: {fields[-1]!r}")
    return None


def _header_shape(text: str) -> tuple[int, ...] | None:
    """A ``# shape: 3 4 5`` comment among the leading comment lines (written by write_tns)."""
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if not s.startswith("#"):
            return None
        m = _SHAPE_COMMENT.match(s)
        if m:
            dims = re.findall(r"\d+", m.group(1))
            return tuple(int(d) for d in dims)
    return None


def read_tns(path: PathLike, shape: Sequence[int] | None = None,
             format: str | Format = "csf") -> Tensor:
    """Read a FROSTT ``.tns`` file (``.tns.gz`` too) as a Tensor (CSF by default).

    ``shape`` defaults to a ``# shape:`` header comment when present (as
    :func:`write_tns` writes), else to the largest coordinate in every mode.
    Duplicate coordinates are summed.  Malformed lines (wrong column count,
    non-integer or < 1 coordinate, bad value) raise ``ValueError`` with the
    line number.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "x.tns")
    >>> _ = open(p, "w").write("# a comment\\n1 1 2 0.5\\n\\n2 3 1 -1\\n")
    >>> t = read_tns(p); t.shape, t.nnz
    ((2, 3, 2), 2)
    >>> _ = open(p, "w").write("1 1 2 0.5\\n2 0 1 1.0\\n")
    >>> read_tns(p)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
      ...
    ValueError: ...x.tns, line 2: coordinate 2 is 0; FROSTT coordinates are 1-based (>= 1)
    """
    name = os.fspath(path)
    with _open_text(path, "r") as f:
        text = f.read()
    ncols = None if shape is None else len(shape) + 1
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
            table = np.loadtxt(_io.StringIO(text), comments="#", dtype=np.float64, ndmin=2)
    except ValueError as exc:
        err = _diagnose(text, name, ncols)
        raise (err or ValueError(f"{name}: {exc}")) from None
    if table.shape[0] == 0:
        header = _header_shape(text) if shape is None else tuple(shape)
        if header is None:
            raise ValueError(f"{name}: no entries and no shape\n  Hint: pass shape=... to read an empty tensor")
        return Tensor.from_coo(np.zeros((len(header), 0), np.int64), np.zeros(0), header, format, name=name)
    if table.shape[1] < 2 or (ncols is not None and table.shape[1] != ncols):
        err = _diagnose(text, name, ncols)
        raise err or ValueError(f"{name}: expected {ncols} columns, got {table.shape[1]}")
    coords_f = table[:, :-1]
    coords = coords_f.astype(np.int64)
    if not np.array_equal(coords, coords_f) or coords.min(initial=1) < 1:
        err = _diagnose(text, name, table.shape[1])
        raise err or ValueError(f"{name}: coordinates must be integers >= 1")
    coords = coords.T - 1
    if shape is None:
        shape = _header_shape(text)
        if shape is not None and len(shape) != coords.shape[0]:
            shape = None
    if shape is None:
        shape = tuple(int(x) + 1 for x in coords.max(axis=1))
    else:
        shape = tuple(int(s) for s in shape)
        over = np.flatnonzero((coords >= np.asarray(shape, dtype=np.int64)[:, None]).any(axis=0))
        if over.size:
            number = _data_lines(text)[int(over[0])][0]
            raise ValueError(f"{name}, line {number}: coordinate outside shape {shape} "
                             f"(coordinates are 1-based, so each must be <= the extent)")
    return Tensor.from_coo(np.ascontiguousarray(coords), np.ascontiguousarray(table[:, -1]), shape,
                           format, name=name)


def write_tns(path: PathLike, obj: Any, *, header: bool = True) -> None:
    """Write a Tensor (or anything :func:`~spfuse.tensor.as_tensor` accepts) as FROSTT text.

    One line per stored entry (entries of dense levels that are zero are
    skipped), 1-based coordinates, values with 17 significant digits (exact
    round trip).  ``header`` adds a ``# shape: ...`` comment that
    :func:`read_tns` uses to restore trailing empty extents.  A ``.gz``
    suffix compresses.

    >>> import tempfile, os, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "x.tns.gz")
    >>> a = np.zeros((2, 3, 4)); a[1, 2, 0] = 7.25
    >>> write_tns(p, a)
    >>> np.array_equal(read_tns(p).todense(), a)
    True
    """
    t = as_tensor(obj, name=os.fspath(path))
    if t.ndim == 0:
        raise ValueError("a .tns file needs at least one mode; got a 0-d tensor")
    if t.format.levels[-1] == "dense":
        t = t.asformat(Format.csf(t.ndim))
    coords = t.coords.astype(np.int64) + 1
    with _open_text(path, "w") as f:
        if header:
            f.write(f"# shape: {' '.join(str(s) for s in t.shape)}\n")
        if t.nnz:
            # format coordinates as integers and values with repr precision, column-wise (vectorised)
            cols = [c.astype(str) for c in coords]
            vals = np.char.mod("%.17g", t.values.astype(np.float64))
            lines = cols[0]
            for c in cols[1:]:
                lines = np.char.add(np.char.add(lines, " "), c)
            lines = np.char.add(np.char.add(lines, " "), vals)
            f.write("\n".join(lines.tolist()))
            f.write("\n")


# --------------------------------------------------------------------------- .mat and dispatch
def read_mat(path: PathLike, key: str | None = None) -> Tensor:
    """Read a MATLAB ``.mat`` file: SuiteSparse's ``Problem.A``, else variable ``key`` / the only matrix.

    >>> import tempfile, os, scipy.io, scipy.sparse as sp
    >>> p = os.path.join(tempfile.mkdtemp(), "m.mat")
    >>> scipy.io.savemat(p, {"A": sp.eye(2, format="csc")})
    >>> read_mat(p).shape
    (2, 2)
    """
    name = os.fspath(path)
    d = scipy.io.loadmat(name)
    if key is None and "Problem" in d:
        problem = d["Problem"]
        if problem.dtype.names and "A" in problem.dtype.names:
            obj = problem["A"].ravel()[0]
            return _from_loaded(obj, name)
    if key is None:
        candidates = [k for k, v in d.items() if not k.startswith("__")
                      and (sp.issparse(v) or (isinstance(v, np.ndarray) and v.dtype.kind in "biuf"))]
        if len(candidates) != 1:
            raise ValueError(f"{name}: cannot tell which variable to read (found {sorted(candidates)})\n"
                             "  Hint: pass key=...")
        key = candidates[0]
    if key not in d:
        raise KeyError(f"{name}: no variable {key!r}; variables: {sorted(k for k in d if not k.startswith('__'))}")
    return _from_loaded(d[key], name)


def _from_loaded(obj: Any, name: str) -> Tensor:
    t = Tensor.from_scipy(obj, name=name) if sp.issparse(obj) else Tensor.from_numpy(np.asarray(obj), name=name)
    t.origin = None
    return t


def read(path: PathLike, **kwargs: Any) -> Tensor:
    """Read any supported file, choosing the reader by suffix.

    ``.mtx``/``.mtx.gz``/``.mtx.bz2`` → :func:`read_mtx`; ``.tns``/``.tns.gz`` →
    :func:`read_tns`; ``.mat`` → :func:`read_mat`; ``.npz`` →
    ``scipy.sparse.load_npz``.  Keyword arguments go to the reader.

    >>> import tempfile, os, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "v.tns")
    >>> write_tns(p, np.array([0.0, 3.0]))
    >>> read(p).todense()
    array([0., 3.])
    """
    p = os.fspath(path)
    low = p.lower()
    if low.endswith((".mtx", ".mtx.gz", ".mtx.bz2")):
        return read_mtx(p, **kwargs)
    if low.endswith((".tns", ".tns.gz")):
        return read_tns(p, **kwargs)
    if low.endswith(".mat"):
        return read_mat(p, **kwargs)
    if low.endswith(".npz"):
        return _from_loaded(sp.load_npz(p), p)
    raise ValueError(f"cannot tell the file type of {p!r}\n  expected: a suffix among "
                     ".mtx, .mtx.gz, .mtx.bz2, .tns, .tns.gz, .mat, .npz")


# --------------------------------------------------------------------------- built-in data
def _data_dir():
    return resources.files("spfuse") / "data"


def builtin_names() -> list[str]:
    """Names of the data sets shipped with spfuse (see ``spfuse/data/README.md``).

    >>> builtin_names()
    ['1138_bus', 'GD97_b', 'karate', 'nations', 'west0479']
    """
    names = []
    for entry in _data_dir().iterdir():
        n = entry.name
        if n.endswith((".mtx", ".tns")):
            names.append(n.rsplit(".", 1)[0])
    return sorted(names)


def load_builtin(name: str) -> Tensor:
    """Load a shipped data set by name (matrices as CSR, tensors as CSF).

    >>> load_builtin("nations")
    <spfuse.Tensor shape=(14, 55, 14) float64 csf nnz=1992 index=int32>
    """
    for suffix in (".mtx", ".tns"):
        entry = _data_dir() / f"{name}{suffix}"
        if entry.is_file():
            with resources.as_file(entry) as p:
                return read(Path(p))
    raise ValueError(f"unknown built-in data set {name!r}\n  expected: one of {builtin_names()}")
