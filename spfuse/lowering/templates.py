"""Template kernels: the fast path for fused groups of a known shape.

A single-statement program that is a pure sum of products of accesses is an
*einsum*; its factors are unified with each template's signature (which
factor is the CSR / CSF / dense operand, which indices are summed).  The
template kernels in ``spfuse._kernels`` implement exactly the fused trees
the planner builds for these programs -- SDDMM's scalar temporary, SpMM-GEMM's
row temporary, MTTKRP's hoisted row -- with dispatch paid per row, not per
element; :func:`follows_template` checks the planned unit operations build
the template's tree (explain() shows the tree that runs).  Programs that are
not einsums use unit-op templates matched on the planned ops (SDDMM-div, the
n-way union op of SpAdd with its coefficients); everything else runs on the
generic loop-tree executor.
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from spfuse._kernels import _csf_kernels as csf
from spfuse._kernels import _csr_kernels as csr
from spfuse._kernels import _dense_kernels
from spfuse._kernels._result_pool import empty as _result
from spfuse.errors import IndexCheckFailed
from spfuse.formats import Format
from spfuse.frontend.ast import Access, Binary
from spfuse.ir.ops import Ref, TensorInfo
from spfuse.lowering.transposes import SharedCopies, shared_copy, shared_layout_copy
from spfuse.passes.max_fusion import lift_sums
from spfuse.runtime.looptree import reduction_block_count
from spfuse.validation import index_dtype_for

__all__ = ["TemplateMatch", "match_template", "follows_template"]


@dataclass(frozen=True)
class TemplateMatch:
    """A template chosen for a program: ``kernel`` name, operand roles, and
    why (shown by ``explain``).  ``run(tensors, num_threads)`` returns
    ``{result_name: ndarray | Tensor}``; it raises :class:`IndexCheckFailed`
    when a kernel finds an out-of-range index of a ``checks_indices``
    operand."""

    kernel: str
    roles: Mapping[str, str]
    why: str
    run: Callable[[Mapping[str, Any], int], dict]
    #: Operands whose column indices the kernel bounds-checks as it reads
    #: them (SpMV, SpMM): the call path need not scan them first.
    checks_indices: frozenset = frozenset()
    #: Makes a ``run`` for one operand signature (a call path's dispatch)
    #: that binds what the signature decides on its first call; None: ``run``.
    bind: Callable[[], Callable[[Mapping[str, Any], int], dict]] | None = None
    #: Does a part of the program run its contractions on the generic
    #: executor, element by element (a group no template or BLAS runs)?
    interpreted: bool = False


# -- classification of operands -------------------------------------------

def _kind(info: TensorInfo) -> str:
    if not info.is_sparse:
        return "dense"
    if info.ndim == 2 and info.levels == ("dense", "compressed") and info.mode_order == (0, 1):
        return "csr"
    if info.ndim == 3 and info.levels == ("compressed",) * 3:
        return "csf"   # in any mode order: a kernel reads its levels as stored (see _stored_indices)
    return "other"


def _stored_indices(info: TensorInfo, indices: tuple) -> tuple:
    """An access's indices in its operand's storage order, the order a
    kernel reads its levels in: ``X[i,j,k]`` of a CSF in mode order
    ``(1, 0, 2)`` is the mode-order-(0, 1, 2) CSF ``X'[j,i,k]``, whose
    arrays are X's own (CSC, a compressed level in column order, is matched
    through its transpose instead: see ``groups._free_transpose``).

    >>> from spfuse.ir.ops import TensorInfo
    >>> X = TensorInfo("X", 3, ("compressed",) * 3, (1, 0, 2), (4, 5, 6))
    >>> _stored_indices(X, ("i", "j", "k"))
    ('j', 'i', 'k')
    """
    if not info.is_sparse or info.ndim != 3:
        return tuple(indices)
    return tuple(indices[m] for m in info.mode_order)


def _einsum(program) -> tuple | None:
    """``(out_name, out_indices, summed, [(name, indices)])`` or None."""
    if len(program.statements) != 1:
        return None
    stmt = program.statements[0]
    lifted = lift_sums(stmt.value)
    if lifted is None:
        return None
    summed, body = lifted
    factors = []

    def collect(e):
        if isinstance(e, Access):
            factors.append((e.name, e.indices))
            return True
        if isinstance(e, Binary) and e.op == "*":
            return collect(e.left) and collect(e.right)
        return False

    if not collect(body) or len(set(summed)) != len(summed):
        return None
    if any(len(set(ix)) != len(ix) for _, ix in factors):
        return None
    return stmt.target.name, stmt.target.indices, tuple(summed), factors


# Template signatures: output letters, then (kind, letters) per factor.
SIGNATURES = {
    "spmv": ("i", [("csr", "ij"), ("dense", "j")]),
    "spmv_t": ("j", [("csr", "ij"), ("dense", "i")]),
    "bilinear": ("", [("dense", "i"), ("csr", "ij"), ("dense", "j")]),
    "row_sums": ("i", [("csr", "ij")]),
    "col_sums": ("j", [("csr", "ij")]),
    # D1·A·D2 and its one-sided forms, on A's pattern
    "scale": ("ij", [("csr", "ij"), ("dense", "i"), ("dense", "j")]),
    "scale_rows": ("ij", [("csr", "ij"), ("dense", "i")]),
    "scale_cols": ("ij", [("csr", "ij"), ("dense", "j")]),
    "spmm": ("ik", [("csr", "ij"), ("dense", "jk")]),
    "spmm_t": ("jk", [("csr", "ij"), ("dense", "ik")]),
    "spgemm": ("ik", [("csr", "ij"), ("csr", "jk")]),
    "masked_spgemm": ("ik", [("csr", "ik"), ("csr", "ij"), ("csr", "jk")]),
    "masked_spgemm_dot": ("ik", [("csr", "ik"), ("csr", "ij"), ("csr", "kj")]),
    "sddmm": ("ij", [("csr", "ij"), ("dense", "ik"), ("dense", "kj")]),
    "sddmm_t": ("ij", [("csr", "ij"), ("dense", "ik"), ("dense", "jk")]),
    "ttv": ("ij", [("csf", "ijk"), ("dense", "k")]),
    "ttv_mid": ("ik", [("csf", "ijk"), ("dense", "j")]),
    "mttkrp": ("ir", [("csf", "ijk"), ("dense", "jr"), ("dense", "kr")]),
    "mttkrp_mid": ("jr", [("csf", "ijk"), ("dense", "ir"), ("dense", "kr")]),
    "mttkrp_inner": ("kr", [("csf", "ijk"), ("dense", "ir"), ("dense", "jr")]),
    "spmm_gemm": ("il", [("csr", "ij"), ("dense", "jk"), ("dense", "kl")]),
    "gnn2": ("ij", [("csr", "ih"), ("dense", "ik"), ("dense", "kh"), ("dense", "jh")]),
    "sddmm_spmm": ("il", [("csr", "ij"), ("dense", "ik"), ("dense", "jk"), ("dense", "jl")]),
    "sddmm_spmm_gemm": ("im", [("csr", "ij"), ("dense", "ik"), ("dense", "jk"), ("dense", "jl"),
                               ("dense", "lm")]),
    "mttkrp_gemm": ("im", [("csf", "ikl"), ("dense", "lj"), ("dense", "kj"), ("dense", "jm")]),
    "spttm_spttm": ("ijm", [("csf", "ijk"), ("dense", "kl"), ("dense", "lm")]),
    "ttm": ("ijl", [("csf", "ijk"), ("dense", "kl")]),
}


def _unify(sig, out_indices, summed, factors, infos):
    """Assign factors to a signature: returns the list of factor names per slot."""
    out_letters, slots = sig
    if len(slots) != len(factors) or len(out_letters) != len(out_indices):
        return None
    letters = {letter for _, ls in slots for letter in ls}
    if len(letters) != len(set(out_indices) | set(summed)):
        return None
    for perm in itertools.permutations(range(len(factors))):
        bind = dict(zip(out_letters, out_indices, strict=True))
        ok = True
        for (kind, ls), f in zip(slots, perm, strict=True):
            name, ix = factors[f]
            ix = _stored_indices(infos[name], ix)
            if _kind(infos[name]) != kind or len(ix) != len(ls):
                ok = False
                break
            for letter, i in zip(ls, ix, strict=True):
                if bind.setdefault(letter, i) != i:
                    ok = False
                    break
            if not ok:
                break
        if ok and len(set(bind.values())) == len(bind):
            return [factors[f][0] for f in perm]
    return None


def follows_template(kernel: str, names, ops, infos: Mapping[str, TensorInfo] | None = None) -> bool:
    """Do the planned unit ``ops`` build the tree template ``kernel`` runs?

    ``mttkrp`` hoists ``t[r] = sum(k, X[i,j,k]·D[k,r])`` per (i,j) fiber, so
    the op reading X must sum X's innermost stored index k alone (X's last
    mode in its storage order, given ``infos``), with D.  A plan
    that sums j first (ReACT's ``T0[k,r]`` per i) is another tree: it runs on
    the generic executor rather than under the template's name.

    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> X, C, D = Ref("X", ("i", "j", "k")), Ref("C", ("j", "r")), Ref("D", ("k", "r"))
    >>> kfirst = [UnitOp(0, "T0", ("i", "j", "r"), "*", (X, D), "sum", ("k",))]
    >>> jfirst = [UnitOp(0, "T0", ("i", "k", "r"), "*", (X, C), "sum", ("j",))]
    >>> follows_template("mttkrp", ["X", "C", "D"], kfirst), follows_template("mttkrp", ["X", "C", "D"], jfirst)
    (True, False)
    """
    if kernel not in ("mttkrp", "mttkrp_mid"):
        return True
    x, _, d = names
    readers = [op for op in ops if any(getattr(a, "name", None) == x for a in op.args)]
    if len(readers) != 1:
        return False
    op = readers[0]
    xref = next(a for a in op.args if getattr(a, "name", None) == x)
    stored = _stored_indices(infos[x], xref.indices) if infos and x in infos else xref.indices
    return (op.operator == "*" and op.reduction == "sum" and tuple(op.reduced) == (stored[-1],)
            and sorted(getattr(a, "name", "") for a in op.args) == sorted((x, d)))


#: ``spmm_t`` (a scatter into the output's rows; a team splits the output
#: rows when it is over 4 MiB) runs when its output is at most this many
#: bytes; a larger one is computed as SpMM of the transpose.  Measured as
#: evaluate calls of ``C[j,k] = A[i,j] * X[i,k]`` (10 entries per row; scatter
#: against SpMM of Aᵀ, 1 / 2 threads): 5000 x 16, 0.40 / 0.44 ms against
#: 1.32 / 0.70; 20000 x 16, 1.8 / 1.8 against 8.1 / 3.1; 100k x 32 (24 MiB),
#: 47 / 19 against 45 / 23; 100k x 64 (49 MiB), 108 / 48 against 92 / 59 --
#: and for a CSC ``A``, whose transpose is free, 108 / 50 against 131 / 133
#: (converted to CSR per call).
SPMM_T_MAX_OUTPUT_BYTES = 1 << 26


def fits_operands(kernel: str, names, infos: Mapping[str, TensorInfo]) -> bool:
    """Is ``kernel`` the one to run on operands of these sizes?  A kernel
    that does not fit leaves the einsum to the next signature or route (it
    says nothing of the planned tree, as :func:`follows_template` does).
    ``spmm_t`` fits when its output (A's columns x B's columns, float64) is
    at most :data:`SPMM_T_MAX_OUTPUT_BYTES`; unknown extents do not fit.

    >>> from spfuse.ir.ops import TensorInfo
    >>> A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), (10**5, 10**5), nnz=10**6)
    >>> fits_operands("spmm_t", ("A", "B"), {"A": A, "B": TensorInfo.dense("B", (10**5, 16))})
    True
    >>> fits_operands("spmm_t", ("A", "B"), {"A": A, "B": TensorInfo.dense("B", (10**5, 128))})
    False
    """
    if kernel != "spmm_t":
        return True
    if names[0] not in infos or names[1] not in infos:
        return False
    cols, width = infos[names[0]].shape[1], infos[names[1]].shape[1]
    return cols is not None and width is not None and 8 * cols * width <= SPMM_T_MAX_OUTPUT_BYTES


# -- array helpers ----------------------------------------------------------

def _dense_view(t, dtype) -> np.ndarray:
    """A dense tensor as an ndarray in its logical mode order: a view of its
    storage (transposed when stored in another mode order, as a Fortran
    array is), copied only to change the dtype."""
    fmt = t._format
    if not fmt.is_dense:
        return np.asarray(t.todense(), dtype=dtype)
    values = t._values
    if values.dtype != dtype:
        values = values.astype(dtype)
    if fmt.is_identity_order:  # (the common case, per kernel operand per call)
        return values.reshape(t._shape)
    order = fmt.mode_order
    return values.reshape(tuple(t.shape[m] for m in order)).transpose(np.argsort(order))


#: elements from which a one-thread transposing copy is tiled whatever its row length
_TILED_COPY_MIN = 1 << 20


def c_ordered(view: np.ndarray, num_threads: int = 1) -> np.ndarray:
    """``view`` as a C-ordered array: itself when it is one; a C-ordered
    matrix's transpose (``D.T``, a Fortran array) copied tile by tile
    (``_dense_kernels.transpose``, at about the speed of a copy, where
    numpy's strided copy runs 2-3x slower when its rows are long); anything
    else copied by numpy.  A large copy's memory comes from the result pool
    (``_result_pool``): a per-call copy dies with the call, and the next
    call's copy reuses its pages instead of faulting in fresh ones.

    >>> a = np.arange(6.0).reshape(2, 3)
    >>> c_ordered(a) is a, c_ordered(a.T).flags.c_contiguous, c_ordered(a.T).tolist()
    (True, True, [[0.0, 3.0], [1.0, 4.0], [2.0, 5.0]])
    """
    if view.flags.c_contiguous:
        return view
    # (on one thread, result rows of at most 64 elements and a result in
    # cache: numpy's copy, writing them in order, runs as fast or faster --
    # (20000, 32) 0.40 ms against 0.51 tiled, (2000, 64) 0.07 against 0.11;
    # past a million elements the tiles win: (100000, 64) 6.2-6.7 against
    # 15-16 ms.  A (32, 20000) result 0.62-0.72 against 0.27.  Two threads
    # share the tiles: 0.29 and 3.0-3.1 ms)
    if view.ndim == 2 and (view.shape[1] > 64 or num_threads > 1 or view.size >= _TILED_COPY_MIN) \
            and view.T.flags.c_contiguous and view.dtype in (_F64, _F32):
        out = _result(view.shape, view.dtype)
        _dense_kernels.transpose(view.T, out, num_threads)
        return out
    out = _result(view.shape, view.dtype)
    np.copyto(out, view)
    return out


def _dense(t, dtype, nt: int = 1) -> np.ndarray:
    """A dense tensor as a C-ordered ndarray (no copy when stored so), a
    kernel's read-only operand."""
    fmt, values = t._format, t._values
    if values.dtype == dtype and fmt.is_dense and fmt.is_identity_order:
        return values.reshape(t._shape)   # (the common case: a Tensor's values are 1-D and C-contiguous)
    return _operand_copy(_dense_view(t, dtype), nt)


def _dense_t(t, dtype, nt: int = 1) -> np.ndarray:
    """A dense matrix's transpose as a C-ordered ndarray: no copy when the
    matrix is stored in column order (``D.T`` of a C array)."""
    return _operand_copy(_dense_view(t, dtype).T, nt)


def _operand_copy(view: np.ndarray, nt: int) -> np.ndarray:
    """:func:`c_ordered` of a kernel's read-only operand, one copy per memory
    layout in a :class:`SharedCopies` block (:func:`shared_layout_copy`)."""
    if view.flags.c_contiguous:
        return view
    return shared_layout_copy(view, lambda: c_ordered(view, nt))


def dense_transposed(t, dtype, nt: int = 1) -> np.ndarray:
    """:func:`_dense_t` as a kernel's operand: made once per
    :class:`~spfuse.lowering.transposes.SharedCopies` block (do not write
    into it).  A kernel gathers its factors in a block of its own, so one
    operand read transposed in two roles (GNN-2's ``Y`` in ``X·Y`` and in
    ``·Yᵀ``) is copied once -- 0.9 ms of a 7 ms 2-thread call at 20000 x 32;
    the kernels of one gradient or one multi-group plan, inside an outer
    block, share the copy too."""
    return shared_copy(t._values, (t._format, t._shape, dtype), lambda: _dense_t(t, dtype, nt))


def _as(a, dtype):
    return a if a.dtype == dtype else a.astype(dtype)  # Tensor arrays are 1-D and contiguous


def _csr(t, itype, dtype):
    lv = t._levels[1]
    return _as(lv.pos, itype), _as(lv.crd, itype), _as(t._values, dtype)


def _csf(t, itype, dtype):
    arrs = []
    for lv in t.levels:
        arrs += [_as(lv.pos, itype), _as(lv.crd, itype)]
    return arrs + [_as(t.values, dtype)]


_F32, _F64, _I32, _I64 = (np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))


