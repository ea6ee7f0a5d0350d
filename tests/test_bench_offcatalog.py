"""Tests of the off-catalogue suite (issue 14): the program table, its peers and spellings, the report.

No timing assertions: the suite runs once at the tiny size (1 thread, one
round) and every peer and spelling must agree with spfuse -- the harness
checks each against spfuse's result before timing it.
"""
from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest

import spfuse
from spfuse.bench import compare, harness, offcatalog, offcatalog_run, peers
from spfuse.cli import main

TINY = offcatalog.SIZES["tiny"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("offcat") / "run.json"
    buf = io.StringIO()
    res = offcatalog_run.run_offcatalog("tiny", threads=[1], repeat=1, out=buf, progress=False, json_path=str(path))
    return res, buf.getvalue(), path


# ----------------------------------------------------------------------------- table

def test_table_covers_every_kind_of_the_issue():
    assert len(offcatalog.PROGRAMS) >= 25
    kinds = {p.kind for p in offcatalog.PROGRAMS}
    assert set(offcatalog.ISSUE_KINDS) <= kinds
    assert {p.input for p in offcatalog.PROGRAMS} == {"uniform", "powerlaw", "tensor3", "tensor4"}
    assert len({p.name.lower() for p in offcatalog.PROGRAMS}) == len(offcatalog.PROGRAMS)  # --kernels ignores case


def test_every_program_has_a_peer_and_spellings_that_compile():
    for p in offcatalog.PROGRAMS:
        assert p.peers and set(p.peers) <= set(offcatalog.LIBRARIES), p.name
        assert p.spellings[0] is offcatalog.AS_WRITTEN
        for s in p.spellings:
            spfuse.compile(s.program or p.program)  # parses and checks


def test_medium_size_follows_the_issue():
    m = offcatalog.SIZES["medium"]
    assert 100_000 <= m.n <= 200_000 and m.row_nnz == 10 and m.rank == 64
    assert m.tensor_nnz >= 2_000_000 and m.tensor4_nnz >= 2_000_000


def test_operands_are_seeded_and_inputs_not_mutated():
    inputs = offcatalog.make_inputs(TINY)
    before = {k: (i.value.indptr.copy(), i.value.indices.copy(), i.value.data.copy())
              for k, i in inputs.items() if k in ("uniform", "powerlaw")}
    for p in offcatalog.PROGRAMS:
        a = p.kernel.operands(inputs[p.input], TINY)
        b = p.kernel.operands(inputs[p.input], TINY)
        for name in a:
            assert compare.agree(a[name], b[name])[0], (p.name, name)
    for k, (ptr, ind, dat) in before.items():
        v = inputs[k].value
        assert np.array_equal(v.indptr, ptr) and np.array_equal(v.indices, ind) and np.array_equal(v.data, dat)


def test_select_programs_rejects_unknown():
    with pytest.raises(ValueError, match="unknown off-catalogue program 'nope'"):
        offcatalog.select_programs("AT-SpMV,nope")


def test_make_inputs_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown input kind"):
        offcatalog.make_inputs(TINY, ["uniform", "cube"])


# ----------------------------------------------------------------------------- the run

def test_every_peer_and_spelling_agrees_with_spfuse(tiny_run):
    res, _, _ = tiny_run
    have = {p.name for p in offcatalog_run.build_peers(offcatalog.PROGRAMS)[0]}
    seen = set()
    for r in res["records"]:
        if r["status"] == "n/a":  # the peer has no formulation of this program
            continue
        seen.add((r["kernel"], r["peer"]))
        assert r["status"] == "ok", (r["kernel"], r["peer"], r["status"], r["note"])
        assert r["median"] > 0
    for p in offcatalog.PROGRAMS:
        expected = {offcatalog_run.spelling_peer(i) for i in range(len(p.spellings))}
        expected |= {lib for lib in p.peers if lib in have}
        assert expected <= {peer for k, peer in seen if k == p.name}, p.name


def test_report_tables_and_json(tiny_run):
    _, text, path = tiny_run
    assert "off-catalogue vs best peer, 1 thread" in text and "geomean best peer / spfuse" in text
    assert "no cliff" in text and "worst/best" in text
    assert "how spfuse ran them" in text and "load average" in text
    for p in offcatalog.PROGRAMS:
        assert p.name in text
    data = json.loads(path.read_text())
    assert data["meta"]["suite"] == "offcatalog" and data["meta"]["size"] == "tiny"
    assert len(data["programs"]) == len(offcatalog.PROGRAMS)
    assert all(s["execution"] for p in data["programs"] for s in p["spellings"])
    ratios = [s["ratio"] for s in data["peer_summary"]]
    assert len(ratios) == len(offcatalog.PROGRAMS) and all(r > 0 for r in ratios)
    for c in data["cliff_summary"]:
        assert c["worst_over_best"] >= 1.0 and min(c["over_best"]) == 1.0


def test_a_wrong_peer_is_a_mismatch():
    prog = offcatalog.PROGRAMS_BY_NAME["row-sums"]
    inp = offcatalog.make_inputs(TINY, ["powerlaw"])["powerlaw"]
    spf = offcatalog_run.build_peers([prog], libraries=[])[0][0]
    wrong = peers.Peer("wrong", "0", {prog.name: peers.Impl(lambda o, ctx: o, lambda o: o["A"].sum(axis=0))})
    recs = harness.run_case(inp, prog.kernel, TINY, [1], 1, peer_list=[spf, wrong], check_budget=False)
    assert {r.peer: r.status for r in recs} == {"spfuse": "ok", "wrong": "MISMATCH"}


def test_a_call_over_the_limit_is_stopped_and_reported():
    prog = offcatalog.PROGRAMS_BY_NAME["AT-A"]
    inp = offcatalog.make_inputs(TINY, ["uniform"])["uniform"]
    sz = dataclasses.replace(TINY, call_limit=1e-4)
    peer_list, _ = offcatalog_run.build_peers([prog], libraries=["scipy"], call_limit=sz.call_limit)
    recs = harness.run_case(inp, prog.kernel, sz, [1], 1, peer_list=peer_list, check_budget=False)
    by = {r.peer: r.as_dict() for r in recs}
    assert by["spfuse"]["status"] == "skip" and by["spfuse"]["note"].startswith("stopped after")
    assert offcatalog_run._measure(by["spfuse"]) == (1e-4, "bound")
    assert offcatalog_run._fmt((1e-4, "bound")) == ">100us"
    assert by["scipy"]["status"] == "ok"  # checked against itself: spfuse gave no reference
    assert spfuse.evaluate(prog.program, **prog.kernel.operands(inp, TINY)) is not None  # runs again


def _res(times: dict, hows: dict) -> dict:
    """A hand-made run of one program with two spellings and one peer, at 1 thread."""
    def rec(peer, t, how):
        status = {"median": "ok", "single": "slow", "bound": "skip"}[how]
        return {"kernel": "P", "peer": peer, "threads": 1, "status": status,
                "median": t if how == "median" else None, "first_call": t if how == "single" else None,
                "note": f"stopped after {t:g} s (call limit)" if how == "bound" else ""}
    prog = {"name": "P", "kind": "k", "peers": {"scipy": "how"},
            "spellings": [{"peer": "spfuse", "label": "as written", "program": "x", "execution": "generic"},
                          {"peer": "spfuse~1", "label": "other", "program": "y", "execution": "template kernel 't'"}]}
    return {"meta": {"threads": [1]}, "programs": [prog],
            "records": [rec(p, times[p], hows[p]) for p in times]}


def test_summaries_with_medians_single_calls_and_bounds():
    res = _res({"spfuse": 2.0, "spfuse~1": 1.0, "scipy": 1.0}, {"spfuse": "median", "spfuse~1": "median",
                                                               "scipy": "single"})
    (ps,), (cs,) = offcatalog_run.peer_summary(res), offcatalog_run.cliff_summary(res)
    assert ps["ratio"] == 0.5 and ps["ratio_side"] == "" and ps["meets_target"] is False
    assert cs["over_best"] == [2.0, 1.0] and cs["within_limit"] is False
    # spfuse stopped at 30 s: its ratio is an upper bound, the cliff a lower bound
    res = _res({"spfuse": 30.0, "spfuse~1": 1.0, "scipy": 1.0}, {"spfuse": "bound", "spfuse~1": "median",
                                                                "scipy": "median"})
    (ps,), (cs,) = offcatalog_run.peer_summary(res), offcatalog_run.cliff_summary(res)
    assert ps["ratio_side"] == "<" and ps["meets_target"] is False
    assert cs["sides"] == [">", ""] and cs["within_limit"] is False
    # every spelling stopped: nothing is known about the cliff
    res = _res({"spfuse": 30.0, "spfuse~1": 30.0, "scipy": 1.0}, {"spfuse": "bound", "spfuse~1": "bound",
                                                                 "scipy": "median"})
    (cs,) = offcatalog_run.cliff_summary(res)
    assert cs["over_best"] == [None, None] and cs["within_limit"] is None
    res = _res({"spfuse": 1.2, "spfuse~1": 1.0, "scipy": 3.0}, {h: "median" for h in ("spfuse", "spfuse~1",
                                                                                         "scipy")})
    (ps,), (cs,) = offcatalog_run.peer_summary(res), offcatalog_run.cliff_summary(res)
    assert ps["meets_target"] is True and cs["within_limit"] is True


def test_a_saved_run_renders_again(tiny_run, capsys):
    _, text, path = tiny_run
    assert offcatalog_run.main([str(path)]) == 0
    again = capsys.readouterr().out
    assert again.split("== no cliff")[1].split("wall time")[0] == text.split("== no cliff")[1].split("wall time")[0]


def test_build_peers_rejects_unknown_library():
    with pytest.raises(ValueError, match="unknown peer"):
        offcatalog_run.build_peers(offcatalog.PROGRAMS[:1], libraries=["matlab"])


# ----------------------------------------------------------------------------- command line

def test_cli_runs_the_suite():
    buf = io.StringIO()
    rc = main(["bench", "--suite", "offcatalog", "--size", "tiny", "--kernels", "col-sums", "--threads", "1",
               "--repeat", "1", "--no-progress", "--peers", "scipy", "--call-budget", "5"], out=buf)
    out = buf.getvalue()
    assert rc == 0 and "col-sums" in out and "A as CSC" in out and "call budget 5 s" in out


def test_cli_rejects_a_size_the_suite_does_not_have(capsys):
    assert main(["bench", "--suite", "offcatalog", "--size", "large", "--no-progress"]) == 2
    assert "sizes tiny, small, medium" in capsys.readouterr().err
