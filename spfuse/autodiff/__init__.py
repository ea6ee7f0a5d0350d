"""Reverse-mode derivatives of spfuse programs, by program transformation.

:func:`adjoint` turns a forward program into its adjoint program (pure, no
operands); :func:`vjp` runs it through the ordinary planner and executor.

>>> import numpy as np, spfuse
>>> g = spfuse.vjp("y[i] = A[i,j] * x[j]", np.ones(2), wrt=("x",), A=np.eye(2), x=np.ones(2))
>>> g["x"]
array([1., 1.])
"""
from spfuse.autodiff.run import vjp
from spfuse.autodiff.transform import TEMPORARY_POLICIES, Adjoint, adjoint

__all__ = ["Adjoint", "adjoint", "vjp", "TEMPORARY_POLICIES"]
