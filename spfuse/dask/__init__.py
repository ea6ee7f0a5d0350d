"""spfuse on Dask: the same programs over dask arrays of sparse row blocks.

Needs the optional extra ``dask`` (``dask[array]`` and ``distributed``).
One idea per module:

* :mod:`spfuse.dask.partition` -- sparse operands as dask arrays of CSR row
  blocks / :class:`spfuse.Tensor` slabs, nnz-balanced, with block metadata;
* :mod:`spfuse.dask.classify` -- which indices are distributed, local or
  contracted-and-distributed (no dask involved);
* :mod:`spfuse.dask.blocks` -- what one task runs: the single-node kernel on a block;
* :mod:`spfuse.dask.combine` -- adding partials (dense add, n-way SpAdd);
* :mod:`spfuse.dask.kernel` -- planning on the client and building the graph;
* :mod:`spfuse.dask.cost` -- the communication cost model and its projection;
* :mod:`spfuse.dask.placement` -- tasks pinned where the cost model places them;
* :mod:`spfuse.dask.registrations` -- ``sizeof``, tokenize, concatenate for Dask.

>>> import numpy as np, scipy.sparse as sp, spfuse, spfuse.dask
>>> B = sp.random_array((60, 50), density=0.1, format="csr", rng=1)
>>> C, D = np.ones((60, 4)), np.ones((4, 50))
>>> dB = spfuse.dask.from_scipy(B, chunks=4)
>>> A = spfuse.dask.evaluate("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", B=dB, C=C, D=D)
>>> ref = spfuse.evaluate("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", B=B, C=C, D=D)
>>> bool(abs(A.compute(scheduler="sync") - ref).max() == 0)
True
"""
from __future__ import annotations

from spfuse.dask import registrations  # noqa: F401  (registers sizeof/tokenize/concatenate)
from spfuse.dask.cost import (
    CommCost,
    FactorChoice,
    Network,
    cost,
    measured_transfers,
    placement_of,
    project,
    transfer_marks,
)
from spfuse.dask.kernel import DaskKernel, compile, evaluate
from spfuse.dask.partition import (
                                   balanced_boundaries,
                                   block_info,
                                   from_mtx,
                                   from_npz,
                                   from_scipy,
                                   from_tensor,
)

__all__ = ["evaluate", "compile", "DaskKernel", "from_scipy", "from_tensor", "from_mtx", "from_npz",
           "balanced_boundaries", "block_info", "cost", "project", "measured_transfers", "CommCost",
           "transfer_marks", "placement_of", "Network", "FactorChoice"]
