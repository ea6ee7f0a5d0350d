"""numpy's own test_einsum.py, run against spfuse.einsum (see numpy_einsum_suite.py).

Every call numpy's tests make is repeated through spfuse with dense operands
and with 2-D operands as scipy CSR.  Zero wrong answers is the bar; refusals
(:class:`spfuse.errors.UnsupportedError`) are allowed only for the value
dtypes spfuse does not compute, and are counted.  complex64/complex128 are
computed (as pairs of real parts); long double only when float64 is exact.
"""
from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from numpy_einsum_suite import format_summary, run_suite

from spfuse.errors import UnsupportedError

#: result dtypes spfuse refuses (it computes in float64 at most)
NOT_COMPUTED = ("object",)
#: dtypes computed through float64 only when exact (integer values below 2**53), else refused
EXACT_ONLY = ("int", "uint", "float128", "float96", "longdouble", "complex256", "complex192", "clongdouble")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if importlib.util.find_spec("numpy._core.tests.test_einsum") is None:
        pytest.skip("numpy was installed without its tests")
    path = tmp_path_factory.mktemp("numpy_einsum") / "report.json"
    proc = run_suite(path)
    assert path.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads(path.read_text())
    print(format_summary(summary))
    return summary, proc


def test_no_wrong_answers(report):
    summary, _ = report
    assert summary["total"].get("wrong", 0) == 0, "\n".join(summary["wrong"])
    assert summary["total"].get("answered", 0) > 10000  # the recorder did see numpy's calls


def test_refusals_only_for_dtypes_not_computed(report):
    summary, _ = report
    for group, counts in summary["counts"].items():
        if group.startswith("[") or not counts.get("refused"):
            continue
        if any(word in group for word in NOT_COMPUTED):
            continue
        if group.startswith(EXACT_ONLY):
            # integer / long double results float64 might not hold exactly are refused, never approximated
            assert counts["refused"] <= 0.02 * (counts["refused"] + counts.get("answered", 0)), (group, counts)
            continue
        raise AssertionError(f"{group}: {counts['refused']} refusals")  # complex64/128 and floats: none


def test_at_least_99_percent_answered_besides_object(report):
    summary, _ = report
    counts = summary["counts"]
    refused = sum(c.get("refused", 0) for g, c in counts.items() if not g.startswith("[") and "object" not in g)
    answered = sum(c.get("answered", 0) for g, c in counts.items() if not g.startswith("[") and "object" not in g)
    assert answered / (answered + refused) >= 0.99, (answered, refused)
    reasons = [r for r, _ in summary["refusal_reasons"]]
    assert all("object" in r or "not all integers" in r or "2**53" in r for r in reasons), reasons


def test_numpy_tests_pass_under_the_recorder(report):
    # the recorder returns numpy's own result, so numpy's assertions still hold
    _, proc = report
    assert proc.returncode == 0, proc.stdout[-5000:]


def _np_einsum(*args, **kwargs):
    """numpy.einsum with sparse operands densified (a stand-in for spfuse.einsum)."""
    return np.einsum(*[a.toarray() if hasattr(a, "toarray") else a for a in args], **kwargs)


@pytest.mark.parametrize("fake, outcome", [
    (lambda *a, **k: _np_einsum(*a, **k) * (1 + 1e-6), "wrong"),         # values off by more than rounding
    (lambda *a, **k: _np_einsum(*a, **k).astype(np.float32), "wrong"),    # dtype differs
    (lambda *a, **k: _np_einsum(*a, **k)[None], "wrong"),                  # shape differs
    (lambda *a, **k: _np_einsum(*a, **k) + 1e-18, "answered"),             # within rounding
    (lambda *a, **k: (_ for _ in ()).throw(UnsupportedError("no")), "refused"),
])
def test_classifies(monkeypatch, fake, outcome):
    import numpy_einsum_suite as suite

    import spfuse
    monkeypatch.setattr(spfuse, "einsum", fake)
    monkeypatch.setattr(suite, "_results", {})
    a = np.arange(1.0, 7.0).reshape(2, 3)
    got = suite.recording_einsum("ij,j->i", a, np.ones(3))
    np.testing.assert_array_equal(got, a.sum(1))  # numpy's answer is handed back
    assert [o for o, _ in suite._results.values()] == [outcome, outcome]  # dense and csr


def test_flags_an_answer_where_numpy_raises(monkeypatch):
    import numpy_einsum_suite as suite

    import spfuse
    monkeypatch.setattr(spfuse, "einsum", lambda *a, **k: np.zeros(2))
    monkeypatch.setattr(suite, "_results", {})
    with pytest.raises(ValueError):
        suite.recording_einsum("i,i", np.ones(2), np.ones(3))
    assert [o for o, _ in suite._results.values()] == ["wrong"]
