"""Gradient oracle: torch's dense autograd over densified operands.

A torch twin of :func:`spfuse.testing.dense_reference` (axes aligned by
index name, statement by statement, float64).  Division is plain ``a / b``:
the tests keep denominators away from 0, where spfuse's ``0/x = 0`` and
IEEE agree in value and in derivative.  ``max``/``min`` use
``torch.amax``/``torch.amin``, whose backward splits the gradient evenly
between ties -- the rule spfuse's adjoint mirrors.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from spfuse.frontend.ast import Access, Binary, Literal, Reduce, Unary, Where
from spfuse.frontend.check import check_program
from spfuse.frontend.parser import parse_program
from spfuse.frontend.reductions import make_reductions_explicit
from spfuse.testing import densify

torch = __import__("pytest").importorskip("torch")

_UNARY = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
          "log": torch.log, "abs": torch.abs, "sqrt": torch.sqrt, "neg": torch.neg}


def _expand(t, idx, union):
    if idx == union:
        return t
    order = sorted(range(len(idx)), key=lambda a: union.index(idx[a]))
    t = t.permute(order) if order else t
    shape, it, present = [], iter(t.shape), set(idx)
    for k in union:
        shape.append(next(it) if k in present else 1)
    return t.reshape(shape)


def _union(*idxs):
    out = {}
    for idx in idxs:
        out.update(dict.fromkeys(idx))
    return tuple(out)


def _eval(e, env, ext):
    if isinstance(e, Access):
        return env[e.name], e.indices
    if isinstance(e, Literal):
        return torch.tensor(float(e.value), dtype=torch.float64), ()
    if isinstance(e, Binary):
        a, ai = _eval(e.left, env, ext)
        b, bi = _eval(e.right, env, ext)
        u = _union(ai, bi)
        a, b = _expand(a, ai, u), _expand(b, bi, u)
        return {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": torch.div}[e.op](a, b), u
    if isinstance(e, Unary):
        a, ai = _eval(e.arg, env, ext)
        return _UNARY[e.fn](a), ai
    if isinstance(e, Where):
        parts = [_eval(c, env, ext) for c in (e.cond, e.then, e.other)]
        u = _union(*(p[1] for p in parts))
        c, a, b = (_expand(p[0], p[1], u) for p in parts)
        c, a, b = torch.broadcast_tensors(c, a, b)
        return torch.where(c != 0, a, b), u
    if isinstance(e, Reduce):
        a, ai = _eval(e.body, env, ext)
        axis = ai.index(e.index)
        rest = ai[:axis] + ai[axis + 1:]
        full = [ext[k] for k in ai]
        a = a.expand(full) if list(a.shape) != full else a
        if e.op == "sum":
            return a.sum(dim=axis), rest
        return (torch.amax(a, dim=axis) if e.op == "max" else torch.amin(a, dim=axis)), rest
    raise TypeError(e)


def torch_vjp(text_or_program, cotangents: Mapping[str, Any], wrt, operands: Mapping[str, Any]):
    """Forward results and the dense gradients ``{name: ndarray}`` of
    ``sum(result * cotangent)`` with respect to ``wrt`` (densified operands)."""
    program = (parse_program(text_or_program) if isinstance(text_or_program, str)
               else make_reductions_explicit(text_or_program))
    dense = {n: densify(v) for n, v in operands.items()}
    ext = check_program(program, {n: v.shape for n, v in dense.items()})
    leaves = {n: torch.tensor(v, dtype=torch.float64, requires_grad=n in wrt) for n, v in dense.items()}
    env = dict(leaves)
    for st, e in zip(program.statements, ext, strict=True):
        t, idx = _eval(st.value, env, e)
        t = _expand(t, idx, st.target.indices)
        env[st.target.name] = t.expand([e[k] for k in st.target.indices])
    loss = torch.zeros((), dtype=torch.float64)
    for name, cot in cotangents.items():
        loss = loss + (env[name] * torch.tensor(densify(cot), dtype=torch.float64)).sum()
    grads = {}
    if loss.requires_grad:
        got = torch.autograd.grad(loss, [leaves[n] for n in wrt], allow_unused=True)
        grads = {n: (g.numpy() if g is not None else np.zeros(dense[n].shape)) for n, g in zip(wrt, got, strict=True)}
    else:
        grads = {n: np.zeros(dense[n].shape) for n in wrt}
    results = {n: env[n].detach().numpy() for n in program.results}
    return results, grads
