# Shared compile-time declarations of the template kernels
# (_csr_kernels, _csf_kernels, _dense_kernels).  Nothing here needs a module
# of its own: only ctypedefs and enum constants.
from libc.stdint cimport int32_t, int64_t

# ONE index type shared by every index array (indptr/indices, pos/crd) of a
# kernel call.  Values use ``cython.floating`` (float32/float64); reductions
# always accumulate in C double.
ctypedef fused index_t:
    int32_t
    int64_t

# Op codes of ``_dense_kernels.map_unary`` (Python-visible copy:
# ``_dense_kernels.UNARY_OPS``).  Keep the two in sync.
cdef enum:
    UNARY_RELU = 0
    UNARY_SIGMOID = 1
    UNARY_TANH = 2
    UNARY_EXP = 3
    UNARY_LOG = 4
    UNARY_ABS = 5
    UNARY_SQRT = 6
    UNARY_NEG = 7

# Op codes of the SDDMM-like kernels (``bdata[p] op dot(C[i], Dt[j])``);
# Python-visible copy: ``_csr_kernels.SDDMM_OPS``.
cdef enum:
    SDDMM_MUL = 0       # out = b * s
    SDDMM_DIV = 1       # out = b / s  if b != 0 else 0   (sparse 0/x = 0)
    SDDMM_DOT = 2       # out = s      (masked GEMM: B only gives the pattern)