def _types(tensors):
    """One value dtype and one index dtype for every array of a kernel call."""
    dtype, itype = _F32, _I32   # (compared with dtype objects: per kernel call, no conversions)
    for t in tensors:
        if t._values.dtype != _F32:
            dtype = _F64
        if t._index_dtype == _I64:
            itype = _I64
    return itype, dtype


# -- kernels ----------------------------------------------------------------

#: Below this much work (:func:`_work`) a kernel runs on one thread: waking
#: an OpenMP team costs more than the work (and milliseconds on a busy machine).
PARALLEL_MIN_WORK = 100_000


def _work(ts) -> int:
    """A kernel's work, roughly: the stored values it reads, plus each entry of
    its sparse operand once per column of its thinnest dense matrix (an SpMM
    or SDDMM does ``nnz·K`` multiply-adds: 40k entries times K = 16 ran
    0.22 ms on one thread, 0.16 on two, where the values alone, 56k, kept
    it on one).

    >>> import numpy as np, scipy.sparse as sp
    >>> from spfuse.tensor import as_tensor
    >>> A = as_tensor(sp.random(100, 100, density=0.1, format="csr", random_state=0))
    >>> _work([A, as_tensor(np.ones((100, 16)))])
    18600
    """
    size = sum(t.values.size for t in ts)
    nnz = max((t.values.size for t in ts if not t.format.is_dense), default=0)
    widths = [min(t.shape) for t in ts if t.format.is_dense and len(t.shape) == 2]
    return size + nnz * min(widths, default=0)


