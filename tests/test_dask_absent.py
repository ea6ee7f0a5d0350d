"""Without the ``dask`` extra, spfuse imports and its test suite skips the Dask
parts cleanly: run in a subprocess where dask and distributed look uninstalled."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

HIDE_DASK = textwrap.dedent('''
    import sys

    class Hide:
        """A meta path finder that finds nothing of dask/distributed (like an uninstalled package)."""
        def __init__(self, finder):
            self.finder = finder
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("dask", "distributed"):
                return None
            find = getattr(self.finder, "find_spec", None)
            return find(name, path, target) if find else None
        def __getattr__(self, attr):
            return getattr(self.finder, attr)

    sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
''')


def run_without_dask(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", HIDE_DASK + textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_spfuse_imports_and_dask_tests_skip_without_dask():
    out = run_without_dask('''
        import importlib.util
        assert importlib.util.find_spec("dask") is None
        import spfuse, spfuse.cli
        spfuse.cli.build_parser().parse_args(["bench", "--suite", "dask"])
        try:
            import spfuse.dask
        except ImportError as exc:
            print("spfuse.dask:", exc)
        import pytest
        sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests/test_dask.py", "spfuse"]))
    ''')
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "No module named 'dask'" in out.stdout
    assert "SKIPPED" in out.stdout and "test_dask.py" in out.stdout
    collected = out.stdout.splitlines()
    assert not [line for line in collected if "spfuse/dask/" in line or "dask_suite" in line]
    assert any("spfuse/" in line for line in collected)  # the other doctests are still collected
