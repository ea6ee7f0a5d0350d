# The one parallel skeleton of the template kernels (_csr_kernels,
# _csf_kernels): rows (or level-0 positions) cut into blocks balanced by
# work, run in interruptible chunks, a kernel's body called once per block.
#
# A kernel is then only its body, ``int body(ctx, block, r0, r1, values,
# indptr, indices)``: the rows' operand comes as typed pointers (CSR: data,
# indptr, indices; CSF: values, pos1, pos2), the rest of its arrays from a
# struct of its own (``ctx``); it takes its
# thread-private workspace from a ``Workspaces`` table in it (``ws_get``),
# runs rows ``[r0, r1)`` and returns 0, or -1 when that workspace could
# not be allocated (the skeleton raises ``MemoryError`` after the parallel
# region).  Interpretation is paid once per block, never per row or entry.
#
# Bodies are fused over the value and index types through those three
# pointers; ``body[floating, index_t]`` names one specialisation, passed
# here cast to ``block_body`` (every specialisation has the same arity and
# passes pointers where ``block_body`` does: the ABI the cast relies on).
#
# Work, chunks and blocks (see ``_interrupt.pxd``): a call estimates its
# work in units, ``num_chunks`` cuts the rows into chunks of about one
# chunk's work per thread, ``PyErr_CheckSignals()`` runs between chunks (GIL
# held: no worker touches the GIL), and each chunk is cut into blocks.  A
# row's arithmetic never depends on its chunk, block or thread, so results
# are bit-identical for any thread count and any chunking.
from cython.parallel cimport prange

from spfuse._kernels._interrupt cimport PyErr_CheckSignals, num_chunks
from spfuse._kernels._kernel_common cimport index_t

ctypedef int (*block_body)(const void* ctx, Py_ssize_t block, Py_ssize_t r0, Py_ssize_t r1,
                           const void* values, const void* indptr, const void* indices) noexcept nogil


cdef inline double cost(const index_t* ptr, const index_t* ptr2, Py_ssize_t r) noexcept nogil:
    """Work before row ``r``: ``ptr[r] + r`` (CSR: entries and rows), plus
    ``ptr2[ptr[r]]`` when rows own fibers of entries (CSF: slices, fibers and
    entries), each relative to row 0."""
    cdef double c = <double>(ptr[r] - ptr[0]) + <double>r
    if ptr2 != NULL:
        c += <double>(ptr2[ptr[r]] - ptr2[ptr[0]])
    return c


cdef inline Py_ssize_t split(const index_t* ptr, const index_t* ptr2, Py_ssize_t m, Py_ssize_t b,
                             Py_ssize_t nb) noexcept nogil:
    """First row of block ``b`` of ``nb`` blocks of rows ``[0, m)`` balanced by
    :func:`cost` (``ptr`` non-decreasing, ``m + 1`` entries).  Block ``b`` is
    ``[split(b), split(b + 1))``; blocks are disjoint and cover ``[0, m)``.
    O(log m)."""
    cdef Py_ssize_t lo, hi, mid
    cdef double target
    if b <= 0:
        return 0
    if b >= nb:
        return m
    target = cost(ptr, ptr2, m) * (<double>b / <double>nb)
    lo = 0
    hi = m
    while lo < hi:
        mid = (lo + hi) >> 1
        if cost(ptr, ptr2, mid) < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


cdef inline Py_ssize_t sub_split(const index_t* ptr, const index_t* ptr2, Py_ssize_t c0, Py_ssize_t c1,
                                 Py_ssize_t b, Py_ssize_t nb) noexcept nogil:
    """First row of block ``b`` of ``nb`` blocks of the rows ``[c0, c1)`` (as :func:`split`)."""
    return c0 + split(ptr + c0, ptr2, c1 - c0, b, nb)


cdef inline Py_ssize_t block_chunk(const index_t* ptr, const index_t* ptr2, Py_ssize_t m, Py_ssize_t b,
                                   Py_ssize_t nb, Py_ssize_t c, Py_ssize_t nch) noexcept nogil:
    """First row of chunk ``c`` of ``nch`` within fixed block ``b`` of ``nb``."""
    return sub_split(ptr, ptr2, split(ptr, ptr2, m, b, nb), split(ptr, ptr2, m, b + 1, nb), c, nch)


cdef inline Py_ssize_t num_blocks(Py_ssize_t m, int num_threads, int per_thread) noexcept nogil:
    """Blocks for ``m`` rows: ``per_thread`` per thread, one on one thread, at most ``m``."""
    cdef Py_ssize_t nb
    if m <= 0:
        return 0
    if num_threads <= 1:
        return 1
    nb = <Py_ssize_t>num_threads * per_thread
    return nb if nb < m else m