def _threads(ts, nt: int) -> int:
    if nt == 1:
        return 1
    return nt if _work(ts) >= PARALLEL_MIN_WORK else 1


#: Kernels that bounds-check their sparse operand's column indices as they
#: read them (and take them in any order, duplicates summed): the call path
#: need not scan that operand's indices first.
CHECKS_INDICES = frozenset({"spmv", "spmv_t", "bilinear", "row_sums", "col_sums", "spmm", "spmm_t"})


def checked_operand(kernel: str, names) -> str:
    """The operand a :data:`CHECKS_INDICES` kernel bounds-checks: its CSR one.

    >>> checked_operand("bilinear", ["x", "A", "y"]), checked_operand("spmv", ["A", "x"])
    ('A', 'A')
    """
    return next(n for n, (kind, _) in zip(names, SIGNATURES[kernel][1], strict=True) if kind == "csr")


#: bilinear's fixed blocks: at most this many, of at least this many entries
BILINEAR_MAX_BLOCKS, BILINEAR_BLOCK_ENTRIES = 16, 16384

#: Per kernel, the dense factors (counted after the sparse operand) it reads
#: transposed: SDDMM's D as Dᵀ rows, GNN-2's two Y reads as Yᵀ rows.
_READ_TRANSPOSED = {"sddmm": (1,), "gnn2": (1, 2)}


