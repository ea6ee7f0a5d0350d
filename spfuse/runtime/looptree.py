"""Generic loop-tree plans: build, print and run any lowered index tree.

Lowering turns a (fused) index tree into a :class:`LoopTreePlan` with a
:class:`LoopTreeBuilder`; :func:`run` executes it in the Cython interpreter
``spfuse._kernels._looptree`` under ``nogil``.  Template kernels cover the
common shapes faster; this is the path that runs *every* legal program,
including trie-fused multi-statement trees with temporaries and resets.

>>> import numpy as np
>>> from spfuse.runtime.looptree import LoopTreeBuilder, access_from_arrays, run
>>> A = access_from_arrays([("dense", 2), ("compressed", 3, [0, 1, 3], [2, 0, 1])],
...                        [5.0, 1.0, 2.0])          # CSR [[0,0,5],[1,2,0]]
>>> b = LoopTreeBuilder()
>>> i, j = b.var("i", 2), b.var("j", 3)
>>> a, x = b.access(A, (i, j)), b.access(np.array([1.0, 10.0, 100.0]), (j,))
>>> y = b.buffer((2,), name="y")
>>> with b.loop(i):
...     with b.loop(j, intersect=[a]):
...         b.statement(y[i], "sum", a * x)
>>> run(b.build())["y"]
array([500.,  21.])

Semantics
---------
* Tensors are TACO level formats: storage level ``l`` holds mode
  ``mode_order[l]``; a dense level has ``parent_positions * size`` positions,
  a compressed level ``pos[p]:pos[p+1]`` into ``crd``; the last level's
  positions index ``values``.  Fill value 0.
* An *access* binds each storage level to a loop variable.  Along the path to
  every statement that reads it the variables must be bound in storage order
  (concordance, checked by :meth:`LoopTreeBuilder.build`).
* ``loop(v)`` is DENSE (``0..extent``); ``loop(v, intersect=[...])`` iterates
  the first driver's segment and skips coordinates absent from any other
  driver; ``loop(v, union=[...])`` visits each coordinate present in any
  driver (absent drivers get position -1).  Every other access whose next
  level binds ``v`` and that is used below is *located* (absent allowed).
  Absent positions propagate to deeper levels; loading an absent access
  yields 0.
* Statements ``target op= expr`` with op in ``assign sum max min``; targets
  are buffer references ``buf[vars]``, pattern outputs (a value per position
  of an access's last level, written at the current position, skipped when
  absent) or COO outputs (emit the current values of its variables and the
  value; duplicates are combined by ``op`` — ``sum`` adds, ``max``/``min``
  reduce, ``assign`` keeps the last emitted — when results are canonicalised).
* Division follows spfuse's sparse convention ``x / y = 0 if x == 0``.
* ``reset(buf[vars], value)`` fills the elements the reference can address
  once the variables already bound above the reset are fixed: bound variables
  contribute their current value, unbound ones range over their full extent.
  ``reset(buf, value)`` fills the whole buffer.

Parallelism
-----------
A top-level loop runs in parallel (contiguous static blocks, one per thread)
when it is DENSE or an INTERSECT whose single driver is a root level, and
every buffer written below it is either ``private`` (each thread gets a copy,
initialised from the shared buffer when the loop starts; its content after
the loop is unspecified) or addressed through the loop variable in *every*
reference below the loop, every pattern output written below it belongs to
an access whose root level binds the loop variable.  COO outputs are always
allowed: thread buffers are appended in thread order, which is the serial
emission order.  Consequently results are bitwise identical for any thread
count.  :meth:`LoopTreePlan.describe` marks parallel loops.

Plan encoding (all int64 numpy arrays unless noted; see ``_looptree.pyx``)
--------------------------------------------------------------------------
``node_kind/node_end/node_arg`` — preorder tree: kind 0 LOOP / 1 STATEMENT /
2 RESET, index one past the subtree, row in the kind's table.  Top-level
nodes are visited by following ``node_end`` from 0.
``loop_var/loop_mode(0 dense,1 intersect,2 union)/loop_lev_start/loop_ndrv/
loop_nlev/loop_levs`` — levels a loop advances: drivers first, then located;
``loop_block`` 1 = innermost loop evaluated in blocks of 256 iterations
(vectorised byte code; bitwise equal to per-element interpretation);
``max_stack`` (int) the deepest expression stack.
``lev_kind(0 dense,1 compressed)/lev_size/lev_parent/lev_pos_arr/
lev_crd_arr`` — every access's levels (global numbering), arrays referenced by
index into ``index_arrays``; ``acc_last/acc_vals_arr`` into ``value_arrays``.
``bref_buf/bref_tstart/bref_nterm/term_var/term_stride`` — buffer references
(offset = sum stride * value of var).  ``stmt_tkind(0 buffer,1 pattern,2 coo)
/stmt_target/stmt_op(0 assign,1 sum,2 max,3 min)/stmt_cstart/stmt_clen`` plus
``code`` (postfix byte code, ops below) and ``consts`` (float64).
``pat_buf/pat_level``, ``coo_nvar/coo_vstart/coo_vars``,
``reset_buf/reset_whole/reset_tstart/reset_nbound/reset_nfree/rterm_a/
rterm_b/reset_value`` (bound terms (var, stride) then free dims (extent,
stride)), ``buf_size``, ``top_parallel`` (per node, 1 = run in parallel).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spfuse._kernels import _looptree, _looptree32
from spfuse.errors import InvalidOperandError, OperandTypeError, ProgramError
from spfuse.threads import effective_num_threads

__all__ = [
    "LoopTreeBuilder", "LoopTreePlan", "LevelTensor", "COOResult", "RowsResult",
    "Var", "Access", "Buffer", "BufferRef", "PatternOutput", "COOOutput", "Expr",
    "access_from_arrays", "const", "where", "unary", "maximum", "minimum", "run",
]

# -- the plan encoding: codes defined once, by the executor ----------------
_CODE = _looptree.PLAN_CODES
N_LOOP, N_STMT, N_RESET, N_FLUSH = (_CODE[k] for k in ("N_LOOP", "N_STMT", "N_RESET", "N_FLUSH"))
M_DENSE, M_INTERSECT, M_UNION = (_CODE[k] for k in ("M_DENSE", "M_INTERSECT", "M_UNION"))
L_DENSE, L_COMPRESSED = _CODE["L_DENSE"], _CODE["L_COMPRESSED"]
T_BUF, T_PATTERN, T_COO, T_WS = (_CODE[k] for k in ("T_BUF", "T_PATTERN", "T_COO", "T_WS"))
PAR_ROWS, PAR_REDUCE = _CODE["PAR_ROWS"], _CODE["PAR_REDUCE"]
ASSIGN_OPS = {name: _CODE[f"A_{name.upper()}"] for name in ("assign", "sum", "max", "min")}
_ASSIGN_SYM = {"assign": "=", "sum": "+=", "max": "max=", "min": "min="}
OP_LOAD_ACC, OP_LOAD_BUF, OP_CONST = _CODE["OP_LOAD_ACC"], _CODE["OP_LOAD_BUF"], _CODE["OP_CONST"]
BINARY_OPS = {sym: _CODE[f"OP_{name}"] for sym, name in (
    ("+", "ADD"), ("-", "SUB"), ("*", "MUL"), ("/", "DIV"), ("max", "MAX"), ("min", "MIN"),
    ("<", "LT"), ("<=", "LE"), (">", "GT"), (">=", "GE"), ("==", "EQ"), ("!=", "NE"))}
OP_WHERE = _CODE["OP_WHERE"]
UNARY_OPS = {name: _CODE[f"OP_{name.upper()}"]
             for name in ("neg", "abs", "sqrt", "exp", "log", "tanh", "sigmoid", "relu")}
STACK_LIMIT = _CODE["STACK_SIZE"]
# a row workspace holds this many elements at most (per thread: a double and a bit each)
WORKSPACE_MAX = 1 << 24
_MODE_NAMES = {M_DENSE: "dense", M_INTERSECT: "intersect", M_UNION: "union"}


# ============================================================ operands ====

@dataclass(frozen=True, eq=False)
class LevelTensor:
    """A tensor in TACO level format with arrays normalised for the runtime.

    ``levels[l]`` is ``("dense", size)`` or ``("compressed", size, pos, crd)``
    (int32 or int64, contiguous); ``values`` float64 contiguous; ``mode_order[l]`` is
    the tensor mode stored at level ``l``.
    """
    levels: tuple
    values: np.ndarray
    mode_order: tuple

    @property
    def ndim(self) -> int:
        return len(self.levels)

    @property
    def shape(self) -> tuple:
        shape = [0] * self.ndim
        for lev, m in zip(self.levels, self.mode_order, strict=True):
            shape[m] = lev[1]
        return tuple(shape)


def _as_index(a: Any, what: str) -> np.ndarray:
    """An index array as int32 (kept: scipy's default, which the int32
    executor reads as is) or int64, contiguous."""
    arr = np.asarray(a)
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise OperandTypeError(f"{what}: expected an integer array, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr.reshape(-1), dtype=np.int32 if arr.dtype == np.int32 else np.int64)


def access_from_arrays(levels_spec: Sequence[Sequence[Any]], values: Any,
                       mode_order: Sequence[int] | None = None, *,
                       check: bool = True) -> LevelTensor:
    """Build a :class:`LevelTensor` from plain arrays (converted once).

    ``levels_spec``: per storage level ``("dense", size)`` or
    ``("compressed", size, pos, crd)``.  ``mode_order`` defaults to identity.
    With ``check`` (default) the O(nnz) validity checks run too: ``pos``
    non-decreasing from 0, ``crd`` in range and strictly increasing within
    every segment (the executor binary-searches segments unchecked).
    """
    levels = []
    npos = 1
    for level, spec in enumerate(levels_spec):
        kind = spec[0]
        size = int(spec[1])
        if size < 0:
            raise InvalidOperandError(f"level {level}: negative size {size}")
        if kind == "dense":
            levels.append(("dense", size))
            npos *= size
        elif kind == "compressed":
            pos = _as_index(spec[2], f"level {level} pos")
            crd = _as_index(spec[3], f"level {level} crd")
            if len(pos) != npos + 1:
                raise InvalidOperandError(
                    f"level {level}: expected pos of length {npos + 1} (parent positions + 1), got {len(pos)}")
            if pos[0] != 0 or len(crd) != pos[-1]:
                raise InvalidOperandError(
                    f"level {level}: expected pos[0] == 0 and len(crd) == pos[-1], got pos[0]={pos[0]}, "
                    f"pos[-1]={pos[-1]}, len(crd)={len(crd)}")
            if check:
                if np.any(np.diff(pos) < 0):
                    raise InvalidOperandError(f"level {level}: pos must be non-decreasing")
                if len(crd) and (crd.min() < 0 or crd.max() >= size):
                    raise InvalidOperandError(f"level {level}: coordinates must lie in [0, {size})")
                if len(crd) > 1:
                    inc = np.diff(crd) > 0
                    starts = np.zeros(len(crd), dtype=bool)
                    starts[pos[1:-1][pos[1:-1] < len(crd)]] = True
                    if not np.all(inc | starts[1:]):
                        raise InvalidOperandError(
                            f"level {level}: coordinates must be strictly increasing within each segment "
                            "(Hint: canonicalise — sort indices, sum duplicates)")
            levels.append(("compressed", size, pos, crd))
            npos = len(crd)
        else:
            raise InvalidOperandError(f"level {level}: unknown level kind {kind!r} (expected 'dense' or 'compressed')")
    vals = np.asarray(values)
    if vals.dtype.kind not in "biuf":
        raise OperandTypeError(f"values: expected a real numeric array, got dtype {vals.dtype}")
    vals = np.ascontiguousarray(vals.reshape(-1), dtype=np.float64)
    if len(vals) != npos:
        raise InvalidOperandError(f"values: expected {npos} entries (positions of the last level), got {len(vals)}")
    if mode_order is None:
        mode_order = tuple(range(len(levels)))
    mode_order = tuple(int(m) for m in mode_order)
    if sorted(mode_order) != list(range(len(levels))):
        raise InvalidOperandError(f"mode_order {mode_order} is not a permutation of 0..{len(levels) - 1}")
    return LevelTensor(tuple(levels), vals, mode_order)


def as_level_tensor(obj: Any, *, check: bool = True) -> LevelTensor:
    """Normalise an operand: LevelTensor, numpy array (all dense levels;
    a Fortran-ordered array gets the reversed mode order, so ``np.asfortranarray``
    is how a lowering asks for a transposed dense operand),
    scipy CSR/CSC (canonicalised on a copy if needed), or a duck-typed
    ``spfuse.tensor.Tensor`` (``.levels`` with ``.size`` and ``.pos``/``.crd``
    on compressed levels, ``.values``, ``.format.mode_order``)."""
    if isinstance(obj, LevelTensor):
        return obj
    if isinstance(obj, np.ndarray) and obj.ndim > 1 and obj.flags.f_contiguous \
            and not obj.flags.c_contiguous:
        # Fortran order = dense levels in reversed mode order (no transpose copy)
        arr = np.asfortranarray(obj, dtype=np.float64)
        order = tuple(reversed(range(arr.ndim)))
        return LevelTensor(tuple(("dense", int(arr.shape[m])) for m in order),
                           arr.ravel(order="F"), order)
    if isinstance(obj, np.ndarray) or np.isscalar(obj):
        arr = np.ascontiguousarray(obj, dtype=np.float64)
        return LevelTensor(tuple(("dense", int(s)) for s in arr.shape), arr.reshape(-1),
                           tuple(range(arr.ndim)))
    fmt = getattr(obj, "format", None)
    if isinstance(fmt, str) and fmt in ("csr", "csc") and hasattr(obj, "indptr"):
        m = obj
        if not m.has_canonical_format:
            m = m.copy()
            m.sum_duplicates()
        n0, n1 = m.shape
        if fmt == "csr":
            return access_from_arrays([("dense", n0), ("compressed", n1, m.indptr, m.indices)],
                                      m.data, (0, 1), check=check)
        return access_from_arrays([("dense", n1), ("compressed", n0, m.indptr, m.indices)],
                                  m.data, (1, 0), check=check)
    if hasattr(obj, "levels") and hasattr(obj, "values"):
        spec = []
        for lev in obj.levels:
            if hasattr(lev, "crd"):
                spec.append(("compressed", lev.size, lev.pos, lev.crd))
            else:
                spec.append(("dense", lev.size))
        mo = getattr(getattr(obj, "format", None), "mode_order", None)
        if mo is None:
            mo = getattr(obj, "mode_order", None)
        return access_from_arrays(spec, obj.values, mo, check=check)
    raise OperandTypeError(
        f"expected a numpy array, scipy CSR/CSC, spfuse Tensor or LevelTensor, got {type(obj).__name__}")


# ========================================================== expressions ===

class Expr:
    """An expression over loads; combine with ``+ - * /`` and helpers."""

    def __add__(self, o): return _Bin("+", self, _wrap(o))
    def __radd__(self, o): return _Bin("+", _wrap(o), self)
    def __sub__(self, o): return _Bin("-", self, _wrap(o))
    def __rsub__(self, o): return _Bin("-", _wrap(o), self)
    def __mul__(self, o): return _Bin("*", self, _wrap(o))
    def __rmul__(self, o): return _Bin("*", _wrap(o), self)
    def __truediv__(self, o): return _Bin("/", self, _wrap(o))
    def __rtruediv__(self, o): return _Bin("/", _wrap(o), self)
    def __neg__(self): return _Un("neg", self)

    def _leaf_ref(self) -> Expr:
        return self


def _wrap(x: Any) -> Expr:
    if isinstance(x, Expr):
        return x._leaf_ref()
    if isinstance(x, Buffer):
        return _buffer_leaf(x)
    if isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool):
        return _Const(float(x))
    raise ProgramError(f"cannot use {x!r} in a loop-tree expression")


@dataclass(frozen=True, eq=False)
class _Const(Expr):
    value: float

    def __str__(self): return repr(self.value)


@dataclass(frozen=True, eq=False)
class _Bin(Expr):
    op: str
    a: Expr
    b: Expr

    def __str__(self):
        if self.op in ("max", "min"):
            return f"{self.op}({self.a}, {self.b})"
        return f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True, eq=False)
class _Un(Expr):
    op: str
    a: Expr

    def __str__(self): return f"{self.op}({self.a})"


@dataclass(frozen=True, eq=False)
class _Where(Expr):
    c: Expr
    a: Expr
    b: Expr

    def __str__(self): return f"where({self.c}, {self.a}, {self.b})"


def const(x: float) -> Expr:
    """A float constant."""
    return _Const(float(x))


def where(c: Any, a: Any, b: Any) -> Expr:
    """``a`` where ``c != 0`` else ``b`` (both evaluated)."""
    return _Where(_wrap(c), _wrap(a), _wrap(b))


def unary(name: str, e: Any) -> Expr:
    """``name`` in relu sigmoid tanh exp log abs sqrt neg."""
    if name not in UNARY_OPS:
        raise ProgramError(f"unknown unary op {name!r}; expected one of {sorted(UNARY_OPS)}")
    return _Un(name, _wrap(e))


def maximum(a: Any, b: Any) -> Expr:
    return _Bin("max", _wrap(a), _wrap(b))


def minimum(a: Any, b: Any) -> Expr:
    return _Bin("min", _wrap(a), _wrap(b))


def compare(op: str, a: Any, b: Any) -> Expr:
    """1.0/0.0 comparison, op in ``< <= > >= == !=``."""
    if op not in ("<", "<=", ">", ">=", "==", "!="):
        raise ProgramError(f"unknown comparison {op!r}")
    return _Bin(op, _wrap(a), _wrap(b))


# ============================================================ handles =====

@dataclass(frozen=True, eq=False)
class Var:
    name: str
    extent: int
    id: int

    def __str__(self): return self.name


@dataclass(frozen=True, eq=False)
class Access(Expr):
    """One use of a tensor; ``vars[m]`` is the loop variable of mode ``m``."""
    tensor: LevelTensor
    vars: tuple
    name: str
    id: int

    @property
    def level_vars(self) -> tuple:
        return tuple(self.vars[m] for m in self.tensor.mode_order)

    def __str__(self): return f"{self.name}[{','.join(v.name for v in self.vars)}]"


@dataclass(frozen=True, eq=False)
class Buffer:
    """A dense float64 C-contiguous array: output or temporary."""
    shape: tuple
    name: str
    private: bool
    init: Any
    id: int

    def __getitem__(self, vars) -> BufferRef:
        if not isinstance(vars, tuple):
            vars = (vars,)
        if len(vars) != len(self.shape):
            raise ProgramError(f"buffer {self.name} has {len(self.shape)} axes, indexed with {len(vars)}")
        for ax, (v, s) in enumerate(zip(vars, self.shape, strict=True)):
            if not isinstance(v, Var):
                raise ProgramError(f"buffer {self.name}: axis {ax} must be indexed by a loop variable, got {v!r}")
            if v.extent != s:
                raise ProgramError(f"buffer {self.name}: axis {ax} has size {s}, variable {v} has extent {v.extent}")
        return BufferRef(self, tuple(vars))

    @property
    def size(self) -> int:
        return int(math.prod(self.shape))


@dataclass(frozen=True, eq=False)
class BufferRef(Expr):
    buffer: Buffer
    vars: tuple

    def strides(self) -> dict:
        """var -> element stride (C order; repeated vars add up)."""
        out: dict = {}
        step = 1
        for v, s in reversed(list(zip(self.vars, self.buffer.shape, strict=True))):
            out[v] = out.get(v, 0) + step
            step *= s
        return {v: st for v, st in out.items() if st}

    def __str__(self):
        if not self.vars:
            return self.buffer.name
        return f"{self.buffer.name}[{','.join(v.name for v in self.vars)}]"


def _buffer_leaf(self: Buffer) -> Expr:
    if self.shape:
        raise ProgramError(f"buffer {self.name} has shape {self.shape}; index it with its variables")
    return BufferRef(self, ())


# a 0-d Buffer can be used directly in expressions
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__neg__"):
    setattr(Buffer, _name, (lambda nm: lambda self, *o: getattr(_buffer_leaf(self), nm)(*o))(_name))
Buffer._leaf_ref = _buffer_leaf


@dataclass(frozen=True, eq=False)
class PatternOutput:
    """Values aligned with the positions of ``access``'s last level."""
    access: Access
    name: str
    buffer: Buffer


