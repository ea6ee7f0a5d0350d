"""Cython runtime of spfuse: co-iteration primitives and template kernels.

Everything here runs without the GIL on arrays that ``spfuse.validation`` has
already checked; nothing in this package validates its inputs.
"""
