"""Test oracle and random generators, shipped so downstream tests can use them.

* :func:`dense_reference` — the reference semantics: numpy on densified
  operands, statement by statement, float64.
* :func:`random_program` / :func:`programs` — random valid programs (with
  input shapes) for property tests.
* :func:`random_sparse` / :func:`random_operands` — scipy/numpy operands
  including empty rows, zero-size dimensions, duplicates and unsorted indices.

Semantics notes (the engine follows the same conventions):

* fill value is 0; ``max``/``min`` reductions see the implicit zeros, and a
  reduction over an empty extent gives 0;
* **division** is ``0`` wherever the numerator is ``0`` (``0/x == 0``, even
  ``0/0``), otherwise IEEE (``1/0 == inf``);
* everything else is IEEE float64 (``0 * inf`` is ``nan`` in the oracle);
* ``where(c, a, b)`` takes ``a`` where ``c != 0``.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from spfuse.frontend.ast import REDUCTIONS, Access, Assignment, Binary, Expr, Literal, Program, Reduce, Unary, Where
from spfuse.frontend.canonical import to_text
from spfuse.frontend.check import check_program
from spfuse.frontend.parser import parse, parse_program
from spfuse.frontend.reductions import bound_indices, free_indices, make_reductions_explicit

__all__ = ["dense_reference", "densify", "random_program", "programs", "random_sparse",
           "random_operands", "SPARSE_FORMATS"]

SPARSE_FORMATS = ("dense", "csr", "csc", "coo")


# ---------------------------------------------------------------------------
# oracle
# ---------------------------------------------------------------------------
def densify(x: Any) -> np.ndarray:
    """``x`` as a float64 numpy array (complex128 when ``x`` is complex; scipy/pydata sparse via ``todense()``).

    >>> import scipy.sparse as sp
    >>> densify(sp.csr_array([[0, 2], [3, 0]]))
    array([[0., 2.],
           [3., 0.]])
    """
    if not isinstance(x, np.ndarray) and hasattr(x, "todense"):
        x = x.todense()
    return np.asarray(x, dtype=np.complex128 if np.iscomplexobj(x) else np.float64)


def _expand(arr: np.ndarray, idx: tuple, union: tuple) -> np.ndarray:
    """Transpose ``arr`` (axes named ``idx``) to ``union`` order, size-1 axes
    where an index is missing, ready to broadcast."""
    if idx == union:
        return arr
    order = sorted(range(len(idx)), key=lambda a: union.index(idx[a]))
    arr = arr.transpose(order)
    shape = []
    it = iter(arr.shape)
    present = set(idx)
    for k in union:
        shape.append(next(it) if k in present else 1)
    return arr.reshape(shape)


def _union(*idxs: tuple) -> tuple:
    out = dict.fromkeys(idxs[0])
    for idx in idxs[1:]:
        out.update(dict.fromkeys(idx))
    return tuple(out)


_UNARY_NP = {
    "relu": lambda x: np.maximum(x, 0.0),
    "sigmoid": lambda x: 0.5 * (1.0 + np.tanh(0.5 * x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "log": np.log,
    "abs": np.abs,
    "sqrt": np.sqrt,
    "neg": np.negative,
}


def _eval(e: Expr, env: dict, ext: dict) -> tuple[np.ndarray, tuple]:
    t = type(e)
    if t is Access:
        arr = env[e.name]
        idx = e.indices
        if len(set(idx)) != len(idx):  # diagonal
            uniq = tuple(dict.fromkeys(idx))
            arr = np.einsum(arr, [uniq.index(k) for k in idx], list(range(len(uniq))))
            idx = uniq
        return arr, idx
    if t is Literal:
        return np.asarray(e.value if isinstance(e.value, complex) else float(e.value)), ()
    if t is Binary:
        a, ai = _eval(e.left, env, ext)
        b, bi = _eval(e.right, env, ext)
        u = _union(ai, bi)
        a, b = _expand(a, ai, u), _expand(b, bi, u)
        if e.op == "+":
            r = a + b
        elif e.op == "-":
            r = a - b
        elif e.op == "*":
            r = a * b
        else:
            r = np.where(a == 0, 0.0, np.divide(a, b))
        return r, u
    if t is Unary:
        a, ai = _eval(e.arg, env, ext)
        return _UNARY_NP[e.fn](a), ai
    if t is Where:
        parts = [_eval(c, env, ext) for c in (e.cond, e.then, e.other)]
        u = _union(*(p[1] for p in parts))
        c, a, b = (_expand(p[0], p[1], u) for p in parts)
        return np.where(c != 0, a, b), u
    if t is Reduce:
        a, ai = _eval(e.body, env, ext)
        if e.index not in ai:  # body constant along the index
            return (a * ext[e.index] if e.op == "sum" else a), ai
        axis = ai.index(e.index)
        rest = ai[:axis] + ai[axis + 1:]
        if e.op == "sum":
            return a.sum(axis=axis), rest
        if a.shape[axis] == 0:
            return np.zeros(a.shape[:axis] + a.shape[axis + 1:]), rest
        return (a.max(axis=axis) if e.op == "max" else a.min(axis=axis)), rest
    raise TypeError(f"not an expression node: {e!r}")


def dense_reference(program_or_text: Program | str, operands: Mapping[str, Any]) -> Any:
    """Evaluate a program with numpy on densified operands (the test oracle).

    Operands may be numpy arrays, scipy sparse arrays/matrices, scalars or
    anything numpy converts. Statements run in order; implicit reductions
    follow :func:`~spfuse.frontend.parser.parse_program`; all arithmetic is
    float64 with axes aligned by index name. Division is 0 where the numerator
    is 0 (``0/x == 0`` even for ``x == 0``), IEEE otherwise. Returns the array
    of the single result (a numpy float for a 0-d result), or a dict of the
    results in assignment order when there are several.

    >>> import numpy as np, scipy.sparse as sp
    >>> A = sp.csr_array([[1.0, 0.0], [0.0, 2.0]])
    >>> dense_reference("y[i] = A[i,j] * x[j]", {"A": A, "x": np.array([3.0, 4.0])})
    array([3., 8.])
    >>> dense_reference("T[i,j] = A[i,j] / B[i,j]; s = T[i,j]",
    ...                 {"A": np.array([[0.0, 1.0]]), "B": np.array([[0.0, 4.0]])})
    np.float64(0.25)
    """
    program = (parse_program(program_or_text) if isinstance(program_or_text, str)
               else make_reductions_explicit(program_or_text))
    env = {name: densify(v) for name, v in operands.items()}
    extents = check_program(program, {name: v.shape for name, v in env.items()})
    with np.errstate(all="ignore"):
        for st, ext in zip(program.statements, extents, strict=True):
            arr, idx = _eval(st.value, env, ext)
            target = st.target.indices
            extra = [k for k in idx if k not in target]
            if extra:
                raise ValueError(f"index {extra[0]!r} is neither on the left nor reduced")
            dtype = np.complex128 if np.iscomplexobj(arr) else np.float64  # complex operands: complex arithmetic
            arr = _expand(np.asarray(arr, dtype=dtype), idx, target)
            env[st.target.name] = np.array(
                np.broadcast_to(arr, tuple(ext[k] for k in target)), dtype=dtype)
    results = program.results

    def out(name):
        v = env[name]
        return v[()] if v.ndim == 0 else v

    if len(results) == 1:
        return out(results[0])
    return {name: out(name) for name in results}


# ---------------------------------------------------------------------------
# random programs
# ---------------------------------------------------------------------------
_INDEX_POOL = ("i", "j", "k", "l", "m", "n")
_BINARY_WEIGHTS = {"*": 4, "+": 2, "-": 1, "/": 1}
_UNARY = ("relu", "sigmoid", "tanh", "exp", "log", "abs", "sqrt", "neg")


class _Gen:
    def __init__(self, rng, max_ndim, max_extent, zero_size, safe, reuse, diagonal):
        self.rng = rng
        self.max_ndim = max_ndim
        self.safe = safe
        self.reuse = reuse
        self.diagonal = diagonal
        n_idx = int(rng.integers(2, len(_INDEX_POOL) + 1))
        lo = 0 if zero_size else 1
        self.ext = {k: int(rng.integers(lo, max_extent + 1)) for k in _INDEX_POOL[:n_idx]}
        if zero_size and 0 not in self.ext.values():
            self.ext[_INDEX_POOL[0]] = 0
        self.inputs: dict[str, tuple[int, ...]] = {}
        self.results: dict[str, tuple[int, ...]] = {}

    def choice(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def fresh_input(self) -> Access:
        rng = self.rng
        ndim = int(rng.integers(0, self.max_ndim + 1))
        names = list(self.ext)
        if self.diagonal and ndim >= 2 and rng.random() < 0.15:
            idx = [self.choice(names) for _ in range(ndim)]
        else:
            idx = list(rng.permutation(names)[:ndim])
        name = f"{chr(ord('A') + len(self.inputs) % 26)}{len(self.inputs) // 26 or ''}"
        self.inputs[name] = tuple(self.ext[k] for k in idx)
        return Access(name, tuple(str(k) for k in idx))

    def reuse_access(self) -> Access | None:
        pool = {**self.inputs, **self.results}
        if not pool:
            return None
        name = self.choice(sorted(pool))
        idx = []
        for extent in pool[name]:
            fits = [k for k in self.ext if self.ext[k] == extent and k not in idx]
            if not fits:
                return None
            idx.append(self.choice(fits))
        return Access(name, tuple(idx))

    def leaf(self) -> Expr:
        rng = self.rng
        if rng.random() < 0.1:
            return Literal(float(self.choice((0.5, 1.0, 2.0, 3.0, 0.25))))
        if rng.random() < self.reuse:
            acc = self.reuse_access()
            if acc is not None:
                return acc
        return self.fresh_input()

    def positive(self, e: Expr) -> Expr:
        """``abs(e) + 1``: a denominator/log argument that is never 0 or < 0."""
        return Binary("+", Unary("abs", e), Literal(1.0))

    def expr(self, depth: int) -> Expr:
        rng = self.rng
        if depth <= 0 or rng.random() < 0.25:
            return self.leaf()
        r = rng.random()
        if r < 0.55:
            ops = list(_BINARY_WEIGHTS)
            w = np.array(list(_BINARY_WEIGHTS.values()), dtype=float)
            op = ops[int(rng.choice(len(ops), p=w / w.sum()))]
            left, right = self.expr(depth - 1), self.expr(depth - 1)
            if op == "/" and self.safe:
                right = self.positive(right)
            return Binary(op, left, right)
        if r < 0.72:
            fn = self.choice(_UNARY)
            arg = self.expr(depth - 1)
            if self.safe and fn == "log":
                arg = self.positive(arg)
            elif self.safe and fn == "sqrt":
                arg = Unary("abs", arg)
            return Unary(fn, arg)
        if r < 0.82:
            return Where(self.expr(depth - 1), self.expr(depth - 1), self.expr(depth - 1))
        body = self.expr(depth - 1)
        free = free_indices(body)
        if not free:
            return body
        return Reduce(self.choice(REDUCTIONS), self.choice(free), body)

    def statement(self, n: int, depth: int) -> Assignment:
        value = self.expr(depth)
        bound = bound_indices(value)
        free = [k for k in free_indices(value) if k not in bound]
        keep = [k for k in self.rng.permutation(free) if self.rng.random() < 0.7] if free else []
        target = Access(f"R{n}", tuple(str(k) for k in keep))
        self.results[target.name] = tuple(self.ext[k] for k in target.indices)
        return Assignment(target, value)


def random_program(rng: np.random.Generator | int | None = None, *,
                   n_statements: int | tuple[int, int] = (1, 3), max_depth: int = 3,
                   max_ndim: int = 3, max_extent: int = 4, zero_size: bool = False,
                   safe: bool = True, reuse: float = 0.3,
                   diagonal: bool = True) -> tuple[Program, dict[str, tuple[int, ...]]]:
    """A random valid program and the shapes of its inputs.

    Programs mix products, sums, differences, divisions, unary functions,
    ``where``, explicit ``sum/max/min`` reductions, implicit reductions,
    diagonals, 0-d operands and literals; later statements may read earlier
    results (results are named ``R0, R1, ...``; inputs ``A, B, ...``).
    ``n_statements`` is a count or an inclusive ``(lo, hi)`` range;
    ``zero_size`` makes at least one index extent 0; ``safe`` (default)
    keeps values finite: denominators and ``log`` arguments become
    ``abs(e) + 1`` and ``sqrt`` arguments ``abs(e)``. Reductions are left
    implicit where the generator did not write them; the program's text is
    :func:`~spfuse.frontend.canonical.to_text` of it, and spans point there.

    >>> p, shapes = random_program(0)
    >>> from spfuse.frontend.check import check_program
    >>> len(check_program(p, shapes)) == len(p.statements)
    True
    """
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    lo, hi = (n_statements, n_statements) if isinstance(n_statements, int) else n_statements
    gen = _Gen(rng, max_ndim, max_extent, zero_size, safe, reuse, diagonal)
    count = int(rng.integers(lo, hi + 1))
    statements = tuple(gen.statement(n, max_depth) for n in range(count))
    raw = Program(statements)
    program = parse(to_text(raw))
    assert program == raw, "to_text/parse round trip failed on a generated program"
    return program, dict(gen.inputs)


def programs(**kwargs: Any):
    """Hypothesis strategy of ``(program, input_shapes)`` from :func:`random_program`.

    Keyword arguments go to :func:`random_program`. Requires ``hypothesis``
    (the ``test`` extra); examples shrink towards small seeds.

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=5)
    ... @given(programs(n_statements=1))
    ... def test(ps):
    ...     assert len(ps[0].statements) == 1
    >>> test()
    """
    from hypothesis import strategies as st
    return st.integers(min_value=0, max_value=2**32 - 1).map(
        lambda seed: random_program(np.random.default_rng(seed), **kwargs))


# ---------------------------------------------------------------------------
# random operands
# ---------------------------------------------------------------------------
def _values(rng, n: int, dtype) -> np.ndarray:
    v = rng.uniform(0.1, 1.0, n) * rng.choice((-1.0, 1.0), n)
    return v.astype(dtype)


def _make_noncanonical(rng, major: np.ndarray, minor: np.ndarray, data: np.ndarray):
    """Split ~1/4 of the entries into two duplicates and shuffle within each
    major slice (rows of CSR). Inputs must be sorted by ``major``."""
    split = rng.random(len(data)) < 0.25
    w = rng.uniform(0.2, 0.8, int(split.sum())).astype(data.dtype)
    dup_data = data[split] * w
    data = data.copy()
    data[split] -= dup_data
    major = np.concatenate([major, major[split]])
    minor = np.concatenate([minor, minor[split]])
    data = np.concatenate([data, dup_data])
    order = np.lexsort((rng.random(len(data)), major))  # by major, random within
    return major[order], minor[order], data[order]


def random_sparse(rng: np.random.Generator | int | None, shape: Sequence[int],
                  density: float = 0.3, fmt: str = "csr", *, dtype: Any = np.float64,
                  index_dtype: Any = np.int32, canonical: bool = True,
                  empty_rows: float = 0.0, flavour: str = "array") -> Any:
    """A random operand of ``shape`` in format ``fmt``.

    ``fmt``: ``"dense"`` (numpy), ``"csr"``, ``"csc"`` (2-d scipy) or
    ``"coo"`` (scipy, any ndim >= 1). Nonzeros are uniform in ±[0.1, 1).
    ``canonical=False`` gives duplicate entries and unsorted indices, built
    directly from arrays (scipy does not canonicalise on construction).
    ``empty_rows`` is the fraction of rows (axis 0) forced empty;
    ``index_dtype`` is kept as given (int32 or int64); ``flavour`` is
    ``"array"`` (``csr_array``) or ``"matrix"`` (``csr_matrix``). 0-d shapes
    always give a numpy 0-d array.

    >>> A = random_sparse(0, (4, 5), 0.5, "csr", canonical=False, index_dtype="int64")
    >>> A.shape, A.indices.dtype, A.has_canonical_format
    ((4, 5), dtype('int64'), False)
    >>> random_sparse(1, (3, 0), fmt="csc").nnz
    0
    """
    import scipy.sparse as sp

    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    shape = tuple(int(n) for n in shape)
    index_dtype = np.dtype(index_dtype)
    mask = rng.random(shape) < density
    if empty_rows and shape and shape[0]:
        mask[rng.random(shape[0]) < empty_rows] = False
    dense = np.zeros(shape, dtype=dtype)
    dense[mask] = _values(rng, int(mask.sum()), dtype)
    if fmt == "dense" or not shape:
        return dense
    if flavour not in ("array", "matrix"):
        raise ValueError(f"flavour must be 'array' or 'matrix', got {flavour!r}")
    coords = np.nonzero(dense)  # C order: sorted by row, then column
    data = dense[coords]
    if fmt in ("csr", "csc"):
        if len(shape) != 2:
            raise ValueError(f"{fmt} needs a 2-d shape, got {shape}")
        major, minor = (coords[0], coords[1]) if fmt == "csr" else (coords[1], coords[0])
        if fmt == "csc":
            order = np.lexsort((minor, major))
            major, minor, data = major[order], minor[order], data[order]
        if not canonical:
            major, minor, data = _make_noncanonical(rng, major, minor, data)
        n_major = shape[0] if fmt == "csr" else shape[1]
        indptr = np.zeros(n_major + 1, dtype=index_dtype)
        np.cumsum(np.bincount(major, minlength=n_major), out=indptr[1:])
        cls = {("csr", "array"): sp.csr_array, ("csr", "matrix"): sp.csr_matrix,
               ("csc", "array"): sp.csc_array, ("csc", "matrix"): sp.csc_matrix}[fmt, flavour]
        m = cls((data, minor.astype(index_dtype), indptr), shape=shape)
        m.indices = minor.astype(index_dtype)  # scipy may have narrowed the index dtype
        m.indptr = indptr
        return m
    if fmt == "coo":
        coords = tuple(coords)
        if not canonical and len(data):
            major, minor, data = _make_noncanonical(rng, coords[0], np.arange(len(data)), data)
            coords = tuple(c[minor] for c in coords)  # duplicates of whole coordinates
            perm = rng.permutation(len(data))
            coords, data = tuple(c[perm] for c in coords), data[perm]
        coords = tuple(c.astype(index_dtype) for c in coords)
        if flavour == "matrix":
            if len(shape) != 2:
                raise ValueError(f"coo_matrix needs a 2-d shape, got {shape}")
            m = sp.coo_matrix((data, coords), shape=shape)
        else:
            m = sp.coo_array((data, coords), shape=shape)
        m.coords = coords
        return m
    raise ValueError(f"unknown format {fmt!r}; expected one of {', '.join(SPARSE_FORMATS)}")


def random_operands(rng: np.random.Generator | int | None, shapes: Mapping[str, Sequence[int]],
                    density: float = 0.4, formats: Sequence[str] = SPARSE_FORMATS,
                    **kwargs: Any) -> dict[str, Any]:
    """One random operand per name in ``shapes``, each in a format drawn from
    ``formats`` (CSR/CSC only for 2-d; COO for 1-d and up; dense always).
    Extra keyword arguments go to :func:`random_sparse`.

    >>> ops = random_operands(0, {"A": (3, 4), "x": (4,), "s": ()})
    >>> sorted(ops), ops["s"].shape
    (['A', 's', 'x'], ())
    """
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng(rng)
    out = {}
    for name, shape in shapes.items():
        shape = tuple(shape)
        fits = [f for f in formats
                if f == "dense" or (f in ("csr", "csc") and len(shape) == 2)
                or (f == "coo" and len(shape) >= 1)] or ["dense"]
        fmt = fits[int(rng.integers(len(fits)))]
        out[name] = random_sparse(rng, shape, density, fmt, **kwargs)
    return out