@dataclass(frozen=True, eq=False)
class COOOutput:
    """A sparse result emitted as (coordinates of ``vars``, value)."""
    vars: tuple
    name: str
    id: int

    @property
    def shape(self) -> tuple:
        return tuple(v.extent for v in self.vars)


class COOResult(tuple):
    """``(coords, values, shape, order)``: canonical COO, unique and sorted
    lexicographically with the axes taken in ``order`` (row-major when
    ``order`` is ``(0, 1, ...)``; the executor's emission order otherwise,
    so that a result emitted column by column needs no sort)."""
    __slots__ = ()

    def __new__(cls, coords, values, shape, order=None):
        order = tuple(range(len(shape))) if order is None else tuple(order)
        return tuple.__new__(cls, (coords, values, shape, order))

    coords = property(lambda self: self[0])
    values = property(lambda self: self[1])
    shape = property(lambda self: self[2])
    order = property(lambda self: self[3])

    def todense(self) -> np.ndarray:
        out = np.zeros(self.shape)
        if len(self.values):
            out[tuple(self.coords)] = self.values
        return out


@dataclass(frozen=True, eq=False)
class RowsResult:
    """A row workspace's output: canonical like :class:`COOResult` (sorted in
    ``order``, unique), stored as rows -- per flushed row the values of the
    output's other variables (``heads``, one row each) and its entry count
    (``counts``), then every entry's workspace coordinate (``ks``) and value.
    ``at`` is the workspace variable's position among the output's."""
    heads: np.ndarray
    counts: np.ndarray
    ks: np.ndarray
    values: np.ndarray
    shape: tuple
    order: tuple
    at: int

    @property
    def coords(self) -> np.ndarray:
        """Coordinates ``(ndim, nnz)``, expanded from the rows."""
        cols = [np.repeat(self.heads[:, d], self.counts) for d in range(self.heads.shape[1])]
        cols.insert(self.at, self.ks)
        return np.stack(cols) if cols else np.zeros((0, len(self.values)), dtype=np.int64)

    def todense(self) -> np.ndarray:
        return COOResult(self.coords, self.values, self.shape, self.order).todense()


