# Interruptible kernels: shared chunking policy of the template kernels
# (_csr_kernels, _csf_kernels) and of the loop-tree interpreter (_looptree).
#
# ``PyErr_CheckSignals`` needs the GIL, and OpenMP worker threads must not take
# it, so a long kernel runs its rows in bounded CHUNKS: the Python-level loop
# over chunks (written once for the template kernels: ``for_rows`` in
# ``_parallel.pxd``) enters one ``with nogil`` parallel region per chunk and
# calls ``PyErr_CheckSignals()`` (GIL held) between chunks.  On a pending
# KeyboardInterrupt (or any exception raised by a signal handler) it returns
# -1 with the exception set and the kernel raises it after freeing its
# thread-private workspaces (``try/finally``); outputs are freshly allocated
# by the callers, so nothing the user owns is left half-written.
#
# Chunks are sized by WORK, never by wall time: a kernel estimates its total
# work in "units" (about 1-2 ns of one core at typical rates: a streamed
# multiply-add, half a random gather, 1/16 of a SpGEMM flop, ...; the
# per-kernel weights are next to each kernel) and cuts its rows into
# ``num_chunks(work, num_threads, rows)`` chunks of about spfuse_chunk_work
# units per thread (~20-30 ms on an idle 2-core machine for the benchmark
# kernels; Ctrl-C was measured to raise within ~10-40 ms).  Chunk boundaries
# only group whole rows, and the arithmetic of one row never depends on which
# chunk or block it falls in, so results stay bit-identical for any thread
# count and any chunking.  Work below one chunk (e.g. SpMV of 2M nonzeros)
# runs as before: one parallel region, no signal check.
#
# The kernels use the GIL-held Python-level loop over chunks, not a check
# from inside the parallel region: no worker ever touches the GIL, and a
# chunk boundary is a plain fork/join (~10 us), negligible at this size.
from cpython.exc cimport PyErr_CheckSignals

cdef extern from *:
    """
    /* Work units per thread per chunk (2**24).  One copy per
       module that cimports this file; tests shrink it (``_set_chunk_work``)
       to run small inputs as many chunks and check that results do not
       change. */
    static double spfuse_chunk_work = 16777216.0;
    static double spfuse_set_chunk_work(double units) {
        double old = spfuse_chunk_work;
        if (units >= 1.0) spfuse_chunk_work = units;
        return old;
    }
    """
    double spfuse_chunk_work
    double spfuse_set_chunk_work(double units) noexcept nogil


cdef inline Py_ssize_t num_chunks(double work, int num_threads, Py_ssize_t n_rows) noexcept nogil:
    """Number of chunks for ``work`` units over ``n_rows`` rows on ``num_threads`` threads.

    ``ceil(work / (spfuse_chunk_work * num_threads))``, at least 1 and at most
    ``n_rows`` (a chunk holds at least one row); 1 when ``n_rows <= 1``.
    """
    cdef double per = spfuse_chunk_work * <double>(num_threads if num_threads > 1 else 1)
    cdef double n = work / per
    cdef Py_ssize_t nch
    if not (n > 1.0) or n_rows <= 1:   # also NaN / negative
        return 1
    if n >= <double>n_rows:
        return n_rows
    nch = <Py_ssize_t>n
    return nch + 1 if <double>nch < n else nch
