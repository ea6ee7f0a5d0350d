"""The off-catalogue program table (issue 14): everyday programs just outside design.md's catalogue.

Each :class:`OffProgram` holds one spfuse program, how its operands are
built from a seeded input (the generators of :mod:`spfuse.bench.suite`), the
formulations a competent user of scipy/numpy (and ``torch.sparse`` /
python-graphblas where natural) writes instead, and the *equivalent
spellings* of the same computation in spfuse -- factor order, CSR vs CSC
input, a pre-transposed operand, a Fortran-ordered or transposed-view dense
operand -- whose times the no-cliff criterion compares (every spelling within
1.5x of the fastest).

Peer formulations that gather one dense row per stored entry work in blocks
of :data:`CHUNK` entries, as a user would at these sizes (a whole
``nnz x K`` gather is 0.5 GB at the medium size).  Structure-only
preparation (a coordinate sort, a format conversion) is done in ``prepare``,
which is not timed -- as for every peer's conversion in the main suite.

>>> len(PROGRAMS) >= 25
True
>>> inp = make_inputs(SIZES["tiny"], ["uniform"])["uniform"]
>>> sorted(PROGRAMS_BY_NAME["AT-SpMV"].kernel.operands(inp, SIZES["tiny"]))
['A', 'x']
>>> [s.label for s in PROGRAMS_BY_NAME["AT-SpMV"].spellings]
['as written', 'A as CSC', 'pre-transposed At[j,i] (CSR)']
"""
from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import scipy.sparse as sp

import spfuse
from spfuse.bench import suite
from spfuse.bench.peers import Impl, Skip
from spfuse.formats import Format

__all__ = ["OffSize", "SIZES", "CallTimeout", "deadline", "Spelling", "AS_WRITTEN", "OffProgram", "PROGRAMS",
           "PROGRAMS_BY_NAME", "ISSUE_KINDS",
           "select_programs", "make_inputs", "CHUNK", "LIBRARIES"]

#: Entries per gathered block in the numpy formulations (``CHUNK x 64`` float64 = 32 MiB).
CHUNK = 1 << 16

#: The peer libraries of this suite, in report order.
LIBRARIES = ("scipy", "numpy", "torch", "graphblas")


@dataclasses.dataclass(frozen=True)
class OffSize(suite.Size):
    """A :class:`~spfuse.bench.suite.Size` with a 4-D tensor as well."""

    tensor4_shape: tuple = ()
    tensor4_nnz: int = 0
    call_limit: float = 30.0  #: a spfuse call still running after this many seconds is stopped


# medium follows issue 14: 100k rows, ~10 nnz/row, K=64, tensors with >= 2M nnz
SIZES = {
    "tiny": OffSize("tiny", 300, 4, 8, (30, 25, 20), 1500, (), 3, 1.0, 1 << 26, 0.5, (12, 10, 9, 8), 1500, 10.0),
    "small": OffSize("small", 5000, 10, 16, (200, 150, 100), 50_000, (), 5, 0.5, 1 << 28, 0.6,
                     (60, 50, 40, 30), 50_000, 10.0),
    "medium": OffSize("medium", 100_000, 10, 64, (1000, 800, 600), 2_000_000, (), 5, 1.0, 1 << 30, 8.0,
                      (200, 150, 100, 80), 2_000_000, 30.0),
}

#: The kinds of program issue 14 names; every one must appear in :data:`PROGRAMS`.
ISSUE_KINDS = ("transposed CSR", "CSC operand", "SpMV plus a vector", "scalar factor", "activation after SpMM",
               "exp of a sampled product", "attention division by a constant", "GNN-2 with Yt",
               "GCN layer", "D^-1/2 A D^-1/2", "element-wise product", "weighted sum", "row sums",
               "column sums", "inner product", "quadratic form", "masked SpGEMM", "tensor middle mode",
               "4-D tensor", "sparse mode order", "dense mode order", "factor order")


class CallTimeout(Skip):
    """A spfuse call ran past its size's ``call_limit`` and was stopped (the harness reports it ``skip``)."""

    PREFIX = "stopped after"


@contextlib.contextmanager
def deadline(seconds: float | None):
    """Raise :class:`CallTimeout` in the block after ``seconds`` (SIGALRM; spfuse's kernels are interruptible).

    A no-op off the main thread, without ``setitimer``, or for ``None``.

    >>> import time
    >>> try:
    ...     with deadline(0.05):
    ...         time.sleep(1)
    ... except CallTimeout as e:
    ...     print(e)
    stopped after 0.05 s (call limit)
    """
    if seconds is None or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise CallTimeout(f"{CallTimeout.PREFIX} {seconds:g} s (call limit)")

    old = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclasses.dataclass(frozen=True)
class Spelling:
    """Another way to write the same computation in spfuse: program text and operand change."""

    label: str
    program: str | None = None                    #: None: the program as written
    adapt: Callable[[dict], dict] = lambda o: o      #: operands as written -> this spelling's (not timed)

    def impl(self, program: str, call_limit: float | None = None) -> Impl:
        """The spelling as a bench :class:`~spfuse.bench.peers.Impl`; its first call stops after ``call_limit`` s.

        Only the first (checked) call runs under the :func:`deadline`: a
        call under the limit once is under it again, and the timed calls pay
        no timer set-up.
        """
        text = self.program or program

        def prepare(o, ctx):
            kernel, ops = spfuse.compile(text), self.adapt(o)
            _check_temporaries(kernel, ops, ctx.max_dense_bytes)
            return [kernel, ops, call_limit]

        def run(state):
            kernel, ops, limit = state
            if limit is None:
                return kernel(**ops)
            state[2] = None
            with deadline(limit):
                return kernel(**ops)

        return Impl(prepare, run, how=text)


AS_WRITTEN = Spelling("as written")


def _check_temporaries(kernel, ops: dict, max_bytes: int) -> None:
    """Raise :class:`Skip` when the auto plan would store temporaries over ``max_bytes`` (an OOM guard).

    Cost-model questions that fail (the planner's API changes under issue
    14) are not a reason to skip: the call then runs under its time limit.
    """
    from spfuse.bench import budget
    try:
        plan = kernel.plans(**ops)["auto"]
        nbytes, what = budget.temporary_bytes(plan)
    except Exception:
        return
    if nbytes > max_bytes:
        raise Skip(f"temporaries of {nbytes / 2**20:.0f} MiB ({what}) exceed {max_bytes / 2**20:.0f} MiB")