# ======================================================= builder nodes ====

@dataclass(eq=False)
class _LoopNode:
    var: Var
    mode: int
    drivers: list
    children: list


@dataclass(eq=False)
class _StmtNode:
    target: Any
    op: str
    expr: Expr


@dataclass(eq=False)
class _ResetNode:
    target: Any   # BufferRef or Buffer (whole)
    value: float


def _expr_leaves(e: Expr, out: list) -> list:
    if isinstance(e, (Access, BufferRef, _Const)):
        out.append(e)
    elif isinstance(e, _Bin):
        _expr_leaves(e.a, out)
        _expr_leaves(e.b, out)
    elif isinstance(e, _Un):
        _expr_leaves(e.a, out)
    elif isinstance(e, _Where):
        _expr_leaves(e.c, out)
        _expr_leaves(e.a, out)
        _expr_leaves(e.b, out)
    else:
        raise ProgramError(f"not a loop-tree expression: {e!r}")
    return out


def _target_str(t: Any) -> str:
    if isinstance(t, PatternOutput):
        return f"{t.name}@{t.access}"
    if isinstance(t, COOOutput):
        return f"{t.name}<coo>[{','.join(v.name for v in t.vars)}]"
    return str(t)


# ============================================================== plan ======

@dataclass(frozen=True, eq=False)
class LoopTreePlan:
    """Executable plan: numpy arrays only (see the module docstring)."""
    var_names: tuple
    var_extent: np.ndarray
    node_kind: np.ndarray
    node_end: np.ndarray
    node_arg: np.ndarray
    top_parallel: np.ndarray
    loop_var: np.ndarray
    loop_mode: np.ndarray
    loop_lev_start: np.ndarray
    loop_ndrv: np.ndarray
    loop_nlev: np.ndarray
    loop_levs: np.ndarray
    loop_block: np.ndarray
    max_stack: int
    lev_kind: np.ndarray
    lev_size: np.ndarray
    lev_parent: np.ndarray
    lev_pos_arr: np.ndarray
    lev_crd_arr: np.ndarray
    acc_last: np.ndarray
    acc_vals_arr: np.ndarray
    index_arrays: tuple
    value_arrays: tuple
    bref_buf: np.ndarray
    bref_tstart: np.ndarray
    bref_nterm: np.ndarray
    term_var: np.ndarray
    term_stride: np.ndarray
    stmt_tkind: np.ndarray
    stmt_target: np.ndarray
    stmt_op: np.ndarray
    stmt_cstart: np.ndarray
    stmt_clen: np.ndarray
    code: np.ndarray
    consts: np.ndarray
    pat_buf: np.ndarray
    pat_level: np.ndarray
    coo_nvar: np.ndarray
    coo_vstart: np.ndarray
    coo_vars: np.ndarray
    ws_buf: np.ndarray
    ws_coo: np.ndarray
    ws_extent: np.ndarray
    ws_pos: np.ndarray
    buf_ws: np.ndarray
    buf_reduce: np.ndarray   # per buffer: the top loop node summing into it by reduction blocks, or -1
    reset_buf: np.ndarray
    reset_whole: np.ndarray
    reset_tstart: np.ndarray
    reset_nbound: np.ndarray
    reset_nfree: np.ndarray
    rterm_a: np.ndarray
    rterm_b: np.ndarray
    reset_value: np.ndarray
    buf_size: np.ndarray
    buf_names: tuple
    buf_shapes: tuple
    buf_private: tuple
    buf_inits: tuple
    buf_kind: tuple          # "buffer" | "pattern" per buffer
    coo_names: tuple
    coo_ops: tuple
    coo_shapes: tuple
    coo_orders: tuple        # per COO output: the variable order it is emitted in, or None
    text: str = dataclasses.field(repr=False, default="")
    #: per top-level loop, ``(variable name, how it runs over threads)``
    parallel: tuple = ()

    @property
    def parallel_nodes(self) -> tuple:
        return tuple(int(n) for n in np.flatnonzero(self.top_parallel))

    def describe(self) -> str:
        """The loop tree as indented text (parallel loops marked)."""
        return self.text

    def __str__(self) -> str:
        return self.describe()


# ============================================================ builder =====

