"""Peers: how each library a user might pick instead expresses each kernel.

A :class:`Peer` maps kernel names to an :class:`Impl`: ``prepare`` converts
the shared operands into the library's own objects (not timed), ``run`` is
the timed call, ``finish`` turns its raw result into something
:func:`spfuse.bench.compare.to_comparable` understands (not timed).  A kernel
missing from ``impls`` is one the library cannot express; ``prepare`` raises
:class:`Skip` when it could, but not at this input (e.g. a dense temporary
larger than the size's budget).

Peers whose module is not importable are reported and left out; nothing
here imports an optional library at module import time.

>>> names = [p.name for p in all_peers()]
>>> names[:4]
['spfuse', 'spfuse[max]', 'spfuse[none]', 'scipy']
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import re
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import scipy.sparse as sp

import spfuse

__all__ = ["Skip", "Impl", "Peer", "Context", "all_peers", "available_peers", "blas_limits"]


class Skip(Exception):
    """The peer can express the kernel, but not for this input (the message says why)."""


@dataclasses.dataclass
class Context:
    """What ``prepare`` may need besides the operands."""

    program: str
    max_dense_bytes: int


@dataclasses.dataclass
class Impl:
    """One peer's formulation of one kernel."""

    prepare: Callable[[dict, Context], Any]
    run: Callable[[Any], Any]
    finish: Callable[[Any], Any] = lambda raw: raw
    how: str = ""                     #: one line: how the kernel is expressed


@dataclasses.dataclass
class Peer:
    """A library (or a spfuse strategy) with its kernel formulations."""

    name: str
    version: str
    impls: dict
    threads: Callable[[int], AbstractContextManager] = lambda n: contextlib.nullcontext()
    threads_note: str = ""
    is_spfuse: bool = False
    fusion: str | None = None      #: the fusion strategy of a spfuse peer


def _try_import(name: str):
    try:
        return importlib.import_module(name)
    except Exception:  # ImportError, or a broken install
        return None


@contextlib.contextmanager
def blas_limits(n: int):
    """Limit BLAS/OpenMP pools of numpy/scipy to ``n`` threads when threadpoolctl is installed."""
    tpc = _try_import("threadpoolctl")
    if tpc is None:
        yield
        return
    with tpc.threadpool_limits(limits=n):
        yield


def _guard(ctx: Context, nbytes: int, what: str) -> None:
    if nbytes > ctx.max_dense_bytes:
        raise Skip(f"dense {what} would take {nbytes / 2**20:.0f} MiB (> {ctx.max_dense_bytes / 2**20:.0f} MiB)")


def _rows_of(a: sp.csr_array) -> np.ndarray:
    return np.repeat(np.arange(a.shape[0]), np.diff(a.indptr))


def _unfold(x: spfuse.Tensor) -> sp.csr_array:
    """A 3-tensor as the CSR matrix ``(I*J, K)``."""
    i, j, k = x.coords
    rows = i.astype(np.int64) * x.shape[1] + j
    m = sp.csr_array((x.values, (rows, k)), shape=(x.shape[0] * x.shape[1], x.shape[2]))
    m.sort_indices()
    return m


def _ops(f: Callable[[dict], Any]) -> Callable[[dict, Context], Any]:
    return lambda o, ctx: f(o)


_IDENT = lambda o, ctx: o  # noqa: E731


# ----------------------------------------------------------------------------- spfuse

def _spfuse_peer(fusion: str) -> Peer:
    def prepare(o, ctx):
        return spfuse.compile(ctx.program, fusion=fusion), o

    def run(state):
        kernel, o = state
        return kernel(**o)

    impl = Impl(prepare, run, how=f"spfuse.compile(program, fusion={fusion!r})(**operands)")
    from spfuse.bench.suite import KERNELS
    name = "spfuse" if fusion == "auto" else f"spfuse[{fusion}]"
    return Peer(name, spfuse.__version__, {k.name: impl for k in KERNELS},
                threads=spfuse.threads, threads_note="OpenMP prange, spfuse.threads(n)", is_spfuse=True,
                fusion=fusion)


# ----------------------------------------------------------------------------- scipy, one call per op

def _scipy_sddmm(o, ctx):
    _guard(ctx, 8 * o["B"].shape[0] * o["B"].shape[1], "C@D")
    return o


