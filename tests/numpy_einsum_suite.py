"""Run numpy's own ``test_einsum.py`` against ``spfuse.einsum``.

A pytest plugin (``-p numpy_einsum_suite``) replaces ``np.einsum`` *inside
numpy's test module* with a recorder.  For every call the recorder

1. calls the real ``numpy.einsum`` with ``optimize=False`` (``out=`` on a
   copy) -- the oracle.  ``optimize`` only picks numpy's contraction order,
   which spfuse's planner replaces; numpy's optimized path differs from its
   reference path in one respect the tests touch: it does not check that the
   result casts safely to ``out`` (``test_einsum_0d_out`` writes a float sum
   into an int64 ``out``).  spfuse checks, as ``optimize=False`` does;
2. calls ``spfuse.einsum`` with the same arguments (``out=`` on another
   copy) with dense operands, and again with every 2-D numeric operand as a
   ``scipy.sparse.csr_array`` (when there is one);
3. classifies each (call signature, mode) as

   * ``answered``: numpy's values (within a rounding bound derived from the
     dtype, the number of summed terms and ``einsum(|operands|)``), shape and
     dtype; or numpy raised and spfuse raised the same exception class;
   * ``refused``: spfuse raised :class:`spfuse.errors.UnsupportedError`
     (the documented refusal) -- the reason is recorded;
   * ``wrong``: anything else (another answer, another exception, no
     exception where numpy raised);

4. returns numpy's own result, so numpy's assertions (views, strides,
   object loops) keep testing numpy and the run proceeds as it would.

Distinct calls are keyed by (mode, subscripts or sublists, operand shapes and
dtypes, keyword arguments); counts are grouped by numpy's result dtype.  The
summary is written as JSON to ``$SPFUSE_NUMPY_EINSUM_REPORT``.

Run by hand (prints the table)::

    python tests/numpy_einsum_suite.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

REPORT_ENV = "SPFUSE_NUMPY_EINSUM_REPORT"
NUMPY_TEST_MODULE = "numpy._core.tests.test_einsum"
_real_einsum = np.einsum
#: worst classification of every distinct (mode, signature): wrong > refused > answered
_results: dict = {}
_reasons: dict = {}
_wrong_examples: list = []
_RANK = {"answered": 0, "refused": 1, "wrong": 2}


# --------------------------------------------------------------- arguments --
def _operand_slots(args) -> list[int]:
    """Positions of the operands in an einsum argument tuple (both call forms)."""
    if args and isinstance(args[0], str):
        return list(range(1, len(args)))
    return list(range(0, 2 * (len(args) // 2), 2))


def _describe(x) -> str:
    if isinstance(x, np.ndarray):
        return f"array{x.shape}:{x.dtype}"
    if isinstance(x, (list, tuple)):
        try:
            return repr(x) if all(isinstance(v, (int, str, tuple, type(Ellipsis))) for v in x) else \
                f"{type(x).__name__}{np.shape(x)}"
        except ValueError:  # ragged
            return f"{type(x).__name__}[{len(x)}]"
    return repr(x) if isinstance(x, (str, int, float, bool, type(None))) else type(x).__name__


def _signature(args, kwargs) -> str:
    slots = set(_operand_slots(args))
    parts = []
    for n, a in enumerate(args):
        if n in slots and hasattr(a, "format") and hasattr(a, "toarray"):
            parts.append(f"{a.format}{a.shape}:{a.dtype}")
        elif n in slots:
            try:
                arr = np.asarray(a)
                parts.append(f"op{arr.shape}:{arr.dtype}")
            except Exception:  # noqa: BLE001 - unconvertible operand, numpy raises on it
                parts.append(type(a).__name__)
        else:
            parts.append(_describe(a))
    parts += [f"{k}={_describe(v)}" for k, v in sorted(kwargs.items())]
    return ", ".join(parts)


def _dtype_group(args, kwargs) -> str:
    try:
        if kwargs.get("dtype") is not None:
            return str(np.dtype(kwargs["dtype"]))
        return str(np.result_type(*[np.asarray(args[n]) for n in _operand_slots(args)]))
    except Exception:  # noqa: BLE001
        return "unknown"


def _as_csr(args):
    """``args`` with every 2-D real/int/bool ndarray operand as a scipy CSR array (None if none)."""
    import scipy.sparse as sp
    out, changed = list(args), False
    for n in _operand_slots(args):
        try:
            arr = np.asarray(args[n])
        except Exception:  # noqa: BLE001
            continue
        if arr.ndim == 2 and arr.dtype.kind in "biufc" and arr.dtype != np.float16 \
                and arr.dtype.itemsize <= 16 and arr.dtype != np.longdouble:
            try:
                out[n] = sp.csr_array(arr)
                changed = True
            except (TypeError, ValueError):
                pass
    return out if changed else None


def _with_out_copy(kwargs):
    kw = dict(kwargs)
    if isinstance(kw.get("out"), np.ndarray):
        kw["out"] = kw["out"].copy()
    return kw


# ----------------------------------------------------------------- compare --
def _dense(x):
    import scipy.sparse as sp
    if sp.issparse(x):
        return x.toarray()
    if hasattr(x, "todense") and not isinstance(x, np.ndarray):
        return np.asarray(x.todense())
    return x


def _tolerance_ok(got: np.ndarray, want: np.ndarray, args, kwargs) -> bool:
    """Whether float/complex ``got`` is within rounding of ``want``.

    The bound is ``4 * (terms + 1) * eps * einsum(|operands|)``: the error of
    any summation order of ``terms`` products, each operand rounded to the
    result dtype first."""
    eps = np.finfo(want.dtype).eps
    slots = _operand_slots(args)
    plain = [a for a in args]
    ones = list(args)
    for n in slots:
        a = np.asarray(args[n])
        plain[n] = np.abs(a).astype(np.float64) if a.dtype.kind != "c" else np.abs(a)
        ones[n] = np.ones(a.shape)
    bound = np.abs(_real_einsum(*plain))
    terms = _real_einsum(*ones)
    tol = 4 * (terms + 1) * eps * bound + np.finfo(np.float64).tiny
    same_nan = np.array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want) & np.isfinite(got)
    inf_ok = np.array_equal(np.where(finite, 0, got), np.where(finite, 0, want), equal_nan=True)
    return same_nan and inf_ok and bool(np.all(np.abs(np.where(finite, got - want, 0)) <= tol))


def _compare(got, want, got_out, want_out, args, kwargs) -> str | None:
    """None when ``got`` is numpy's answer, else what differs."""
    if "out" in kwargs and kwargs["out"] is not None:
        if got is not got_out:
            return "did not return out"
        got, want = got_out, want_out
    got = _dense(got)
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return f"shape {g.shape} != {w.shape}"
    if g.dtype != w.dtype:
        return f"dtype {g.dtype} != {w.dtype}"
    if np.ndim(want) == 0 and "out" not in kwargs and isinstance(got, np.ndarray) and not isinstance(want, np.ndarray):
        return "0-d array where numpy returns a scalar"
    if w.dtype.kind in "fc":
        return None if _tolerance_ok(g, w, args, kwargs) else "values differ"
    return None if np.array_equal(g, w) else "values differ"


