# cython: language_level=3
"""``_csr_kernels`` built for x86-64 CPUs with AVX2 (setup.py adds ``-mavx2``).

The source is ``_csr_kernels.pyx``, included whole; ``spfuse._kernels`` loads
this build in its place on a CPU that has AVX2.  Floating-point contraction
is off in both builds, so results are bitwise the same.
"""
include "_csr_kernels.pyx"
