"""``spfuse bench --suite training|backward`` and the example models (tiny sizes)."""
from __future__ import annotations

import io
import warnings

import pytest

torch = pytest.importorskip("torch")

from spfuse.cli import main  # noqa: E402

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


@pytest.mark.parametrize("module", ["gcn", "autoencoder", "attention"])
def test_examples_train_and_agree_with_torch_sparse(module):
    import importlib

    from spfuse.examples.training import compare
    m = importlib.import_module(f"spfuse.examples.{module}")
    if module == "gcn":
        backends, params = m.model(*m.karate())
    elif module == "autoencoder":
        backends, params = m.model(m.ratings(60, 40, 5))
    else:
        backends, params = m.model(m.pattern(40, 4))
    r = compare(backends, params, 5)
    assert r["spfuse"]["losses"][-1] < r["spfuse"]["losses"][0]  # it trains
    for name in ("torch.sparse", "dense"):
        assert r[name]["max_loss_diff"] < 1e-9, name


def test_gcn_with_sparse_features_agrees_with_torch_sparse():
    import numpy as np
    import scipy.sparse as sp

    from spfuse.examples import gcn
    from spfuse.examples.training import compare
    A, y = gcn.graph(60, 3, 3, seed=1)
    X = sp.random_array((60, 25), density=0.1, format="csr", rng=2)
    backends, params = gcn.model(A, y, features=X, hidden=4, labelled=np.arange(0, 60, 5))
    assert tuple(params["W1"].shape) == (25, 4)
    r = compare(backends, params, 4)
    assert r["spfuse"]["losses"][-1] < r["spfuse"]["losses"][0]
    for name in ("torch.sparse", "dense"):
        assert r[name]["max_loss_diff"] < 1e-9, name


def test_planetoid_gcn_in_the_training_suite(shared_data):
    from spfuse.bench.training import run_training_suite
    from spfuse.examples import gcn
    A, X, y = gcn.planetoid("cora", shared_data)
    assert A.shape == (2708, 2708) and X.shape == (2708, 1433) and X.nnz == 49216 and y.shape == (2708,)
    rows = run_training_suite("tiny", 2, out=io.StringIO(), data=str(shared_data))
    names = [r["model"] for r in rows]
    assert "GCN cora (sparse X)" in names and "GCN citeseer (sparse X)" in names
    for r in rows:
        assert r["max_loss_diff"] < 1e-9, r["model"]


def test_training_suite_cli():
    out = io.StringIO()
    assert main(["bench", "--suite", "training", "--size", "tiny", "--epochs", "2"], out=out) == 0
    text = out.getvalue()
    assert "GCN karate" in text and "attention" in text and "geomean" in text


def test_backward_suite_cli():
    out = io.StringIO()
    assert main(["bench", "--suite", "backward", "--size", "tiny", "--kernels", "SpMV,SDDMM",
                 "--repeat", "1"], out=out) == 0
    assert "SDDMM" in out.getvalue() and "ratio" in out.getvalue() and "first vjp" in out.getvalue()


def test_backward_suite_reports_the_first_vjp_call():
    from spfuse.bench.training import run_backward_suite
    rows = run_backward_suite("tiny", kernels="SDDMM", repeat=1, out=io.StringIO())
    (row,) = rows
    # (the first call plans too, but at this size a loaded machine's noise can hide that: no order asserted)
    assert row["first_backward_ms"] > 0.0 and row["backward_ms"] > 0.0
