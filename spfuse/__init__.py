"""spfuse: fused sparse/dense tensor expressions with a precompiled runtime.

>>> import numpy as np, scipy.sparse as sp, spfuse
>>> spfuse.get_num_threads() >= 1
True
"""
from __future__ import annotations

__version__ = "0.1.0.dev0"

from spfuse._show_config import config_info, show_config
from spfuse.errors import (InvalidOperandError, OperandTypeError, ProgramError,
                           SpfuseError, UnsupportedError)
from spfuse.threads import get_num_threads, set_num_threads, threads

__all__ = [
    "__version__", "show_config", "config_info",
    "get_num_threads", "set_num_threads", "threads",
    "SpfuseError", "InvalidOperandError", "OperandTypeError", "ProgramError", "UnsupportedError",
]