def _scipy_ttv(o, ctx):
    x = o["X"]
    _guard(ctx, 8 * x.shape[0] * x.shape[1], "X·c")
    return dict(o, Xu=_unfold(x), shape=x.shape)


def _scipy_mttkrp(name):
    def prepare(o, ctx):
        x = o[name]
        r = o["D"].shape[1] if name == "X" else o["C"].shape[1]
        _guard(ctx, 8 * x.shape[0] * x.shape[1] * r, "unfolded product")
        return dict(o, Xu=_unfold(x), shape=x.shape)
    return prepare


def _scipy_mttkrp_run(s):
    i, j, _ = s["shape"]
    t = (s["Xu"] @ s["D"]).reshape(i, j, -1)
    return np.einsum("ijr,jr->ir", t, s["C"])


def _scipy_mttkrp_gemm_run(s):
    # A[i,m] = B[i,k,l] C[l,j] D[k,j] E[j,m]: unfold (i,k) x l, then reduce k, then GEMM
    i, k, _ = s["shape"]
    t = (s["Xu"] @ s["C"]).reshape(i, k, -1)
    return np.einsum("ikr,kr->ir", t, s["D"]) @ s["E"]


def _scipy_spttm_run(s):
    i, j, _ = s["shape"]
    return ((s["Xu"] @ s["C"]) @ s["D"]).reshape(i, j, -1)


def _scipy_impls() -> dict:
    add7 = lambda o: functools.reduce(lambda a, b: a + b, (o[f"B{k}"] for k in range(1, 8)))  # noqa: E731
    return {
        "SpMV": Impl(_IDENT, lambda o: o["A"] @ o["x"], how="A @ x"),
        "SpMM": Impl(_IDENT, lambda o: o["A"] @ o["B"], how="A @ B"),
        "SDDMM": Impl(_scipy_sddmm, lambda o: o["B"].multiply(o["C"] @ o["D"]), how="B.multiply(C @ D)"),
        "SpGEMM": Impl(_IDENT, lambda o: o["A"] @ o["B"], how="A @ B"),
        "SpAdd-7": Impl(_IDENT, add7, how="B1 + B2 + ... + B7"),
        "TTV": Impl(_scipy_ttv, lambda s: (s["Xu"] @ s["c"]).reshape(s["shape"][:2]),
                    how="unfold X to (IJ,K) CSR; (Xu @ c).reshape"),
        "MTTKRP": Impl(_scipy_mttkrp("X"), _scipy_mttkrp_run,
                       how="(Xu @ D).reshape(I,J,R), einsum with C"),
        "GNN-1": Impl(_IDENT, lambda o: (o["A"] @ o["X"]) @ o["W"], how="(A @ X) @ W"),
        "GNN-2": Impl(lambda o, ctx: (_guard(ctx, 8 * o["A"].shape[0] * o["A"].shape[1], "X@Y"), o)[1],
                      lambda o: o["A"].multiply(o["X"] @ o["Y"]) @ o["Y"].T, how="A.multiply(X @ Y) @ Y.T"),
        "SDDMM-SpMM": Impl(_scipy_sddmm, lambda o: o["B"].multiply(o["C"] @ o["D"].T) @ o["E"],
                           how="B.multiply(C @ D.T) @ E"),
        "SpMM-GEMM": Impl(_IDENT, lambda o: (o["B"] @ o["C"]) @ o["D"], how="(B @ C) @ D"),
        "SDDMM-SpMM-GEMM": Impl(_scipy_sddmm, lambda o: (o["B"].multiply(o["C"] @ o["D"].T) @ o["F"]) @ o["W"],
                                how="(B.multiply(C @ D.T) @ F) @ W"),
        "MTTKRP-GEMM": Impl(_scipy_mttkrp("B"), _scipy_mttkrp_gemm_run,
                            how="(Bu @ C).reshape, einsum with D, @ E"),
        "SpTTM-SpTTM": Impl(_scipy_mttkrp("B"), _scipy_spttm_run, how="((Bu @ C) @ D).reshape(I,J,M)"),
        "SDDMM-div": Impl(_scipy_sddmm, lambda o: o["B"].multiply(1.0 / (o["C"] @ o["D"])),
                          how="B.multiply(1 / (C @ D))"),
    }


# ----------------------------------------------------------------------------- best vectorised numpy/scipy