#: The scaling kernels and the side each dense factor scales.
_SCALINGS = {"scale": ("i", "j"), "scale_rows": ("i",), "scale_cols": ("j",)}


_C_TYPES = {_I32: "int32_t", _I64: "int64_t", _F32: "float", _F64: "double"}


def _specialised(kernel: Callable, *dtypes) -> Callable:
    """A fused-type kernel's compiled specialisation for these index and
    value dtypes (no fused-type dispatch per call), or the kernel itself.

    >>> f = _specialised(csr.spmv, np.dtype(np.int32), np.dtype(np.float64))
    >>> f is csr.spmv, f is csr.spmv.__signatures__["int32_t|double"]
    (False, True)
    """
    return getattr(kernel, "__signatures__", {}).get("|".join(_C_TYPES[d] for d in dtypes), kernel)


def _no_check(call: Callable) -> Callable:
    """A kernel call that does not check its operand's indices (they are
    scanned before it runs) in the form of those that do: returns -1."""
    def run(*args) -> int:
        call(*args)
        return -1
    return run


#: ``kernel(indptr, indices, data, *dense factors, out, 0, nt)``: the SDDMM family (op 0: multiply)
_SDDMM_CALL = _no_check(lambda k, ip, ix, v, d, out, nt, S, tile: k(ip, ix, v, *d, out, 0, nt))

#: The CSR kernels :func:`bind_einsum` binds (by name in ``_csr_kernels``,
#: looked up when bound), and how each takes its dense factors (``d``, those
#: of :data:`_READ_TRANSPOSED` transposed) and options after ``(indptr,
#: indices, data)``; each returns -1 or the position of an out-of-range index.
_BOUND_CALLS: dict[str, tuple[str, Callable]] = {
    "spmv": ("spmv", lambda k, ip, ix, v, d, out, nt, S, tile: k(ip, ix, v, d[0], out, nt, S._shape[1])),
    "row_sums": ("spmv", lambda k, ip, ix, v, d, out, nt, S, tile: k(ip, ix, v, None, out, nt, S._shape[1])),
    "spmm": ("spmm", lambda k, ip, ix, v, d, out, nt, S, tile: k(ip, ix, v, d[0], out, nt, tile)),
    "spmm_t": ("spmm_t", lambda k, ip, ix, v, d, out, nt, S, tile: k(ip, ix, v, d[0], out, nt)),
    "spmm_gemm": ("spmm_gemm", _no_check(lambda k, ip, ix, v, d, out, nt, S, tile: k(ip, ix, v, *d, out, nt))),
    "sddmm": ("sddmm", _SDDMM_CALL),
    "sddmm_t": ("sddmm", _SDDMM_CALL),
    "gnn2": ("sddmm_spmm", _SDDMM_CALL),
    "sddmm_spmm": ("sddmm_spmm", _SDDMM_CALL),
    "sddmm_spmm_gemm": ("sddmm_spmm_gemm",
                        _no_check(lambda k, ip, ix, v, d, out, nt, S, tile: k(ip, ix, v, *d, out, nt))),
}
#: bound kernels whose result is values on the sparse operand's pattern
_ON_PATTERN = frozenset({"sddmm", "sddmm_t"})


def bind_einsum(kernel: str, names, out_shape, tensors, tile: int = 0) -> Callable | None:
    """:func:`_run_einsum` of ``kernel`` bound to the operand signature of
    ``tensors``: ``run(tensors, nt) -> ndarray``, or None when the kernel is
    not one bound here or an operand would be converted (another dtype, a
    dense factor not C-ordered).

    Bound are what depends on the signature only: the dtypes, the compiled
    specialisation, whether the work is worth a team (decided on these
    operands' sizes: results do not depend on the team size).  Each call
    checks the signature by identity (formats and dtypes are shared
    objects) and takes the general path when it differs, so a bound call
    is never wrong, only sometimes not faster.

    >>> import scipy.sparse as sp
    >>> from spfuse.tensor import as_tensor
    >>> ops = {"A": as_tensor(sp.csr_array(np.eye(3))), "x": as_tensor(np.arange(3.0))}
    >>> run = bind_einsum("spmv", ("A", "x"), (3,), ops)
    >>> run(ops, 1)
    array([0., 1., 2.])
    """
    found = _BOUND_CALLS.get(kernel)
    if found is None:
        return None
    names = tuple(names)
    ts = [tensors[n] for n in names]
    S, dense = ts[0], ts[1:]
    itype, dtype = _types(ts)
    sparse_format = Format.csr()
    if S._format is not sparse_format or S._index_dtype is not itype or S._values.dtype is not dtype:
        return None
    transposed = _READ_TRANSPOSED.get(kernel, ())
    # a factor read as stored: C-ordered; one read transposed: any dense order (a copy when C-ordered)
    formats = tuple(t._format if n in transposed else Format.dense(len(t._shape)) for n, t in enumerate(dense))
    if any(t._format is not f or t._values.dtype is not dtype for t, f in zip(dense, formats, strict=True)):
        return None
    fn, call = found
    compiled = _specialised(getattr(csr, fn), itype, dtype)
    team = _work(ts) >= PARALLEL_MIN_WORK
    sparse_name = names[0]
    dense_names = tuple(zip(names[1:], formats, (n in transposed for n in range(len(dense))), strict=True))
    out_shape = tuple(out_shape)
    on_pattern = kernel in _ON_PATTERN

    def run(tensors, nt: int):
        S = tensors[sparse_name]
        nt = nt if team else 1
        d = []
        same = S._format is sparse_format and S._index_dtype is itype and S._values.dtype is dtype
        with SharedCopies():
            for name, fmt, flip in dense_names:
                t = tensors[name]
                same = same and t._format is fmt and t._values.dtype is dtype
                d.append(dense_transposed(t, dtype, nt) if flip else t._values.reshape(t._shape))
        if not same:
            return _run_einsum(kernel, list(names), "", out_shape, tensors, nt, tile)
        level = S._levels[1]
        out = _result(len(S._values) if on_pattern else out_shape, dtype)
        bad = call(compiled, level.pos, level.crd, S._values, d, out, nt, S, tile)
        if bad >= 0:
            raise IndexCheckFailed(sparse_name, bad)
        return S._with_kernel_values(out) if on_pattern else out
    return run


