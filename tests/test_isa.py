"""The kernel builds (baseline and AVX2) and the choice between them.

The AVX2 build must give bitwise the results of the baseline build on every
program of the catalogue and off-catalogue tables, in every spelling, at 1
and 2 threads, and on gradients (``isa_results.py`` writes them; one
subprocess per build).
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys

import numpy as np
import pytest

from spfuse import _kernels

HERE = os.path.dirname(os.path.abspath(__file__))


def _python(code_or_script: list[str], isa: str | None, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop(_kernels.ISA_ENV, None)
    if isa is not None:
        env[_kernels.ISA_ENV] = isa
    return subprocess.run([sys.executable, *code_or_script], env=env, capture_output=True, text=True,
                          timeout=600, **kw)


def _avx2_available() -> bool:
    return _kernels._cpu_has_avx2() and all(_kernels.build_of(m, "avx2") is not None for m in _kernels.DISPATCHED)


def test_every_spelling_names_the_chosen_build():
    suffix = "_avx2" if _kernels.ISA == "avx2" else ""
    for name in _kernels.DISPATCHED:
        module = importlib.import_module(f"spfuse._kernels.{name}")
        assert module is sys.modules[f"spfuse._kernels.{name}"] is getattr(_kernels, name, module)
        assert module.__name__ == f"spfuse._kernels.{name}{suffix}"
    from spfuse._kernels import _csr_kernels
    from spfuse.lowering import templates
    assert templates.csr is _csr_kernels


def test_the_cpu_decides_unless_told():
    expected = "avx2" if _avx2_available() else "baseline"
    if os.environ.get(_kernels.ISA_ENV, "auto") == "auto":
        assert _kernels.ISA == expected
    code = "import spfuse._kernels as k, spfuse._kernels._csr_kernels as c; print(k.ISA, c.__name__)"
    forced = _python(["-c", code], "baseline")
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.split() == ["baseline", "spfuse._kernels._csr_kernels"]
    auto = _python(["-c", code], None)
    assert auto.stdout.split()[0] == expected


def test_an_unknown_build_name_is_refused():
    bad = _python(["-c", "import spfuse"], "sse9")
    assert bad.returncode != 0
    assert "SPFUSE_KERNEL_ISA='sse9'" in bad.stderr and "baseline" in bad.stderr
    with pytest.raises(ValueError, match="no 'avx512' build"):
        _kernels.build_of("_csr_kernels", "avx512")


@pytest.mark.skipif(not _avx2_available(), reason="no AVX2 build or no AVX2 CPU here")
def test_avx2_build_gives_bitwise_the_baseline_results(tmp_path):
    files = {}
    for isa in ("baseline", "auto"):
        files[isa] = tmp_path / f"{isa}.npz"
        done = _python([os.path.join(HERE, "isa_results.py"), str(files[isa])], isa, cwd=HERE)
        assert done.returncode == 0, done.stderr[-3000:]
    base, avx2 = np.load(files["baseline"]), np.load(files["auto"])
    assert str(base["isa"]) == "baseline" and str(avx2["isa"]) == "avx2"
    assert base.files == avx2.files and len(base.files) > 300
    differ = [k for k in base.files if k != "isa" and not np.array_equal(base[k], avx2[k], equal_nan=True)]
    assert not differ, f"{len(differ)} results differ between the builds, e.g. {differ[:5]}"