def _sampled(b, left, right_t, div=False):
    """Values of ``B ∘ (left @ right_t.T)`` on B's pattern by row/column gathers."""
    dots = np.einsum("nk,nk->n", left[_rows_of(b)], right_t[b.indices])
    vals = b.data / dots if div else b.data * dots
    return sp.csr_array((vals, b.indices, b.indptr), shape=b.shape)


def _coords(name):
    def prepare(o, ctx):
        x = o[name]
        i, j, k = (c.astype(np.intp) for c in x.coords)
        return dict(o, i=i, j=j, k=k, v=x.values, shape=x.shape)
    return prepare


def _segment_sum(keys, p, nrows):
    """Rows of ``p`` summed by sorted ``keys`` into an ``(nrows, ...)`` array."""
    out = np.zeros((nrows,) + p.shape[1:])
    if keys.size:
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        out[keys[starts]] = np.add.reduceat(p, starts, axis=0)
    return out


def _np_ttv(s):
    vals = s["v"] * s["c"][s["k"]]
    return sp.csr_array((vals, (s["i"], s["j"])), shape=s["shape"][:2])


def _np_mttkrp(s):
    p = s["v"][:, None] * s["C"][s["j"]] * s["D"][s["k"]]
    return _segment_sum(s["i"], p, s["shape"][0])


def _np_mttkrp_gemm(s):
    # B[i,k,l]: coords (i, j=k, k=l) in this dict's naming
    p = s["v"][:, None] * s["C"][s["k"]] * s["D"][s["j"]]
    return _segment_sum(s["i"], p, s["shape"][0]) @ s["E"]


def _np_spttm(s):
    key = s["i"] * s["shape"][1] + s["j"]
    p = s["v"][:, None] * (s["C"] @ s["D"])[s["k"]]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else key
    return key[starts], np.add.reduceat(p, starts, axis=0) if key.size else p, s["shape"]


def _np_spttm_finish(raw):
    rows, vals, shape = raw
    m = vals.shape[1]
    r = np.repeat(rows, m)
    c = np.tile(np.arange(m), rows.size)
    return sp.csr_array((vals.ravel(), (r, c)), shape=(shape[0] * shape[1], m))


def _np_add7(o):
    bs = [o[f"B{k}"] for k in range(1, 8)]
    rows = np.concatenate([_rows_of(b) for b in bs])
    cols = np.concatenate([b.indices for b in bs])
    return sp.csr_array((np.concatenate([b.data for b in bs]), (rows, cols)), shape=bs[0].shape)


def _numpy_impls() -> dict:
    return {
        "SDDMM": Impl(_IDENT, lambda o: _sampled(o["B"], o["C"], o["D"].T),
                      how="B.data * einsum(C[rows], D.T[cols]) on B's pattern"),
        "SDDMM-div": Impl(_IDENT, lambda o: _sampled(o["B"], o["C"], o["D"].T, div=True),
                          how="B.data / einsum(C[rows], D.T[cols])"),
        "SpAdd-7": Impl(_IDENT, _np_add7, how="concatenate COO triplets, one CSR build (sums duplicates)"),
        "TTV": Impl(_coords("X"), _np_ttv, how="v * c[k] summed into CSR by (i, j)"),
        "MTTKRP": Impl(_coords("X"), _np_mttkrp, how="v * C[j] * D[k], add.reduceat over i"),
        "GNN-1": Impl(_IDENT, lambda o: o["A"] @ (o["X"] @ o["W"]), how="A @ (X @ W)"),
        "GNN-2": Impl(_IDENT, lambda o: _sampled(o["A"], o["X"], o["Y"].T) @ o["Y"].T,
                      how="sampled A∘(X@Y) by gathers, then @ Y.T"),
        "SDDMM-SpMM": Impl(_IDENT, lambda o: _sampled(o["B"], o["C"], o["D"]) @ o["E"],
                           how="sampled B∘(C@D.T) by gathers, then @ E"),
        "SpMM-GEMM": Impl(_IDENT, lambda o: o["B"] @ (o["C"] @ o["D"]), how="B @ (C @ D)"),
        "SDDMM-SpMM-GEMM": Impl(_IDENT, lambda o: _sampled(o["B"], o["C"], o["D"]) @ (o["F"] @ o["W"]),
                                how="sampled SDDMM, then @ (F @ W)"),
        "MTTKRP-GEMM": Impl(_coords("B"), _np_mttkrp_gemm, how="v * C[l] * D[k], add.reduceat over i, @ E"),
        "SpTTM-SpTTM": Impl(_coords("B"), _np_spttm, _np_spttm_finish,
                            how="v * (C@D)[k], add.reduceat over (i,j) fibers"),
    }


