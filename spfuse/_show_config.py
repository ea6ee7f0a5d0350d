"""``spfuse.show_config()``: how this copy of spfuse was built and will run."""
from __future__ import annotations

import platform
import sys

from spfuse import _kernels
from spfuse._kernels import _config
from spfuse.threads import effective_num_threads

__all__ = ["show_config", "config_info"]


def config_info() -> dict:
    """Build and runtime facts as a dict (what :func:`show_config` prints).

    >>> import spfuse
    >>> "openmp" in spfuse.config_info()
    True
    """
    import numpy
    import scipy

    import spfuse

    info = {
        "spfuse": spfuse.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "openmp": _config.openmp_enabled(),
        "openmp_max_threads": _config.openmp_max_threads(),
        "threads_used": effective_num_threads(None),
        "kernel_isa": _kernels.ISA,
    }
    try:
        import threadpoolctl

        info["threadpools"] = threadpoolctl.threadpool_info()
    except ImportError:
        info["threadpools"] = "threadpoolctl not installed"
    return info


def show_config() -> None:
    """Print how spfuse was built (OpenMP or not) and the thread pools in use.

    >>> import spfuse
    >>> spfuse.show_config()  # doctest: +ELLIPSIS
    spfuse ...
    """
    info = config_info()
    print(f"spfuse {info['spfuse']} (python {info['python']}, numpy {info['numpy']}, scipy {info['scipy']})")
    print(f"platform: {info['platform']}")
    if info["openmp"]:
        print(f"built with OpenMP: yes (max threads {info['openmp_max_threads']}, "
              f"kernels will use {info['threads_used']})")
    else:
        print("built with OpenMP: NO -- kernels run on one thread")
    print(f"kernel build in use: {info['kernel_isa']} (set {_kernels.ISA_ENV}=baseline to force the baseline build)")
    pools = info["threadpools"]
    if isinstance(pools, str):
        print(f"thread pools: {pools}")
    else:
        for pool in pools:
            print(f"thread pool: {pool.get('user_api')} {pool.get('internal_api')} "
                  f"num_threads={pool.get('num_threads')} ({pool.get('filepath')})")