def _record(key, group, outcome, reason=None):
    old = _results.get(key)
    if old is None or _RANK[outcome[0]] > _RANK[old[0]]:
        _results[key] = (outcome[0], group)
        if outcome[0] == "refused":
            _reasons[key] = reason
        if outcome[0] == "wrong" and len(_wrong_examples) < 50:
            _wrong_examples.append(f"{key[0]}: {key[1]} -> {reason}")


def _same_kind(exc: BaseException, want: BaseException) -> bool:
    """spfuse raised what numpy raised: the same builtin class (ValueError, TypeError) or a subclass."""
    for base in (TypeError, ValueError):
        if isinstance(want, base):
            return isinstance(exc, base)
    return isinstance(exc, type(want))


def _check(mode, args, kwargs, want, want_out, want_exc, group, dense_args):
    import spfuse
    from spfuse.errors import UnsupportedError
    key = (mode, _signature(args, kwargs))
    kw = _with_out_copy(kwargs)
    try:
        got = spfuse.einsum(*args, **kw)
    except UnsupportedError as exc:
        _record(key, group, ("refused",), str(exc).splitlines()[0])
        return
    except Exception as exc:  # noqa: BLE001 - any other failure is classified, not raised
        if want_exc is not None and _same_kind(exc, want_exc):
            _record(key, group, ("answered",))
        else:
            _record(key, group, ("wrong",), f"raised {type(exc).__name__}: {exc}"
                    + (f" (numpy: {type(want_exc).__name__}: {want_exc})" if want_exc is not None else ""))
        return
    if want_exc is not None:
        _record(key, group, ("wrong",), f"answered where numpy raised {type(want_exc).__name__}: {want_exc}")
        return
    try:
        problem = _compare(got, want, kw.get("out"), want_out, dense_args, kwargs)
    except Exception as exc:  # noqa: BLE001
        problem = f"comparison failed: {type(exc).__name__}: {exc}"
    _record(key, group, ("wrong",) if problem else ("answered",), problem)