# ----------------------------------------------------------------------------- python-graphblas

def _graphblas_impls(gb) -> dict:
    def conv(o, ctx):
        out = {}
        for n, v in o.items():
            if sp.issparse(v):
                out[n] = gb.io.from_scipy_sparse(v)
            elif isinstance(v, spfuse.Tensor):
                out[n] = gb.io.from_scipy_sparse(_unfold(v))
                out["shape"] = v.shape
            elif np.ndim(v) == 1:
                out[n] = gb.Vector.from_dense(v)
            else:
                out[n] = gb.Matrix.from_dense(np.ascontiguousarray(v))
        return out

    def sampled(b, left, right, op=gb.binary.times):
        t = left.mxm(right).new(mask=b.S)
        return b.ewise_mult(t, op).new()

    def add7(g):
        acc = g["B1"]
        for k in range(2, 8):
            acc = acc.ewise_add(g[f"B{k}"]).new()
        return acc

    def ttv_finish(raw):
        return raw.to_dense(fill_value=0.0)

    return {
        "SpMV": Impl(conv, lambda g: g["A"].mxv(g["x"]).new(), how="A.mxv(x)"),
        "SpMM": Impl(conv, lambda g: g["A"].mxm(g["B"]).new(), how="A.mxm(B)"),
        "SDDMM": Impl(conv, lambda g: sampled(g["B"], g["C"], g["D"]),
                      how="C.mxm(D).new(mask=B.S), B.ewise_mult(T)"),
        "SpGEMM": Impl(conv, lambda g: g["A"].mxm(g["B"]).new(), how="A.mxm(B)"),
        "SpAdd-7": Impl(conv, add7, how="6 x ewise_add"),
        "TTV": Impl(conv, lambda g: g["X"].mxv(g["c"]).new(), ttv_finish, how="unfolded X (IJ,K) .mxv(c)"),
        "GNN-1": Impl(conv, lambda g: g["A"].mxm(g["X"].mxm(g["W"]).new()).new(), how="A.mxm(X.mxm(W))"),
        "GNN-2": Impl(conv, lambda g: sampled(g["A"], g["X"], g["Y"]).mxm(g["Y"].T).new(),
                      how="masked X.mxm(Y) on A.S, ewise_mult, .mxm(Y.T)"),
        "SDDMM-SpMM": Impl(conv, lambda g: sampled(g["B"], g["C"], g["D"].T).mxm(g["E"]).new(),
                           how="masked C.mxm(D.T), ewise_mult, .mxm(E)"),
        "SpMM-GEMM": Impl(conv, lambda g: g["B"].mxm(g["C"].mxm(g["D"]).new()).new(), how="B.mxm(C.mxm(D))"),
        "SDDMM-SpMM-GEMM": Impl(conv, lambda g: sampled(g["B"], g["C"], g["D"].T).mxm(
            g["F"].mxm(g["W"]).new()).new(), how="masked SDDMM, .mxm(F.mxm(W))"),
        "SpTTM-SpTTM": Impl(conv, lambda g: g["B"].mxm(g["C"].mxm(g["D"]).new()).new(),
                            how="unfolded B (IJ,K) .mxm(C.mxm(D))"),
        "SDDMM-div": Impl(conv, lambda g: sampled(g["B"], g["C"], g["D"], gb.binary.truediv),
                          how="masked C.mxm(D), B.ewise_mult(T, truediv)"),
    }


@contextlib.contextmanager
def _gb_threads(gb, n):
    old = gb.ss.config["nthreads"]
    gb.ss.config["nthreads"] = n
    try:
        yield
    finally:
        gb.ss.config["nthreads"] = old


# ----------------------------------------------------------------------------- torch CPU sparse

