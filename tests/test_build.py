"""The build itself: OpenMP present, threads resolved as documented."""
import os

import pytest

import spfuse
from spfuse._kernels import _config


def test_built_with_openmp_unless_allowed():
    # A wheel that silently lost OpenMP is a performance bug; CI machines have gcc.
    if os.environ.get("SPFUSE_ALLOW_NO_OPENMP"):
        pytest.skip("serial build explicitly allowed")
    assert _config.openmp_enabled()


def test_team_size_follows_request():
    assert _config.team_size(1) == 1
    if _config.openmp_enabled():
        assert _config.team_size(2) == 2


def test_thread_settings_resolution():
    with spfuse.threads(1):
        assert spfuse.get_num_threads() == 1
    spfuse.set_num_threads(1)
    try:
        assert spfuse.get_num_threads() == 1
    finally:
        spfuse.set_num_threads(None)
    with pytest.raises(ValueError):
        spfuse.set_num_threads(0)
    with pytest.raises(TypeError):
        spfuse.set_num_threads(1.5)


def test_show_config_reports_openmp(capsys):
    spfuse.show_config()
    out = capsys.readouterr().out
    assert "built with OpenMP" in out
