"""Kernel.explain(picture=...) draws the plan; Kernel._repr_html_ shows the report."""
from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

import pytest

import spfuse
from spfuse.api import describe_execution
from spfuse.ir.tree import iter_nodes

pytest.importorskip("matplotlib")

PROGRAMS = [
    ("y[i] = A[i,j] * x[j]", {"A": "csr"}),
    ("A[i,l] = B[i,j] * C[i,k] * D[j,k] * E[j,l]", {"B": "csr"}),          # SDDMM-SpMM: temporaries
    ("A[i,j] = B[i,j] / (C[i,k] * D[k,j])", {"B": "csr"}),
]


def _svg_texts(path) -> list[str]:
    root = ET.parse(path).getroot()
    return ["".join(el.itertext()) for el in root.iter() if el.tag.endswith("text")]


@pytest.mark.parametrize("program, formats", PROGRAMS, ids=[p for p, _ in PROGRAMS])
def test_picture_contains_every_tree_node(program, formats, tmp_path):
    k = spfuse.compile(program, **formats)
    out = tmp_path / "plan.svg"
    text = k.explain(picture=out)
    assert text.splitlines()[1:] == k.explain().splitlines()[1:]  # the same report (line 1 has the planning time)
    texts = _svg_texts(out)
    plan = k.plans()[k.fusion]
    for tree in (plan.unfused, plan.tree):
        for node in iter_nodes(tree):
            assert node.render() in texts, node.render()
    for t in plan.temporaries.values():
        assert any(t.shape_text in s for s in texts)
    assert any(describe_execution(plan).split()[0] in s for s in texts)  # the kernel is named


def test_picture_formats(tmp_path):
    k = spfuse.compile("y[i] = A[i,j] * x[j]", A="csr")
    for suffix, magic in ((".png", b"\x89PNG"), (".pdf", b"%PDF")):
        out = tmp_path / f"plan{suffix}"
        k.explain(picture=str(out))
        assert out.read_bytes().startswith(magic)


def test_picture_with_operands_shows_extents(tmp_path):
    import numpy as np
    import scipy.sparse as sp
    A = sp.random_array((7, 5), density=0.5, format="csr", rng=0)
    k = spfuse.compile("y[i] = A[i,j] * x[j]", A=A)
    out = tmp_path / "plan.svg"
    k.explain(picture=out, x=np.ones(5))
    assert any(re.fullmatch(r"for i < 7 \(dense\).*", s) for s in _svg_texts(out))


def test_repr_html_is_the_report():
    k = spfuse.compile("y[i] = A[i,j] * x[j]", A="csr")
    page = k._repr_html_()
    assert page.startswith('<div class="spfuse-kernel">') and page.endswith("</pre></div>")
    assert html.escape("\n".join(k.explain().splitlines()[1:])) in page
