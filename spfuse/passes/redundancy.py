"""Which of ReACT's four redundancies a plan contains, and what it costs.

* **reduction**: a factor that does not use a summed index is multiplied
  inside that sum's loop (maximal fusion of SDDMM multiplies B[i,j] K times);
* **loop-invariant**: a product of operands is recomputed inside a loop over
  an output index it does not depend on (GNN-1's ``A·X`` inside ``j``);
* **load-store**: a temporary is stored whole and loaded back;
* **dead-value**: an operation computes values no consumer reads (the
  library SDDMM forms all of ``C·D``).

Costs count loop iterations of every statement, symbolically (``nnz(B)·K``)
and, when extents and nnz are known, numerically.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from spfuse.frontend.ast import Access, Binary, Literal, Unary, Where
from spfuse.ir.ops import TensorInfo
from spfuse.ir.tree import Loop, Root, paths_to_computes
from spfuse.passes.iteration_space import atom_tensor

__all__ = ["RedundancyReport", "analyse", "path_cost", "asymptotic", "dominated"]

KINDS = ("reduction", "loop-invariant", "load-store", "dead-value")


@dataclass(frozen=True)
class RedundancyReport:
    """Redundancies present (kind → list of reasons) and the cost of a plan."""

    present: Mapping[str, tuple[str, ...]]
    terms: tuple[tuple[str, ...], ...]
    estimate: float | None

    @property
    def cost_text(self) -> str:
        return asymptotic(self.terms)


def _symbol(loop: Loop) -> str:
    return loop.index.upper()


def _vars(e) -> set[str]:
    if isinstance(e, Access):
        return set(e.indices)
    if isinstance(e, Binary):
        return _vars(e.left) | _vars(e.right)
    if isinstance(e, Unary):
        return _vars(e.arg)
    if isinstance(e, Where):
        return _vars(e.cond) | _vars(e.then) | _vars(e.other)
    return set()


def _compound_subexpressions(e):
    """Proper sub-expressions combining two or more operands."""
    kids = (e.left, e.right) if isinstance(e, Binary) else (e.arg,) if isinstance(e, Unary) else \
        (e.cond, e.then, e.other) if isinstance(e, Where) else ()
    for k in kids:
        if isinstance(k, (Binary, Where)) or (isinstance(k, Unary) and not isinstance(k.arg, (Access, Literal))):
            yield k
        yield from _compound_subexpressions(k)


def _factors(e):
    if isinstance(e, Binary) and e.op == "*":
        return _factors(e.left) + _factors(e.right)
    return [e]


def path_cost(path: tuple[Loop, ...], ops_by_id, infos: Mapping[str, TensorInfo],
              atoms: Mapping[str, tuple]) -> tuple[str, ...]:
    """Symbolic iteration count of a statement under ``path``: a tuple of factors."""
    factors: list[str] = []
    absorbed: set[int] = set()
    sparse_groups: dict[str, list[Loop]] = {}
    for loop in path:
        if not loop.mask.is_true:
            key = " ∨ ".join(sorted(" ∧ ".join(sorted({atoms[a][1] if a in atoms else a for a in t}))
                                    for t in loop.mask.terms))
            sparse_groups.setdefault(key, []).append(loop)
    for key, loops in sparse_groups.items():
        tensors = {atom_tensor(a, atoms) for a in loops[0].mask.atoms}
        # Dense outer levels of a masking tensor (CSR's rows) are part of its
        # nnz; its indices bound by another sparse loop (SpGEMM's j, driven
        # by A, is B's row) leave an average fiber per outer coordinate.
        mine, outer = set(), []
        for n, loop in enumerate(path):
            if loop in loops:
                continue
            for op_id, ix in loop.binds:
                for ref in ops_by_id[op_id].refs:
                    info = infos.get(ref.name)
                    if ref.name in tensors and info is not None and ix in ref.indices:
                        if loop.mask.is_true and not info.mode_is_compressed(ref.indices.index(ix)):
                            mine.add(n)
                        elif not loop.mask.is_true and loop not in outer:
                            outer.append(loop)
        ndims = [infos[t].ndim for t in tensors if t in infos]
        if ndims and len(loops) + len(mine) + len(outer) < min(ndims):
            if len(loops) > 1 and not outer and _storage_prefix(loops, tensors, infos, atoms):
                # X's top levels (i, j of a CSF): one iteration per stored
                # fiber, as MTTKRP's consumer of the hoisted row visits them
                # (at most nnz and the product of the loops' extents; one
                # level alone stays its extent).
                absorbed |= mine
                factors.append(f"fibers({key}; {'·'.join(_symbol(lp) for lp in loops)})")
                continue
            # A projection (A's columns k, without A's rows around them): at
            # most the loops' extents, not nnz -- count them as dense.
            factors.extend(_symbol(lp) for lp in loops)
            continue
        absorbed |= mine
        if outer:
            factors.append(f"nnz({key})/" + "·".join(_symbol(lp) for lp in outer))
            continue
        full = any(len(loops) >= sum(1 for lv in infos[t].levels if lv == "compressed")
                   for t in tensors if t in infos)
        factors.append(f"nnz({key})" if full else f"fibers({key})")
    for n, loop in enumerate(path):
        if loop.mask.is_true and n not in absorbed:
            factors.append(_symbol(loop))
    return tuple(sorted(factors))


def _storage_prefix(loops, tensors, infos, atoms) -> bool:
    """Do ``loops`` iterate the top storage levels of every masking tensor
    (levels above the deepest one they iterate are iterated or dense)?"""
    for t in tensors:
        info = infos.get(t)
        if info is None:
            return False
        levels = {info.level_of_mode(atoms[a][3]) for lp in loops for a in lp.mask.atoms
                  if a in atoms and atoms[a][1] == t}
        if not levels or any(lv not in levels and info.levels[lv] != "dense" for lv in range(max(levels))):
            return False
    return True


def dominated(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Is term ``a`` at most term ``b`` (multiset inclusion)?"""
    ca, cb = Counter(a), Counter(b)
    return all(cb[k] >= v for k, v in ca.items())