class LoopTreeBuilder:
    """Record a loop tree with Python handles, then :meth:`build` a plan."""

    def __init__(self) -> None:
        self._vars: list[Var] = []
        self._accesses: list[Access] = []
        self._buffers: list[Buffer] = []
        self._coos: list[COOOutput] = []
        self._patterns: list[PatternOutput] = []
        self._tensors: dict[int, tuple] = {}
        self._root: list = []
        self._stack: list[list] = [self._root]
        self._open_vars: list[Var] = []

    # -- declarations -----------------------------------------------------
    def var(self, name: str, extent: int) -> Var:
        extent = int(extent)
        if extent < 0:
            raise ProgramError(f"variable {name}: negative extent {extent}")
        v = Var(name, extent, len(self._vars))
        self._vars.append(v)
        return v

    def access(self, tensor: Any, vars: Sequence[Var], name: str | None = None, *,
               check: bool = True) -> Access:
        """Use ``tensor`` with loop variable ``vars[m]`` for mode ``m``.

        The operand is normalised once per tensor object (shared between
        accesses of the same object)."""
        hit = self._tensors.get(id(tensor))
        if hit is not None and hit[0] is tensor:
            lt = hit[1]
        else:
            lt = as_level_tensor(tensor, check=check)
            self._tensors[id(tensor)] = (tensor, lt)   # holding tensor keeps id() unique
        vars = tuple(vars)
        if len(vars) != lt.ndim:
            raise ProgramError(f"access has {lt.ndim} modes, got {len(vars)} variables")
        for m, (v, s) in enumerate(zip(vars, lt.shape, strict=True)):
            if not isinstance(v, Var):
                raise ProgramError(f"mode {m}: expected a loop variable, got {v!r}")
            if v.extent != s:
                raise ProgramError(f"mode {m} has size {s} but variable {v} has extent {v.extent}")
        lv = tuple(vars[m] for m in lt.mode_order)
        if len(set(lv)) != len(lv):
            raise ProgramError("repeated variables inside one access (diagonals) must be resolved "
                               "before lowering")
        a = Access(lt, vars, name or f"T{len(self._accesses)}", len(self._accesses))
        self._accesses.append(a)
        return a

    def buffer(self, shape: Sequence[int] = (), name: str | None = None, *,
               private: bool = False, init: float | np.ndarray = 0.0) -> Buffer:
        """A dense float64 buffer, filled with ``init`` (scalar or array) at
        the start of every :func:`run`.  ``private`` marks a temporary that
        threads may copy."""
        shape = tuple(int(s) for s in shape)
        if not np.isscalar(init):
            init = np.ascontiguousarray(init, dtype=np.float64)
            if init.shape != shape:
                raise ProgramError(f"buffer init has shape {init.shape}, expected {shape}")
        else:
            init = float(init)
        b = Buffer(shape, name or f"buf{len(self._buffers)}", bool(private), init, len(self._buffers))
        self._check_name(b.name)
        self._buffers.append(b)
        return b

    def pattern_output(self, access: Access, name: str | None = None) -> PatternOutput:
        """An output with one value per position of ``access``'s last level."""
        n = len(access.tensor.values)
        name = name or f"pat{len(self._patterns)}"
        self._check_name(name)
        buf = Buffer((n,), name, False, 0.0, len(self._buffers))
        self._buffers.append(buf)
        p = PatternOutput(access, name, buf)
        self._patterns.append(p)
        return p

    def coo_output(self, vars: Sequence[Var], name: str | None = None) -> COOOutput:
        """A sparse output emitted as coordinate lists (canonicalised by :func:`run`)."""
        name = name or f"coo{len(self._coos)}"
        self._check_name(name)
        c = COOOutput(tuple(vars), name, len(self._coos))
        self._coos.append(c)
        return c

    def _check_name(self, name: str) -> None:
        used = {b.name for b in self._buffers} | {c.name for c in self._coos}
        if name in used:
            raise ProgramError(f"output/buffer name {name!r} used twice")

    # -- tree -------------------------------------------------------------
    @contextlib.contextmanager
    def loop(self, var: Var, *, intersect: Sequence[Access] | None = None,
             union: Sequence[Access] | None = None) -> Iterator[None]:
        """A loop over ``var``: DENSE, or co-iterating drivers (∩ or ∪)."""
        if intersect and union:
            raise ProgramError("a loop is either an intersection or a union")
        if var in self._open_vars:
            raise ProgramError(f"variable {var} is already bound by an enclosing loop")
        mode = M_INTERSECT if intersect else M_UNION if union else M_DENSE
        node = _LoopNode(var, mode, list(intersect or union or ()), [])
        self._stack[-1].append(node)
        self._stack.append(node.children)
        self._open_vars.append(var)
        try:
            yield
        finally:
            self._stack.pop()
            self._open_vars.pop()

    def statement(self, target: Any, op: str, expr: Any) -> None:
        if op not in ASSIGN_OPS:
            raise ProgramError(f"unknown statement op {op!r}; expected one of {sorted(ASSIGN_OPS)}")
        if isinstance(target, Buffer):
            target = _buffer_leaf(target)
        if not isinstance(target, (BufferRef, PatternOutput, COOOutput)):
            raise ProgramError(f"cannot assign to {target!r}")
        self._stack[-1].append(_StmtNode(target, op, _wrap(expr)))

    def reset(self, target: Buffer | BufferRef, value: float = 0.0) -> None:
        if not isinstance(target, (Buffer, BufferRef)):
            raise ProgramError(f"reset needs a buffer or buffer reference, got {target!r}")
        self._stack[-1].append(_ResetNode(target, float(value)))

    # -- lowering to arrays -----------------------------------------------
    def build(self) -> LoopTreePlan:
        if len(self._stack) != 1:
            raise ProgramError("build() called inside an open loop")
        _inline_scalar_temporaries(self._root)
        return _Lowerer(self).lower()


def _substitute(e: Expr, buf_id: int, value: Expr) -> Expr:
    if isinstance(e, BufferRef):
        return value if e.buffer.id == buf_id else e
    if isinstance(e, _Bin):
        return _Bin(e.op, _substitute(e.a, buf_id, value), _substitute(e.b, buf_id, value))
    if isinstance(e, _Un):
        return _Un(e.op, _substitute(e.a, buf_id, value))
    if isinstance(e, _Where):
        return _Where(*(_substitute(x, buf_id, value) for x in (e.c, e.a, e.b)))
    return e


def _inline_scalar_temporaries(root: list) -> None:
    """Fold ``T = e`` into the sibling statements after it that read ``T``,
    when ``T`` is a private 0-d buffer nothing else reads or writes (a
    dimension-reduced temporary of a fused chain: ``T = x[i]*A[i,j]`` then
    ``S = T*x[j]``).  The statements compute the same operations in the same
    order, so results are bitwise unchanged, and a body of statements that
    no longer reads what it writes can run in block mode."""
    reads: dict[int, int] = {}
    writes: dict[int, int] = {}

    def count(nodes):
        for n in nodes:
            if isinstance(n, _LoopNode):
                count(n.children)
            elif isinstance(n, _StmtNode):
                for leaf in _expr_leaves(n.expr, []):
                    if isinstance(leaf, BufferRef):
                        reads[leaf.buffer.id] = reads.get(leaf.buffer.id, 0) + 1
                t = n.target
                if isinstance(t, (BufferRef, PatternOutput)):
                    writes[t.buffer.id] = writes.get(t.buffer.id, 0) + 1
            else:
                t = n.target.buffer if isinstance(n.target, BufferRef) else n.target
                writes[t.id] = writes.get(t.id, 0) + 2  # never inline a reset buffer

    def visit(nodes):
        k = 0
        while k < len(nodes):
            n = nodes[k]
            if isinstance(n, _LoopNode):
                visit(n.children)
            elif (isinstance(n, _StmtNode) and n.op == "assign" and isinstance(n.target, BufferRef)
                  and not n.target.vars and n.target.buffer.private
                  and writes.get(n.target.buffer.id) == 1 and _fold(nodes, k, n)):
                del nodes[k]
                continue
            k += 1

    def _fold(nodes, k, n) -> bool:
        tid = n.target.buffer.id
        used = {leaf.buffer.id for leaf in _expr_leaves(n.expr, []) if isinstance(leaf, BufferRef)}
        seen, users = 0, []
        for m in nodes[k + 1:]:
            if seen == reads.get(tid, 0):
                break
            if not isinstance(m, _StmtNode):
                return False
            users.append(m)
            seen += sum(1 for leaf in _expr_leaves(m.expr, []) if isinstance(leaf, BufferRef)
                        and leaf.buffer.id == tid)
            t = m.target
            if isinstance(t, (BufferRef, PatternOutput)) and t.buffer.id in used and seen < reads[tid]:
                return False  # an operand of T's expression changes before T's last use
        if seen != reads.get(tid, 0) or seen == 0:
            return False
        for m in users:
            m.expr = _substitute(m.expr, tid, n.expr)
        return True

    count(root)
    visit(root)