class BoundEinsum:
    """A one-template program's run for one operand signature: its first
    call binds the kernel (:func:`bind_einsum`) to the operands it meets;
    a kernel not bound there runs :func:`_run_einsum` per call."""

    def __init__(self, kernel: str, names, out_name: str, out_shape, tile: int = 0):
        self.kernel, self.names, self.out_name, self.tile = kernel, list(names), out_name, tile
        self.out_shape = out_shape
        self.bound: Callable | None = None

    def __call__(self, tensors, nt: int) -> dict:
        run = self.bound
        if run is None:
            run = self.bound = bind_einsum(self.kernel, self.names, self.out_shape, tensors, self.tile) or self._unbound
        return {self.out_name: run(tensors, nt)}

    def _unbound(self, tensors, nt: int):
        return _run_einsum(self.kernel, self.names, self.out_name, self.out_shape, tensors, nt, self.tile)


def _run_einsum(kernel: str, names: list, out_name: str, out_shape, tensors, nt: int, tile: int = 0):
    ts = [tensors[n] for n in names]
    nt = _threads(ts, nt)
    itype, dtype = _types(ts)
    S = ts[0]
    if kernel == "bilinear":   # wᵀ·A·x: the SpMV's rows summed as made
        w, S = ts[0], ts[1]
        ip, ix, vals = _csr(S, itype, dtype)
        # scalar partials cost nothing: many blocks, so that a thread slowed by
        # another process is made up for; their count depends on nnz alone
        value, bad = csr.bilinear(ip, ix, vals, _dense(w, dtype), _dense(ts[2], dtype),
                                  max(1, min(BILINEAR_MAX_BLOCKS, len(vals) // BILINEAR_BLOCK_ENTRIES)), nt)
        if bad >= 0:
            raise IndexCheckFailed(names[1], bad)
        return np.array(value, dtype)
    if kernel in _SCALINGS:
        # ``d[i] * A[i,j] * e[j]`` (a missing side is ones)
        ip, ix, vals = _csr(S, itype, dtype)
        d = {kernel_side: _dense(t, dtype) for kernel_side, t in zip(_SCALINGS[kernel], ts[1:], strict=True)}
        outv = _result(vals.shape, vals.dtype)
        csr.scale(ip, ix, vals, d.get("i"), d.get("j"), outv, nt)
        return S._with_kernel_values(outv)
    if kernel in ("spmv", "spmv_t", "row_sums", "col_sums", "spmm", "spmm_t", "sddmm", "sddmm_t", "spmm_gemm", "gnn2",
                  "sddmm_spmm", "sddmm_spmm_gemm"):
        ip, ix, vals = _csr(S, itype, dtype)
        # the dense factors, C-ordered; those a kernel reads transposed are
        # made from the views (no copy for a column-ordered factor), once per
        # operand (GNN-2 reads Y transposed twice)
        transposed = _READ_TRANSPOSED.get(kernel, ())
        with SharedCopies():
            d = [dense_transposed(t, dtype, nt) if n in transposed else _dense(t, dtype, nt)
                 for n, t in enumerate(ts[1:])]
        if kernel in CHECKS_INDICES:  # these check A's indices as they read them
            out = _result(out_shape, dtype)
            if kernel in ("spmv", "row_sums"):   # row sums: SpMV by ones (x not read)
                bad = csr.spmv(ip, ix, vals, d[0] if d else None, out, nt, S.shape[1])
            elif kernel in ("spmv_t", "col_sums"):
                blocks = reduction_block_count(len(vals), out_shape[0])
                bad = csr.spmv_t(ip, ix, vals, d[0] if d else None, out, blocks, nt)
            elif kernel == "spmm_t":
                bad = csr.spmm_t(ip, ix, vals, d[0], out, nt)
            else:
                bad = csr.spmm(ip, ix, vals, d[0], out, nt, tile)  # tile: Plan.tiles (0 = untiled)
            if bad >= 0:
                raise IndexCheckFailed(names[0], bad)
        elif kernel in ("sddmm", "sddmm_t"):
            outv = _result(vals.shape, vals.dtype)
            csr.sddmm(ip, ix, vals, d[0], d[1], outv, 0, nt)
            return S._with_kernel_values(outv)
        elif kernel == "spmm_gemm":
            # (A·C)·D fused with a row temporary.  The association and the
            # fused-vs-separate choice are the planner's (reassociate,
            # separate): A·(C·D) or separate kernels arrive as several groups.
            C, D = d
            out = _result(out_shape, dtype)
            csr.spmm_gemm(ip, ix, vals, C, D, out, nt)
        elif kernel == "gnn2":
            X, Dt, E = d
            out = _result(out_shape, dtype)
            csr.sddmm_spmm(ip, ix, vals, X, Dt, E, out, 0, nt)
        elif kernel == "sddmm_spmm":
            C, D, E = d
            out = _result(out_shape, dtype)
            csr.sddmm_spmm(ip, ix, vals, C, D, E, out, 0, nt)
        else:
            C, D, F, W = d
            out = _result(out_shape, dtype)
            csr.sddmm_spmm_gemm(ip, ix, vals, C, D, F, W, out, nt)
        return out
    if kernel in ("masked_spgemm", "masked_spgemm_dot"):
        return _run_masked_spgemm(kernel, ts, itype, dtype, out_shape, nt)
    if kernel == "spgemm":
        A, B = ts
        a, b = _csr(A, itype, dtype), _csr(B, itype, dtype)
        indptr, indices, data = csr.spgemm(*a, *b, B.shape[1], nt)
        from spfuse.tensor import CompressedLevel, DenseLevel, Tensor
        return Tensor._trusted(out_shape, Format.csr(), (DenseLevel(out_shape[0]),
                               CompressedLevel(out_shape[1], indptr, indices)), data, None)
    arrs = _csf(S, itype, dtype)
    d = [_dense(t, dtype) for t in ts[1:]]
    if kernel == "ttm":
        # X[i,j,k]·C[k,l]: the CSF's last level is a CSR matrix whose rows are
        # X's (i, j) fibers, so this is SpMM over fibers; the result keeps
        # X's two outer levels and a dense row of L per fiber.
        from spfuse.tensor import DenseLevel, Tensor
        L = d[0].shape[1]
        outv = np.empty((len(arrs[3]), L), dtype)
        bad = csr.spmm(arrs[4], arrs[5], arrs[6], d[0], outv, nt)
        if bad >= 0:  # X was validated: only a caller writing to it meanwhile gets here
            raise IndexCheckFailed(names[0], bad)
        return Tensor._trusted(out_shape, Format(("compressed", "compressed", "dense")),
                               tuple(S.levels[:2]) + (DenseLevel(L),), outv.reshape(-1), None)
    if kernel in ("ttv", "spttm_spttm"):
        from spfuse.tensor import CompressedLevel, DenseLevel, Tensor
        n_fibers = len(arrs[3])  # level-1 positions: X's (i, j) fibers
        if kernel == "ttv":
            outv = np.empty(n_fibers, dtype)
            csf.ttv(*arrs, d[0], outv, nt)
            levels, fmt = S.levels[:2], Format(("compressed", "compressed"))
        else:
            M = d[1].shape[1]
            outv = np.empty((n_fibers, M), dtype)
            csf.spttm_spttm(*arrs, d[0], d[1], outv, nt)
            levels = tuple(S.levels[:2]) + (DenseLevel(M),)
            fmt = Format(("compressed", "compressed", "dense"))
            outv = outv.reshape(-1)
        return Tensor._trusted(out_shape, fmt, levels, outv, None)
    out = _result(out_shape, dtype)
    if kernel == "ttv_mid":
        csf.ttv_mid(*arrs, d[0], out, nt)
    elif kernel == "mttkrp":
        csf.mttkrp(*arrs, d[0], d[1], out, nt)
    elif kernel == "mttkrp_mid":
        csf.mttkrp_mid(*arrs, d[0], d[1], out, nt)
    elif kernel == "mttkrp_inner":
        R = out_shape[1]
        csf.mttkrp_inner(*arrs, d[0], d[1], out, reduction_block_count(len(arrs[6]) * R, out_shape[0] * R), nt)
    else:
        csf.mttkrp_gemm(*arrs, d[0], d[1], d[2], out, nt)
    return out


def _run_masked_spgemm(kernel, ts, itype, dtype, out_shape, nt):
    """``M ∘ (A·B)`` by masked Gustavson (B as CSR) or a gather-dot per mask
    entry (B as the CSR of Bᵀ); the entries of M that no product reaches are
    dropped (the product stores none there)."""
    from spfuse.tensor import CompressedLevel, DenseLevel, Tensor
    M = ts[0]
    m = _csr(M, itype, dtype)
    outv = np.empty(len(m[2]), dtype)
    hit = np.empty(len(m[2]), np.uint8)
    dot = kernel == "masked_spgemm_dot"   # B given as the CSR of Bᵀ
    width = ts[1].shape[1] if dot else out_shape[1]   # the dense workspace's
    csr.masked_spgemm(*m, *_csr(ts[1], itype, dtype), *_csr(ts[2], itype, dtype), width, outv, hit, nt, dot)
    if hit.all():
        return M._with_kernel_values(outv)
    keep = np.flatnonzero(hit)
    indptr = np.searchsorted(keep, m[0]).astype(itype, copy=False)
    return Tensor._trusted(out_shape, Format.csr(), (DenseLevel(out_shape[0]),
                           CompressedLevel(out_shape[1], indptr, m[1][keep])), outv[keep], None)


_WHY = {
    "spmv": "gather-dot per row",
    "spmv_t": "scatter-axpy per row into fixed blocks' partial results, added in block order",
    "bilinear": "SpMV whose rows are weighted and summed as they are made (fixed blocks, added in order)",
    "row_sums": "SpMV by ones: a sum per row",
    "row_extremum": "one pass per stored row, its implicit zeros counted in",
    "col_extremum": "a scatter per row into fixed blocks' extrema and counts, combined in block order",
    "scale": "d[i]·A[i,j]·e[j] on A's pattern, one pass over its values",
    "scale_rows": "d[i]·A[i,j] on A's pattern, one pass over its values",
    "scale_cols": "A[i,j]·e[j] on A's pattern, one pass over its values",
    "col_sums": "Aᵀ·ones: a scatter per row into fixed blocks' partial results, added in block order",
    "spmm": "row axpy of B rows into the output row (k tiled only when Plan.tiles says so)",
    "spmm_t": ("scatter-axpy of B's rows into the output rows, rows in order (no transpose; past 4 MiB of "
               "output a team, each thread its range of output rows)"),
    "spgemm": "Gustavson i,j,k with a dense workspace, two phases (count, prefix sum, fill)",
    "masked_spgemm": "masked Gustavson: M's row marks the columns, A's row scatters B's rows only there",
    "masked_spgemm_dot": "A's row scattered dense, gathered at Bᵀ's row per stored M entry",
    "sddmm": "dot of two dense rows per stored B entry: scalar temporary, O(nnz·K)",
    "sddmm_t": "dot of two dense rows per stored B entry: scalar temporary, O(nnz·K)",
    "ttv": "one dot per (i,j) fiber of X",
    "ttv_mid": "each (i,j) fiber of X scaled by c[j] and scattered into the dense row i",
    "mttkrp": "X[i,j,k]·D[k,r] hoisted into a row temporary per (i,j) fiber",
    "mttkrp_mid": "X[i,j,k]·D[k,r] hoisted into a row temporary per (i,j) fiber, added to row j by the "
                  "block that owns j's range of rows (every slice searched for the range's fibers)",
    "mttkrp_inner": "C[i,r]·D[j,r] formed once per (i,j) fiber, X's entries scatter-added into the rows k "
                    "of fixed blocks' partial results, added in block order",
    "gnn2": "<SDDMM,SpMM> with a scalar temporary per stored A entry",
    "sddmm_spmm": "<SDDMM,SpMM> with a scalar temporary per stored B entry (SparseLNR)",
    "sddmm_spmm_gemm": "<SDDMM,SpMM,GEMM>: scalar temporary, then a row temporary times W",
    "mttkrp_gemm": "<MTTKRP,GEMM>: hoisted row temporary per i, then times E",
    "spttm_spttm": "<SpTTM,SpTTM>: row temporary per (i,j) fiber, then times D",
    "ttm": "SpMM over X's (i,j) fibers: a dense row per fiber",
    "spmm_gemm": "<SpMM,GEMM>: (A·C)·D with a row temporary per i, then times D (SparseLNR); "
                 "association and fusion chosen by the planner (see decisions)",
}


def _why(kernel, names, infos) -> str:
    return _WHY[kernel]


def _spadd_choice(ts, out_shape, max_row=None):
    from spfuse.passes.statistics import choose_spadd, spadd_stats
    return choose_spadd(spadd_stats([t.nnz for t in ts], out_shape[0], out_shape[1], max_row))


def _spadd_why(names, infos, out_shape) -> str:
    base = f"{len(names)}-way union in one pass (rows written at their upper-bound offsets)"
    if any(infos[n].nnz is None for n in names):
        return base + "; row variant (merge / scatter) chosen at run time from row statistics"
    choice = _spadd_choice([infos[n] for n in names], out_shape)
    return f"{base}; {choice.describe()} [longest row refined at run time]"


def _run_add(names, coef, out_shape, tensors, nt):
    """SpAdd-n of CSR tensors: row statistics (O(rows x operands)) pick the
    row variant, then one kernel call; no dtype conversion when all operands
    share the index and value dtypes."""
    from spfuse._kernels import _csr_kernels as csr
    from spfuse.tensor import CompressedLevel, DenseLevel, Tensor
    ts = [tensors[n] for n in names]
    itype, dtype = _types(ts)
    nt = _threads(ts, nt)
    parts = [_csr(t, itype, dtype) for t in ts]
    ips = [p[0] for p in parts]
    ub = csr.spadd_row_bounds(ips, out_shape[0])
    max_row = int(np.diff(ub).max()) if out_shape[0] else 0
    choice = _spadd_choice(ts, out_shape, max_row)
    # the result's index dtype (the Tensor's own rule, on the upper bound of
    # nnz): int64 operands whose sum fits int32 are written as int32 at once
    # instead of narrowed by a copy afterwards
    out_index = index_dtype_for(out_shape[0] + 1, out_shape[1], int(ub[-1]))
    indptr, indices, data = csr.spadd(ips, [p[1] for p in parts], [p[2] for p in parts], coef,
                                      out_shape[0], out_shape[1], nt, choice.variant, ub, out_index)
    return Tensor._trusted(out_shape, Format.csr(), (DenseLevel(out_shape[0]),
                           CompressedLevel(out_shape[1], indptr, indices)), data, None)


def _match_spadd(plan, infos):
    """The plan is one n-way union op of CSR inputs, each indexed like the
    result (one workspace per row): the template runs exactly that op, with
    its coefficients (``A - 2*B``: 1, -2)."""
    if len(plan.ops) != 1:
        return None
    op = plan.ops[0]
    if getattr(op, "operator", None) != "+" or op.reduction is not None or len(op.args) < 2:
        return None
    refs = op.args
    if not all(isinstance(r, Ref) and r.name in infos and r.indices == op.out_indices
               and _kind(infos[r.name]) == "csr" for r in refs):
        return None
    return [r.name for r in refs], np.array(op.coefficients, dtype=np.float64)


def _match_extremum(plan, infos):
    """``(name, along_rows, is_min)`` when the plan is one max/min over one
    index of a CSR or CSC input, the other index the result's:
    ``along_rows`` when the reduced index is the one the operand stores
    within a row of its arrays (row maxima of CSR, column maxima of CSC)."""
    if len(plan.ops) != 1:
        return None
    op = plan.ops[0]
    if op.reduction not in ("max", "min") or op.operator is not None or len(op.args) != 1 or len(op.reduced) != 1:
        return None
    # the reduced value must be the access itself: max(k, 0.25 * B[j,k]) is a
    # maximal-fusion statement op over an expression, or a scaled unit op
    if not isinstance(getattr(op, "expr", None), Access | None) or any(c != 1.0 for c in getattr(op, "coefs", ())):
        return None
    (ref,) = op.args
    info = infos.get(getattr(ref, "name", None))
    if (info is None or not info.is_sparse or info.ndim != 2 or info.levels != ("dense", "compressed")
            or len(set(ref.indices)) != 2 or tuple(op.out_indices) not in ((ref.indices[0],), (ref.indices[1],))):
        return None
    inner = ref.indices[info.mode_order[1]]   # the index stored within a row of its arrays
    return ref.name, op.reduced[0] == inner, op.reduction == "min"


def _run_extremum(t, along_rows: bool, is_min: bool, nt: int) -> np.ndarray:
    """Row or column maxima (minima) of a CSR or CSC matrix, implicit zeros
    included, on the arrays as stored (a CSC matrix's are the CSR of Aᵀ)."""
    itype, dtype = _types([t])
    ip, ix, vals = _csr(t, itype, dtype)
    nouter, ninner = len(ip) - 1, t.levels[1].size
    nt = _threads([t], nt)
    if along_rows:
        out = np.empty(nouter, dtype)
        csr.row_extremum(ip, vals, out, ninner, is_min, nt)
    else:
        out = np.empty(ninner, dtype)
        csr.col_extremum(ip, ix, vals, out, is_min, reduction_block_count(len(vals), ninner), nt)
    return out


def _match_sddmm_div(plan, infos):
    ops = plan.ops
    if len(ops) != 2 or len(plan.program.statements) != 1:
        return None
    t, a = ops
    if not (t.reduction == "sum" and t.operator == "*" and len(t.reduced) == 1 and a.operator == "/"
            and a.reduction is None and a.args[1].name == t.out and a.args[0].indices == a.out_indices
            and getattr(a.args[0], "name", None) in infos and _kind(infos[a.args[0].name]) == "csr"):
        return None
    i, j = a.out_indices
    k = t.reduced[0]
    (c, cix), (d, dix) = [(r.name, r.indices) for r in t.args]
    if cix != (i, k):
        (c, cix), (d, dix) = (d, dix), (c, cix)
    if cix != (i, k) or dix not in ((k, j), (j, k)) or t.args[1].indices == t.args[0].indices:
        return None
    if any(_kind(infos[n]) != "dense" for n in (c, d)):
        return None
    return a.args[0].name, c, d, dix == (j, k)


#: Gustavson-style kernels (SpGEMM, SpAdd) keep a dense row workspace of the
#: output's width per thread; beyond this width (hypersparse outputs) the
#: generic executor, which emits coordinates instead, is used.
MAX_WORKSPACE_COLUMNS = 2**25


def _one_op_per_statement(plan) -> bool:
    """Is every operation of ``plan`` a statement of its program (no workspace)?"""
    return {op.out for op in plan.ops} <= {st.target.name for st in plan.program.statements}


def match_template(plan) -> TemplateMatch | None:
    """The template kernel for ``plan`` (auto fusion; ``none`` group by group), or None.

    A whole-program template implements the program as written, fused; when
    the planner re-associated a chain or split a contraction out of its fused
    group, or no whole-program template matches, the plan runs group by group (:mod:`spfuse.lowering.groups`),
    each group on a template kernel where one matches -- one decision
    procedure, the planner's."""
    if plan.fusion == "none" or plan.fusion == "max" and _one_op_per_statement(plan):
        # none: every operation its own group, on the kernels auto's groups use; max: each statement
        # one group, on those kernels where its loop nest is theirs.  Not for a statement with a
        # workspace (its loop nest keeps it in a register or a row) nor a product of more than two
        # factors: a template computes a longer maximal-fusion chain with auto's temporaries --
        # spmm_gemm's row of A·X for sum(h, sum(j, A*X*W)) -- not the fused loop nest whose cost
        # max stands for.
        from spfuse.lowering.groups import lower_groups
        return lower_groups(plan)
    if plan.fusion == "max":
        return None
    as_written = not getattr(plan, "separated", ()) and not any(
        a.changed for a in getattr(plan, "associations", ()))
    m = _match(plan) if as_written else None
    if m is not None and m.kernel in ("spgemm", "masked_spgemm", "masked_spgemm_dot", "spadd"):
        width = plan.shapes.get(plan.results[0], (0, 0))[-1]
        if width is None or width > MAX_WORKSPACE_COLUMNS:
            return None
    if m is None:
        from spfuse.lowering.groups import lower_groups
        m = lower_groups(plan)
    return m


def whole_program_kernel(plan) -> str | None:
    """The kernel that runs ``plan``'s whole program on its operands as
    stored, or None (then its groups may still reach kernels one by one).
    The planner keeps such a plan's storage orders (``with_storage_orders``).

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.planner import plan_program
    >>> from spfuse.ir.ops import TensorInfo
    >>> csc = TensorInfo("A", 2, ("dense", "compressed"), (1, 0), (50, 40), nnz=200)
    >>> whole_program_kernel(plan_program(parse_program("y[i] = max(j, A[i,j])"), {"A": csc}))
    'col_max'
    """
    m = _match(plan)
    return None if m is None else m.kernel


def _match(plan) -> TemplateMatch | None:
    infos = plan.inputs
    ein = _einsum(plan.program)
    result = plan.results[0] if plan.results else None
    out_shape = tuple(plan.shapes.get(result, ())) if result else ()
    if ein is not None and None not in out_shape:
        out_name, out_ix, summed, factors = ein
        if all(n in infos for n, _ in factors):
            for kernel, sig in SIGNATURES.items():
                names = _unify(sig, out_ix, summed, factors, infos)
                if names is not None and not fits_operands(kernel, names, infos):
                    continue   # (spmm_t's output too large to scatter into: SpMM of the transpose, a group's route)
                if names is not None and not follows_template(kernel, names, plan.ops, infos):
                    return None  # the planned tree is another one: the generic executor runs it
                if names is not None:
                    roles = dict(zip(names, (k for k, _ in sig[1]), strict=True))
                    # the tiling pass's tile of the dense output index (SpMM's k); 0 = untiled
                    tile = max((d.get(out_ix[-1], 0) for d in plan.tiles.values()), default=0)
                    why = _why(kernel, names, infos)
                    if kernel == "spmm":
                        why = "row axpy; " + (f"the dense k loop in tiles of {tile} (Plan.tiles)" if tile
                                              else "whole rows of k (Plan.tiles: k untiled)")
                    return TemplateMatch(
                        "sddmm" if kernel == "sddmm_t" else kernel, roles, why,
                        lambda tensors, nt, k=kernel, names=names, tile=tile: {
                            out_name: _run_einsum(k, names, out_name, out_shape, tensors, nt, tile)},
                        frozenset({checked_operand(kernel, names)}) if kernel in CHECKS_INDICES else frozenset(),
                        bind=functools.partial(BoundEinsum, kernel, names, out_name, out_shape, tile))
    ext = _match_extremum(plan, infos)
    if ext is not None and None not in out_shape:
        name, along_rows, is_min = ext
        kernel = ("row_" if along_rows else "col_") + ("min" if is_min else "max")
        return TemplateMatch(kernel, {name: _kind(infos[name]) if _kind(infos[name]) == "csr" else "csc"},
                             _WHY["row_extremum" if along_rows else "col_extremum"],
                             lambda tensors, nt: {result: _run_extremum(tensors[name], along_rows, is_min, nt)})
    add = _match_spadd(plan, infos)
    if add is not None and None not in out_shape:
        names, coef = add
        return TemplateMatch("spadd", {n: "csr" for n in names}, _spadd_why(names, infos, out_shape),
                             lambda tensors, nt, names=names, coef=coef: {
                                 result: _run_add(names, coef, out_shape, tensors, nt)})
    div = _match_sddmm_div(plan, infos)
    if div is not None:
        b, c, d, transposed = div

        def run_div(tensors, nt, b=b, c=c, d=d, transposed=transposed):
            from spfuse._kernels import _csr_kernels as csr
            ts = [tensors[b], tensors[c], tensors[d]]
            itype, dtype = _types(ts)
            nt = _threads(ts, nt)
            ip, ix, vals = _csr(ts[0], itype, dtype)
            C = _dense(ts[1], dtype, nt)
            Dt = _dense(ts[2], dtype, nt) if transposed else _dense_t(ts[2], dtype, nt)
            outv = _result(vals.shape, vals.dtype)
            csr.sddmm(ip, ix, vals, C, Dt, outv, 1, nt)
            return {result: ts[0]._with_kernel_values(outv)}
        return TemplateMatch("sddmm(div)", {b: "csr", c: "dense", d: "dense"},
                             "B / (C·D) on B's pattern with a scalar temporary", run_div)
    return None