def _torch_impls(torch) -> dict:
    def csr(indptr, indices, data, shape):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "beta state", "invariant checks disabled"
            return torch.sparse_csr_tensor(indptr, indices, data, shape)

    def conv(o, ctx):
        out = {}
        for n, v in o.items():
            if sp.issparse(v):
                out[n] = csr(torch.from_numpy(v.indptr.astype(np.int64)),
                                                 torch.from_numpy(v.indices.astype(np.int64)),
                                                 torch.from_numpy(v.data), v.shape)
            elif isinstance(v, spfuse.Tensor):
                u = _unfold(v)
                out[n] = csr(torch.from_numpy(u.indptr.astype(np.int64)),
                                                 torch.from_numpy(u.indices.astype(np.int64)),
                                                 torch.from_numpy(u.data), u.shape)
                out["shape"] = v.shape
            else:
                out[n] = torch.from_numpy(np.ascontiguousarray(v))
        return out

    def sampled(b, left, right, div=False):
        r = torch.sparse.sampled_addmm(b, left, right, beta=0.0)
        vals = b.values() / r.values() if div else b.values() * r.values()
        return csr(b.crow_indices(), b.col_indices(), vals, b.shape)

    def spttm(t):
        i, j, _ = t["shape"]
        return (t["B"] @ (t["C"] @ t["D"])).reshape(i, j, -1)

    add7 = lambda t: functools.reduce(lambda a, b: a + b, (t[f"B{k}"] for k in range(1, 8)))  # noqa: E731
    return {
        "SpMV": Impl(conv, lambda t: t["A"] @ t["x"], how="A_csr @ x"),
        "SpMM": Impl(conv, lambda t: t["A"] @ t["B"], how="A_csr @ B"),
        "SDDMM": Impl(conv, lambda t: sampled(t["B"], t["C"], t["D"]),
                      how="sparse.sampled_addmm(B, C, D, beta=0); values * B.values"),
        "SpGEMM": Impl(conv, lambda t: t["A"] @ t["B"], how="A_csr @ B_csr"),
        "SpAdd-7": Impl(conv, add7, how="B1 + ... + B7 (CSR)"),
        "TTV": Impl(conv, lambda t: (t["X"] @ t["c"]).reshape(t["shape"][:2]), how="unfolded X_csr @ c"),
        "GNN-1": Impl(conv, lambda t: t["A"] @ (t["X"] @ t["W"]), how="A_csr @ (X @ W)"),
        "GNN-2": Impl(conv, lambda t: sampled(t["A"], t["X"], t["Y"]) @ t["Y"].T,
                      how="sampled_addmm(A, X, Y) * A, @ Y.T"),
        "SDDMM-SpMM": Impl(conv, lambda t: sampled(t["B"], t["C"], t["D"].T) @ t["E"],
                           how="sampled_addmm(B, C, D.T) * B, @ E"),
        "SpMM-GEMM": Impl(conv, lambda t: t["B"] @ (t["C"] @ t["D"]), how="B_csr @ (C @ D)"),
        "SDDMM-SpMM-GEMM": Impl(conv, lambda t: sampled(t["B"], t["C"], t["D"].T) @ (t["F"] @ t["W"]),
                                how="sampled SDDMM, @ (F @ W)"),
        "SpTTM-SpTTM": Impl(conv, spttm, how="unfolded B_csr @ (C @ D)"),
        "SDDMM-div": Impl(conv, lambda t: sampled(t["B"], t["C"], t["D"], div=True),
                          how="sampled_addmm; B.values / values"),
    }


@contextlib.contextmanager
def _torch_threads(torch, n):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ----------------------------------------------------------------------------- pydata sparse

_ACCESS = re.compile(r"(\w+)\[([\w,\s]*)\]")


def einsum_subscripts(program: str) -> tuple[str, list[str]]:
    """The einsum subscripts and operand names of a one-statement product program.

    >>> einsum_subscripts("A[i,j] = B[i,j] * (C[i,k] * D[k,j])")
    ('ij,ik,kj->ij', ['B', 'C', 'D'])
    """
    target, rhs = program.split("=", 1)
    out = "".join(_ACCESS.search(target).group(2).replace(" ", "").split(","))
    names, subs = [], []
    for m in _ACCESS.finditer(rhs):
        names.append(m.group(1))
        subs.append("".join(m.group(2).replace(" ", "").split(",")))
    return ",".join(subs) + "->" + out, names