def asymptotic(terms) -> str:
    """``O(...)`` of a sum of terms, dropping dominated ones.

    >>> asymptotic([("K", "nnz(B)"), ("nnz(B)",)])
    'O(K·nnz(B))'
    """
    uniq = sorted(set(terms))
    keep = [t for t in uniq if not any(t != o and dominated(t, o) for o in uniq)]
    return "O(" + " + ".join("·".join(t) or "1" for t in keep) + ")"


def _estimate(terms, extents: Mapping[str, int | None], infos, atoms) -> float | None:
    total = 0.0
    for t in terms:
        v = 1.0
        for f in t:
            if f.startswith(("nnz(", "fibers(")):
                f, _, per = f.partition("/")  # nnz(B)/J: B's entries per coordinate of J
                inner, _, over = f[f.index("(") + 1:-1].partition(";")  # fibers(X; I·J)
                bound = 1.0
                for sym in filter(None, over.strip().split("·")):
                    e = extents.get(sym)
                    if e is None:
                        return None
                    bound *= e
                nn = [infos[a].nnz for a in inner.replace("∧", " ").replace("∨", " ").split() if a in infos]
                if not nn or any(x is None for x in nn):
                    return None
                v *= (min(nn) if "∨" not in inner else sum(nn)) if not over else min(min(nn), bound)
                for sym in filter(None, per.split("·")):
                    e = extents.get(sym)
                    if e is None:
                        return None
                    v /= max(e, 1)
            else:
                e = extents.get(f)
                if e is None:
                    return None
                v *= e
        total += v
    return total


def analyse(root: Root, ops, infos: Mapping[str, TensorInfo], final_masks, temporaries,
            extents: Mapping[str, int | None], atoms: Mapping[str, tuple] = {}) -> RedundancyReport:
    """Redundancies and cost of one plan tree.

    ``final_masks`` are the propagated masks (what each op must compute);
    ``temporaries`` the storage decided for each temporary.
    """
    ops_by_id = {op.id: op for op in ops}
    paths = paths_to_computes(root)
    present: dict[str, list[str]] = {k: [] for k in KINDS}
    terms = []
    for op_id, path in paths.items():
        op = ops_by_id[op_id]
        terms.append(path_cost(path, ops_by_id, infos, atoms))
        expr = getattr(op, "expr", None)
        loops = {loop.bound(op_id): loop for loop in path}
        if op.reduction == "sum":
            factors = _factors(expr) if expr is not None else list(op.args) if op.operator == "*" else []
            for k in op.reduced:
                for f in factors:
                    fv = _vars(f) if expr is not None else set(getattr(f, "indices", ()))
                    if k not in fv and not isinstance(f, Literal) and getattr(f, "value", 1) is not None:
                        present["reduction"].append(f"S{op_id}: factor independent of {k} multiplied in the {k} loop")
                        break
        if expr is not None:
            for sub in _compound_subexpressions(expr):
                missing = [ix for ix in loops if ix in op.out_indices and ix not in _vars(sub)]
                if missing:
                    present["loop-invariant"].append(f"S{op_id}: a product not using {missing[0]} "
                                                     f"recomputed in the {missing[0]} loop")
                    break
        for ix, loop in loops.items():
            want = final_masks.get(op_id, {}).get(ix)
            if want is not None and loop.mask != want and (loop.mask | want) == loop.mask:
                present["dead-value"].append(f"S{op_id}: iterates {ix} over {loop.mask}, only {want} is used")
                break
    for t in temporaries.values():
        if t.kept == t.dims and t.dims:
            present["load-store"].append(f"{t.name}[{','.join(t.dims)}] stored whole and reloaded")
    return RedundancyReport({k: tuple(v) for k, v in present.items()}, tuple(terms),
                            _estimate(terms, extents, infos, atoms))