def recording_einsum(*args, **kwargs):
    """``numpy.einsum`` that also checks ``spfuse.einsum`` on the same call."""
    group = _dtype_group(args, kwargs)
    want = want_out = want_exc = None
    # the oracle is numpy's reference (C) einsum: spfuse's planner replaces
    # `optimize`, and numpy's optimize=True path skips the casting check of out
    kw = {**_with_out_copy(kwargs), "optimize": False}
    try:
        want = _real_einsum(*args, **kw)
        want_out = kw.get("out")
    except Exception as exc:  # noqa: BLE001
        want_exc = exc
        group = f"numpy raises ({group})"
    _check("dense", args, kwargs, want, want_out, want_exc, group, args)
    csr = _as_csr(args)
    if csr is not None:
        _check("csr", csr, kwargs, want, want_out, want_exc, group, args)
    return _real_einsum(*args, **kwargs)


# ------------------------------------------------------------------ plugin --
class _NumpyWithRecorder(types.ModuleType):
    """numpy, except that ``einsum`` is :func:`recording_einsum`."""

    def __getattr__(self, name):
        return recording_einsum if name == "einsum" else getattr(np, name)


def pytest_collection_finish(session):
    modules = {item.module for item in session.items if getattr(item, "module", None) is not None
               and item.module.__name__.endswith("test_einsum")}
    if len(modules) != 1:
        raise RuntimeError(f"{NUMPY_TEST_MODULE} was not collected: run with --pyargs {NUMPY_TEST_MODULE}")
    modules.pop().np = _NumpyWithRecorder("numpy")


def summary() -> dict:
    counts: dict = defaultdict(Counter)
    for (mode, _), (outcome, group) in _results.items():
        counts[group][outcome] += 1
        counts[f"[{mode}]"][outcome] += 1
    reasons = Counter(_reasons.values())
    return {"counts": {g: dict(c) for g, c in sorted(counts.items())},
            "total": dict(Counter(o for o, _ in _results.values())),
            "refusal_reasons": reasons.most_common(),
            "wrong": _wrong_examples}


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get(REPORT_ENV)
    if path:
        Path(path).write_text(json.dumps(summary(), indent=1))


# -------------------------------------------------------------------- main --
def run_suite(report: Path, extra: list[str] = ()) -> subprocess.CompletedProcess:
    """Run numpy's einsum tests under the recorder in a fresh interpreter."""
    here = Path(__file__).resolve().parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(here.parent), str(here), env.get("PYTHONPATH", "")])
    env[REPORT_ENV] = str(report)
    cmd = [sys.executable, "-m", "pytest", "--pyargs", NUMPY_TEST_MODULE, "-p", "numpy_einsum_suite",
           "-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(report.parent),
           "-W", "ignore", *extra]
    return subprocess.run(cmd, env=env, cwd=str(report.parent), capture_output=True, text=True)


def format_summary(s: dict) -> str:
    lines = [f"{'group':32} {'answered':>9} {'refused':>8} {'wrong':>6}"]
    for group, c in s["counts"].items():
        lines.append(f"{group:32} {c.get('answered', 0):9d} {c.get('refused', 0):8d} {c.get('wrong', 0):6d}")
    t = s["total"]
    lines.append(f"{'TOTAL distinct calls':32} {t.get('answered', 0):9d} {t.get('refused', 0):8d} "
                 f"{t.get('wrong', 0):6d}")
    lines.append("refusal reasons:")
    lines += [f"  {n:5d}  {r}" for r, n in s["refusal_reasons"]]
    if s["wrong"]:
        lines.append("wrong:")
        lines += [f"  {w}" for w in s["wrong"]]
    return "\n".join(lines)


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        proc = run_suite(report, sys.argv[1:])
        print(proc.stdout[-3000:], proc.stderr[-3000:])
        print(format_summary(json.loads(report.read_text())))
