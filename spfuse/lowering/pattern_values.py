"""Element-wise work on one sparse pattern, run on the pattern's values arrays.

Sparse attention and its gradient are mostly statements like
``E[i,j] = A[i,j] * exp(S[i,j] - m[i])`` or ``r[i] = sum(j, A[i,j]/A[i,j] *
where(...))``: every sparse operand is a CSR matrix on *one* pattern, read
at the same ``[i,j]``, and the work is entry by entry on that pattern, or
a reduction along its rows.  The generic executor co-iterates the operands
entry by entry (tens of ns per stored entry); here, once the operands are
known to store one pattern (checked per call), each operation is one numpy
expression over the values arrays (a row vector ``m[i]`` gathered by the
entries' rows, a dense ``D[i,j]`` at their coordinates, a row reduction by
segment).

A group qualifies (:func:`pattern_group`, at planning) when

* its sparse operands (two or more: one alone is walked as fast by the
  executor) are 2-D CSR inputs, each read as ``X[r,c]`` (the column index
  may be named differently in a nested reduction);
* every operation's result is ``[r,c]`` (entry-wise), ``[r]`` (row-wise,
  or a reduction of ``[r,c]`` over ``c``) -- or a 0-d constant;
* every entry-wise operation is restricted to the pattern: its iteration
  mask on ``c`` reads a column level of those operands in each term (so it
  is zero, or not needed, off the pattern), and on ``r`` at most the
  pattern's rows.

The semantics are the executor's (the numpy oracle of
:mod:`spfuse.testing`): ``a / b`` is 0 where ``a`` is 0, ``where`` tests
``!= 0``, a ``max``/``min`` over a row also sees its implicit zeros
(rows not full), a row-wise result is 0 on rows the executor would not
visit.  A call whose operands store different patterns, or whose results
come out non-finite (where the executor, skipping entries, might not), is
handed back (None): the caller runs the generic executor.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from spfuse.ir.ops import Const, Ref, UnitOp
from spfuse.testing import _UNARY_NP

__all__ = ["PatternGroup", "pattern_group", "run_pattern_group"]

_REDUCE = {"sum": None, "max": np.maximum, "min": np.minimum}


@dataclass(frozen=True)
class PatternGroup:
    """A group run on one pattern's values: its row index, its sparse
    operands, its ops in order with the column index each works along
    (None for row-wise ops; a statement may name the columns differently
    in a nested reduction), and the row-wise outputs the executor computes
    only on the pattern's rows (0 elsewhere)."""

    rows: str
    sparse: tuple[str, ...]
    ops: tuple[UnitOp, ...]
    op_cols: tuple[str | None, ...]
    outputs: tuple[str, ...]
    row_restricted: frozenset

    def describe(self) -> str:
        """How the group runs, for ``explain()`` (see :func:`pattern_group`)."""
        return f"on the values of the one pattern of {', '.join(self.sparse)} (checked per call)"


def _is_csr(info) -> bool:
    return (info is not None and info.is_sparse and info.ndim == 2 and tuple(info.levels) == ("dense", "compressed")
            and tuple(info.mode_order) == (0, 1))


def _pattern_atoms(plan, term, sparse: set, rows: str, cols: str, level: int) -> bool:
    """Does a mask term read the ``level`` (0 rows, 1 columns) of one of the pattern's operands?"""
    for atom in term:
        _, tensor, indices, mode = plan.atoms[atom]
        if tensor in sparse and tuple(indices) == (rows, cols) and mode == level:
            return True
    return False


def _mask(plan, op: UnitOp, ix: str):
    m = plan.masks.get(op.id, {}).get(ix)
    return None if m is None or m.is_true else m