cdef enum BlockMode:
    # per chunk, ``per_thread`` blocks per thread of its rows, handed out
    # dynamically (a thread slowed by another process leaves its blocks to
    # its teammates)
    DYNAMIC_BLOCKS = 0
    # ``nb`` FIXED blocks whose partial results the caller keeps apart
    # (``spmv_t``, ``bilinear``, ``col_extremum``): each chunk runs every
    # block's share of it, so the blocks, never the chunks or the threads,
    # decide which rows a partial holds; handed out dynamically
    FIXED_BLOCKS = 1
    # FIXED_BLOCKS with block ``b`` on thread ``b mod num_threads`` in every
    # chunk (its partial stays in that core's cache)
    FIXED_BLOCKS_STATIC = 2
    # ``nb`` teammates, each over ALL the rows of every chunk and owning a
    # part of the output (``spmm_t``, ``mttkrp_mid``); one per thread, each
    # stays on its thread in every chunk (its part of the output in that
    # core's cache), else handed out dynamically
    TEAM = 3


cdef inline Py_ssize_t block_row(BlockMode mode, const index_t* ptr, const index_t* ptr2, Py_ssize_t m,
                               Py_ssize_t c0, Py_ssize_t c1, Py_ssize_t ch, Py_ssize_t nch, Py_ssize_t b,
                               Py_ssize_t nb, bint end) noexcept nogil:
    """The first row (``end``: one past the last) of block ``b`` of ``nb`` in
    chunk ``ch`` of ``nch``, whose rows are ``[c0, c1)``.  (Two scalars per
    block, never an array: an array written in a prange is shared by its
    threads.)"""
    if mode == TEAM:
        return c1 if end else c0
    if mode == DYNAMIC_BLOCKS:
        return sub_split(ptr, ptr2, c0, c1, b + end, nb)
    return block_chunk(ptr, ptr2, m, b, nb, ch + end, nch)


cdef inline int for_rows(str name, block_body body, const void* ctx, const void* values, const void* indptr,
                         const void* indices, const index_t* ptr, const index_t* ptr2, Py_ssize_t m, double work,
                         int num_threads, BlockMode mode, Py_ssize_t blocks, const Py_ssize_t* stop) except -1:
    """Run ``body`` over rows ``[0, m)`` chunk by chunk (``num_chunks(work)``),
    each chunk's rows in blocks as ``mode`` says (``blocks``: blocks per
    thread for DYNAMIC_BLOCKS, else the number of blocks), balanced by
    :func:`cost` of ``ptr`` (and ``ptr2``; NULL for CSR).  ``body`` gets
    ``values``, ``indptr`` and ``indices``: the rows' operand, typed as the
    body declares them (usually ``ptr`` is its indptr too).  Stops after the chunk in which
    ``stop[0]`` (if given) became >= 0: a bad index found.  Raises
    ``MemoryError`` naming ``name`` when a body could not get its
    workspace, and whatever a signal handler raises between chunks."""
    cdef Py_ssize_t nch = num_chunks(work, num_threads, m)
    cdef Py_ssize_t ch, b, c0 = 0, c1 = m, nb = blocks
    cdef int failed = 0
    if m <= 0:
        return 0
    for ch in range(nch):
        if ch > 0:
            PyErr_CheckSignals()
        if mode == DYNAMIC_BLOCKS or mode == TEAM:
            c0 = split(ptr, ptr2, m, ch, nch)
            c1 = split(ptr, ptr2, m, ch + 1, nch)
        if mode == DYNAMIC_BLOCKS:
            nb = num_blocks(c1 - c0, num_threads, <int>blocks)
        with nogil:
            if mode == FIXED_BLOCKS_STATIC or mode == TEAM and nb == num_threads:
                for b in prange(nb, schedule="static", chunksize=1, num_threads=num_threads):
                    if body(ctx, b, block_row(mode, ptr, ptr2, m, c0, c1, ch, nch, b, nb, False),
                            block_row(mode, ptr, ptr2, m, c0, c1, ch, nch, b, nb, True),
                            values, indptr, indices) != 0:
                        failed += 1
            else:
                for b in prange(nb, schedule="dynamic", chunksize=1, num_threads=num_threads):
                    if body(ctx, b, block_row(mode, ptr, ptr2, m, c0, c1, ch, nch, b, nb, False),
                            block_row(mode, ptr, ptr2, m, c0, c1, ch, nch, b, nb, True),
                            values, indptr, indices) != 0:
                        failed += 1
        if failed:
            raise MemoryError(f"{name}: cannot allocate the thread workspace")
        if stop != NULL and stop[0] >= 0:
            break
    return 0