@dataclass(frozen=True, eq=False)
class _Workspace:
    """A COO output assembled row by row: statements scatter into a private
    dense ``buffer`` over the output's last variable (remembering which
    coordinates they touched), and a FLUSH node at the end of every iteration
    of ``host`` (the loop over the output's second-to-last variable) emits
    the touched coordinates in order and clears them.  Emissions are then
    sorted and unique, so no coordinate list of every product is kept or
    sorted (Gustavson's SpGEMM)."""
    id: int
    coo: COOOutput
    buffer: Buffer
    host: _LoopNode
    var: Var           # the output variable the workspace is indexed by


def _coo_orders(b: LoopTreeBuilder) -> tuple[dict[int, tuple], list[_Workspace]]:
    """Per COO output, the order of its variables in which the executor
    emits it (outermost loop first), and the outputs a row workspace
    assembles.

    Every statement writing ``C`` must sit below the same chain of outermost
    loops over all of ``C``'s variables but one, ``r``; they then finish
    ``C`` one host iteration (the chain's last loop) at a time.  When every
    statement sits directly in a loop over ``r`` under that chain, the
    emissions are already sorted and unique in the chain's order.  Otherwise
    (a reduction loop between, or ``r`` bound above another loop) a
    workspace over ``r`` collects them, if ``r``'s extent is at most
    :data:`WORKSPACE_MAX`.  Outputs with no such chain are emitted unordered
    (order None) and sorted afterwards."""
    paths: dict[int, list] = {}

    def visit(nodes: list, path: list) -> None:
        for n in nodes:
            if isinstance(n, _LoopNode):
                visit(n.children, path + [n])
            elif isinstance(n, _StmtNode) and isinstance(n.target, COOOutput):
                paths.setdefault(n.target.id, []).append(path)

    visit(b._root, [])
    orders: dict[int, tuple] = {}
    out: list[_Workspace] = []
    for c in b._coos:
        k = len(c.vars) - 1
        if k < 0 or c.id not in paths:
            continue
        chains = {tuple(id(lp) for lp in p[:k]) for p in paths[c.id]}
        chain = paths[c.id][0][:k]
        rest = set(c.vars) - {lp.var for lp in chain}
        if len(chains) != 1 or len(chain) != k or len(rest) != 1:
            continue
        r = rest.pop()
        order = tuple(c.vars.index(lp.var) for lp in chain) + (c.vars.index(r),)
        if all([lp.var for lp in p[k:]] == [r] for p in paths[c.id]):
            orders[c.id] = order
        elif k >= 1 and r.extent <= WORKSPACE_MAX:
            orders[c.id] = order
            ws = Buffer((r.extent,), f"{c.name}.ws", True, 0.0, len(b._buffers) + len(out))
            out.append(_Workspace(len(out), c, ws, chain[-1], r))
    return orders, out


