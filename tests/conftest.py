"""Shared pytest fixtures for spfuse.

* ``rng``: a ``numpy.random.Generator`` seeded from ``SPFUSE_TEST_SEED``
  (default 0); the seed is printed in the report header so a failure can be
  replayed with ``SPFUSE_TEST_SEED=<seed> pytest ...``.
* ``any_work``: group splitting whatever the size (``TAIL_MIN_WORK`` 0,
  caches cleared around the test), for small operands.
* ``shared_data``: the project's real-data directory (``../shared/data``
  relative to the repository root); tests using it skip when it is absent, so
  the suite never depends on it.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

SEED = int(os.environ.get("SPFUSE_TEST_SEED", "0"))
SHARED_DATA = Path(__file__).parents[2] / "shared" / "data"


def pytest_report_header(config):
    return f"spfuse: SPFUSE_TEST_SEED={SEED}"


@pytest.fixture
def rng() -> np.random.Generator:
    """A fresh generator seeded from SPFUSE_TEST_SEED (default 0) for every test."""
    return np.random.default_rng(SEED)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path of ../shared/data; skips the test when the directory is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data directory {SHARED_DATA} not present")
    return SHARED_DATA


@pytest.fixture
def any_work(monkeypatch):
    """Split groups whatever the size (tests use small operands)."""
    import spfuse
    from spfuse.lowering import groups
    monkeypatch.setattr(groups, "TAIL_MIN_WORK", 0)
    spfuse.clear_cache()
    yield
    spfuse.clear_cache()
