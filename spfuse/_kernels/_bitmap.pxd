# A two-level bitmap of touched coordinates (a row's scatter workspace):
# one bit per coordinate, one summary bit per 64-coordinate word.  Reading it
# back yields the touched coordinates in increasing order without a sort.
# Shared by the SpGEMM/SpAdd templates (_csr_kernels) and the loop-tree
# executor's row workspaces (_looptree).
from cython cimport floating
from libc.stdint cimport int32_t, int64_t, uint64_t

cdef extern from *:
    """
    #if defined(__GNUC__) || defined(__clang__)
    #define SPFUSE_CTZ64(x) ((Py_ssize_t)__builtin_ctzll(x))
    #else
    static inline Py_ssize_t SPFUSE_CTZ64(unsigned long long x) {
        Py_ssize_t n = 0; while (!(x & 1)) { x >>= 1; n++; } return n; }
    #endif
    """
    # index of the lowest set bit of a non-zero word
    Py_ssize_t SPFUSE_CTZ64(uint64_t x) noexcept nogil


# An OUTPUT index type, independent of the operands' (SpAdd writes the sum
# of int64 operands that fits int32 as int32 directly: the result's tensor
# would narrow it anyway, at the cost of a copy).
ctypedef fused out_index_t:
    int32_t
    int64_t


cdef inline void _bitmap_add(double* acc, uint64_t* bits, uint64_t* words, Py_ssize_t k, double x,
                             Py_ssize_t* span) noexcept nogil:
    """Scatter ``x`` into column ``k`` of a row: ``acc[k] += x`` when the row
    has touched ``k`` already, else ``acc[k] = x`` and ``k`` marked (its bit,
    its word's summary bit, and ``span = [minw, maxw]``, the summary words
    in use: ``[-1, -1]`` for a row that touched nothing yet)."""
    cdef Py_ssize_t w0 = k >> 6
    cdef uint64_t bit = (<uint64_t>1) << (k & 63)
    if bits[w0] & bit:
        acc[k] += x
    else:
        bits[w0] |= bit
        acc[k] = x
        words[w0 >> 6] |= (<uint64_t>1) << (w0 & 63)
        if span[0] < 0 or (w0 >> 6) < span[0]:
            span[0] = w0 >> 6
        if (w0 >> 6) > span[1]:
            span[1] = w0 >> 6


cdef inline Py_ssize_t _bitmap_readback(const double* acc, uint64_t* bits, uint64_t* words,
                                        Py_ssize_t minw, Py_ssize_t maxw,
                                        out_index_t* outc, floating* outv) noexcept nogil:
    """Write the marked columns of a scattered row, in increasing order, to
    ``outc``/``outv`` (values from ``acc``) and clear the marks; return their
    count.

    ``bits`` has a bit per column (set = touched), ``words`` a summary bit per
    64-column word of ``bits``; ``[minw, maxw]`` bounds the summary words in
    use.  Set summary bits lead to set words, set bits to columns (count
    trailing zeros): sorted without a sort, O(entries + span / 4096), and both
    bitmaps are all-zero again afterwards."""
    cdef Py_ssize_t w1, w0, k, cnt = 0
    cdef uint64_t sw, bw
    for w1 in range(minw, maxw + 1):
        sw = words[w1]
        if sw == 0:
            continue
        words[w1] = 0
        while sw:
            w0 = (w1 << 6) + SPFUSE_CTZ64(sw)
            sw &= sw - 1
            bw = bits[w0]
            bits[w0] = 0
            while bw:
                k = (w0 << 6) + SPFUSE_CTZ64(bw)
                bw &= bw - 1
                outc[cnt] = <out_index_t>k
                outv[cnt] = <floating>acc[k]
                cnt += 1
    return cnt