def pattern_group(plan, ops, outputs) -> PatternGroup | None:
    """The :class:`PatternGroup` running ``ops`` (a fused group of ``plan``
    with these outputs), or None when the group does not qualify.

    >>> import numpy as np, scipy.sparse as sp, spfuse
    >>> A = sp.random_array((50, 50), density=0.1, format="csr", rng=0)
    >>> S, m = A.copy(), np.zeros(50)
    >>> plan = spfuse.compile("E[i,j] = A[i,j] * exp(S[i,j] - m[i])").plans(A=A, S=S, m=m)["auto"]
    >>> pattern_group(plan, plan.ops, ("E",)).describe()
    'on the values of the one pattern of A, S (checked per call)'
    """
    produced = {op.out: op for op in ops}
    sparse = {a.name for op in ops for a in op.args
              if isinstance(a, Ref) and a.name not in produced and plan.inputs.get(a.name) is not None
              and plan.inputs[a.name].is_sparse}
    if not sparse or not all(_is_csr(plan.inputs[n]) for n in sparse):
        return None
    reads = {tuple(a.indices) for op in ops for a in op.args if isinstance(a, Ref) and a.name in sparse}
    rows = {r for r, _ in reads}
    colnames = {c for _, c in reads}
    if len(rows) != 1 or rows & colnames:
        return None
    (rows,) = rows
    row_restricted = set()
    op_cols = []
    for op in ops:
        if type(op) is not UnitOp:
            return None  # a whole fused statement (fusion="max"): its expression is the executor's
        out = tuple(op.out_indices)
        if op.operator not in ("+", "-", "*", "/", "where", None, *_UNARY_NP):
            return None
        along = [ix for ix in op.indices if ix in colnames]
        if len(along) > 1 or any(ix not in colnames and ix != rows for ix in op.indices):
            return None
        cols = along[0] if along else None
        if op.reduction is not None:
            if op.reduction not in _REDUCE or cols is None or tuple(op.reduced) != (cols,) or out != (rows,):
                return None
        elif out not in ({(rows, cols), (rows,), ()} if cols else {(rows,), ()}):
            return None
        wide = cols is not None
        for a in op.args:
            if isinstance(a, Const) or a.name in sparse:
                continue
            info = plan.inputs.get(a.name)
            if a.name not in produced and (info is None and plan.shapes.get(a.name) is None
                                           or info is not None and info.is_sparse):
                return None
        if wide:
            cm = _mask(plan, op, cols)
            if cm is None or not all(_pattern_atoms(plan, t, sparse, rows, cols, 1) for t in cm.terms):
                return None  # not restricted to the pattern: it has values off it
        rm = _mask(plan, op, rows)
        if rm is not None:
            if not all(any(_pattern_atoms(plan, t, sparse, rows, c, lv) for c in colnames for lv in (0, 1))
                       for t in rm.terms):
                return None
            if not wide or op.reduction is not None:
                row_restricted.add(op.out)
        if out == () and op.reduction is None and any(not isinstance(a, Const) for a in op.args):
            return None
        op_cols.append(cols)
    for name in outputs:
        if name not in produced:
            return None
    if len(sparse) < 2:
        return None  # nothing to co-iterate: the executor's sweeps over one operand are as fast
    return PatternGroup(rows, tuple(sorted(sparse)), tuple(ops), tuple(op_cols), tuple(outputs),
                        frozenset(row_restricted))


def _same_pattern(a, b) -> bool:
    la, lb = a.levels[1], b.levels[1]
    return a.shape == b.shape and a.nnz == b.nnz and (la.pos is lb.pos or np.array_equal(la.pos, lb.pos)) and (
        la.crd is lb.crd or np.array_equal(la.crd, lb.crd))