class _Lowerer:
    def __init__(self, b: LoopTreeBuilder):
        self.b = b
        # arrays of tensors
        self.index_arrays: list = []
        self.value_arrays: list = []
        idx_of: dict[int, int] = {}
        val_of: dict[int, int] = {}

        def index_slot(arr):
            k = idx_of.get(id(arr))
            if k is None:
                k = idx_of[id(arr)] = len(self.index_arrays)
                self.index_arrays.append(arr)
            return k

        lev_kind, lev_size, lev_var, lev_parent, lev_pos, lev_crd = [], [], [], [], [], []
        self.acc_levels: list[list[int]] = []
        acc_last, acc_vals = [], []
        for a in b._accesses:
            t = a.tensor
            levs = []
            for depth, lev in enumerate(t.levels):
                g = len(lev_kind)
                lev_kind.append(L_DENSE if lev[0] == "dense" else L_COMPRESSED)
                lev_size.append(lev[1])
                lev_var.append(a.vars[t.mode_order[depth]].id)
                lev_parent.append(levs[-1] if levs else -1)
                if lev[0] == "compressed":
                    lev_pos.append(index_slot(lev[2]))
                    lev_crd.append(index_slot(lev[3]))
                else:
                    lev_pos.append(-1)
                    lev_crd.append(-1)
                levs.append(g)
            self.acc_levels.append(levs)
            k = val_of.get(id(t.values))
            if k is None:
                k = val_of[id(t.values)] = len(self.value_arrays)
                self.value_arrays.append(t.values)
            acc_vals.append(k)
            # a 0-d access has no level: give it a pseudo dense root of size 1
            acc_last.append(levs[-1] if levs else -2)
        self.lev = dict(kind=lev_kind, size=lev_size, var=lev_var, parent=lev_parent,
                        pos=lev_pos, crd=lev_crd)
        self.acc_last = acc_last
        self.acc_vals = acc_vals
        self.brefs: list = []
        self.bref_key: dict = {}
        self.term_var, self.term_stride = [], []
        self.bref_tstart, self.bref_nterm, self.bref_buf = [], [], []
        self.code: list[int] = []
        self.consts: list[float] = []
        self.const_of: dict = {}
        self.lines: list[str] = []
        self.top_parallel_marks: dict = {}
        self.coo_op: dict = {}
        self.desc: list = []
        self.max_stack = 1

    # ------------------------------------------------------------------
    def bref(self, r: BufferRef) -> int:
        strides = r.strides()
        key = (r.buffer.id, tuple(sorted((v.id, s) for v, s in strides.items())))
        k = self.bref_key.get(key)
        if k is None:
            k = self.bref_key[key] = len(self.bref_buf)
            self.bref_buf.append(r.buffer.id)
            self.bref_tstart.append(len(self.term_var))
            self.bref_nterm.append(len(strides))
            for v, s in strides.items():
                self.term_var.append(v.id)
                self.term_stride.append(s)
        return k

    def const(self, x: float) -> int:
        key = np.float64(x).tobytes()
        k = self.const_of.get(key)
        if k is None:
            k = self.const_of[key] = len(self.consts)
            self.consts.append(x)
        return k

    def emit_expr(self, e: Expr) -> int:
        """Append postfix code; return the max stack depth."""
        if isinstance(e, Access):
            self.code += [OP_LOAD_ACC, e.id]
            return 1
        if isinstance(e, BufferRef):
            self.code += [OP_LOAD_BUF, self.bref(e)]
            return 1
        if isinstance(e, _Const):
            self.code += [OP_CONST, self.const(e.value)]
            return 1
        if isinstance(e, _Un):
            d = self.emit_expr(e.a)
            self.code.append(UNARY_OPS[e.op])
            return d
        if isinstance(e, _Bin):
            d1 = self.emit_expr(e.a)
            d2 = self.emit_expr(e.b)
            self.code.append(BINARY_OPS[e.op])
            return max(d1, d2 + 1)
        if isinstance(e, _Where):
            d1 = self.emit_expr(e.c)
            d2 = self.emit_expr(e.a)
            d3 = self.emit_expr(e.b)
            self.code.append(OP_WHERE)
            return max(d1, d2 + 1, d3 + 2)
        raise ProgramError(f"not a loop-tree expression: {e!r}")

    # ------------------------------------------------------------------
    @staticmethod
    def used_accesses(node) -> set:
        if isinstance(node, _StmtNode):
            s = {leaf.id for leaf in _expr_leaves(node.expr, []) if isinstance(leaf, Access)}
            if isinstance(node.target, PatternOutput):
                s.add(node.target.access.id)
            return s
        if isinstance(node, _LoopNode):
            s = {d.id for d in node.drivers}
            for c in node.children:
                s |= _Lowerer.used_accesses(c)
            return s
        return set()

    def lower(self) -> LoopTreePlan:
        b = self.b
        self.nodes: list = []    # [kind, end, arg]
        self.loops: list = []    # (var, mode, lev_start, ndrv, nlev)
        self.loop_levs: list[int] = []
        self.stmts: list = []    # (tkind, target, op, cstart, clen)
        self.resets: list = []   # (buf, whole, tstart, nbound, nfree, value)
        self.rterm_a, self.rterm_b = [], []
        self.top_parallel: list[int] = []
        depth = [0] * len(b._accesses)   # levels bound per access
        for a in b._accesses:
            if not a.tensor.levels:
                raise ProgramError(f"access {a}: 0-d tensors are not supported; use a constant")
        self.coo_orders, self.workspaces = _coo_orders(b)
        self.bufs = list(b._buffers) + [w.buffer for w in self.workspaces]
        buf_reduce = np.full(len(self.bufs), -1, dtype=np.int64)
        self.ws_of_coo = {w.coo.id: w for w in self.workspaces}
        self.flush_at: dict[int, list] = {}
        for w in self.workspaces:
            self.flush_at.setdefault(id(w.host), []).append(w)
        for node in b._root:
            start = len(self.nodes)
            self.walk(node, depth, [], 0)
            if isinstance(node, _LoopNode):
                par, why, reduced = self.parallel_ok(node)
                self.top_parallel_marks[start] = (par, why, node.var.name)
                buf_reduce[reduced] = start
        top_par = np.zeros(len(self.nodes), dtype=np.int64)
        for n, (par, _, _) in self.top_parallel_marks.items():
            top_par[n] = int(par)
        self.describe_lines(top_par)

        def i64(x):
            arr = np.asarray(x, dtype=np.int64).reshape(-1)
            arr.flags.writeable = False
            return arr

        nodes = np.asarray(self.nodes, dtype=np.int64).reshape(-1, 3)
        loops = np.asarray(self.loops, dtype=np.int64).reshape(-1, 6)
        stmts = np.asarray(self.stmts, dtype=np.int64).reshape(-1, 5)
        resets = np.asarray([r[:5] for r in self.resets], dtype=np.int64).reshape(-1, 5)
        bufs = self.bufs
        buf_ws = np.full(len(bufs), -1, dtype=np.int64)
        for w in self.workspaces:
            buf_ws[w.buffer.id] = w.id
        return LoopTreePlan(
            var_names=tuple(v.name for v in b._vars),
            var_extent=i64([v.extent for v in b._vars]),
            node_kind=i64(nodes[:, 0]), node_end=i64(nodes[:, 1]), node_arg=i64(nodes[:, 2]),
            top_parallel=i64(top_par),
            loop_var=i64(loops[:, 0]), loop_mode=i64(loops[:, 1]), loop_lev_start=i64(loops[:, 2]),
            loop_ndrv=i64(loops[:, 3]), loop_nlev=i64(loops[:, 4]), loop_levs=i64(self.loop_levs),
            loop_block=i64(loops[:, 5]), max_stack=int(self.max_stack),
            lev_kind=i64(self.lev["kind"]), lev_size=i64(self.lev["size"]),
            lev_parent=i64(self.lev["parent"]), lev_pos_arr=i64(self.lev["pos"]),
            lev_crd_arr=i64(self.lev["crd"]),
            acc_last=i64(self.acc_last), acc_vals_arr=i64(self.acc_vals),
            index_arrays=tuple(self.index_arrays), value_arrays=tuple(self.value_arrays),
            bref_buf=i64(self.bref_buf), bref_tstart=i64(self.bref_tstart),
            bref_nterm=i64(self.bref_nterm), term_var=i64(self.term_var),
            term_stride=i64(self.term_stride),
            stmt_tkind=i64(stmts[:, 0]), stmt_target=i64(stmts[:, 1]), stmt_op=i64(stmts[:, 2]),
            stmt_cstart=i64(stmts[:, 3]), stmt_clen=i64(stmts[:, 4]),
            code=i64(self.code), consts=np.asarray(self.consts, dtype=np.float64),
            pat_buf=i64([p.buffer.id for p in b._patterns]),
            pat_level=i64([self.acc_last[p.access.id] for p in b._patterns]),
            coo_nvar=i64([len(c.vars) for c in b._coos]),
            coo_vstart=i64(np.cumsum([0] + [len(c.vars) for c in b._coos])[:-1]),
            coo_vars=i64([v.id for c in b._coos for v in c.vars]),
            ws_buf=i64([w.buffer.id for w in self.workspaces]),
            ws_coo=i64([w.coo.id for w in self.workspaces]),
            ws_extent=i64([w.buffer.size for w in self.workspaces]),
            ws_pos=i64([w.coo.vars.index(w.var) for w in self.workspaces]),
            buf_ws=i64(buf_ws), buf_reduce=i64(buf_reduce),
            reset_buf=i64(resets[:, 0]), reset_whole=i64(resets[:, 1]),
            reset_tstart=i64(resets[:, 2]), reset_nbound=i64(resets[:, 3]),
            reset_nfree=i64(resets[:, 4]), rterm_a=i64(self.rterm_a), rterm_b=i64(self.rterm_b),
            reset_value=np.asarray([r[5] for r in self.resets], dtype=np.float64),
            buf_size=i64([x.size for x in bufs]),
            buf_names=tuple(x.name for x in bufs), buf_shapes=tuple(x.shape for x in bufs),
            buf_private=tuple(x.private for x in bufs), buf_inits=tuple(x.init for x in bufs),
            buf_kind=tuple("pattern" if any(p.buffer is x for p in b._patterns) else "buffer"
                           for x in bufs),
            coo_names=tuple(c.name for c in b._coos),
            coo_ops=tuple(self.coo_op.get(c.id, "sum") for c in b._coos),
            coo_shapes=tuple(c.shape for c in b._coos),
            coo_orders=tuple(self.coo_orders.get(c.id) for c in b._coos),
            text="\n".join(self.lines),
            parallel=tuple((name, _PARALLEL_TEXT.get(par) or f"serial ({why})")
                           for par, why, name in self.top_parallel_marks.values()),
        )

    def walk(self, node, depth: list, bound: list, level: int) -> None:
        b = self.b
        me = len(self.nodes)
        self.nodes.append([0, 0, 0])
        if isinstance(node, _LoopNode):
            v = node.var
            used = self.used_accesses(node)
            drivers, located = [], []
            for d in node.drivers:
                if depth[d.id] >= len(d.tensor.levels) or d.level_vars[depth[d.id]] is not v:
                    raise ProgramError(
                        f"loop {v}: driver {d} does not bind {v} at its next level "
                        f"(levels bound so far: {depth[d.id]}, level variables "
                        f"{[x.name for x in d.level_vars]})")
                if d.id in [x.id for x in drivers]:
                    continue
                drivers.append(d)
            for aid in sorted(used):
                a = b._accesses[aid]
                lv = a.level_vars
                if depth[aid] < len(lv) and lv[depth[aid]] is v:
                    if a not in drivers:
                        located.append(a)
                elif v in lv[depth[aid]:]:
                    raise ProgramError(
                        f"access {a} is not concordant with the loop order: loop {v} binds its level "
                        f"{lv.index(v)} before level {depth[aid]} ({lv[depth[aid]]}) is bound")
            mode = node.mode
            if mode == M_INTERSECT:
                # iterate a compressed driver if there is one
                comp = [d for d in drivers if self.lev["kind"][self.acc_levels[d.id][depth[d.id]]] == L_COMPRESSED]
                if comp:
                    drivers.remove(comp[0])
                    drivers.insert(0, comp[0])
            if mode != M_DENSE and not drivers:
                mode = M_DENSE
            levs = [self.acc_levels[a.id][depth[a.id]] for a in drivers + located]
            lid = len(self.loops)
            block = self.block_ok(node)
            self.loops.append([v.id, mode, len(self.loop_levs), len(drivers), len(levs), int(block)])
            self.loop_levs.extend(levs)
            self.nodes[me][0] = N_LOOP
            self.nodes[me][2] = lid
            drv = f" {_MODE_NAMES[mode]}({', '.join(str(d) for d in drivers)})" if mode != M_DENSE else " dense"
            loc = f"  locate {', '.join(str(a) for a in located)}" if located else ""
            blk = "  [block]" if block else ""
            self.desc.append([level, f"for {v} in 0..{v.extent}{drv}{loc}{blk}", me])
            for a in drivers + located:
                depth[a.id] += 1
            bound.append(v)
            for c in node.children:
                self.walk(c, depth, bound, level + 1)
            for w in self.flush_at.get(id(node), ()):
                self.nodes.append([N_FLUSH, len(self.nodes) + 1, w.id])
                self.desc.append([level + 1, f"flush {w.buffer.name} -> {_target_str(w.coo)} "
                                  f"(touched {w.var} in order)", len(self.nodes) - 1])
            bound.pop()
            for a in drivers + located:
                depth[a.id] -= 1
        elif isinstance(node, _StmtNode):
            for leaf in _expr_leaves(node.expr, []):
                if isinstance(leaf, Access):
                    self.check_bound_access(leaf, depth, "reads")
                elif isinstance(leaf, BufferRef):
                    self.check_bound_ref(leaf, bound)
            t = node.target
            if isinstance(t, BufferRef):
                self.check_bound_ref(t, bound)
                tk, tid = T_BUF, self.bref(t)
            elif isinstance(t, PatternOutput):
                self.check_bound_access(t.access, depth, "is the pattern of a write to")
                tk, tid = T_PATTERN, b._patterns.index(t)
            else:
                for v in t.vars:
                    if v not in bound:
                        raise ProgramError(f"COO output {t.name}: variable {v} is not bound here")
                prev = self.coo_op.setdefault(t.id, node.op)
                if prev != node.op:
                    raise ProgramError(f"COO output {t.name} is written with both {prev!r} and {node.op!r}")
                ws = self.ws_of_coo.get(t.id)
                if ws is None:
                    tk, tid = T_COO, t.id
                else:
                    tk, tid = T_WS, self.bref(ws.buffer[ws.var])
            cstart = len(self.code)
            d = self.emit_expr(node.expr)
            self.max_stack = max(self.max_stack, d)
            if d > STACK_LIMIT:
                raise ProgramError(f"expression needs a stack of {d} > {STACK_LIMIT}: {node.expr}")
            self.stmts.append([tk, tid, ASSIGN_OPS[node.op], cstart, len(self.code) - cstart])
            self.nodes[me][0] = N_STMT
            self.nodes[me][2] = len(self.stmts) - 1
            shown = _target_str(t) if tk != T_WS else f"{ws.buffer.name}[{ws.var}]"
            self.desc.append([level, f"{shown} {_ASSIGN_SYM[node.op]} {node.expr}", me])
        else:
            t = node.target
            if isinstance(t, Buffer):
                buf, whole, tstart, nb, nf = t, 1, len(self.rterm_a), 0, 0
                what = t.name
            else:
                buf = t.buffer
                strides = t.strides()
                bnd = [(v, s) for v, s in strides.items() if v in bound]
                free = sorted([(v, s) for v, s in strides.items() if v not in bound], key=lambda x: -x[1])
                tstart = len(self.rterm_a)
                for v, s in bnd:
                    self.rterm_a.append(v.id)
                    self.rterm_b.append(s)
                for v, s in free:
                    self.rterm_a.append(v.extent)
                    self.rterm_b.append(s)
                nb, nf = len(bnd), len(free)
                whole = int(not bnd and math.prod(v.extent for v, _ in free) == buf.size
                            and len(set(v for v, _ in free)) == len(free))
                what = str(t)
            self.resets.append([buf.id, whole, tstart, nb, nf, node.value])
            self.nodes[me][0] = N_RESET
            self.nodes[me][2] = len(self.resets) - 1
            self.desc.append([level, f"reset {what} = {node.value!r}", me])
        self.nodes[me][1] = len(self.nodes)

    @staticmethod
    def block_ok(node: _LoopNode) -> bool:
        """May this loop run in blocks (see ``_looptree.pyx``, block mode)?

        Its body must be statements only, no buffer written by two
        statements, and a buffer written in the body read only by a later
        statement at the element the same iteration wrote (the same
        reference, moving with this loop: ``H[i,h] = relu(T[i,h]); S[i,h] =
        H[i,h]``).  Block mode runs each statement over the whole block,
        storing before the next statement starts, so evaluating statement
        by statement is then bitwise the same as interpreting iteration by
        iteration."""
        if not node.children or not all(isinstance(c, _StmtNode) for c in node.children):
            return False
        written: dict = {}   # buffer id -> (position in the body, target)
        for k, c in enumerate(node.children):
            t = c.target
            if isinstance(t, (BufferRef, PatternOutput)):
                if t.buffer.id in written:
                    return False
                written[t.buffer.id] = (k, t)
        for k, c in enumerate(node.children):
            for leaf in _expr_leaves(c.expr, []):
                if isinstance(leaf, BufferRef) and leaf.buffer.id in written:
                    at, target = written[leaf.buffer.id]
                    if not (at < k and isinstance(target, BufferRef) and target.vars == leaf.vars
                            and target.strides().get(node.var, 0) != 0):
                        return False
        return True

    def check_bound_access(self, a: Access, depth: list, verb: str) -> None:
        if depth[a.id] != len(a.tensor.levels):
            lv = a.level_vars
            raise ProgramError(
                f"a statement {verb} {a} but only {depth[a.id]} of its levels are bound here "
                f"(needs loops over {', '.join(v.name for v in lv[depth[a.id]:])} in storage order)")

    @staticmethod
    def check_bound_ref(r: BufferRef, bound: list) -> None:
        for v in r.strides():
            if v not in bound:
                raise ProgramError(f"buffer reference {r}: variable {v} is not bound here")

    # ------------------------------------------------------------------
    def parallel_ok(self, node: _LoopNode) -> tuple:
        """How this top-level loop may run over threads, as ``(mode, why
        not, reduced buffers)``: ``PAR_ROWS`` as static blocks of
        iterations; ``PAR_REDUCE`` as fixed reduction blocks, each summing
        into private copies of the buffers it accumulates across iterations
        (:meth:`reduced_buffers`); 0 serially."""
        mode = node.mode
        v = node.var
        if mode == M_UNION and len(node.drivers) > 0:
            return 0, "union loop", []
        if mode == M_INTERSECT and len({d.id for d in node.drivers}) > 1:
            return 0, "intersection of several drivers", []
        bad: list = []
        unsplit: set = set()
        unsplit_why: list = []

        def visit(n):
            if isinstance(n, _LoopNode):
                for c in n.children:
                    visit(c)
                return
            refs = []
            written = None
            if isinstance(n, _StmtNode):
                refs = [leaf for leaf in _expr_leaves(n.expr, []) if isinstance(leaf, BufferRef)]
                t = n.target
                if isinstance(t, BufferRef):
                    written = t
                elif isinstance(t, PatternOutput):
                    if t.access.level_vars[0] is not v:
                        bad.append(f"pattern output {t.name} is not split by {v}")
            else:
                written = n.target if isinstance(n.target, BufferRef) else None
                if isinstance(n.target, Buffer) and not n.target.private:
                    bad.append(f"whole-buffer reset of shared {n.target.name}")
            if written is not None:
                refs.append(written)
            for r in refs:
                all_refs.setdefault(r.buffer.id, []).append(r)
            if written is not None:
                writes.add(written.buffer.id)

        all_refs: dict = {}
        writes: set = set()
        visit(node)
        for bid in writes:
            buf = self.bufs[bid]
            if buf.private:
                continue
            for r in all_refs[bid]:
                if v not in r.strides():
                    unsplit.add(bid)
                    unsplit_why.append(f"{r} is written below the loop but not split by {v}")
                    break
        if bad or (unsplit_why and self.workspaces):
            return 0, (bad + unsplit_why)[0], []
        if unsplit:
            reduced = self.reduced_buffers(node, unsplit)
            if not reduced:
                return 0, unsplit_why[0], []
            return PAR_REDUCE, "", reduced
        return PAR_ROWS, "", []

    def reduced_buffers(self, node: _LoopNode, unsplit: set) -> list:
        """The buffers ``unsplit`` (written below ``node`` but not split by
        its variable) when every one is only summed into there -- never
        assigned, reset or read by an expression -- and the loop emits
        nothing else (no COO or pattern output), so that
        per-block partial sums added in block order give the result; else
        an empty list."""
        ok = True

        def visit(n):
            nonlocal ok
            if isinstance(n, _LoopNode):
                for c in n.children:
                    visit(c)
            elif isinstance(n, _StmtNode):
                t = n.target
                if not isinstance(t, BufferRef):
                    ok = False
                elif t.buffer.id in unsplit and n.op != "sum":
                    ok = False
                if any(isinstance(leaf, BufferRef) and leaf.buffer.id in unsplit
                       for leaf in _expr_leaves(n.expr, [])):
                    ok = False
            elif isinstance(n, _ResetNode):
                t = n.target
                if (t.buffer if isinstance(t, BufferRef) else t).id in unsplit:
                    ok = False
            else:
                ok = False

        visit(node)
        return sorted(unsplit) if ok else []

    def describe_lines(self, top_par) -> None:
        b = self.b
        out = [f"LoopTreePlan: {len(b._vars)} vars, {len(b._accesses)} accesses, "
               f"{len(b._buffers)} buffers, {len(b._coos)} COO outputs"]
        if b._vars:
            out.append("  vars: " + ", ".join(f"{v.name}={v.extent}" for v in b._vars))
        for a in b._accesses:
            kinds = "".join("d" if lev[0] == "dense" else "c" for lev in a.tensor.levels)
            out.append(f"  access {a}: levels {kinds} mode_order {a.tensor.mode_order} "
                       f"nnz {len(a.tensor.values)}")
        for x in self.bufs:
            flag = " private" if x.private else ""
            out.append(f"  buffer {x.name}{list(x.shape)}{flag}")
        for level, text, n in self.desc:
            mark = ""
            if n in self.top_parallel_marks:
                par, why, _ = self.top_parallel_marks[n]
                mark = {PAR_ROWS: "   [parallel]", PAR_REDUCE: "   [parallel: reduction blocks]"}.get(
                    par, f"   [serial: {why}]")
            out.append("  " + "  " * level + text + mark)
        self.lines = out