def pairwise_steps(subscripts: str) -> list[str]:
    """Left-to-right two-operand einsum steps for a product, keeping only indices still needed.

    >>> pairwise_steps("ij,ik,kj->ij")
    ['ij,ik->ijk', 'ijk,kj->ij']
    """
    ins, out = subscripts.split("->")
    ops = ins.split(",")
    acc, steps = ops[0], []
    for n, nxt in enumerate(ops[1:], start=1):
        later = set(out).union(*ops[n + 1:])
        keep = "".join(dict.fromkeys(c for c in acc + nxt if c in later))
        steps.append(f"{acc},{nxt}->{keep}")
        acc = keep
    if len(ops) == 1:
        steps.append(f"{acc}->{out}")
    elif acc != out:
        steps[-1] = steps[-1].split("->")[0] + "->" + out
    return steps


def _sparse_impls(sparse) -> dict:
    from spfuse.bench.suite import KERNELS

    def conv(o, ctx):
        out = {}
        for n, v in o.items():
            if sp.issparse(v):
                out[n] = sparse.COO.from_scipy_sparse(v)
            elif isinstance(v, spfuse.Tensor):
                out[n] = sparse.COO(v.coords.astype(np.intp), v.values, shape=v.shape)
            else:
                out[n] = v
        subs, names = einsum_subscripts(ctx.program)
        return pairwise_steps(subs), [out[n] for n in names], out

    def run(s):
        steps, ops, _ = s
        acc = ops[0]
        for step, nxt in zip(steps, ops[1:], strict=True):
            acc = sparse.einsum(step, acc, nxt)
        return acc

    impls = {}
    for k in KERNELS:
        if "/" in k.program:
            continue  # einsum cannot divide by a reduction
        if "+" in k.program:
            impls[k.name] = Impl(conv, lambda s: functools.reduce(lambda a, b: a + b, s[1]),
                                 how="B1 + ... + B7 (COO)")
        else:
            steps = pairwise_steps(einsum_subscripts(k.program)[0])
            impls[k.name] = Impl(conv, run, how="sparse.einsum pairwise on COO: " + "; ".join(steps))
    return impls


# ----------------------------------------------------------------------------- registry

def _version(mod) -> str:
    return str(getattr(mod, "__version__", "?"))


def all_peers() -> list[Peer]:
    """Every peer whose library imports now, spfuse strategies first."""
    peers = [_spfuse_peer("auto"), _spfuse_peer("max"), _spfuse_peer("none")]
    scipy = _try_import("scipy")
    peers.append(Peer("scipy", _version(scipy), _scipy_impls(), threads=blas_limits,
                      threads_note="scipy.sparse is single-threaded (dense BLAS parts may use threads)"))
    peers.append(Peer("numpy", np.__version__, _numpy_impls(), threads=blas_limits,
                      threads_note="single-threaded gathers/reductions (BLAS may thread)"))
    gb = _try_import("graphblas")
    if gb is not None:
        peers.append(Peer("graphblas", _version(gb), _graphblas_impls(gb), threads=lambda n: _gb_threads(gb, n),
                          threads_note='SuiteSparse:GraphBLAS, gb.ss.config["nthreads"]'))
    torch = _try_import("torch")
    if torch is not None:
        peers.append(Peer("torch", _version(torch), _torch_impls(torch),
                          threads=lambda n: _torch_threads(torch, n), threads_note="torch.set_num_threads(n)"))
    sparse = _try_import("sparse")
    if sparse is not None:
        peers.append(Peer("sparse", _version(sparse), _sparse_impls(sparse), threads=blas_limits,
                          threads_note="pydata sparse (numba), single-threaded"))
    return peers


OPTIONAL = ("graphblas", "torch", "sparse")


def available_peers(names: list[str] | None = None) -> tuple[list[Peer], list[str]]:
    """Peers to run (all, or those in ``names``) and notes on optional ones that are missing."""
    peers = all_peers()
    have = {p.name for p in peers}
    notes = [f"{m}: not installed, skipped" for m in OPTIONAL if m not in have]
    if names:
        unknown = [n for n in names if n not in have and n not in OPTIONAL]
        if unknown:
            raise ValueError(f"unknown peer(s) {', '.join(unknown)}; known: {', '.join(sorted(have))}")
        peers = [p for p in peers if p.name in names or p.name == "spfuse"]
    return peers, notes
