"""Cython runtime of spfuse: co-iteration primitives and template kernels.

Everything here runs without the GIL on arrays that ``spfuse.validation`` has
already checked; nothing in this package validates its inputs.

**One source, two builds.**  On x86-64 the compute modules (:data:`DISPATCHED`)
are also built with ``-mavx2`` (``<module>_avx2``: the same ``.pyx``, included
whole; see ``setup.py``).  Importing this package picks a build once per
process, as numpy picks its SIMD loops: the AVX2 build when the CPU has AVX2
(numpy's own CPU detection says so) and it was built, the baseline build
otherwise.  The chosen build is registered under the module's own name, so
``from spfuse._kernels import _csr_kernels`` and every other spelling give
the same module.  Both builds keep floating-point contraction off and
vectorise only element-wise work, so their results are bitwise equal
(``tests/test_isa.py``); the AVX2 build runs the row-wide inner loops
(axpy, dot, fiber products) twice as wide.

``SPFUSE_KERNEL_ISA=baseline`` forces the baseline build (read at import).

>>> ISA in ("avx2", "baseline")
True
"""
from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

__all__ = ["DISPATCHED", "ISA", "ISA_ENV", "build_of"]

#: the modules built twice (the others hold no arithmetic worth widening)
DISPATCHED = ("_csr_kernels", "_csf_kernels", "_dense_kernels", "_looptree", "_looptree32")

#: environment variable: ``baseline`` forces the baseline build, ``auto`` (or unset) picks
ISA_ENV = "SPFUSE_KERNEL_ISA"


def _cpu_has_avx2() -> bool:
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:  # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__ as features  # type: ignore[no-redef]
    return bool(features.get("AVX2"))


def _wanted() -> str:
    wanted = os.environ.get(ISA_ENV, "auto").strip().lower() or "auto"
    if wanted not in ("auto", "baseline"):
        raise ValueError(f"{ISA_ENV}={wanted!r}: expected 'auto' or 'baseline'")
    return "avx2" if wanted == "auto" and _cpu_has_avx2() else "baseline"


def build_of(name: str, isa: str) -> ModuleType | None:
    """Module ``name``'s ``isa`` build (``"baseline"`` or ``"avx2"``), loaded
    from its file whichever build this process runs (a build already loaded
    shares its library's state); None when that build is not installed.
    For comparing the builds.

    >>> build_of("_csr_kernels", "baseline") is not None
    True
    """
    if name not in DISPATCHED or isa not in ("baseline", "avx2"):
        raise ValueError(f"no {isa!r} build of {name!r} (dispatched modules: {', '.join(DISPATCHED)})")
    file_name = name if isa == "baseline" else name + "_avx2"
    spec = importlib.machinery.PathFinder.find_spec(f"{__name__}.{file_name}", __path__)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _register(isa: str) -> str:
    """Register the ``isa`` build of every dispatched module under its own name."""
    if isa == "baseline":
        return isa
    chosen = {}
    for name in DISPATCHED:
        try:
            chosen[name] = importlib.import_module(f"{__name__}.{name}_avx2")
        except ImportError:  # not built here (debug build, another platform)
            return "baseline"
    for name, module in chosen.items():
        sys.modules[f"{__name__}.{name}"] = module
        globals()[name] = module
    return isa


#: the build this process runs: ``"avx2"`` or ``"baseline"``
ISA = _register(_wanted())
