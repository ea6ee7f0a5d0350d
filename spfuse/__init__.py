"""spfuse: fused sparse/dense tensor expressions with a precompiled runtime.

>>> import numpy as np, scipy.sparse as sp, spfuse
>>> A = sp.csr_array(np.array([[1.0, 0.0], [2.0, 3.0]]))
>>> spfuse.evaluate("y[i] = A[i,j] * x[j]", A=A, x=np.array([1.0, 1.0]))
array([1., 5.])
"""
from __future__ import annotations

__version__ = "0.1.0.dev0"

from spfuse import io
from spfuse._show_config import config_info, show_config
from spfuse.api import Kernel, cache_info, clear_cache, compile, einsum, evaluate
from spfuse.autodiff import vjp
from spfuse.errors import InvalidOperandError, OperandTypeError, ProgramError, SpfuseError, UnsupportedError
from spfuse.formats import Format
from spfuse.tensor import CompressedLevel, DenseLevel, Tensor, as_tensor
from spfuse.threads import get_num_threads, set_num_threads, threads

__all__ = [
    "__version__", "evaluate", "compile", "einsum", "vjp", "Kernel", "clear_cache", "cache_info",
    "Tensor", "Format", "DenseLevel", "CompressedLevel", "as_tensor", "io",
    "show_config", "config_info",
    "get_num_threads", "set_num_threads", "threads",
    "SpfuseError", "InvalidOperandError", "OperandTypeError", "ProgramError", "UnsupportedError",
]
