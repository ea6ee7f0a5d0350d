"""The kernel table of design.md section 4, shared by IR and engine tests."""
import numpy as np
import scipy.sparse as sp

from spfuse.ir.ops import TensorInfo
from spfuse.tensor import Tensor

KERNELS = {
    "SpMV": "y[i] = A[i,j] * x[j]",
    "SpMM": "C[i,k] = A[i,j] * B[j,k]",
    "SDDMM": "A[i,j] = B[i,j] * (C[i,k] * D[k,j])",
    "SpGEMM": "C[i,k] = A[i,j] * B[j,k]",
    "SpAdd-7": "A[i,j] = B1[i,j] + B2[i,j] + B3[i,j] + B4[i,j] + B5[i,j] + B6[i,j] + B7[i,j]",
    "TTV": "A[i,j] = X[i,j,k] * c[k]",
    "MTTKRP": "A[i,r] = X[i,j,k] * C[j,r] * D[k,r]",
    "GNN-1": "Z[i,j] = A[i,k] * X[k,h] * W[h,j]",
    "GNN-2": "Z[i,j] = (A[i,h] * (X[i,k] * Y[k,h])) * Y[j,h]",
    "SDDMM-SpMM": "A[i,l] = B[i,j] * C[i,k] * D[j,k] * E[j,l]",
    "SpMM-GEMM": "A[i,l] = B[i,j] * C[j,k] * D[k,l]",
    "SDDMM-SpMM-GEMM": "A[i,m] = B[i,j] * C[i,k] * D[j,k] * F[j,l] * W[l,m]",
    "MTTKRP-GEMM": "A[i,m] = B[i,k,l] * C[l,j] * D[k,j] * E[j,m]",
    "SpTTM-SpTTM": "A[i,j,m] = B[i,j,k] * C[k,l] * D[l,m]",
    "SDDMM-div": "A[i,j] = B[i,j] / (C[i,k] * D[k,j])",
}

SPARSE = {  # which operands are sparse, and how
    "SpMV": {"A": "csr"}, "SpMM": {"A": "csr"}, "SDDMM": {"B": "csr"}, "SpGEMM": {"A": "csr", "B": "csr"},
    "SpAdd-7": {f"B{n}": "csr" for n in range(1, 8)}, "TTV": {"X": "csf"}, "MTTKRP": {"X": "csf"},
    "GNN-1": {"A": "csr"}, "GNN-2": {"A": "csr"}, "SDDMM-SpMM": {"B": "csr"}, "SpMM-GEMM": {"B": "csr"},
    "SDDMM-SpMM-GEMM": {"B": "csr"}, "MTTKRP-GEMM": {"B": "csf"}, "SpTTM-SpTTM": {"B": "csf"},
    "SDDMM-div": {"B": "csr"},
}


def operands(name, rng, n=12, r=4, density=0.3, dtype=np.float64):
    """Random operands for kernel ``name``: every index gets extent n (sparse
    modes) or r (dense feature modes), shapes consistent with the program."""
    from spfuse.frontend.parser import parse_program
    prog = parse_program(KERNELS[name])
    sparse = SPARSE[name]
    ext: dict[str, int] = {}
    for s in prog.statements:
        from spfuse.frontend.ast import iter_accesses
        for a in iter_accesses(s.value):
            for ix in a.indices:
                if a.name in sparse:
                    ext.setdefault(ix, n + len(ext))
    out = {}
    for s in prog.statements:
        from spfuse.frontend.ast import iter_accesses
        for a in iter_accesses(s.value):
            shape = tuple(ext.setdefault(ix, r + len(ext) % 3) for ix in a.indices)
            if a.name in out:
                continue
            fmt = sparse.get(a.name)
            if fmt == "csr":
                out[a.name] = sp.random_array(shape, density=density, format="csr", rng=rng, dtype=dtype)
            elif fmt == "csf":
                nnz = int(np.prod(shape) * density / 2) + 1
                coords = np.vstack([rng.integers(0, e, nnz) for e in shape])
                out[a.name] = Tensor.from_coo(coords, rng.random(nnz).astype(dtype), shape)
            else:
                out[a.name] = rng.random(shape).astype(dtype) + 0.5
    return out


def infos(name, n=100, r=16, nnz_per_row=5):
    """TensorInfo for planning-only tests (no data)."""
    ops = operands(name, np.random.default_rng(0), n=n, r=r, density=0.01)
    out = {}
    for k, v in ops.items():
        t = v if isinstance(v, Tensor) else Tensor.from_scipy(v) if sp.issparse(v) else Tensor.from_numpy(v)
        out[k] = TensorInfo(k, t.ndim, tuple(t.format.levels), tuple(t.format.mode_order), t.shape, nnz=t.nnz)
    return out


def assert_weighted_union(indptr, indices, data, mats, coef, m, n, dt, tolerance):
    """The CSR arrays equal sum(coef[t] * mats[t]) (numpy oracle) and store the
    union of the operands' patterns: cancellation zeros stay stored."""
    want = np.zeros((m, n))
    pattern = np.zeros((m, n), bool)
    for c, M in zip(coef, mats, strict=True):
        want += c * M.toarray().astype(dt).astype(np.float64)
        pattern |= M.toarray() != 0
    C = sp.csr_matrix((data, indices, indptr), shape=(m, n))
    np.testing.assert_allclose(C.toarray(), want, **tolerance)
    assert C.nnz == pattern.sum()
