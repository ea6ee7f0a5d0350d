"""Element-wise work on one sparse pattern, run on the pattern's values arrays.

Sparse attention and its gradient are mostly statements like
``E[i,j] = A[i,j] * exp(S[i,j] - m[i])`` or ``r[i] = sum(j, A[i,j]/A[i,j] *
where(...))``: every sparse operand is a CSR matrix on *one* pattern, read
at the same ``[i,j]``, and the work is entry by entry on that pattern, or
a reduction along its rows.  The generic executor co-iterates the operands
entry by entry (tens of ns per stored entry); here, once the operands are
known to store one pattern (checked per call), the group runs as a
*pattern program* (:func:`spfuse._kernels._dense_kernels.pattern_program`):
one compiled pass over blocks of whole rows, every operation in turn over
the block's entries (a row vector ``m[i]`` each row's value, a dense
``D[i,j]`` read at the entries' columns, a row reduction over each row's
entries), blocks shared by the team.  The program is made once per group
(:func:`_program`).  A group with a 0-d output runs each operation as one
numpy expression over row blocks of the values arrays instead
(:func:`_run_block`).  On the sparse-attention
backward pass (1000 nodes, 18k entries) the program took the pattern groups
from 2.1 to 1.2 ms per epoch.

A group qualifies (:func:`pattern_group`, at planning) when

* its sparse operands are 2-D CSR inputs, each read as ``X[r,c]`` (the
  column index may be named differently in a nested reduction): two or
  more, or one with an earlier group's result read at its entries (the
  work after an SDDMM kept on its pattern -- ``B * exp(C·D)``, a scale, a
  bias -- took the generic executor, merging the two entry by entry,
  about 30 ms over 1M entries, against 7 ms as a pattern program); one
  alone is swept faster by the executor;
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

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from spfuse._kernels._dense_kernels import PATTERN_ARGS, PATTERN_OPS, UNARY_OPS, pattern_program
from spfuse._kernels._result_pool import empty as _result
from spfuse.ir.ops import Const, Ref, UnitOp
from spfuse.lowering.templates import dense_transposed
from spfuse.memo import attached_dict
from spfuse.tensor import same_pattern
from spfuse.testing import _UNARY_NP

__all__ = ["PatternGroup", "pattern_group", "run_pattern_group"]

_REDUCE = {"sum": None, "max": np.maximum, "min": np.minimum}
_OTHER = {"max": "min", "min": "max"}
_F64 = np.dtype(np.float64)


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
    #: per op, an earlier op computing the same values (None: computed here)
    same_as: tuple[str | None, ...] = ()
    #: per op, a dense-row leaf: "dot" (``T[r,c] = sum(e, L[r,e] * R[c,e])``,
    #: SDDMM's), "axpy" (``O[r,e] = sum(c, V[r,c] * R[c,e])``, SpMM's), or None
    leaves: tuple[str | None, ...] = ()

    def describe(self) -> str:
        """How the group runs, for ``explain()`` (see :func:`pattern_group`)."""
        scalar_out = any(not op.out_indices for op in self.ops if op.out in self.outputs)
        how = "numpy row blocks" if scalar_out else "a compiled pattern program"
        leaves = {"dot": "an SDDMM's dot per entry", "axpy": "an SpMM's row"}
        with_leaves = " and ".join(leaves[k] for k in leaves if k in self.leaves)
        how += f" (dense-row leaves: {with_leaves})" if with_leaves else ""
        return f"{how} on the values of the one pattern of {', '.join(self.sparse)} (checked per call)"


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
    'a compiled pattern program on the values of the one pattern of A, S (checked per call)'
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
    # a nested sum may name the columns anew where it reads the group's own entries (``sum(j2, E[i,j2])``)
    stored_cols = set(colnames)
    colnames = colnames | {a.indices[1] for op in ops for a in op.args
                           if isinstance(a, Ref) and a.name in produced and len(a.indices) == 2
                           and a.indices[0] == rows and a.indices[1] != rows
                           and tuple(produced[a.name].out_indices[:1]) == (rows,)
                           and tuple(produced[a.name].out_indices[1:]) in {(c,) for c in stored_cols}}
    row_restricted = set()
    op_cols = []
    leaves: list[str | None] = []
    row_dots = 0
    for op in ops:
        if type(op) is not UnitOp:
            return None  # a whole fused statement (fusion="max"): its expression is the executor's
        out = tuple(op.out_indices)
        leaf = _dense_row_leaf(plan, op, rows, colnames, sparse, produced)
        leaves.append(None if leaf is None else leaf[0])
        if leaf is not None:
            kind, cols, _ = leaf
            if not _columns_on_pattern(plan, op, cols, sparse, rows, stored_cols) \
                    or not _rows_on_pattern(plan, op, sparse, rows, colnames):
                return None  # not restricted to the pattern
            if kind == "axpy" and (any(r.name == op.out for o in ops for r in o.refs) or op.out not in outputs):
                return None  # (a leaf's dense rows are written out, not read again within the program)
            op_cols.append(cols)
            continue
        if op.operator not in ("+", "-", "*", "/", "where", None, *_UNARY_NP):
            return None
        along = [ix for ix in op.indices if ix in colnames]
        # a row's dot product over dense operands is row-wise; its operands are checked there
        row_dot = _dense_row_sum(plan, op, rows, colnames, sparse)
        row_dots += row_dot
        if not row_dot and (len(along) > 1 or any(ix not in colnames and ix != rows for ix in op.indices)):
            return None
        cols = along[0] if along and not row_dot else None
        if row_dot:
            pass
        elif op.reduction is not None:
            if op.reduction not in _REDUCE or cols is None or tuple(op.reduced) != (cols,) or out != (rows,):
                return None
        elif out not in ({(rows, cols), (rows,), ()} if cols else {(rows,), ()}):
            return None
        wide = cols is not None
        for a in op.args:
            if isinstance(a, Const) or a.name in sparse or row_dot:
                continue
            info = plan.inputs.get(a.name)
            if a.name not in produced and (info is None and plan.shapes.get(a.name) is None
                                           or info is not None and info.is_sparse):
                return None
            if tuple(a.indices) not in {(), (rows,), (cols,), (rows, cols)}:
                return None  # a dense operand read across the pattern (D[j,i]): gathered as the executor does
        if wide and not _columns_on_pattern(plan, op, cols, sparse, rows, stored_cols):
            return None  # not restricted to the pattern: it has values off it
        if _mask(plan, op, rows) is not None:
            if not _rows_on_pattern(plan, op, sparse, rows, colnames):
                return None
            if not wide or op.reduction is not None:
                row_restricted.add(op.out)
        if out == () and op.reduction is None and any(not isinstance(a, Const) for a in op.args):
            return None
        op_cols.append(cols)
    for name in outputs:
        if name not in produced:
            return None
    reductions = [op.reduction for op in ops if op.reduction is not None]
    if len(sparse) < 2 and not row_dots and not any(leaves) \
            and not (len(reductions) > 1 or "max" in reductions or "min" in reductions) \
            and not _reads_earlier_entries(plan, ops, produced, rows, colnames):
        # nothing to co-iterate: the executor's sweeps over one operand are as fast (an SpMV-like row sum,
        # 100k rows: 5.9 against 9.9 ms row by row; element-wise chains and a sum of exp, 1M entries:
        # 8-10 ms either way) -- unless it also walks a dense dot per row (the attention gradient's:
        # 0.45 ms there against 0.05 ms here), reads another group's result at the entries (an SDDMM's,
        # kept on the pattern: the executor merges it with the operand entry by entry), or reduces rows
        # to a maximum or minimum, or more than once (a softmax over the stored entries, 1M entries, one
        # thread: 105-110 ms there against 21-27 ms here; a row maximum 17-19 against 8.5-10.6 ms)
        return None
    if (row_dots or any(leaves)) and any(not produced[name].out_indices for name in outputs):
        return None  # (a row dot or a leaf runs in the compiled program only, which has no 0-d output)
    for name in outputs:
        decision = plan.formats.get(name)
        if leaves[ops.index(produced[name])] == "axpy" and name in plan.results and (
                decision is None or any(lv != "dense" for lv in decision.levels)):
            return None
    return PatternGroup(rows, tuple(sorted(sparse)), tuple(ops), tuple(op_cols), tuple(outputs),
                        frozenset(row_restricted), _repeats(ops, op_cols, rows, row_restricted, leaves),
                        tuple(leaves))


def _columns_on_pattern(plan, op: UnitOp, cols: str, sparse: set, rows: str, stored_cols: set) -> bool:
    """Does ``op``'s mask on ``cols`` read a column level of the pattern's
    operands in each term (zero, or not needed, off the pattern)?  A nested
    sum's column index is masked by the pattern's own column names."""
    cm = _mask(plan, op, cols)
    return cm is not None and all(any(_pattern_atoms(plan, t, sparse, rows, c, 1) for c in stored_cols)
                                  for t in cm.terms)


def _rows_on_pattern(plan, op: UnitOp, sparse: set, rows: str, colnames: set) -> bool:
    """Is ``op``'s mask on the rows, if any, at most the pattern's rows?"""
    rm = _mask(plan, op, rows)
    return rm is None or all(any(_pattern_atoms(plan, t, sparse, rows, c, lv) for c in colnames for lv in (0, 1))
                             for t in rm.terms)


def _dense_row_leaf(plan, op: UnitOp, rows: str, colnames: set, sparse: set, produced) -> tuple | None:
    """``("dot", c, e)`` when ``op`` is ``T[r,c] = sum(e, L[r,e] * R[c,e])``
    (an entry's dot of two dense rows, SDDMM's leaf), ``("axpy", c, e)``
    when it is ``O[r,e] = sum(c, V[r,c] * R[c,e])`` (a row of dense rows
    summed with the entries' values, SpMM's), else None.  ``L`` and ``R``
    are dense, read either way round (a transposed read takes a copy);
    ``e`` is a dense index no mask restricts."""
    if op.reduction != "sum" or len(op.reduced) != 1 or op.operator != "*" or len(op.args) != 2 \
            or not all(isinstance(a, Ref) and len(a.indices) == 2 for a in op.args):
        return None
    (summed,) = op.reduced
    out = tuple(op.out_indices)

    def dense(a) -> bool:
        info = plan.inputs.get(a.name)
        if a.name in produced or a.name in sparse:
            return False
        return (info is not None and not info.is_sparse) or (info is None and plan.shapes.get(a.name) is not None)

    if len(out) == 2 and out[0] == rows and out[1] in colnames and summed not in colnames and summed != rows:
        c, e = out[1], summed
        by_ix = {frozenset(a.indices): a for a in op.args}
        left, right = by_ix.get(frozenset((rows, e))), by_ix.get(frozenset((c, e)))
        if left is None or right is None or left is right or not dense(left) or not dense(right):
            return None
        return None if _mask(plan, op, e) is not None else ("dot", c, e)
    if len(out) == 2 and out[0] == rows and out[1] not in colnames and out[1] != rows and summed != rows:
        c, e = summed, out[1]
        values = next((a for a in op.args if tuple(a.indices) == (rows, c)), None)
        if c not in colnames and (values is None or values.name not in produced):
            return None   # (a column index named anew in a nested sum: its values are the group's, on the pattern)
        right = next((a for a in op.args if a is not values and set(a.indices) == {c, e}), None)
        if values is None or right is None or not dense(right):
            return None
        return None if _mask(plan, op, e) is not None else ("axpy", c, e)
    return None


def _reads_earlier_entries(plan, ops, produced, rows: str, colnames: set) -> bool:
    """Does the group read an earlier group's result at the pattern's entries (``T[r,c]``)?"""
    return any(isinstance(a, Ref) and a.name not in produced and a.name not in plan.inputs
               and len(a.indices) == 2 and a.indices[0] == rows and a.indices[1] in colnames
               for op in ops for a in op.args)


def _dense_row_sum(plan, op: UnitOp, rows: str, colnames: set, sparse: set) -> bool:
    """Is ``op`` a sum along one dense index of a product of dense operands,
    per row (``T[r] = sum(e, G[r,e] * V[r,e])``, the dot of two rows of an
    attention gradient), its summed index not restricted by a mask?"""
    if op.reduction != "sum" or len(op.reduced) != 1 or tuple(op.out_indices) != (rows,) \
            or op.operator not in ("*", None):
        return False
    (e,) = op.reduced
    if e in colnames or e == rows or _mask(plan, op, e) is not None \
            or not any(isinstance(a, Ref) and e in a.indices for a in op.args):   # (its extent from an operand)
        return False
    for a in op.args:
        if isinstance(a, Const):
            continue
        if a.name in sparse or tuple(a.indices) not in {(), (rows,), (e,), (rows, e)}:
            return False
        info = plan.inputs.get(a.name)
        if info is not None and info.is_sparse or info is None and plan.shapes.get(a.name) is None:
            return False
    return True


def _repeats(ops, op_cols, rows: str, row_restricted, leaves) -> tuple[str | None, ...]:
    """Per op, an earlier op computing the same values, or None: a statement's
    terms repeat sub-expressions (``A/A``, ``m_r_1 - m_r_2`` read at ``j``
    and at ``j_1`` -- every column index walks the same entries).  A
    dense-row leaf is always computed (its reads name dense indices too)."""
    seen: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    out: list[str | None] = []
    for op, c, leaf in zip(ops, op_cols, leaves, strict=True):
        if leaf is not None:
            out.append(None)
            continue
        key = (op.operator, op.reduction, c is not None, op.coefs, op.out in row_restricted, tuple(
            ("const", a.value) if isinstance(a, Const) else
            (alias.get(a.name, a.name), tuple("r" if ix == rows else "c" for ix in a.indices)) for a in op.args))
        same = seen.get(key)
        if same is None:
            seen[key] = op.out
        else:
            alias[op.out] = same
        out.append(same)
    return tuple(out)


def _stored_extrema(pg: PatternGroup) -> tuple[dict[int, tuple], frozenset]:
    """The ops of ``pg`` forming the front end's max/min over a pattern's
    stored entries (:mod:`spfuse.frontend.patterns`)::

        c[r] = min(c1, P[r,c1] * e[r,c1]);  d[r,c] = e[r,c] - c[r]
        x[r] = max(c, P[r,c] * d[r,c]);     m[r] = x[r] + c[r]

    (min: the other way round; ``P`` and ``e`` the same operands in both
    products, repeats found by :func:`_repeats`; ``d`` may be ``e``'s own
    terms and ``- c[r]`` in one sum, as the planner merges them): ``({index
    of m: (1 max / 2 min, P, e, the column index)}, indices of the ops it
    replaces)``, for one ``stored_extremum`` instruction doing the same
    arithmetic in one pass over each row.  Only where ``c``, ``d`` and
    ``x`` are read by nothing else."""
    ops, rows = pg.ops, pg.rows
    alias = {op.out: same for op, same in zip(ops, pg.same_as, strict=True) if same is not None}
    made = {op.out: k for k, op in enumerate(ops) if op.out not in alias}
    readers: dict[str, set] = {}
    for k, op in enumerate(ops):
        for a in op.refs:
            readers.setdefault(alias.get(a.name, a.name), set()).add(k)

    def key(a) -> str:
        return alias.get(a.name, a.name)

    def producer(a) -> int | None:
        return made.get(key(a)) if isinstance(a, Ref) else None

    def read(a, k: int) -> tuple:   # an argument as ``_repeats`` compares it (column names by position)
        if isinstance(a, Const):
            return ("const", a.value)
        return key(a), tuple("r" if ix == rows else "c" if ix == pg.op_cols[k] else ix for ix in a.indices)

    def only_read_by(a, *ks: int) -> bool:
        return readers.get(key(a)) == set(ks) and a.name not in pg.outputs and key(a) not in pg.outputs

    def entrywise(k: int) -> bool:
        return ops[k].reduction is None and (not pg.leaves or pg.leaves[k] is None)

    def product(k: int, reduction: str) -> bool:
        op = ops[k]
        return (op.reduction == reduction and op.operator == "*" and len(op.args) == 2
                and (not pg.leaves or pg.leaves[k] is None))

    def shifted_value(idn: int, ic: int, ix: int):
        """``e`` when op ``idn`` is ``e - c`` (``c`` op ``ic``'s result),
        read where op ``ix`` reads it; else None."""
        d = ops[idn]
        *terms, bound = d.args
        *coefs, bound_coef = d.coefficients
        if not entrywise(idn) or (d.operator, bound_coef) not in (("+", -1.0), ("-", 1.0)) \
                or producer(bound) != ic or tuple(bound.indices) != (rows,):
            return None
        if len(terms) == 1 and coefs == [1.0]:
            return terms[0] if read(terms[0], idn)[1] == ("r", "c") else None
        for a in ops[ic].args:   # e's terms merged into d: e is the op of those terms
            ie = producer(a)
            if ie is not None and entrywise(ie) and ops[ie].operator == d.operator \
                    and list(ops[ie].coefficients) == coefs \
                    and [read(t, ie) for t in ops[ie].args] == [read(t, idn) for t in terms]:
                return Ref(ops[ie].out, (rows, pg.op_cols[ix]))
        return None

    fused: dict[int, tuple] = {}
    replaced: set[int] = set()
    for k, op in enumerate(ops):
        if pg.op_cols[k] is not None or not entrywise(k) or op.out in alias or op.operator != "+" \
                or len(op.args) != 2 or op.coefficients != (1.0, 1.0) \
                or not all(isinstance(a, Ref) and tuple(a.indices) == (rows,) for a in op.args):
            continue
        for x_ref, c_ref in (op.args, op.args[::-1]):
            ix, ic = producer(x_ref), producer(c_ref)
            if ix is None or ic is None or {ix, ic} & replaced or not only_read_by(x_ref, k):
                continue
            x, c = ops[ix], ops[ic]
            if x.reduction not in _OTHER or not product(ix, x.reduction) or not product(ic, _OTHER[x.reduction]):
                continue
            for p, d_ref in (x.args, x.args[::-1]):
                idn = producer(d_ref)
                if idn is None or read(p, ix)[1] != ("r", "c") or read(d_ref, ix)[1] != ("r", "c") \
                        or pg.op_cols[idn] != pg.op_cols[ix] or not only_read_by(d_ref, ix):
                    continue
                e = shifted_value(idn, ic, ix)
                if e is None or not only_read_by(c_ref, idn, k) \
                        or sorted(read(a, ic) for a in c.args) != sorted((read(p, ix), read(e, ix))):
                    continue
                fused[k] = (1 if x.reduction == "max" else 2, p, e, pg.op_cols[ix])
                replaced.update({ix, ic, idn})
                break
            if k in fused:
                break
    replaced.update(j for j, op in enumerate(ops) if op.out in alias and made.get(alias[op.out]) in replaced)
    return fused, frozenset(replaced)


#: entries evaluated per block: numpy's temporaries then stay in cache (and
#: below malloc's mmap threshold -- a fresh 18k-entry temporary per operation
#: cost page faults, 100+ µs each, more than the arithmetic).  Each operation
#: is one numpy call per block: measured over a sparse-attention backward
#: pass's statements (one thread, the work buffers reused), 32768 took
#: 8.3-10.8 ms against 9.3-12.7 ms with 8192 and 15-21 ms with 2048 (18k
#: entries), and 44-47 ms against 50-58 ms with 8192 (160k entries).
BLOCK = 32768


def _row_blocks(indptr: np.ndarray, nrows: int) -> list[tuple[int, int]]:
    """Row ranges of about :data:`BLOCK` entries each (a longer row alone)."""
    bounds, lo = [], 0
    while lo < nrows:
        hi = int(np.searchsorted(indptr, indptr[lo] + BLOCK, side="right")) - 1
        hi = min(max(hi, lo + 1), nrows)
        bounds.append((lo, hi))
        lo = hi
    return bounds or [(0, 0)]


def run_pattern_group(pg: PatternGroup, env: dict, shapes, nt: int = 1) -> dict[str, Any] | None:
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
    if first.format.name != "csr" or any(not same_pattern(first, env[n]) for n in pg.sparse[1:]):
        return None
    level = first.levels[1]
    indptr, cols = level.pos, level.crd
    if indptr.dtype != cols.dtype or indptr.dtype not in (np.int32, np.int64):   # (one index type, as the kernels)
        indptr, cols = indptr.astype(np.int64), cols.astype(np.int64)
    nrows, ncols = first.shape
    on_pattern: dict[str, np.ndarray] = {n: env[n].values for n in pg.sparse}
    for op, c in zip(pg.ops, pg.op_cols, strict=True):
        # a sparse temporary of an earlier group (SDDMM kept on the pattern) on the same pattern
        for a in op.args:
            t = env.get(a.name) if isinstance(a, Ref) and tuple(a.indices) == (pg.rows, c) else None
            if t is not None and a.name not in on_pattern and not t.format.is_dense and t.format.name == "csr" \
                    and same_pattern(first, t):
                on_pattern[a.name] = t.values
    dense_cache: dict[str, np.ndarray] = {}

    def dense(name):
        d = dense_cache.get(name)
        if d is None:
            t = env[name]
            d = dense_cache[name] = np.asarray(t.todense() if not t.format.is_dense or not t.format.is_identity_order
                                               else t.values.reshape(t.shape))
        return d

    def transposed(name):
        return dense_transposed(env[name], _F64, nt)

    program = _program(pg, frozenset(on_pattern))
    if program is not None:
        results = _run_program(program, indptr, cols, nrows, ncols, on_pattern, dense, nt, transposed)
        if results is None:
            return None
    elif any(pg.leaves) or any(c is None and op.reduction is not None for op, c in zip(pg.ops, pg.op_cols,
                                                                                        strict=True)):
        return None   # a row's dot product, a dense-row leaf: no numpy block form (pattern_group makes no such group)
    else:   # (a 0-d output: the numpy blocks)
        results = {}
        for name in pg.outputs:
            op = next(o for o in pg.ops if o.out == name)
            wide = op.reduction is None and len(op.out_indices) == 2
            results[name] = np.empty(len(cols) if wide else (nrows if op.out_indices else ()))
        counts = np.diff(indptr)
        for lo, hi in _row_blocks(indptr, nrows):
            _run_block(pg, lo, hi, indptr, cols, counts, ncols, on_pattern, dense, results)
        # (inf or NaN anywhere makes a sum so; an overflow only sends it back too)
        if not all(math.isfinite(v.sum()) for v in results.values()):
            return None
    out: dict[str, Any] = {}
    for name, v in results.items():
        if v.ndim == 1 and len(v) == len(cols) and name in {o.out for o in pg.ops if len(o.out_indices) == 2}:
            out[name] = first._with_kernel_values(v)  # (float64, as the executor's; the call path casts results)
        else:
            out[name] = v.reshape(shapes[name])
    return out


#: Below this many entry-operations a pattern program runs on one thread.
PARALLEL_MIN_WORK = 100_000


@dataclass(frozen=True)
class _Program:
    """A :class:`PatternGroup` as a pattern program of
    :func:`spfuse._kernels._dense_kernels.pattern_program` (one compiled pass
    over each row, every operation in turn): its instruction table and
    constants, the operand arrays it reads (``(kind, name)``, fetched per
    call), its register counts and its outputs ``(name, register kind,
    register)``."""

    code: np.ndarray
    consts: np.ndarray
    sources: tuple[tuple[str, str], ...]
    n_entry: int
    n_row: int
    outputs: tuple[tuple[str, int, int], ...]
    #: the dense matrices its ``row_axpy`` leaves write, ``(name, source of
    #: their gathered rows)``: each is a source of kind ``"axpy_out"``
    written: tuple[tuple[str, int], ...] = ()


def _program(pg: PatternGroup, on_pattern: frozenset) -> _Program | None:
    """``pg`` compiled for these operands stored on the pattern (made once
    per group and set of them), or None when an output is 0-d."""
    made = attached_dict(pg, "_programs")
    if on_pattern in made:
        return made[on_pattern]
    entry: dict[str, int] = {}   # name -> entry register
    row: dict[str, int] = {}     # name -> row register
    counts = [0, 0]              # registers made: entry, row
    consts: list[float] = []
    sources: dict[tuple[str, str], int] = {}
    rows_ix = pg.rows
    table: list[list[int]] = []

    def const(v: float) -> int:
        consts.append(float(v))
        return len(consts) - 1

    def source(kind: str, name: str) -> int:
        return sources.setdefault((kind, name), len(sources))

    def arg(a, c: str | None) -> tuple[int, int]:   # (the numpy blocks' ``arg``, as a register or an array)
        if isinstance(a, Const):
            return PATTERN_ARGS["const"], const(a.value)
        ix = tuple(a.indices)
        if c is not None and ix == (rows_ix, c) and (a.name in entry or a.name in on_pattern):
            return (PATTERN_ARGS["entry"], entry[a.name]) if a.name in entry else (
                PATTERN_ARGS["pattern"], source("pattern", a.name))
        if ix in ((), (rows_ix,)):
            if a.name in row:
                return PATTERN_ARGS["row"], row[a.name]
            return (PATTERN_ARGS["scalar"], source("scalar", a.name)) if ix == () else (
                PATTERN_ARGS["rowvec"], source("rowvec", a.name))
        if ix == (c,):
            return PATTERN_ARGS["colvec"], source("colvec", a.name)
        return PATTERN_ARGS["matrix"], source("matrix", a.name)

    def register(kind: int) -> int:
        counts[kind] += 1
        return counts[kind] - 1

    def emit(op: UnitOp, args: list, dst_kind: int, dst: int, flags: int = 0) -> None:
        o = op.operator
        kind = "copy" if o is None else (o if o in PATTERN_OPS else "unary")
        coefs = const(op.coefficients[0]) if o in ("+", "-") else 0
        if o in ("+", "-"):
            for k in op.coefficients[1:]:
                const(k)
        table.append([PATTERN_OPS[kind], UNARY_OPS.get(o, 0), dst_kind, dst, len(args), coefs, flags,
                      *(x for a in args for x in a)])

    written: list[tuple[str, int]] = []

    def dense_row(a, other: str) -> tuple[int, int]:
        """A leaf's dense operand, as stored when its index ``other`` (the
        row's or the column's) comes first, else as a transposed copy."""
        kind = "dense_row" if a.indices[0] == rows_ix else "col_row"
        stored = a.indices[0] == other
        return PATTERN_ARGS[kind], source(kind if stored else kind + "_t", a.name)

    fused, skipped = _stored_extrema(pg)
    for k, (op, c, same, leaf) in enumerate(zip(pg.ops, pg.op_cols, pg.same_as, pg.leaves or (None,) * len(pg.ops),
                                                strict=True)):
        if k in skipped:
            continue
        if k in fused:
            sub, p, e, along = fused[k]
            row[op.out] = register(1)
            table.append([PATTERN_OPS["stored_extremum"], sub, 1, row[op.out], 2, 0, 0, *arg(p, along),
                          *arg(e, along)])
            continue
        if leaf == "dot":
            left = next(a for a in op.args if rows_ix in a.indices)
            right = next(a for a in op.args if a is not left)
            args = [dense_row(left, rows_ix), dense_row(right, c)]
            entry[op.out] = register(0)
            table.append([PATTERN_OPS["entry_dot"], 0, 0, entry[op.out], 2, 0, 0, *(x for a in args for x in a)])
            continue
        if leaf == "axpy":
            values = next(a for a in op.args if tuple(a.indices) == (rows_ix, c))
            right = next(a for a in op.args if a is not values)
            args = [arg(values, c), dense_row(right, c)]
            written.append((op.out, args[1][1]))
            table.append([PATTERN_OPS["row_axpy"], 0, 2, source("axpy_out", op.out), 2, 0, 0,
                          *(x for a in args for x in a)])
            continue
        if same is not None:
            for regs in (entry, row):
                if same in regs:
                    regs[op.out] = regs[same]
            continue
        if c is None and op.reduction is not None:   # a row's dot product over dense operands
            (e_ix,) = op.reduced
            dot = [(PATTERN_ARGS["dense_row"], source("dense_row", a.name)) if tuple(a.indices) == (rows_ix, e_ix) else
                   (PATTERN_ARGS["dense_e"], source("dense_e", a.name)) if tuple(a.indices) == (e_ix,) else
                   arg(a, None) for a in op.args]
            extent = next(i for kind, i in dot if kind in (PATTERN_ARGS["dense_row"], PATTERN_ARGS["dense_e"]))
            row[op.out] = register(1)
            table.append([PATTERN_OPS["row_dot"], extent, 1, row[op.out], len(dot), 0,
                          1 if op.out in pg.row_restricted else 0, *(x for a in dot for x in a)])
            continue
        args = [arg(a, c) for a in op.args]
        if c is None:   # row-wise
            row[op.out] = register(1)
            emit(op, args, 1, row[op.out], 1 if op.out in pg.row_restricted else 0)
            continue
        if op.reduction is None:
            entry[op.out] = register(0)
            emit(op, args, 0, entry[op.out])
            continue
        if op.operator is None:   # a reduction of one argument: of it as it is laid out, no copy first
            summed = args[0]
        else:   # the entries' values, then their sum / max / min per row
            summed = (PATTERN_ARGS["entry"], register(0))
            emit(op, args, 0, summed[1])
        row[op.out] = register(1)
        table.append([PATTERN_OPS["reduce"], ("sum", "max", "min").index(op.reduction), 1, row[op.out], 1, 0, 0,
                      *summed])
    outputs = []
    for name in pg.outputs:
        if any(name == w for w, _ in written):
            continue   # (written in place)
        if name in entry:
            outputs.append((name, 0, entry[name]))
        elif next(o for o in pg.ops if o.out == name).out_indices:
            outputs.append((name, 1, row[name]))
        else:
            made[on_pattern] = None
            return None
    width = max((len(t) for t in table), default=7)
    code = np.zeros((len(table), width), dtype=np.int64)
    for t, ins in enumerate(table):
        code[t, :len(ins)] = ins
    found = made[on_pattern] = _Program(code, np.array(consts or [0.0]), tuple(sources), counts[0], counts[1],
                                        tuple(outputs), tuple(written))
    return found


def _run_program(program: _Program, indptr, cols, nrows: int, ncols: int, on_pattern, dense, nt: int,
                 transposed=None) -> dict | None:
    """The outputs of ``program`` over the pattern ``(indptr, cols)``
    (``transposed(name)``: a dense operand's transpose, C-ordered), or None
    when one of them holds an infinity or a NaN."""
    arrays, strides = [], []
    results = {}
    widths = dict(program.written)
    for kind, name in program.sources:
        if kind == "axpy_out":   # a leaf's dense rows: as long as the rows it gathers
            a = results[name] = _result((nrows, strides[widths[name]]), _F64)   # (pages reused: no faults)
        else:
            a = on_pattern[name] if kind == "pattern" else transposed(name) if kind.endswith("_t") else dense(name)
        # a matrix's row length; a dot's extent: its rows' length, its vector's
        strides.append(a.shape[1] if kind in ("matrix", "dense_row", "dense_row_t", "col_row", "col_row_t")
                       else len(a) if kind == "dense_e" else 0)
        arrays.append(np.ascontiguousarray(a, dtype=np.float64).reshape(-1))
    outputs = np.empty((len(program.outputs), 3), dtype=np.int64)
    for k, (name, kind, reg) in enumerate(program.outputs):
        results[name] = _result((len(cols) if kind == 0 else nrows,), _F64)
        outputs[k] = (kind, reg, len(arrays))
        arrays.append(results[name])
    work = len(cols) * max(1, len(program.code))
    nonfinite = pattern_program(indptr, cols, ncols, program.code, program.consts, arrays,   # (indices as stored)
                                np.array(strides + [0] * len(program.outputs), dtype=np.int64), program.n_entry,
                                program.n_row, outputs, nt if work >= PARALLEL_MIN_WORK else 1)
    return results if nonfinite == 0 else None


_pools = threading.local()
#: row vectors gathered per block into kept buffers (more are gathered into fresh arrays)
_GATHERS = 8


def _buffers(pg: PatternGroup, n: int) -> list[np.ndarray]:
    """Per op of ``pg``, a work buffer of at least ``n`` entries, kept per
    thread across calls: numpy's fresh temporaries, freed and allocated
    again block after block, cost page faults (malloc hands the freed top
    of the heap back to the system) that came to more than the arithmetic."""
    pools = getattr(_pools, "by_group", None)
    if pools is None:
        pools = _pools.by_group = {}
    found = pools.get(id(pg))
    if found is None or found[0] is not pg or len(found[1][0]) < n:
        if len(pools) >= 64:
            pools.clear()
        found = pools[id(pg)] = (pg, [np.empty(max(n, BLOCK)) for _ in range(len(pg.ops) + _GATHERS)])
    return found[1]


def _unary(fn: str, x, out: np.ndarray) -> np.ndarray:
    """``_UNARY_NP[fn](x)`` written into ``out``."""
    with np.errstate(all="ignore"):
        if fn == "relu":
            return np.maximum(x, 0.0, out=out)
        if fn == "sigmoid":  # 0.5 * (1 + tanh(x / 2)), as the oracle
            np.multiply(x, 0.5, out=out)
            np.tanh(out, out=out)
            np.add(out, 1.0, out=out)
            return np.multiply(out, 0.5, out=out)
        ufunc = {"tanh": np.tanh, "exp": np.exp, "log": np.log, "abs": np.abs, "sqrt": np.sqrt,
                 "neg": np.negative}[fn]
        return ufunc(x, out=out)


def _entrywise(op: UnitOp, xs: list, out: np.ndarray) -> np.ndarray:
    """One entry-wise operation over ``xs`` (arrays of the block's entries,
    or scalars) written into ``out``."""
    o = op.operator
    if o is None:
        np.copyto(out, xs[0])
    elif o in ("+", "-"):
        coefs = op.coefficients
        np.multiply(xs[0], coefs[0], out=out)
        for k, x in zip(coefs[1:], xs[1:], strict=True):
            term = x if k == 1.0 else np.multiply(x, k)
            (np.subtract if o == "-" else np.add)(out, term, out=out)
    elif o == "*":
        np.multiply(xs[0], xs[1], out=out)
        for x in xs[2:]:
            np.multiply(out, x, out=out)
    elif o == "/":  # a / b, and 0 where a is 0 (0/0 too)
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(xs[0], xs[1], out=out)
        np.copyto(out, 0.0, where=np.asarray(xs[0]) == 0)
    elif o == "where":
        np.copyto(out, xs[2])
        np.copyto(out, xs[1], where=np.asarray(xs[0]) != 0)
    else:
        _unary(o, xs[0], out)
    return out


def _run_block(pg: PatternGroup, lo: int, hi: int, indptr, cols, counts, ncols: int, on_pattern, dense,
               results: dict) -> None:
    """Every op of ``pg`` on rows ``lo:hi`` (every op is row-local); the
    outputs' parts written into ``results``."""
    elo, ehi = int(indptr[lo]), int(indptr[hi])
    n = ehi - elo
    bufs = _buffers(pg, n)
    local_counts = counts[lo:hi]
    local_rows = np.repeat(np.arange(hi - lo), local_counts)  # each entry's row, from lo
    c_idx = cols[elo:ehi]
    vals = {name: v[elo:ehi] for name, v in on_pattern.items()}
    rowwise: dict[str, Any] = {}
    gathered: dict[str, np.ndarray] = {}

    def arg(a, c: str | None):
        if isinstance(a, Const):
            return a.value
        ix, wide = tuple(a.indices), c is not None
        if a.name in vals and ix == (pg.rows, c):
            return vals[a.name]
        if ix == ():
            return rowwise[a.name] if a.name in rowwise else float(dense(a.name).reshape(-1)[0])
        if ix == (pg.rows,):
            v = rowwise[a.name] if a.name in rowwise else dense(a.name).reshape(-1)[lo:hi]
            if not wide:
                return v
            g = gathered.get(a.name)
            if g is None:  # a row vector at each entry, gathered once
                slot = len(pg.ops) + len(gathered)
                # (into a kept float64 buffer when v is float64: take casts nothing)
                g = gathered[a.name] = (np.take(v, local_rows, out=bufs[slot][:n])
                                        if slot < len(bufs) and v.dtype == bufs[slot].dtype else v[local_rows])
            return g
        if ix == (c,):
            return dense(a.name).reshape(-1)[c_idx]
        return dense(a.name)[local_rows + lo, c_idx]

    for k, (op, c, same) in enumerate(zip(pg.ops, pg.op_cols, pg.same_as, strict=True)):
        if same is not None:  # computed already (A/A once per statement, not once per term)
            for table in (vals, rowwise):
                if same in table:
                    table[op.out] = table[same]
            continue
        xs = [arg(a, c) for a in op.args]
        if c is not None:  # entry-wise (or the operand of a row reduction)
            r = _entrywise(op, xs, bufs[k][:n])
            if op.reduction is not None:
                rowwise[op.out] = _reduce(op.reduction, r, indptr[lo:hi] - elo, local_counts, ncols)
            else:
                vals[op.out] = r
            continue
        shape = (hi - lo,) if op.out_indices else ()
        r = _entrywise(op, [np.broadcast_to(x, shape) for x in xs], np.empty(shape))  # row-wise: small
        if op.out in pg.row_restricted:
            r = np.where(local_counts > 0, r, 0.0)
        rowwise[op.out] = r
    for name, whole in results.items():
        if name in vals:
            whole[elo:ehi] = vals[name]
        elif whole.ndim:
            whole[lo:hi] = rowwise[name]
        else:
            whole[()] = rowwise[name]


def _reduce(kind: str, x: np.ndarray, starts: np.ndarray, counts: np.ndarray, ncols: int) -> np.ndarray:
    """A row reduction of entry values ``x`` (rows starting at ``starts``);
    max and min also see a row's implicit zeros (a row not full), and give 0
    on an empty row."""
    out = np.zeros(len(counts))
    full = counts > 0
    if full.any():
        ufunc = np.add if kind == "sum" else _REDUCE[kind]
        out[full] = ufunc.reduceat(x, starts[full])
        if kind != "sum":
            partial = full & (counts < ncols)
            out[partial] = ufunc(out[partial], 0.0)
    return out