@dataclasses.dataclass(frozen=True)
class OffProgram:
    """One off-catalogue program, its operands, its peers' formulations and its other spellings."""

    name: str
    kind: str                                        #: one of ISSUE_KINDS or a further kind
    input: str                                       #: "uniform", "powerlaw", "tensor3" or "tensor4"
    program: str
    build: Callable[[Any, int, np.random.Generator], dict]
    peers: dict                                      #: library name -> Impl
    variants: tuple = ()                             #: Spellings besides the program as written

    @property
    def kernel(self) -> suite.BenchKernel:
        """The program as a :class:`~spfuse.bench.suite.BenchKernel` (what the harness runs)."""
        kind = "tensor" if self.input.startswith("tensor") else "matrix"
        return suite.BenchKernel(self.name, self.program, kind, self.build)

    @property
    def spellings(self) -> tuple:
        """The program as written, then its variants."""
        return (AS_WRITTEN,) + tuple(self.variants)


# ----------------------------------------------------------------------------- operand helpers

def _dense(g, *shape, center=False, positive=False):
    a = g.random(shape)
    return a - 0.5 if center else a + 0.5 if positive else a


def _second_matrix(a, g, row_nnz=None):
    """Another seeded CSR matrix of ``a``'s shape that shares about half of ``a``'s pattern."""
    keep = g.random(a.nnz) < 0.5
    shared = sp.csr_array((g.random(a.nnz) * keep, a.indices.copy(), a.indptr.copy()), shape=a.shape)
    shared.eliminate_zeros()  # in place: hence the copies of a's arrays
    per_row = max(1, (row_nnz or max(1, a.nnz // max(a.shape[0], 1))) // 2)
    other = suite.uniform_matrix(a.shape[0], a.shape[1], per_row, int(g.integers(2 ** 31)))
    b = (shared + other).tocsr()
    b.sum_duplicates()
    b.sort_indices()
    return b


def _csc(*names):
    return lambda o: {n: (v.tocsc() if n in names else v) for n, v in o.items()}


def _transposed(name, new):
    def adapt(o):
        out = {k: v for k, v in o.items() if k != name}
        t = o[name].T.tocsr()
        t.sort_indices()
        out[new] = t
        return out
    return adapt


def _renamed(name, new, f=lambda v: v):
    return lambda o: {(new if k == name else k): (f(v) if k == name else v) for k, v in o.items()}


def _modes(name, order):
    return lambda o: {k: (v.asformat(Format.csf(order)) if k == name else v) for k, v in o.items()}


def _rows_of(a) -> np.ndarray:
    return np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))


def _ident(o, ctx):
    return o


def _with_rows(o, ctx):
    """Operands plus the row of every stored entry of ``o['B']``, ``o['A']`` or ``o['R']`` (structure only)."""
    m = next(o[n] for n in ("B", "A", "R") if n in o and sp.issparse(o[n]))
    return dict(o, rows=_rows_of(m))


def _sampled_dots(rows, cols, left, right_rows) -> np.ndarray:
    """``sum_k left[rows[e],k] * right_rows[cols[e],k]`` for every entry ``e``, in blocks of CHUNK."""
    out = np.empty(rows.size)
    for s in range(0, rows.size, CHUNK):
        out[s:s + CHUNK] = np.einsum("nk,nk->n", left[rows[s:s + CHUNK]], right_rows[cols[s:s + CHUNK]])
    return out


def _on_pattern(b, vals):
    return sp.csr_array((vals, b.indices, b.indptr), shape=b.shape)


# ----------------------------------------------------------------------------- torch / graphblas helpers

def _torch():
    import torch
    return torch


def _gb():
    import graphblas
    return graphblas


def _to_torch(o, ctx):
    """scipy CSR/CSC -> torch sparse CSR/CSC (int64 indices), numpy -> torch (strides kept)."""
    import warnings
    torch = _torch()
    out = {}
    for n, v in o.items():
        if sp.issparse(v) and v.format in ("csr", "csc"):
            ctor = torch.sparse_csr_tensor if v.format == "csr" else torch.sparse_csc_tensor
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                out[n] = ctor(torch.from_numpy(v.indptr.astype(np.int64)),
                              torch.from_numpy(v.indices.astype(np.int64)), torch.from_numpy(v.data), v.shape)
        elif isinstance(v, np.ndarray):
            out[n] = torch.from_numpy(v)
        else:
            out[n] = v
    return out


def _torch_sampled(b, left, right):
    """``(left @ right)`` on B's pattern as a torch CSR tensor (``sampled_addmm`` with beta=0)."""
    return _torch().sparse.sampled_addmm(b, left, right, beta=0.0)


def _torch_csr_like(b, vals):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _torch().sparse_csr_tensor(b.crow_indices(), b.col_indices(), vals, b.shape)


def _to_gb(o, ctx):
    """scipy sparse -> graphblas Matrix, 1-D numpy -> Vector, 2-D numpy -> Matrix."""
    gb = _gb()
    out = {}
    for n, v in o.items():
        if sp.issparse(v):
            out[n] = gb.io.from_scipy_sparse(v)
        elif isinstance(v, np.ndarray):
            out[n] = gb.Vector.from_dense(v) if v.ndim == 1 else gb.Matrix.from_dense(np.ascontiguousarray(v))
        else:
            out[n] = v
    return out


def _gb_dense(x):
    return x.to_dense(fill_value=0.0)


def _gb_scalar(s):
    return 0.0 if s.value is None else float(s.value)


# ----------------------------------------------------------------------------- tensor helpers (numpy peers)

def _sorted_coords(name: str, key_modes: Sequence[int]):
    """``prepare`` for tensor peers: coordinates and values sorted by the output modes ``key_modes``."""
    def prepare(o, ctx):
        x = o[name]
        c = x.coords.astype(np.intp)
        key = np.ravel_multi_index(tuple(c[m] for m in key_modes), tuple(x.shape[m] for m in key_modes))
        perm = np.argsort(key, kind="stable")
        return dict(o, coords=c[:, perm], v=x.values[perm], key=key[perm], shape=x.shape)
    return prepare


def _factor_rows_sum(s, out_mode: int, factors: dict) -> np.ndarray:
    """MTTKRP-style ``out[c[out_mode]] += v * prod(F[c[m]])`` over entries sorted by ``out_mode``, in blocks."""
    keys, c, v = s["key"], s["coords"], s["v"]
    rank = next(iter(factors.values())).shape[1]
    out = np.zeros((s["shape"][out_mode], rank))
    for b in range(0, keys.size, CHUNK):
        k = keys[b:b + CHUNK]
        p = v[b:b + CHUNK, None] * np.ones((1, rank))
        for m, f in factors.items():
            p *= f[c[m, b:b + CHUNK]]
        starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
        out[k[starts]] += np.add.reduceat(p, starts, axis=0)
    return out


def _vector_contract(s, out_modes: tuple, vectors: dict) -> sp.csr_array:
    """TTV-style ``v * prod(vec[c[m]])`` summed into a CSR matrix indexed by the two ``out_modes``."""
    c, vals = s["coords"], s["v"].copy()
    for m, vec in vectors.items():
        vals *= vec[c[m]]
    r, q = out_modes
    return sp.csr_array((vals, (c[r], c[q])), shape=(s["shape"][r], s["shape"][q]))


# ----------------------------------------------------------------------------- the table

def _p(run, how, prepare=_ident, finish=lambda raw: raw) -> Impl:
    return Impl(prepare, run, finish, how)


def _torch_p(run, how, finish=lambda raw: raw) -> Impl:
    return Impl(_to_torch, run, finish, how)


def _gb_p(run, how, finish=lambda raw: raw) -> Impl:
    return Impl(_to_gb, run, finish, how)


def _a_vec(rows_extent: bool = False):
    return lambda a, r, g: {"A": a, "x": _dense(g, a.shape[0] if rows_extent else a.shape[1])}


#: a weighted matrix factorisation's gradient in U: the residual on the ratings' pattern (R, and the
#: weights W stored on the same coordinates, in their own index arrays), then its SpMM with V
MF_GRADIENT = "E[i,j] = W[i,j] * (R[i,j] - U[i,k] * V[j,k]); G[i,k] = E[i,j] * V[j,k]"


def _mf_ops(a, r, g):
    ratings = sp.csr_array((1.0 + 4.0 * g.random(a.nnz), a.indices, a.indptr), shape=a.shape)
    weights = sp.csr_array((1.0 + 0.5 * ratings.data, a.indices.copy(), a.indptr.copy()), shape=a.shape)
    return {"W": weights, "R": ratings, "U": _dense(g, a.shape[0], r, center=True),
            "V": _dense(g, a.shape[1], r, center=True)}


def _sddmm_ops(a, r, g):
    return {"B": a, "C": _dense(g, a.shape[0], r, center=True), "D": _dense(g, r, a.shape[1], center=True)}


def _np_sddmm(s, f):
    """``f(B.data, dots)`` on B's pattern, with D given as ``(K, n)`` (one transposing copy per call)."""
    dots = _sampled_dots(s["rows"], s["B"].indices, s["C"], np.ascontiguousarray(s["D"].T))
    return _on_pattern(s["B"], f(s["B"].data, dots))


#: a sparse attention layer after its projections: scores on B's pattern, a
#: softmax over each row's stored entries, the weighted sum of the values' rows
ATTENTION = ("S[i,j] = B[i,j] * Q[i,k] * K[j,k] / 8.0; m[i] = max(j in B[i,j], S[i,j]); "
             "E[i,j] = B[i,j] * exp(S[i,j] - m[i]); Y[i,h] = E[i,j] * V[j,h] / sum(j, E[i,j])")


def _attention_ops(a, r, g):
    n, m = a.shape
    return {"B": a, "Q": _dense(g, n, r, center=True), "K": _dense(g, m, r, center=True),
            "V": _dense(g, m, r, center=True)}


def _row_reduceat(ufunc, values: np.ndarray, indptr: np.ndarray, empty: float) -> np.ndarray:
    """``ufunc.reduceat`` of each CSR row's stored ``values``; ``empty`` for a row storing nothing."""
    out = np.full(len(indptr) - 1, empty)
    full = np.diff(indptr) > 0
    if values.size:
        out[full] = ufunc.reduceat(values, indptr[:-1][full])
    return out


def _torch_row_max(values, rows, n: int):
    """Each row's largest stored value (``rows``: the row of every entry), 0 for an empty row."""
    return _torch().zeros(n, dtype=values.dtype).scatter_reduce(0, rows, values, "amax", include_self=False)


def _np_attention(s):
    """:data:`ATTENTION` in numpy: sampled dots in blocks, the row maxima by
    ``maximum.reduceat``, scipy's SpMM, rows without entries 0."""
    b, rows = s["B"], s["rows"]
    scores = b.data * _sampled_dots(rows, b.indices, s["Q"], s["K"]) / 8.0
    m = _row_reduceat(np.maximum, scores, b.indptr, 0.0)
    e = b.data * np.exp(scores - m[rows])
    weights = _on_pattern(b, e)
    total = weights.sum(axis=1)
    out = weights @ s["V"]
    np.divide(out, total[:, None], out=out, where=total[:, None] != 0)
    return out


def _torch_attention(t):
    """:data:`ATTENTION` in torch: ``sampled_addmm`` scores, ``scatter_reduce``
    row maxima, a CSR SpMM and ``index_add_`` row sums."""
    torch = _torch()
    b = t["B"]
    crow = b.crow_indices()
    rows = torch.repeat_interleave(torch.arange(b.shape[0]), crow[1:] - crow[:-1])
    scores = b.values() * _torch_sampled(b, t["Q"], t["K"].T).values() / 8.0
    m = _torch_row_max(scores, rows, b.shape[0])
    e = b.values() * torch.exp(scores - m[rows])
    total = torch.zeros(b.shape[0], dtype=e.dtype).index_add_(0, rows, e)
    out = _torch_csr_like(b, e) @ t["V"]
    return torch.where(total[:, None] != 0, out / total[:, None], torch.zeros((), dtype=out.dtype))


#: a softmax over each row's stored entries (``torch.sparse.softmax``'s), on the power-law
#: graph: most rows hold a few entries, so a pattern program's work per row is small
PATTERN_SOFTMAX = ("m[i] = max(j in A[i,j], A[i,j]); E[i,j] = A[i,j] / A[i,j] * exp(A[i,j] - m[i]); "
                   "s[i] = sum(j, E[i,j]); Y[i,j] = E[i,j] / s[i]")


def _np_pattern_softmax(s):
    """:data:`PATTERN_SOFTMAX` in numpy: ``maximum.reduceat`` and ``add.reduceat`` over the rows."""
    a, rows = s["A"], s["rows"]
    e = np.exp(a.data - _row_reduceat(np.maximum, a.data, a.indptr, 0.0)[rows])
    return _on_pattern(a, e / _row_reduceat(np.add, e, a.indptr, 1.0)[rows])


def _torch_pattern_softmax(t):
    """:data:`PATTERN_SOFTMAX` in torch on CSR: ``scatter_reduce`` row maxima, ``index_add_`` sums."""
    torch = _torch()
    a = t["A"]
    crow = a.crow_indices()
    rows = torch.repeat_interleave(torch.arange(a.shape[0]), crow[1:] - crow[:-1])
    v = a.values()
    e = torch.exp(v - _torch_row_max(v, rows, a.shape[0])[rows])
    total = torch.zeros(a.shape[0], dtype=e.dtype).index_add_(0, rows, e)
    return _torch_csr_like(a, e / total[rows])


def _with_transpose(o: dict, name: str, new: str) -> dict:
    """``o`` plus ``new``: a C-contiguous copy of ``o[name].T``."""
    return dict(o, **{new: np.ascontiguousarray(o[name].T)})


def _scipy_sym_norm(o):
    d = sp.diags_array(o["d"])
    return (d @ o["A"] @ d).tocsr()


def _tensor_ops(*factors, vectors=()):
    """Builder for a tensor program: dense factors ``(name, mode)`` of rank r and vectors ``(name, mode)``."""
    def build(x, r, g):
        o = {"X": x}
        for name, mode in factors:
            o[name] = _dense(g, x.shape[mode], r)
        for name, mode in vectors:
            o[name] = _dense(g, x.shape[mode])
        return o
    return build


PROGRAMS = [
    # --- transposed access of a CSR operand
    OffProgram(
        "AT-SpMV", "transposed CSR", "uniform", "y[j] = A[i,j] * x[i]", _a_vec(rows_extent=True),
        {"scipy": _p(lambda o: o["A"].T @ o["x"], "A.T @ x"),
         "torch": _torch_p(lambda t: t["A"].t() @ t["x"], "A_csr.t() @ x"),
         "graphblas": _gb_p(lambda g: g["A"].T.mxv(g["x"]).new(), "A.T.mxv(x)", _gb_dense)},
        (Spelling("A as CSC", adapt=_csc("A")),
         Spelling("pre-transposed At[j,i] (CSR)", "y[j] = At[j,i] * x[i]", _transposed("A", "At")))),
    OffProgram(
        "AT-SpMM", "transposed CSR", "uniform", "C[j,k] = A[i,j] * X[i,k]",
        lambda a, r, g: {"A": a, "X": _dense(g, a.shape[0], r)},
        {"scipy": _p(lambda o: o["A"].T @ o["X"], "A.T @ X"),
         "torch": _torch_p(lambda t: t["A"].t() @ t["X"], "A_csr.t() @ X"),
         "graphblas": _gb_p(lambda g: g["A"].T.mxm(g["X"]).new(), "A.T.mxm(X)")},
        (Spelling("A as CSC", adapt=_csc("A")),
         Spelling("pre-transposed At[j,i] (CSR)", "C[j,k] = At[j,i] * X[i,k]", _transposed("A", "At")))),
    OffProgram(
        "AT-sum", "transposed SpMMs summed", "uniform", "C[j,k] = sum(i, A[i,j] * X[i,k]) + sum(i, W[i,j] * G[i,k])",
        lambda a, r, g: {"A": a, "W": _on_pattern(a, g.random(a.nnz)), "X": _dense(g, a.shape[0], r),
                         "G": _dense(g, a.shape[0], r)},
        {"scipy": _p(lambda o: o["A"].T @ o["X"] + o["W"].T @ o["G"], "A.T @ X + W.T @ G"),
         "torch": _torch_p(lambda t: t["A"].t() @ t["X"] + t["W"].t() @ t["G"], "A_csr.t() @ X + W_csr.t() @ G"),
         "graphblas": _gb_p(lambda g: g["A"].T.mxm(g["X"]).new().ewise_add(g["W"].T.mxm(g["G"]).new()).new(),
                            "A.T.mxm(X) ewise_add W.T.mxm(G)")},
        (Spelling("one reduction", "C[j,k] = sum(i, A[i,j] * X[i,k] + W[i,j] * G[i,k])"),
         Spelling("A and W as CSC", adapt=_csc("A", "W")))),
    OffProgram(
        "SpMM-sum", "SpMMs summed", "uniform", "Y[i,k] = A[i,j] * X[j,k] + W[i,j] * Z[j,k]",
        lambda a, r, g: {"A": a, "W": _on_pattern(a, g.random(a.nnz)), "X": _dense(g, a.shape[1], r),
                         "Z": _dense(g, a.shape[1], r)},
        {"scipy": _p(lambda o: o["A"] @ o["X"] + o["W"] @ o["Z"], "A @ X + W @ Z"),
         "torch": _torch_p(lambda t: t["A"] @ t["X"] + t["W"] @ t["Z"], "A_csr @ X + W_csr @ Z"),
         "graphblas": _gb_p(lambda g: g["A"].mxm(g["X"]).new().ewise_add(g["W"].mxm(g["Z"]).new()).new(),
                            "A.mxm(X) ewise_add W.mxm(Z)")},
        (Spelling("explicit sums", "Y[i,k] = sum(j, A[i,j] * X[j,k]) + sum(j, W[i,j] * Z[j,k])"),
         Spelling("W in its own index arrays", adapt=lambda o: dict(o, W=o["W"].copy())))),
    OffProgram(
        "AT-A", "transposed CSR", "uniform", "C[j,k] = A[i,j] * A[i,k]", lambda a, r, g: {"A": a},
        {"scipy": _p(lambda o: o["A"].T @ o["A"], "A.T @ A"),
         "graphblas": _gb_p(lambda g: g["A"].T.mxm(g["A"]).new(), "A.T.mxm(A)")},
        (Spelling("pre-transposed At[j,i] (CSR)", "C[j,k] = At[j,i] * A[i,k]",
                  lambda o: dict(_transposed("A", "At")(o), A=o["A"])),)),
    OffProgram(
        "SpGEMM-ABt", "transposed CSR", "uniform", "C[i,k] = A[i,j] * B[k,j]",
        lambda a, r, g: {"A": a, "B": suite.uniform_matrix(*a.shape, max(1, a.nnz // a.shape[0]),
                                                           int(g.integers(2 ** 31)))},
        {"scipy": _p(lambda o: o["A"] @ o["B"].T, "A @ B.T"),
         "graphblas": _gb_p(lambda g: g["A"].mxm(g["B"].T).new(), "A.mxm(B.T)")},
        (Spelling("pre-transposed Bt[j,k] (CSR)", "C[i,k] = A[i,j] * Bt[j,k]", _transposed("B", "Bt")),
         Spelling("B as CSC", adapt=_csc("B")))),
    # --- CSC operands
    OffProgram(
        "CSC-SpMV", "CSC operand", "uniform", "y[i] = A[i,j] * x[j]",
        lambda a, r, g: {"A": a.tocsc(), "x": _dense(g, a.shape[1])},
        {"scipy": _p(lambda o: o["A"] @ o["x"], "A_csc @ x"),
         "torch": _torch_p(lambda t: t["A"] @ t["x"], "A_csc @ x"),
         "graphblas": _gb_p(lambda g: g["A"].mxv(g["x"]).new(), "A.mxv(x)", _gb_dense)},
        (Spelling("A as CSR", adapt=lambda o: dict(o, A=o["A"].tocsr())),)),
    OffProgram(
        "CSC-SpMM", "CSC operand", "uniform", "C[i,k] = A[i,j] * B[j,k]",
        lambda a, r, g: {"A": a.tocsc(), "B": _dense(g, a.shape[1], r)},
        {"scipy": _p(lambda o: o["A"] @ o["B"], "A_csc @ B"),
         "torch": _torch_p(lambda t: t["A"] @ t["B"], "A_csc @ B"),
         "graphblas": _gb_p(lambda g: g["A"].mxm(g["B"]).new(), "A.mxm(B)")},
        (Spelling("A as CSR", adapt=lambda o: dict(o, A=o["A"].tocsr())),)),
    OffProgram(
        "CSC-SpMM-powerlaw", "CSC operand", "powerlaw", "C[i,k] = A[i,j] * B[j,k]",
        lambda a, r, g: {"A": a.tocsc(), "B": _dense(g, a.shape[1], r)},
        {"scipy": _p(lambda o: o["A"] @ o["B"], "A_csc @ B"),
         "torch": _torch_p(lambda t: t["A"] @ t["B"], "A_csc @ B")},
        (Spelling("A as CSR", adapt=lambda o: dict(o, A=o["A"].tocsr())),)),
    # --- vectors, scalars, activations
    OffProgram(
        "SpMV+b", "SpMV plus a vector", "uniform", "y[i] = A[i,j] * x[j] + b[i]",
        lambda a, r, g: {"A": a, "x": _dense(g, a.shape[1]), "b": _dense(g, a.shape[0])},
        {"scipy": _p(lambda o: o["A"] @ o["x"] + o["b"], "A @ x + b"),
         "torch": _torch_p(lambda t: _torch().addmv(t["b"], t["A"], t["x"]), "torch.addmv(b, A_csr, x)")},
        (Spelling("bias first", "y[i] = b[i] + A[i,j] * x[j]"),)),
    OffProgram(
        "alpha-SpMV", "scalar factor", "uniform", "y[i] = 2.5 * A[i,j] * x[j]", _a_vec(),
        {"scipy": _p(lambda o: 2.5 * (o["A"] @ o["x"]), "2.5 * (A @ x)"),
         "torch": _torch_p(lambda t: 2.5 * (t["A"] @ t["x"]), "2.5 * (A_csr @ x)")},
        (Spelling("scalar last", "y[i] = A[i,j] * x[j] * 2.5"),)),
    OffProgram(
        "relu-SpMM", "activation after SpMM", "uniform", "C[i,k] = relu(A[i,j] * B[j,k])",
        lambda a, r, g: {"A": a, "B": _dense(g, a.shape[1], r, center=True)},
        {"scipy": _p(lambda o: np.maximum(o["A"] @ o["B"], 0.0), "np.maximum(A @ B, 0)"),
         "torch": _torch_p(lambda t: _torch().relu(t["A"] @ t["B"]), "torch.relu(A_csr @ B)")},
        (Spelling("factors swapped", "C[i,k] = relu(B[j,k] * A[i,j])"),)),
    # --- sampled products
    OffProgram(
        "exp-SDDMM", "exp of a sampled product", "uniform",
        "A[i,j] = where(B[i,j], exp(B[i,j] * (C[i,k] * D[k,j])), 0)", _sddmm_ops,
        {"numpy": _p(lambda s: _np_sddmm(s, lambda b, d: np.exp(b * d)),
                     "exp(B.data * rowwise dot(C[rows], D.T[cols])) on B's pattern, blocks", _with_rows),
         "torch": _torch_p(lambda t: _torch_csr_like(t["B"], _torch().exp(
             t["B"].values() * _torch_sampled(t["B"], t["C"], t["D"]).values())),
             "exp(B.values * sampled_addmm(B, C, D, beta=0).values)")},
        (Spelling("factors swapped", "A[i,j] = where(B[i,j], exp((D[k,j] * C[i,k]) * B[i,j]), 0)"),)),
    OffProgram(
        "mask-exp-SDDMM", "exp of a sampled product", "uniform", "A[i,j] = B[i,j] * exp(C[i,k] * D[k,j])",
        _sddmm_ops,
        {"numpy": _p(lambda s: _np_sddmm(s, lambda b, d: b * np.exp(d)),
                     "B.data * exp(rowwise dot(C[rows], D.T[cols])), blocks", _with_rows),
         # GraphBLAS left out: its masked dense x dense mxm took 3 s at 5000 rows (it forms C·D whole)
         "torch": _torch_p(lambda t: _torch_csr_like(t["B"], t["B"].values() * _torch().exp(
             _torch_sampled(t["B"], t["C"], t["D"]).values())), "B.values * exp(sampled_addmm(...).values)")},
        (Spelling("mask last", "A[i,j] = exp(C[i,k] * D[k,j]) * B[i,j]"),)),
    OffProgram(
        "attention-scale", "attention division by a constant", "uniform",
        "A[i,j] = B[i,j] * (Q[i,k] * K[j,k]) / 8.0",
        lambda a, r, g: {"B": a, "Q": _dense(g, a.shape[0], r), "K": _dense(g, a.shape[1], r)},
        {"numpy": _p(lambda s: _on_pattern(s["B"], s["B"].data * _sampled_dots(
            s["rows"], s["B"].indices, s["Q"], s["K"]) / 8.0), "B.data * dot(Q[rows], K[cols]) / 8, blocks",
            _with_rows),
         "torch": _torch_p(lambda t: _torch_csr_like(t["B"], t["B"].values() * _torch_sampled(
             t["B"], t["Q"], t["K"].T).values() / 8.0), "B.values * sampled_addmm(B, Q, K.T).values / 8")},
        (Spelling("scale first", "A[i,j] = 0.125 * B[i,j] * (Q[i,k] * K[j,k])"),
         Spelling("divide the dot", "A[i,j] = B[i,j] * (Q[i,k] * K[j,k] / 8.0)"))),
    OffProgram(
        "sparse-attention", "attention layer", "uniform", ATTENTION, _attention_ops,
        {"numpy": _p(_np_attention, "sampled dots, maximum.reduceat, exp, (E @ V) / E.sum(1), blocks", _with_rows),
         "torch": _torch_p(_torch_attention, "sampled_addmm, scatter_reduce amax, exp, CSR @ V / index_add_ sums")},
        (Spelling("keys, values transposed", ATTENTION.replace("K[j,k]", "Kt[k,j]").replace("V[j,h]", "Vt[h,j]"),
                  lambda o: {**{n: v for n, v in o.items() if n not in ("K", "V")},
                             "Kt": np.ascontiguousarray(o["K"].T), "Vt": np.ascontiguousarray(o["V"].T)}),)),
    OffProgram(
        "MF-gradient", "operands on one pattern", "uniform", MF_GRADIENT, _mf_ops,
        {"numpy": _p(lambda s: _on_pattern(s["R"], s["W"].data * (s["R"].data - _sampled_dots(
            s["rows"], s["R"].indices, s["U"], s["V"]))) @ s["V"],
            "E = W.data * (R.data - dot(U[rows], V[cols])), then csr(E) @ V, blocks", _with_rows),
         "torch": _torch_p(lambda t: _torch_csr_like(t["R"], t["W"].values() * _torch().sparse.sampled_addmm(
             t["R"], t["U"], t["V"].T, beta=1.0, alpha=-1.0).values()) @ t["V"],
             "W.values * sampled_addmm(R, U, V.T, alpha=-1).values, then CSR @ V")},
        (Spelling("the residual first", "E[i,j] = R[i,j] - W[i,j] / W[i,j] * (U[i,k] * V[j,k]); "
                  "G[i,k] = W[i,j] * E[i,j] * V[j,k]"),)),
    OffProgram(
        "SDDMM-bias", "SDDMM with a bias", "uniform", "A[i,j] = B[i,j] * (C[i,k] * D[k,j] + e[j])",
        lambda a, r, g: dict(_sddmm_ops(a, r, g), e=_dense(g, a.shape[1])),
        {"numpy": _p(lambda s: _on_pattern(s["B"], s["B"].data * (_sampled_dots(
            s["rows"], s["B"].indices, s["C"], np.ascontiguousarray(s["D"].T)) + s["e"][s["B"].indices])),
            "B.data * (dot(C[rows], D.T[cols]) + e[cols]), blocks", _with_rows)},
        (Spelling("bias first", "A[i,j] = B[i,j] * (e[j] + C[i,k] * D[k,j])"),)),
    OffProgram(
        "SDDMM-Dt-view", "dense mode order", "uniform", "A[i,j] = B[i,j] * (C[i,k] * D[k,j])",
        lambda a, r, g: {"B": a, "C": _dense(g, a.shape[0], r), "D": _dense(g, a.shape[1], r).T},
        {"numpy": _p(lambda s: _on_pattern(s["B"], s["B"].data * _sampled_dots(
            s["rows"], s["B"].indices, s["C"], s["D"].T)), "B.data * dot(C[rows], D.T[cols]) (D.T contiguous)",
            _with_rows),
         "torch": _torch_p(lambda t: _torch_csr_like(t["B"], t["B"].values() * _torch_sampled(
             t["B"], t["C"], t["D"]).values()), "B.values * sampled_addmm(B, C, D).values")},
        (Spelling("D copied C-contiguous", adapt=lambda o: dict(o, D=np.ascontiguousarray(o["D"]))),
         Spelling("Dt[j,k] (the contiguous array)", "A[i,j] = B[i,j] * (C[i,k] * Dt[j,k])",
                  _renamed("D", "Dt", lambda v: v.T)))),
    OffProgram(
        "SpMM-Fortran", "dense mode order", "uniform", "C[i,k] = A[i,j] * B[j,k]",
        lambda a, r, g: {"A": a, "B": np.asfortranarray(_dense(g, a.shape[1], r))},
        {"scipy": _p(lambda o: o["A"] @ o["B"], "A @ B (B Fortran-ordered)"),
         "torch": _torch_p(lambda t: t["A"] @ t["B"], "A_csr @ B (column-major strides)")},
        (Spelling("B C-contiguous", adapt=lambda o: dict(o, B=np.ascontiguousarray(o["B"]))),
         Spelling("Bt[k,j] (the C-contiguous transpose)", "C[i,k] = A[i,j] * Bt[k,j]",
                  _renamed("B", "Bt", lambda v: v.T)))),
    # --- GNN layers
    OffProgram(
        "GNN-2-Yt", "GNN-2 with Yt", "uniform", "Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Yt[h,j]",
        lambda a, r, g: _with_transpose({"A": a, "X": _dense(g, a.shape[0], r), "Y": _dense(g, r, a.shape[1])},
                                        "Y", "Yt"),
        {"numpy": _p(lambda s: _on_pattern(s["A"], s["A"].data * _sampled_dots(
            s["rows"], s["A"].indices, s["X"], s["Yt"])) @ s["Yt"], "(A.data * dot(X[rows], Yt[cols])) @ Yt",
            _with_rows),
         "torch": _torch_p(lambda t: _torch_csr_like(t["A"], t["A"].values() * _torch_sampled(
             t["A"], t["X"], t["Y"]).values()) @ t["Yt"], "(A * sampled_addmm(A, X, Y)) @ Yt")},
        (Spelling("catalogue GNN-2 (Y twice)", "Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]",
                  lambda o: {k: v for k, v in o.items() if k != "Yt"}),
         Spelling("Yt the view Y.T", adapt=lambda o: dict(o, Yt=o["Y"].T)))),
    OffProgram(
        "GCN", "GCN layer", "uniform", "Z[i,j] = relu(A[i,k] * (X[k,h] * W[h,j]) + b[j])",
        lambda a, r, g: {"A": a, "X": _dense(g, a.shape[1], r), "W": _dense(g, r, r, center=True),
                         "b": _dense(g, r, center=True)},
        {"scipy": _p(lambda o: np.maximum(o["A"] @ (o["X"] @ o["W"]) + o["b"], 0.0),
                     "np.maximum(A @ (X @ W) + b, 0)"),
         "torch": _torch_p(lambda t: _torch().relu(t["A"] @ (t["X"] @ t["W"]) + t["b"]),
                           "torch.relu(A_csr @ (X @ W) + b)")},
        (Spelling("flat product, bias first", "Z[i,j] = relu(b[j] + A[i,k] * X[k,h] * W[h,j])"),)),
    OffProgram(
        "GNN-1-reordered", "factor order", "uniform", "Z[i,j] = W[h,j] * X[k,h] * A[i,k]",
        lambda a, r, g: {"A": a, "X": _dense(g, a.shape[1], r), "W": _dense(g, r, r)},
        {"scipy": _p(lambda o: o["A"] @ (o["X"] @ o["W"]), "A @ (X @ W)"),
         "torch": _torch_p(lambda t: t["A"] @ (t["X"] @ t["W"]), "A_csr @ (X @ W)")},
        (Spelling("catalogue order", "Z[i,j] = A[i,k] * X[k,h] * W[h,j]"),)),
    OffProgram(
        "SpMM-reordered", "factor order", "powerlaw", "C[i,k] = B[j,k] * A[i,j]",
        lambda a, r, g: {"A": a, "B": _dense(g, a.shape[1], r)},
        {"scipy": _p(lambda o: o["A"] @ o["B"], "A @ B"),
         "torch": _torch_p(lambda t: t["A"] @ t["B"], "A_csr @ B")},
        (Spelling("catalogue order", "C[i,k] = A[i,j] * B[j,k]"),)),
    # --- scalings and element-wise products of sparse operands
    OffProgram(
        "sym-norm", "D^-1/2 A D^-1/2", "powerlaw", "N[i,j] = d[i] * A[i,j] * d[j]",
        lambda a, r, g: {"A": a, "d": _dense(g, a.shape[0], positive=True)},
        {"scipy": _p(_scipy_sym_norm, "D @ A @ D with D = sp.diags_array(d)"),
         "numpy": _p(lambda s: _on_pattern(s["A"], s["A"].data * s["d"][s["rows"]] * s["d"][s["A"].indices]),
                     "A.data * d[rows] * d[cols] on A's pattern", _with_rows)},
        (Spelling("matrix first", "N[i,j] = A[i,j] * d[i] * d[j]"),)),
    OffProgram(
        "ewise-mul", "element-wise product", "uniform", "C[i,j] = A[i,j] * B[i,j]",
        lambda a, r, g: {"A": a, "B": _second_matrix(a, g)},
        {"scipy": _p(lambda o: o["A"].multiply(o["B"]), "A.multiply(B)"),
         "torch": _torch_p(lambda t: t["A"] * t["B"], "A_csr * B_csr"),
         "graphblas": _gb_p(lambda g: g["A"].ewise_mult(g["B"]).new(), "A.ewise_mult(B)")},
        (Spelling("operands swapped", "C[i,j] = B[i,j] * A[i,j]"),)),
    OffProgram(
        "weighted-sum", "weighted sum", "uniform", "C[i,j] = 2.0 * A[i,j] + 0.5 * B[i,j]",
        lambda a, r, g: {"A": a, "B": _second_matrix(a, g)},
        {"scipy": _p(lambda o: 2.0 * o["A"] + 0.5 * o["B"], "2.0 * A + 0.5 * B"),
         "torch": _torch_p(lambda t: 2.0 * t["A"] + 0.5 * t["B"], "2.0 * A_csr + 0.5 * B_csr"),
         "graphblas": _gb_p(lambda g: (2.0 * g["A"]).new().ewise_add((0.5 * g["B"]).new()).new(),
                            "(2*A).ewise_add(0.5*B)")},
        (Spelling("terms swapped", "C[i,j] = 0.5 * B[i,j] + 2.0 * A[i,j]"),
         Spelling("scalars last", "C[i,j] = A[i,j] * 2.0 + B[i,j] * 0.5"))),
    OffProgram(
        "pattern-softmax", "softmax on the pattern, short rows", "powerlaw", PATTERN_SOFTMAX,
        lambda a, r, g: {"A": a},
        {"numpy": _p(_np_pattern_softmax, "maximum.reduceat, exp, add.reduceat over the rows", _with_rows),
         "torch": _torch_p(_torch_pattern_softmax, "scatter_reduce amax, exp, index_add_ sums, on CSR")},
        (Spelling("where", PATTERN_SOFTMAX.replace("A[i,j] / A[i,j] * exp(A[i,j] - m[i])",
                                                   "where(A[i,j], exp(A[i,j] - m[i]), 0.0)")),)),
    # --- reductions
    OffProgram(
        "row-sums", "row sums", "powerlaw", "y[i] = A[i,j]", lambda a, r, g: {"A": a},
        {"scipy": _p(lambda o: o["A"].sum(axis=1), "A.sum(axis=1)"),
         "graphblas": _gb_p(lambda g: g["A"].reduce_rowwise().new(), "A.reduce_rowwise()", _gb_dense)},
        (Spelling("explicit sum", "y[i] = sum(j, A[i,j])"),)),
    OffProgram(
        "col-sums", "column sums", "powerlaw", "y[j] = A[i,j]", lambda a, r, g: {"A": a},
        {"scipy": _p(lambda o: o["A"].sum(axis=0), "A.sum(axis=0)"),
         "graphblas": _gb_p(lambda g: g["A"].reduce_columnwise().new(), "A.reduce_columnwise()", _gb_dense)},
        (Spelling("A as CSC", adapt=_csc("A")),
         Spelling("pre-transposed At[j,i] (CSR)", "y[j] = At[j,i]", _transposed("A", "At")))),
    OffProgram(
        "row-max", "row maxima", "uniform", "y[i] = max(j, A[i,j])", lambda a, r, g: {"A": a},
        {"scipy": _p(lambda o: o["A"].max(axis=1), "A.max(axis=1)", finish=lambda m: m.toarray())},
        (Spelling("A as CSC", adapt=_csc("A")),)),
    OffProgram(
        "inner-product", "inner product", "uniform", "s = A[i,j] * B[i,j]",
        lambda a, r, g: {"A": a, "B": _second_matrix(a, g)},
        {"scipy": _p(lambda o: o["A"].multiply(o["B"]).sum(), "A.multiply(B).sum()"),
         "graphblas": _gb_p(lambda g: g["A"].ewise_mult(g["B"]).new().reduce_scalar().new(),
                            "A.ewise_mult(B).reduce_scalar()", _gb_scalar)},
        (Spelling("operands swapped", "s = B[i,j] * A[i,j]"),
         Spelling("B as CSC", adapt=_csc("B")))),
    OffProgram(
        "quadratic-form", "quadratic form", "uniform", "s = x[i] * A[i,j] * x[j]", _a_vec(),
        {"scipy": _p(lambda o: o["x"] @ (o["A"] @ o["x"]), "x @ (A @ x)"),
         "torch": _torch_p(lambda t: t["x"] @ (t["A"] @ t["x"]), "x @ (A_csr @ x)", lambda r: float(r)),
         "graphblas": _gb_p(lambda g: g["x"].inner(g["A"].mxv(g["x"]).new()).new(), "x.inner(A.mxv(x))",
                            _gb_scalar)},
        (Spelling("matrix first", "s = A[i,j] * x[i] * x[j]"),
         Spelling("A as CSC", adapt=_csc("A")))),
    # --- masked products
    OffProgram(
        "masked-SpGEMM", "masked SpGEMM", "uniform", "C[i,k] = M[i,k] * (A[i,j] * B[j,k])",
        lambda a, r, g: {"M": _second_matrix(a, g), "A": a,
                         "B": suite.uniform_matrix(*a.shape, max(1, a.nnz // a.shape[0]), int(g.integers(2 ** 31)))},
        {"scipy": _p(lambda o: o["M"].multiply(o["A"] @ o["B"]), "M.multiply(A @ B)"),
         "graphblas": _gb_p(lambda g: g["M"].ewise_mult(g["A"].mxm(g["B"]).new(mask=g["M"].S)).new(),
                            "M.ewise_mult(A.mxm(B, mask=M.S))")},
        (Spelling("mask last", "C[i,k] = A[i,j] * B[j,k] * M[i,k]"),
         Spelling("B as CSC", adapt=_csc("B")))),
    # --- tensors: other modes, other mode orders, 4-D
    OffProgram(
        "TTV-mode1", "tensor middle mode", "tensor3", "A[i,k] = X[i,j,k] * c[j]",
        _tensor_ops(vectors=[("c", 1)]),
        {"numpy": _p(lambda s: _vector_contract(s, (0, 2), {1: s["c"]}), "csr_array((v * c[j], (i, k)))",
                     _sorted_coords("X", (0, 2)))},
        (Spelling("X in mode order (0,2,1)", adapt=_modes("X", (0, 2, 1))),
         Spelling("vector first", "A[i,k] = c[j] * X[i,j,k]"))),
    OffProgram(
        "MTTKRP-mode1", "tensor middle mode", "tensor3", "A[j,r] = X[i,j,k] * C[i,r] * D[k,r]",
        _tensor_ops(("C", 0), ("D", 2)),
        {"numpy": _p(lambda s: _factor_rows_sum(s, 1, {0: s["C"], 2: s["D"]}),
                     "v * C[i] * D[k] summed over j-sorted entries (add.reduceat), blocks",
                     _sorted_coords("X", (1,)))},
        (Spelling("X in mode order (1,0,2)", adapt=_modes("X", (1, 0, 2))),
         Spelling("factors first", "A[j,r] = D[k,r] * C[i,r] * X[i,j,k]"))),
    OffProgram(
        "MTTKRP-mode2", "tensor inner mode", "tensor3", "A[k,r] = X[i,j,k] * C[i,r] * D[j,r]",
        _tensor_ops(("C", 0), ("D", 1)),
        {"numpy": _p(lambda s: _factor_rows_sum(s, 2, {0: s["C"], 1: s["D"]}),
                     "v * C[i] * D[j] summed over k-sorted entries (add.reduceat), blocks",
                     _sorted_coords("X", (2,)))},
        (Spelling("X in mode order (2,0,1)", adapt=_modes("X", (2, 0, 1))),)),
    OffProgram(
        "MTTKRP-csf102", "sparse mode order", "tensor3", "A[i,r] = X[i,j,k] * C[j,r] * D[k,r]",
        lambda x, r, g: dict(_tensor_ops(("C", 1), ("D", 2))(x, r, g), X=x.asformat(Format.csf((1, 0, 2)))),
        {"numpy": _p(lambda s: _factor_rows_sum(s, 0, {1: s["C"], 2: s["D"]}),
                     "v * C[j] * D[k] summed over i-sorted entries, blocks", _sorted_coords("X", (0,)))},
        (Spelling("X in mode order (0,1,2)", adapt=_modes("X", (0, 1, 2))),)),
    OffProgram(
        "TTV-4D", "4-D tensor", "tensor4", "A[i,j] = X[i,j,k,l] * c[k] * d[l]",
        _tensor_ops(vectors=[("c", 2), ("d", 3)]),
        {"numpy": _p(lambda s: _vector_contract(s, (0, 1), {2: s["c"], 3: s["d"]}),
                     "csr_array((v * c[k] * d[l], (i, j)))", _sorted_coords("X", (0, 1)))},
        (Spelling("vectors first", "A[i,j] = c[k] * d[l] * X[i,j,k,l]"),)),
    OffProgram(
        "MTTKRP-4D", "4-D tensor", "tensor4", "A[i,r] = X[i,j,k,l] * B[j,r] * C[k,r] * D[l,r]",
        _tensor_ops(("B", 1), ("C", 2), ("D", 3)),
        {"numpy": _p(lambda s: _factor_rows_sum(s, 0, {1: s["B"], 2: s["C"], 3: s["D"]}),
                     "v * B[j] * C[k] * D[l] summed over i-sorted entries, blocks", _sorted_coords("X", (0,)))},
        (Spelling("X in mode order (1,0,2,3)", adapt=_modes("X", (1, 0, 2, 3))),)),
]
PROGRAMS_BY_NAME = {p.name: p for p in PROGRAMS}


def select_programs(spec: str | None) -> list[OffProgram]:
    """Programs named in a comma-separated ``spec`` (case-insensitive); all when ``None``.

    >>> [p.name for p in select_programs("at-spmv, GCN")]
    ['AT-SpMV', 'GCN']
    """
    return suite.select_by_name(spec, PROGRAMS_BY_NAME, "off-catalogue program")


def make_inputs(size: OffSize, which: Sequence[str] = ("uniform", "powerlaw", "tensor3", "tensor4"),
                seed: int = 0) -> dict:
    """The seeded inputs ``which`` at ``size``: ``{"uniform"|"powerlaw"|"tensor3"|"tensor4": Input}``.

    >>> sorted(make_inputs(SIZES["tiny"], ["tensor4"])["tensor4"].value.shape)
    [8, 9, 10, 12]
    """
    n, r = size.n, size.row_nnz
    makers = {
        "uniform": lambda: suite.Input(f"uniform-{n}", "synthetic", suite.uniform_matrix(n, n, r, seed), seed),
        "powerlaw": lambda: suite.Input(f"powerlaw-{n}", "synthetic", suite.powerlaw_matrix(n, n, r, seed + 1),
                                        seed + 1),
        "tensor3": lambda: suite.Input("tensor-" + "x".join(map(str, size.tensor_shape)), "synthetic",
                                       suite.random_tensor(size.tensor_shape, size.tensor_nnz, seed + 2), seed + 2),
        "tensor4": lambda: suite.Input("tensor-" + "x".join(map(str, size.tensor4_shape)), "synthetic",
                                       suite.random_tensor(size.tensor4_shape, size.tensor4_nnz, seed + 3),
                                       seed + 3),
    }
    unknown = sorted(set(which) - set(makers))
    if unknown:
        raise ValueError(f"unknown input kind(s) {unknown}; known: {sorted(makers)}")
    return {w: makers[w]() for w in dict.fromkeys(which)}