#: how a top-level loop runs over threads, by its parallel mode (``LoopTreePlan.parallel``)
_PARALLEL_TEXT = {PAR_ROWS: "blocks of iterations over the threads",
                  PAR_REDUCE: "fixed reduction blocks over the threads, partial sums added in block order"}


# ================================================================ run =====

def _canonical_coo(crd: np.ndarray, val: np.ndarray, op: str, shape: tuple,
                   axes: tuple | None = None) -> COOResult:
    """Emitted coordinates ``crd`` (n, nvar) and values as a canonical
    :class:`COOResult` sorted in ``axes`` order (row-major if None):
    duplicates combined by ``op``.  Emissions already sorted and unique
    (a row workspace's) are checked in one pass and kept as they are."""
    nvar = len(shape)
    axes = tuple(range(nvar)) if axes is None else tuple(axes)
    if len(val) == 0:
        return COOResult(np.zeros((nvar, 0), dtype=np.int64), val, shape, axes)
    if nvar == 0:
        keys = np.zeros(len(val), dtype=np.int64)
        order = np.arange(len(val))
    elif math.prod(shape) < 2 ** 62:
        if nvar > 1:
            keys = np.ravel_multi_index(tuple(crd[:, d] for d in axes), tuple(shape[d] for d in axes))
        else:
            keys = crd[:, 0].copy()
        if bool(np.all(keys[1:] > keys[:-1])):
            return COOResult(np.ascontiguousarray(crd.T), val, shape, axes)
        order = np.argsort(keys, kind="stable")
        keys = keys[order]
    else:
        order = np.lexsort(tuple(crd[:, d] for d in reversed(axes)))
        keys = None
    crd_s = crd[order]
    val_s = val[order]
    if keys is not None:
        new = np.empty(len(keys), dtype=bool)
        new[0] = True
        np.not_equal(keys[1:], keys[:-1], out=new[1:])
    else:
        new = np.ones(len(val_s), dtype=bool)
        new[1:] = np.any(crd_s[1:] != crd_s[:-1], axis=1)
    starts = np.flatnonzero(new)
    if op == "sum":
        with np.errstate(invalid="ignore"):  # inf + -inf = nan, as numpy's sum gives
            vals = np.add.reduceat(val_s, starts)
    elif op == "max":
        vals = np.maximum.reduceat(val_s, starts)
    elif op == "min":
        vals = np.minimum.reduceat(val_s, starts)
    else:  # assign: last emitted wins
        ends = np.append(starts[1:], len(val_s)) - 1
        vals = val_s[ends]
    return COOResult(np.ascontiguousarray(crd_s[starts].T), vals, shape, axes)


