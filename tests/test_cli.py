"""Tests of the ``spfuse`` command line (``python -m spfuse``)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spfuse import cli

ROOT = Path(__file__).parents[1]


def run(argv):
    out = io.StringIO()
    code = cli.main(argv, out=out)
    return code, out.getvalue()


def test_bench_arguments_parse():
    a = cli.build_parser().parse_args(["bench", "--size", "medium", "--kernels", "SpMV,SDDMM", "--threads", "1,2",
                                       "--repeat", "3", "--json", "x.json", "--plot", "x.png", "--data", "d"])
    assert (a.size, a.kernels, a.threads, a.repeat, a.json, a.plot, a.data) == \
        ("medium", "SpMV,SDDMM", [1, 2], 3, "x.json", "x.png", "d")
    assert cli.build_parser().parse_args(["bench"]).size == "small"


@pytest.mark.parametrize("bad", [["bench", "--threads", "0"], ["bench", "--threads", "a"],
                                 ["bench", "--size", "huge"], ["bench", "--repeat", "0"], []])
def test_bad_arguments_exit(bad, capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(bad)
    assert e.value.code == 2


def test_tiny_size_is_hidden_from_help():
    text = cli.build_parser()._subparsers._group_actions[0].choices["bench"].format_help()
    assert "{small,medium,large}" in text and "tiny" not in text


def test_bench_tiny_prints_a_table(tmp_path):
    js = tmp_path / "out.json"
    code, text = run(["bench", "--size", "tiny", "--kernels", "SpMV,SDDMM,TTV", "--threads", "1",
                      "--peers", "scipy,numpy", "--no-progress", "--json", str(js)])
    assert code == 0
    assert "== 1 thread: synthetic inputs ==" in text
    for word in ("SpMV", "SDDMM", "TTV", "scipy", "numpy", "planning", "STREAM-style copy", "wall time"):
        assert word in text
    assert "MISMATCH" not in text
    data = json.loads(js.read_text())
    assert {r["peer"] for r in data["records"]} == {"spfuse", "scipy", "numpy"}


def test_bench_unknown_kernel_is_an_error(capsys):
    code, _ = run(["bench", "--size", "tiny", "--kernels", "SpMV,Nope", "--no-progress"])
    assert code == 2 and "unknown kernel 'Nope'" in capsys.readouterr().err


def test_bench_missing_data_dir_is_an_error(tmp_path, capsys):
    code, _ = run(["bench", "--size", "tiny", "--kernels", "SpMV", "--data", str(tmp_path / "none"),
                   "--no-progress"])
    assert code == 2 and "not a directory" in capsys.readouterr().err


def test_bench_data_dir_is_reported_apart(tmp_path):
    (tmp_path / "t.tns").write_text("1 1 1 1.0\n2 3 2 2.0\n3 2 1 4.0\n")
    code, text = run(["bench", "--size", "tiny", "--kernels", "TTV", "--threads", "1", "--peers", "numpy",
                      "--data", str(tmp_path), "--no-progress", "--no-planning"])
    assert code == 0 and "inputs from --data" in text and "t " in text


def test_explain_prints_a_report():
    code, text = run(["explain", "A[i,j] = B[i,j] * (C[i,k] * D[k,j])", "--format", "B=csr",
                      "--shape", "B=100x80,C=100x8", "--shape", "D=8x80"])
    assert code == 0 and len(text.splitlines()) > 5
    assert "B" in text


def test_explain_formats_only_and_fusion():
    code, text = run(["explain", "y[i] = A[i,j] * x[j]", "--format", "A=csr", "--fusion", "none"])
    assert code == 0 and text.strip()


def test_explain_png_says_not_implemented(capsys):
    code, _ = run(["explain", "y[i] = A[i,j] * x[j]", "--format", "A=csr", "--png", "t.png"])
    assert code == 0 and "not implemented" in capsys.readouterr().err


def test_explain_bad_assignment(capsys):
    code, _ = run(["explain", "y[i] = A[i,j] * x[j]", "--format", "A"])
    assert code == 2 and "NAME=VALUE" in capsys.readouterr().err


def test_example_operands_density_and_dense():
    ops = cli.example_operands({"B": "50x40", "C": "40x3"}, {"B": "csr"}, density=0.1)
    assert ops["B"].format.name == "csr" and 0 < ops["B"].nnz <= 200
    assert ops["C"].shape == (40, 3)


def test_python_dash_m_runs():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    res = subprocess.run([sys.executable, "-m", "spfuse", "--help"], capture_output=True, text=True, cwd=ROOT,
                         env=env, timeout=60)
    assert res.returncode == 0 and "bench" in res.stdout and "explain" in res.stdout
