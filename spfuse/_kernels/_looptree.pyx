"""Generic loop-tree executor: interprets a lowered index tree under ``nogil``.

The plan is plain data built by :mod:`spfuse.runtime.looptree` (see its module
docstring for the encoding).  This module only turns the plan's numpy arrays
into a C struct of pointers (:class:`_Program`) and walks the preorder node
arrays recursively:

* LOOP nodes co-iterate one variable (DENSE range, INTERSECT of driver
  levels, UNION k-way merge) and locate every other level bound by it with a
  galloping search from a monotone cursor (O(m log(n/m)) per segment);
* STATEMENT nodes evaluate a postfix byte code on a fixed C stack and apply
  ``=``, ``+=``, ``max=`` or ``min=`` to a dense buffer, a pattern buffer, or
  append to a growable COO buffer;
* RESET nodes fill a buffer region with a constant.

Nothing in the interpreted loop takes the GIL or allocates (COO buffers grow
geometrically with ``realloc``).  A top-level loop flagged parallel by the
builder runs as contiguous static blocks, one per thread, with thread-private
copies of ``private`` buffers; COO emissions of the threads are appended in
thread (= iteration) order, so results are identical for any thread count.

Interruptible (see ``_interrupt.pxd``): every top-level loop runs in chunks
of consecutive iterations (serial or parallel alike), one ``nogil`` section
(one parallel region) per chunk, with ``PyErr_CheckSignals()`` between
chunks.  Chunks are sized by counted work -- ``Ctx.work`` adds the iterations
of every loop at every depth and the elements of every RESET -- not by time:
the first chunk is one iteration per thread, the next ones aim at
``spfuse_chunk_work / LT_UNIT`` units per thread from the work per iteration
measured so far (growing at most 8x per chunk).  A top-level UNION loop
(never parallel) is resumed from its merge cursors instead.  A chunk boundary
only changes where the COO emissions are appended (still in iteration order)
and where block mode flushes (bitwise the per-element results), so results
do not depend on the chunking.
"""
# The executor is written once (_looptree_impl.pxi) over the index type of
# the operands' pos/crd arrays; this module instantiates it for int64 and
# _looptree32 for int32 (scipy's default), so int32 operands are read as
# they are instead of being widened on every call.
from libc.stdint cimport int64_t
import numpy as np

ctypedef int64_t idx_t
INDEX_DTYPE = np.dtype(np.int64)
cimport numpy as cnp
cdef int INDEX_TYPENUM = cnp.NPY_INT64

include "_looptree_impl.pxi"