def rebound(plan: LoopTreePlan, index_arrays: tuple, value_arrays: tuple, buf_size: np.ndarray,
            buf_shapes: tuple, buf_inits: tuple | None = None) -> LoopTreePlan:
    """``plan`` over other operand arrays of the same formats and shapes
    (pattern buffers resized; buffers' initial values replaced when
    ``buf_inits`` is given -- a 0-d operand lives in one): its executable
    structure is reused by :func:`run`, which then only re-points the arrays."""
    # a shallow copy by hand: copy.copy's reduce protocol costs microseconds per call
    new = object.__new__(type(plan))
    fields = new.__dict__
    fields.update(plan.__dict__)
    for key in _PROGRAM_KEYS:  # (a filtering pass over ~65 fields cost ~15 µs a call)
        fields.pop(key, None)
    fields["index_arrays"], fields["value_arrays"] = index_arrays, value_arrays
    fields["buf_size"], fields["buf_shapes"] = buf_size, buf_shapes
    if buf_inits is not None:
        fields["buf_inits"] = buf_inits
    fields["_structure"] = plan.__dict__.get("_structure", plan)
    return new


def without_arrays(plan: LoopTreePlan) -> LoopTreePlan:
    """``plan``'s structure with empty operand arrays: what a cache keeps,
    so that it holds no caller's data alive."""
    empty_i, empty_f = np.zeros(0, np.int64), np.zeros(0, np.float64)
    bare = rebound(plan, tuple(empty_i for _ in plan.index_arrays),
                   tuple(empty_f for _ in plan.value_arrays), plan.buf_size, plan.buf_shapes)
    bare.__dict__.pop("_structure", None)
    return bare


#: where a structure keeps its built executor program, per index type
_PROGRAM_KEY = "_program_"
#: ... under these names (one per executor index type)
_PROGRAM_KEYS = tuple(_PROGRAM_KEY + ex.INDEX_DTYPE.name for ex in (_looptree, _looptree32))
#: executor module -> its key (``dtype.name`` costs microseconds per call)
_PROGRAM_KEY_OF = {ex: key for ex, key in zip((_looptree, _looptree32), _PROGRAM_KEYS, strict=True)}
_INT32 = np.dtype(np.int32)


def _executor(plan: LoopTreePlan):
    """The executor module for ``plan``'s index arrays: the int32 one when
    every array is int32 (no widening copy), else the int64 one (which
    widens the int32 arrays)."""
    arrays = plan.index_arrays
    if arrays and all(a.dtype == _INT32 for a in arrays):
        return _looptree32
    return _looptree


def _program(plan: LoopTreePlan, blocks: bool):
    """The executor's program for ``plan``: built once per structure and
    index type."""
    ex = _executor(plan)
    if not blocks:
        return ex._Program(plan, False)
    structure = plan.__dict__.get("_structure", plan)
    key = _PROGRAM_KEY_OF[ex]
    base = structure.__dict__.get(key)
    if base is None:
        base = ex._Program(structure, True)
        object.__setattr__(structure, key, base)
    if structure is plan:
        return base
    return base.with_arrays(plan.index_arrays, plan.value_arrays, plan.buf_size)


#: most blocks a reduction loop is cut into (each holds a partial copy of
#: the buffers it sums into)
MAX_REDUCE_BLOCKS = 8
#: the machine's cores (not the process's affinity or the call's threads:
#: the blocks, and so the rounding, must not change with either)
_CORES = os.cpu_count() or 1
#: stored entries per element of a reduction's partial copies below which
#: cutting it into blocks costs more (filling and adding the copies) than
#: running a block per core saves
REDUCE_WORK_PER_ELEMENT = 4


def reduce_blocks(plan: LoopTreePlan) -> int:
    """How many fixed blocks the plan's reduction loops (``PAR_REDUCE``)
    are cut into: one per core of this machine (not per thread of the
    call, so that results are the same on any thread count), at most
    :data:`MAX_REDUCE_BLOCKS`, and fewer when the operands' stored entries
    would not pay for the partial copies of the reduced buffers.

    >>> import numpy as np, scipy.sparse as sp
    >>> b = LoopTreeBuilder()
    >>> i, j = b.var("i", 4), b.var("j", 4)
    >>> a, y = b.access(sp.csr_array(np.eye(4)), (i, j), "A"), b.buffer((4,), "y")
    >>> with b.loop(i):
    ...     with b.loop(j, intersect=[a]):
    ...         b.statement(y[j], "sum", a)   # column sums: y is not split by i
    >>> plan = b.build()
    >>> int(plan.buf_reduce[0]) >= 0, reduce_blocks(plan)   # 4 entries do not pay for a copy of y
    (True, 1)
    """
    structure = plan.__dict__.get("_structure", plan)   # (a call's plan is a rebound copy)
    reduced = structure.__dict__.get("_reduced")
    if reduced is None:   # worked out once per plan structure
        reduced = tuple(int(b) for b in np.flatnonzero(plan.buf_reduce >= 0))
        object.__setattr__(structure, "_reduced", reduced)
    if not reduced:
        return 1
    cells = sum(int(plan.buf_size[b]) for b in reduced)
    return reduction_block_count(sum(map(len, plan.value_arrays)), cells)


def reduction_block_count(entries: int, cells: int) -> int:
    """The number of fixed blocks a reduction of ``entries`` stored entries
    into ``cells`` output elements is cut into: the executor's reduction
    loops and the scatter SpMV kernel (``spmv_t``) share this one rule.

    >>> reduction_block_count(10, 100), reduction_block_count(10**6, 10**5) == min(_CORES, 2)
    (1, True)
    """
    return max(1, min(_CORES, MAX_REDUCE_BLOCKS, entries // (REDUCE_WORK_PER_ELEMENT * max(cells, 1))))


def run(plan: LoopTreePlan, num_threads: int | None = None, *, blocks: bool = True) -> dict:
    """Execute ``plan``; return ``{name: array}`` for non-private buffers
    (reshaped), ``{name: 1-d array}`` for pattern outputs, and
    ``{name: COOResult}`` for COO outputs.  ``blocks=False`` interprets
    block-eligible loops element by element (same results; for testing)."""
    nthreads = effective_num_threads(num_threads)
    bufs = []
    for size, init in zip(plan.buf_size.tolist(), plan.buf_inits, strict=True):
        if isinstance(init, np.ndarray):
            bufs.append(np.array(init, dtype=np.float64).reshape(-1))
        elif init == 0 and not math.copysign(1.0, init) < 0:
            bufs.append(np.zeros(size))  # calloc'd: cheaper than a fill (and -0.0 is kept apart)
        else:
            bufs.append(np.full(size, init, dtype=np.float64))
    prog = _program(plan, blocks)
    coos = prog.execute(bufs, list(plan.buf_private), nthreads, reduce_blocks(plan))
    out: dict = {}
    for buf, name, shape, priv in zip(bufs, plan.buf_names, plan.buf_shapes, plan.buf_private, strict=True):
        if not priv:
            out[name] = buf.reshape(shape)
    if not coos:
        return out
    at = dict(zip(plan.ws_coo.tolist(), plan.ws_pos.tolist(), strict=True))
    for c, (raw, name, op, shape, axes) in enumerate(zip(coos, plan.coo_names, plan.coo_ops, plan.coo_shapes,
                                                         plan.coo_orders, strict=True)):
        if c in at:   # a row workspace's rows: sorted and unique as emitted
            rec, ks, val = raw
            out[name] = RowsResult(rec[:, :-1], rec[:, -1], ks, val, shape, axes, at[c])
        else:
            out[name] = _canonical_coo(raw[0], raw[1], op, shape, axes)
    return out
