"""Write every result of a fixed set of programs to an ``.npz`` (for test_isa.py).

``python isa_results.py OUT.npz`` runs the catalogue kernels, every
off-catalogue program in each of its spellings, and two gradients, at 1 and
2 threads, on seeded inputs with a rank of 13 (so vector loops have tails),
in whichever kernel build this process loaded; test_isa.py runs it once per
build and compares the files bitwise.
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np

import spfuse
from spfuse import _kernels
from spfuse.bench import offcatalog, suite


def _arrays(result) -> list[np.ndarray]:
    if isinstance(result, dict):
        return [a for k in sorted(result) for a in _arrays(result[k])]
    if hasattr(result, "indptr"):   # scipy sparse
        return [np.asarray(result.indptr), np.asarray(result.indices), np.asarray(result.data)]
    if isinstance(result, spfuse.Tensor):
        return [np.asarray(result.todense())]
    return [np.asarray(result)]


def main(path: str) -> None:
    out: dict[str, np.ndarray] = {"isa": np.array(_kernels.ISA)}
    size = dataclasses.replace(suite.SIZES["tiny"], rank=13)
    inputs = suite.synthetic_inputs(size)
    for kernel in suite.KERNELS:
        inp = next(i for i in inputs if i.kind == kernel.kind)
        ops = kernel.operands(inp, size)
        for nt in (1, 2):
            for k, a in enumerate(_arrays(spfuse.evaluate(kernel.program, **ops, num_threads=nt))):
                out[f"{kernel.name}/{nt}/{k}"] = a
    osize = dataclasses.replace(offcatalog.SIZES["tiny"], rank=13)
    inputs = offcatalog.make_inputs(osize)
    for prog in offcatalog.PROGRAMS:
        ops = prog.kernel.operands(inputs[prog.input], osize)
        for s in prog.spellings:
            for nt in (1, 2):
                result = spfuse.evaluate(s.program or prog.program, **s.adapt(ops), num_threads=nt)
                for k, a in enumerate(_arrays(result)):
                    out[f"{prog.name}/{s.label}/{nt}/{k}"] = a
    # gradients: the adjoint programs run on the same kernels.  Their way (one fused
    # program or statement by statement) is chosen by timing and the two ways round
    # differently: pinned to the first way, so both builds run the same kernels (a
    # loaded CI machine once chose differently in the two processes)
    from spfuse.autodiff.run import ExecutionChoice
    ExecutionChoice.MARGIN = 1.0
    rng = np.random.default_rng(7)
    A = suite.uniform_matrix(40, 30, 5, 3)
    C, D = rng.standard_normal((40, 13)), rng.standard_normal((13, 30))
    grads = spfuse.vjp("Z[i,j] = A[i,j] * C[i,k] * D[k,j]", A.multiply(1.0).tocsr(), wrt=("C", "D"),
                       A=A, C=C, D=D)
    for name, g in sorted(grads.items()):
        for k, a in enumerate(_arrays(g)):
            out[f"vjp/{name}/{k}"] = a
    np.savez(path, **out)


if __name__ == "__main__":
    main(sys.argv[1])