def _divide(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(a == 0, 0.0, np.divide(a, b))


def run_pattern_group(pg: PatternGroup, env: dict, shapes) -> dict[str, Any] | None:
    """Run ``pg`` on ``env``'s operands: ``{output: value}`` (an ``[r,c]``
    output on the pattern, a row-wise one dense), or None (patterns differ,
    or a non-finite result): the caller then runs the generic executor.

    >>> import numpy as np, scipy.sparse as sp, spfuse
    >>> from spfuse.tensor import as_tensor
    >>> A = sp.random_array((50, 50), density=0.1, format="csr", rng=0); S = A.copy()
    >>> plan = spfuse.compile("r[i] = sum(j, A[i,j] * exp(S[i,j]))").plans(A=A, S=S)["auto"]
    >>> pg = pattern_group(plan, plan.ops, ("r",))
    >>> r = run_pattern_group(pg, {"A": as_tensor(A), "S": as_tensor(S)}, plan.shapes)["r"]
    >>> bool(np.allclose(r, (A.toarray() * np.where(A.toarray() != 0, np.exp(A.toarray()), 0)).sum(1)))
    True
    """
    first = env[pg.sparse[0]]
    if first.format.name != "csr" or any(not _same_pattern(first, env[n]) for n in pg.sparse[1:]):
        return None
    level = first.levels[1]
    indptr, cols = level.pos, level.crd
    nrows, ncols = first.shape
    counts = np.diff(indptr)
    rowidx = np.repeat(np.arange(nrows), counts)
    vals: dict[str, np.ndarray] = {n: env[n].values for n in pg.sparse}
    for op, c in zip(pg.ops, pg.op_cols, strict=True):
        # a sparse temporary of an earlier group (SDDMM kept on the pattern) on the same pattern
        for a in op.args:
            t = env.get(a.name) if isinstance(a, Ref) and tuple(a.indices) == (pg.rows, c) else None
            if t is not None and a.name not in vals and not t.format.is_dense and t.format.name == "csr" \
                    and _same_pattern(first, t):
                vals[a.name] = t.values
    rowwise: dict[str, np.ndarray] = {}
    dense_cache: dict[str, np.ndarray] = {}
    gathered: dict[str, np.ndarray] = {}
    done: dict[tuple, str] = {}  # an operation already computed (A/A once per statement, not per term)

    def dense(name):
        d = dense_cache.get(name)
        if d is None:
            t = env[name]
            d = dense_cache[name] = np.asarray(t.todense() if not t.format.is_dense or not t.format.is_identity_order
                                               else t.values.reshape(t.shape))
        return d

    def arg(a, c: str | None):
        if isinstance(a, Const):
            return a.value
        ix, wide = tuple(a.indices), c is not None
        if a.name in vals and ix == (pg.rows, c):
            return vals[a.name]
        if ix == ():
            return float(dense(a.name).reshape(-1)[0]) if a.name not in rowwise else rowwise[a.name]
        if ix == (pg.rows,):
            v = rowwise[a.name] if a.name in rowwise else dense(a.name).reshape(-1)
            if not wide:
                return v
            g = gathered.get(a.name)
            if g is None:
                g = gathered[a.name] = v[rowidx]  # a row vector at each entry, gathered once
            return g
        if ix == (c,):
            return dense(a.name).reshape(-1)[cols]
        return dense(a.name)[rowidx, cols]

    for op, c in zip(pg.ops, pg.op_cols, strict=True):
        wide = c is not None
        # the column index's name does not matter: every one walks the same entries
        key = (op.operator, op.reduction, wide, op.coefs, op.out in pg.row_restricted, tuple(
            a.value if isinstance(a, Const) else
            (done.get(a.name, a.name), tuple("r" if ix == pg.rows else "c" for ix in a.indices)) for a in op.args))
        same = done.get(key)
        if same is not None:
            done[op.out] = same
            for table in (vals, rowwise):
                if same in table:
                    table[op.out] = table[same]
            continue
        done[key] = op.out
        xs = [arg(a, c) for a in op.args]
        if op.operator is None:
            r = xs[0]
        elif op.operator in ("+", "-"):
            coefs = op.coefficients
            r = coefs[0] * xs[0] if coefs[0] != 1.0 else xs[0]
            for c, x in zip(coefs[1:], xs[1:], strict=True):
                term = x if c == 1.0 else c * x
                r = r - term if op.operator == "-" else r + term
        elif op.operator == "*":
            r = xs[0]
            for x in xs[1:]:
                r = r * x
        elif op.operator == "/":
            r = _divide(xs[0], xs[1])
        elif op.operator == "where":
            r = np.where(np.asarray(xs[0]) != 0, xs[1], xs[2])
        else:
            with np.errstate(all="ignore"):
                r = _UNARY_NP[op.operator](np.asarray(xs[0], dtype=np.float64))
        if wide:
            r = np.broadcast_to(np.asarray(r, dtype=np.float64), rowidx.shape)
        if op.reduction is not None:
            r = _reduce(op.reduction, r, indptr, counts, ncols)
            rowwise[op.out] = r
        elif wide:
            vals[op.out] = np.ascontiguousarray(r, dtype=np.float64)
        else:
            r = np.broadcast_to(np.asarray(r, dtype=np.float64), (nrows,) if op.out_indices else ())
            if op.out in pg.row_restricted:
                r = np.where(counts > 0, r, 0.0)
            rowwise[op.out] = r
    out: dict[str, Any] = {}
    for name in pg.outputs:
        if name in vals:
            v = vals[name]  # (float64, as the executor's results; the call path casts results)
            if not np.all(np.isfinite(v)):
                return None
            out[name] = first._with_kernel_values(np.ascontiguousarray(v))
        else:
            v = np.array(rowwise[name], dtype=np.float64).reshape(shapes[name])
            if not np.all(np.isfinite(v)):
                return None
            out[name] = v
    return out


def _reduce(kind: str, x: np.ndarray, indptr: np.ndarray, counts: np.ndarray, ncols: int) -> np.ndarray:
    """A row reduction of entry values ``x`` (pattern order); max and min also
    see a row's implicit zeros (a row not full), and give 0 on an empty row."""
    nrows = len(counts)
    if kind == "sum":
        return np.bincount(np.repeat(np.arange(nrows), counts), weights=x, minlength=nrows)
    out = np.zeros(nrows)
    full = counts > 0
    if full.any():
        starts = np.asarray(indptr[:-1])[full]
        out[full] = _REDUCE[kind].reduceat(x, starts)
        partial = full & (counts < ncols)
        out[partial] = _REDUCE[kind](out[partial], 0.0)
    return out
