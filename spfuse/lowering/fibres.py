"""Sums over the fibres sparse operands share, as sums over one fibre index.

In ``grad_D[l,m] = sum(i, j, G[i,j,m] * A[i,j,l])`` with ``G`` and ``A``
stored (compressed, compressed, dense) on the *same* ``(i,j)`` fibres (an
adjoint of SpTTM-SpTTM: the cotangent and a kept temporary both live on the
fibres of the forward's tensor), the pair ``(i,j)`` only ever names a stored
fibre.  Numbering the fibres ``f = 0 .. nfib-1`` turns each operand into a
tensor with one dense leading level over the fibres and the same levels
below (the same arrays, no copy)::

    grad_D[l,m] = sum(f, G[f,m] * A[f,l])        # G, A: nfib × M, nfib × L dense: a GEMM

and ``grad_c[k] = sum(i, j, dA[i,j] * X[i,j,k])`` (TTV's adjoint) becomes
``sum(f, dA[f] * X[f,k])``, a transposed SpMV of X's fibres as a CSR matrix.
The flattened statement reaches template kernels the original (on the
generic executor, iterating the fibres as an intersection of patterns)
does not.

Structure, decided once per program and formats (:func:`shared_fibres`):
the sparse operands lead with compressed levels over the same indices; those
indices are summed (by one run of nested ``sum`` reductions), appear in no
other access, and the summand is zero wherever those operands store nothing
(a product with one of them, say), so fibres none of them stores contribute
nothing.  Per call (:meth:`FibreFlattening.operands`): the operands store
the same fibres (equal index arrays), else the original program runs.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from spfuse.formats import Format
from spfuse.frontend.ast import Access, Assignment, Binary, Expr, Program, Reduce, Unary, Where, iter_accesses
from spfuse.frontend.canonical import to_text
from spfuse.frontend.parser import parse_program
from spfuse.frontend.reductions import children, map_children
from spfuse.passes.rename import all_indices
from spfuse.tensor import CompressedLevel, DenseLevel, Tensor

__all__ = ["FibreFlattening", "shared_fibres"]

#: unary functions with f(0) = 0: a summand they wrap is still zero off the fibres
_ZERO_PRESERVING = frozenset({"neg", "relu", "tanh", "abs", "sqrt"})


@dataclass(frozen=True)
class FibreFlattening:
    """The flattened ``program`` and the operands flattened: each in ``sparse``
    loses its ``depth`` leading levels to one dense level over their fibres."""

    program: Program
    depth: int
    sparse: tuple[str, ...]

    def describe(self) -> str:
        """The flattening in words, for ``explain()``.

        >>> print(shared_fibres(parse_program("c[k] = sum(i, j, X[i,j,k] * Y[i,j,k])"),
        ...                     {"X": Format.csf((0, 1, 2)), "Y": Format.csf((0, 1, 2))}).describe())
        when X, Y store the same fibres of their 2 leading levels (checked per call): c[k] = sum(f, X[f, k] * Y[f, k])
        """
        return (f"when {', '.join(self.sparse)} store the same fibres of their {self.depth} leading levels "
                f"(checked per call): {self.program.text}")

    def operands(self, tensors: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
        """The operands of :attr:`program` (views of ``tensors``' arrays), or
        None when the sparse operands do not store the same fibres.

        >>> import numpy as np
        >>> X = Tensor.from_numpy(np.arange(8.0).reshape(2, 2, 2) % 3, "csf")
        >>> flat = shared_fibres(parse_program("c[k] = sum(i, j, X[i,j,k] * X[i,j,k])"), {"X": X.format})
        >>> flat.program.text
        'c[k] = sum(f, X[f, k] * X[f, k])'
        >>> t = flat.operands({"X": X})["X"]
        >>> t.shape, t.format.levels
        ((4, 2), ('dense', 'compressed'))
        """
        first = tensors[self.sparse[0]].levels
        for name in self.sparse[1:]:
            levels = tensors[name].levels
            for a, b in zip(first[:self.depth], levels[:self.depth], strict=True):
                if not (isinstance(b, CompressedLevel) and _same(a.pos, b.pos) and _same(a.crd, b.crd)):
                    return None
        out = dict(tensors)
        for name in self.sparse:
            out[name] = _flattened(tensors[name], self.depth)
        return {n: out[n] for n in self.program.inputs}


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a is b or (len(a) == len(b) and bool(np.array_equal(a, b)))


def _flattened(t: Tensor, depth: int) -> Tensor:
    """``t`` with its ``depth`` leading (compressed) levels as one dense level over their stored fibres."""
    fibres = len(t.levels[depth - 1].crd)
    rest = t.format.storage_shape(t.shape)[depth:]
    levels = t.format.levels[depth:]
    if all(lv == "dense" for lv in levels):
        return Tensor._trusted((fibres, *rest), Format.dense(1 + len(rest)), (DenseLevel(fibres),) + tuple(
            DenseLevel(e) for e in rest), t.values)
    return Tensor._trusted((fibres, *rest), Format(("dense", *levels)), (DenseLevel(fibres), *t.levels[depth:]),
                           t.values)


def _leading(a: Access, fmt: Format) -> tuple[str, ...]:
    """The indices of ``a``'s leading compressed levels, outermost first."""
    out = []
    for level, mode in zip(fmt.levels, fmt.mode_order, strict=True):
        if level != "compressed":
            break
        out.append(a.indices[mode])
    return tuple(out)


def _vanishes(e: Expr, sparse: frozenset, fibre: frozenset) -> bool:
    """Is ``e`` zero wherever the ``sparse`` operands store nothing?"""
    if isinstance(e, Access):
        return e.name in sparse
    if isinstance(e, Binary):
        left, right = _vanishes(e.left, sparse, fibre), _vanishes(e.right, sparse, fibre)
        if e.op == "*":
            return left or right
        if e.op == "/":
            return left   # 0 / x is 0 in spfuse (and in its oracle)
        return left and right
    if isinstance(e, Unary):
        return e.fn in _ZERO_PRESERVING and _vanishes(e.arg, sparse, fibre)
    if isinstance(e, Reduce):
        return e.op == "sum" and e.pattern is None and _vanishes(e.body, sparse, fibre)
    if isinstance(e, Where):
        return _vanishes(e.then, sparse, fibre) and _vanishes(e.other, sparse, fibre)
    return False


def _fibre_sums(e: Expr, fibre: frozenset):
    """The outermost run of nested ``sum`` reductions binding exactly ``fibre``
    (with any other sums inside it), as ``(node, body)``; None if there is none."""
    if isinstance(e, Reduce) and e.index in fibre:
        bound, body = set(), e
        while isinstance(body, Reduce) and body.op == "sum" and body.pattern is None and body.index in fibre:
            bound.add(body.index)
            body = body.body
        return (e, body) if bound == fibre else None
    for child in children(e):
        found = _fibre_sums(child, fibre)
        if found is not None:
            return found
    return None


def shared_fibres(program: Program, formats: Mapping[str, Format]) -> FibreFlattening | None:
    """The flattening of a one-statement ``program`` over its sparse operands'
    shared leading fibres, or None when it does not apply (see the module);
    ``formats``: each operand's storage format.

    >>> X = Format.csf((0, 1, 2))
    >>> shared_fibres(parse_program("c[k] = sum(i, j, X[i,j,k])"), {"X": X}).program.text
    'c[k] = sum(f, X[f, k])'
    >>> shared_fibres(parse_program("A[i,k] = sum(j, X[i,j,k])"), {"X": X}) is None   # i is not summed
    True
    """
    if len(program.statements) != 1:
        return None
    st = program.statements[0]
    accesses = list(iter_accesses(st.value))
    fmts = {a.name: formats[a.name] for a in accesses if a.name in formats}
    sparse = [a for a in accesses if a.name in fmts and not fmts[a.name].is_dense]
    if not sparse or len(fmts) != len({a.name for a in accesses}):
        return None
    lead = [_leading(a, fmts[a.name]) for a in sparse]
    # the longest common run of leading indices summed and read by no dense operand
    kept = set(st.target.indices).union(*(a.indices for a in accesses if fmts[a.name].is_dense))
    depth = 0
    while all(len(seq) > depth and seq[depth] == lead[0][depth] for seq in lead) and lead[0][depth] not in kept:
        depth += 1
    fibre = frozenset(lead[0][:depth])
    if not depth or len(fibre) != depth:
        return None
    if any(sum(ix in fibre for ix in a.indices) != depth for a in sparse):
        return None   # (each leads with the fibre indices: read again elsewhere in it, no)
    names = frozenset(a.name for a in sparse)
    found = _fibre_sums(st.value, fibre)
    if found is None or not _vanishes(found[1], names, fibre):
        return None
    # every fibre index bound by that one run of sums, every sparse read under it
    if sum(node.index in fibre for node in _reductions(st.value)) != depth or sum(
            a.name in names for a in iter_accesses(found[1])) != len(sparse):
        return None
    taken = all_indices(st.value) | set(st.target.indices) | {
        node.index for node in _reductions(st.value)}
    index = next(n for n in ("f", "fibre", *(f"f{k}" for k in range(100))) if n not in taken)

    def flat(e: Expr) -> Expr:
        if isinstance(e, Access) and e.name in names:
            fmt = fmts[e.name]
            rest = tuple(e.indices[m] for m in fmt.mode_order[depth:])
            return Access(e.name, (index, *rest))
        if e is found[0]:
            return Reduce("sum", index, flat(found[1]))
        return map_children(e, flat)

    value = flat(st.value)
    text = to_text(Program((Assignment(st.target, value),)))
    return FibreFlattening(parse_program(text), depth, tuple(dict.fromkeys(a.name for a in sparse)))


def _reductions(e: Expr):
    if isinstance(e, Reduce):
        yield e
    for child in children(e):
        yield from _reductions(child)
