"""The generic loop-tree executor over int32 index arrays (see _looptree)."""
from libc.stdint cimport int32_t
import numpy as np

ctypedef int32_t idx_t
INDEX_DTYPE = np.dtype(np.int32)
cimport numpy as cnp
cdef int INDEX_TYPENUM = cnp.NPY_INT32

include "_looptree_impl.pxi"
