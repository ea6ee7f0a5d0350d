"""The benchmark suite: kernels (design.md section 4), sizes and inputs.

An *input* is one sparse matrix or one sparse 3-tensor; every kernel of the
matching kind builds its operands from it (dense factors of rank ``size.rank``
drawn from a seeded generator), so all peers see exactly the same numbers.

>>> [k.name for k in KERNELS][:4]
['SpMV', 'SpMM', 'SDDMM', 'SpGEMM']
>>> inp = synthetic_inputs(SIZES["tiny"])[0]
>>> sorted(KERNELS_BY_NAME["SpMV"].operands(inp, SIZES["tiny"]))
['A', 'x']
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp

import spfuse

__all__ = ["Size", "SIZES", "Input", "BenchKernel", "KERNELS", "KERNELS_BY_NAME", "select_kernels", "select_by_name",
           "synthetic_inputs", "builtin_inputs", "data_dir_inputs", "uniform_matrix", "powerlaw_matrix",
           "random_tensor"]


@dataclasses.dataclass(frozen=True)
class Size:
    """Extents of the synthetic inputs and the time budget at one size."""

    name: str
    n: int                    #: rows = columns of the synthetic matrices
    row_nnz: int              #: mean stored entries per row
    rank: int                 #: extent of every dense factor dimension
    tensor_shape: tuple       #: shape of the synthetic 3-tensor
    tensor_nnz: int
    builtins: tuple           #: names of shipped real inputs used at this size
    repeat: int               #: timed calls per variant (median reported)
    call_budget: float        #: a variant whose single call takes longer is not timed
    max_dense_bytes: int      #: peers needing a larger dense temporary are skipped
    case_budget: float        #: seconds of timed rounds per case and thread count (fewer rounds if over)


SIZES = {
    "tiny": Size("tiny", 300, 4, 8, (30, 25, 20), 1500, (), 3, 1.0, 1 << 26, 0.5),
    "small": Size("small", 2000, 8, 16, (120, 100, 80), 20_000, ("west0479", "nations"), 5, 0.5, 1 << 28, 0.6),
    "medium": Size("medium", 20_000, 16, 32, (600, 500, 400), 300_000,
                   ("karate", "GD97_b", "west0479", "1138_bus", "nations"), 7, 5.0, 1 << 30, 10.0),
    "large": Size("large", 200_000, 16, 64, (3000, 2500, 2000), 3_000_000,
                  ("karate", "GD97_b", "west0479", "1138_bus", "nations"), 9, 30.0, 1 << 32, 60.0),
}


@dataclasses.dataclass
class Input:
    """One benchmark input: a scipy CSR matrix or an :class:`spfuse.Tensor` of order 3."""

    name: str
    section: str              #: "synthetic", "builtin" or "data"
    value: Any
    seed: int = 0

    @property
    def kind(self) -> str:
        """``"matrix"`` or ``"tensor"``."""
        return "tensor" if isinstance(self.value, spfuse.Tensor) else "matrix"

    def describe(self) -> str:
        """``name (shape, nnz)`` for reports."""
        v = self.value
        nnz = v.nnz
        return f"{self.name} {'x'.join(map(str, v.shape))} nnz={nnz}"


# ----------------------------------------------------------------------------- generators

def uniform_matrix(n: int, m: int, row_nnz: int, seed: int) -> sp.csr_array:
    """A seeded ``n x m`` CSR matrix with uniformly placed entries, ``row_nnz`` per row on average."""
    rng = np.random.default_rng(seed)
    density = min(1.0, row_nnz / m)
    a = sp.random_array((n, m), density=density, format="csr", rng=rng, dtype=np.float64)
    a.sort_indices()
    return a


def powerlaw_matrix(n: int, m: int, row_nnz: int, seed: int, sigma: float = 1.6) -> sp.csr_array:
    """A seeded CSR matrix whose row lengths follow a lognormal (heavy-tailed) law.

    The mean row length is ``row_nnz``; a few rows are hundreds of times
    longer than the median, like the degree sequence of a social graph.
    """
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(0.0, sigma, n)
    lengths = np.minimum(np.rint(raw * (row_nnz * n / raw.sum())).astype(np.int64), m)
    rows = np.repeat(np.arange(n), lengths)
    cols = rng.integers(0, m, rows.size)
    a = sp.csr_array((rng.random(rows.size), (rows, cols)), shape=(n, m))
    a.sum_duplicates()
    a.sort_indices()
    return a


def random_tensor(shape: tuple, nnz: int, seed: int) -> spfuse.Tensor:
    """A seeded sparse tensor (of any order: ``len(shape)``) in CSF with about ``nnz`` uniformly placed entries."""
    rng = np.random.default_rng(seed)
    coords = np.stack([rng.integers(0, s, nnz) for s in shape])
    return spfuse.Tensor.from_coo(coords, rng.random(nnz), shape, format="csf")


def synthetic_inputs(size: Size, seed: int = 0) -> list[Input]:
    """Uniform and power-law matrices and one random 3-tensor at ``size``."""
    n, r = size.n, size.row_nnz
    return [Input(f"uniform-{n}", "synthetic", uniform_matrix(n, n, r, seed), seed),
            Input(f"powerlaw-{n}", "synthetic", powerlaw_matrix(n, n, r, seed + 1), seed + 1),
            Input("tensor-" + "x".join(map(str, size.tensor_shape)), "synthetic",
                  random_tensor(size.tensor_shape, size.tensor_nnz, seed + 2), seed + 2)]


def _as_input(name: str, section: str, t: spfuse.Tensor) -> Input | None:
    if t.ndim == 2:
        m = t.to_scipy("sparray").tocsr().astype(np.float64)
        m.sum_duplicates()
        m.sort_indices()
        return Input(name, section, m)
    if t.ndim == 3:
        return Input(name, section, t.asformat("csf").astype(np.float64))
    return None


def builtin_inputs(size: Size) -> list[Input]:
    """The shipped real inputs (``spfuse.io.load_builtin``) chosen for ``size``."""
    known = set(spfuse.io.builtin_names())
    out = []
    for name in size.builtins:
        if name in known:
            inp = _as_input(name, "builtin", spfuse.io.load_builtin(name))
            if inp is not None:
                out.append(inp)
    return out


def data_dir_inputs(path: str) -> tuple[list[Input], list[str]]:
    """Every ``.mtx``/``.tns``/``.mat`` 2-D or 3-D input under ``path`` (recursively).

    Returns the inputs and a list of notes about files that were left out.
    """
    inputs, notes = [], []
    for root, _, files in sorted(os.walk(path)):
        for f in sorted(files):
            if not f.endswith((".mtx", ".tns", ".mat")):
                continue
            full = os.path.join(root, f)
            try:
                inp = _as_input(os.path.splitext(f)[0], "data", spfuse.io.read(full))
            except Exception as e:  # a bad file is a note, not a crash
                notes.append(f"{full}: not read ({type(e).__name__}: {e})")
                continue
            if inp is None:
                notes.append(f"{full}: neither a matrix nor a 3-tensor, skipped")
            else:
                inputs.append(inp)
    return inputs, notes


# ----------------------------------------------------------------------------- kernels

@dataclasses.dataclass(frozen=True)
class BenchKernel:
    """One kernel of the suite: its program and how to build operands from an input."""

    name: str
    program: str
    kind: str                                  #: "matrix" or "tensor"
    build: Callable[[Any, int, np.random.Generator], dict]
    note: str = ""

    def operands(self, inp: Input, size: Size) -> dict:
        """The operands (scipy CSR / numpy / spfuse.Tensor) for ``inp``, seeded by input and kernel."""
        seed = (inp.seed * 1000 + sum(map(ord, self.name))) % (2 ** 32)
        return self.build(inp.value, size.rank, np.random.default_rng(seed))


def _dense(rng, *shape, positive=False):
    a = rng.random(shape)
    return a + 0.5 if positive else a


def _spadd(a, r, rng):
    ops = {}
    for k in range(1, 8):
        perm = rng.permutation(a.shape[0])
        b = a[perm].tocsr()
        b.sort_indices()
        ops[f"B{k}"] = b
    return ops


def _spgemm_rhs(a):
    if a.shape[0] == a.shape[1]:
        return a
    b = a.T.tocsr()
    b.sort_indices()
    return b


KERNELS = [
    BenchKernel("SpMV", "y[i] = A[i,j] * x[j]", "matrix",
                lambda a, r, g: {"A": a, "x": _dense(g, a.shape[1])}),
    BenchKernel("SpMM", "C[i,k] = A[i,j] * B[j,k]", "matrix",
                lambda a, r, g: {"A": a, "B": _dense(g, a.shape[1], r)}),
    BenchKernel("SDDMM", "A[i,j] = B[i,j] * (C[i,k] * D[k,j])", "matrix",
                lambda a, r, g: {"B": a, "C": _dense(g, a.shape[0], r), "D": _dense(g, r, a.shape[1])}),
    BenchKernel("SpGEMM", "C[i,k] = A[i,j] * B[j,k]", "matrix",
                lambda a, r, g: {"A": a, "B": _spgemm_rhs(a)}, note="A·A (A·Aᵀ when A is not square)"),
    BenchKernel("SpAdd-7", "A[i,j] = " + " + ".join(f"B{k}[i,j]" for k in range(1, 8)), "matrix", _spadd,
                note="B1..B7 are row permutations of the input"),
    BenchKernel("TTV", "A[i,j] = X[i,j,k] * c[k]", "tensor",
                lambda x, r, g: {"X": x, "c": _dense(g, x.shape[2])}),
    BenchKernel("MTTKRP", "A[i,r] = X[i,j,k] * C[j,r] * D[k,r]", "tensor",
                lambda x, r, g: {"X": x, "C": _dense(g, x.shape[1], r), "D": _dense(g, x.shape[2], r)}),
    BenchKernel("GNN-1", "Z[i,j] = A[i,k] * X[k,h] * W[h,j]", "matrix",
                lambda a, r, g: {"A": a, "X": _dense(g, a.shape[1], r), "W": _dense(g, r, r)}),
    BenchKernel("GNN-2", "Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]", "matrix",
                lambda a, r, g: {"A": a, "X": _dense(g, a.shape[0], r), "Y": _dense(g, r, a.shape[1])}),
    BenchKernel("SDDMM-SpMM", "A[i,l] = B[i,j] * C[i,k] * D[j,k] * E[j,l]", "matrix",
                lambda a, r, g: {"B": a, "C": _dense(g, a.shape[0], r), "D": _dense(g, a.shape[1], r),
                                 "E": _dense(g, a.shape[1], r)}),
    BenchKernel("SpMM-GEMM", "A[i,l] = B[i,j] * C[j,k] * D[k,l]", "matrix",
                lambda a, r, g: {"B": a, "C": _dense(g, a.shape[1], r), "D": _dense(g, r, r)}),
    BenchKernel("SDDMM-SpMM-GEMM", "A[i,m] = B[i,j] * C[i,k] * D[j,k] * F[j,l] * W[l,m]", "matrix",
                lambda a, r, g: {"B": a, "C": _dense(g, a.shape[0], r), "D": _dense(g, a.shape[1], r),
                                 "F": _dense(g, a.shape[1], r), "W": _dense(g, r, r)}),
    BenchKernel("MTTKRP-GEMM", "A[i,m] = B[i,k,l] * C[l,j] * D[k,j] * E[j,m]", "tensor",
                lambda x, r, g: {"B": x, "C": _dense(g, x.shape[2], r), "D": _dense(g, x.shape[1], r),
                                 "E": _dense(g, r, r)}),
    BenchKernel("SpTTM-SpTTM", "A[i,j,m] = B[i,j,k] * C[k,l] * D[l,m]", "tensor",
                lambda x, r, g: {"B": x, "C": _dense(g, x.shape[2], r), "D": _dense(g, r, r)}),
    BenchKernel("SDDMM-div", "A[i,j] = B[i,j] / (C[i,k] * D[k,j])", "matrix",
                lambda a, r, g: {"B": a, "C": _dense(g, a.shape[0], r, positive=True),
                                 "D": _dense(g, r, a.shape[1], positive=True)}),
]
KERNELS_BY_NAME = {k.name: k for k in KERNELS}


def select_by_name(spec: str | None, by_name: dict, what: str = "kernel") -> list:
    """Entries of ``by_name`` named in a comma-separated ``spec`` (case-insensitive); all when ``None``.

    >>> select_by_name("b, A", {"A": 1, "B": 2})
    [2, 1]
    """
    if not spec:
        return list(by_name.values())
    lower = {k.lower(): k for k in by_name}
    out = []
    for name in (s.strip() for s in spec.split(",") if s.strip()):
        if name.lower() not in lower:
            raise ValueError(f"unknown {what} {name!r}; known: {', '.join(by_name)}")
        out.append(by_name[lower[name.lower()]])
    return out


def select_kernels(spec: str | None) -> list[BenchKernel]:
    """Kernels named in a comma-separated ``spec`` (case-insensitive); all when ``None``.

    >>> [k.name for k in select_kernels("spmv,SDDMM")]
    ['SpMV', 'SDDMM']
    """
    return select_by_name(spec, KERNELS_BY_NAME)
