"""Trie-like fusion with legality (ReACT Algorithms 1 and 2).

At every level of the tree the children are connected by a small dependence
graph (flow edges through produced tensors, input edges through shared
inputs).  An edge is *fusion-preventing* when the two loops have
incompatible ranges: different extents or iteration masks, or a produced
tensor whose dimension is not the one the consumer reads at that loop (a
reduction loop of the producer, or a transposed read).  Algorithm 1 groups
children along non-preventing edges when no other path joins them (no
cycles); Algorithm 2 merges each group into its first loop (the host) and
recurses into the host -- only common prefixes are fused, as in a trie.
"""
from __future__ import annotations

from dataclasses import replace

from spfuse.ir.tree import Compute, Loop, Root

__all__ = ["trie_fuse", "find_fusion_groups", "ops_under"]


def ops_under(node) -> list:
    """Unit operations of the compute nodes below ``node`` (pre-order)."""
    if isinstance(node, Compute):
        return [node.op]
    return [op for c in getattr(node, "children", ()) for op in ops_under(c)]


def _reads(node) -> set[str]:
    return {r.name for op in ops_under(node) for r in op.refs}


def _writes(node) -> set[str]:
    return {op.out for op in ops_under(node)}


def _aligned(producer_loop: Loop, consumer_loop: Loop, producer_ops, consumer_ops, tensor: str) -> bool:
    """Can the loops over ``tensor``'s producer and consumer share one index?"""
    for p in producer_ops:
        if p.out != tensor:
            continue
        p_ix = producer_loop.bound(p.id)
        if p_ix is None or p_ix not in p.out_indices:
            return False  # a reduction loop of the producer: value not final yet
        dim = p.out_indices.index(p_ix)
        for c in consumer_ops:
            for ref in c.refs:
                if ref.name != tensor:
                    continue
                c_ix = consumer_loop.bound(c.id)
                if c_ix is None or ref.indices[dim] != c_ix or ref.indices.count(c_ix) != 1:
                    return False
    return True


def _shared_input_aligned(a: Loop, b: Loop, a_ops, b_ops, tensor: str) -> bool:
    dims_a = {ref.indices.index(a.bound(op.id)) for op in a_ops for ref in op.refs
              if ref.name == tensor and a.bound(op.id) in ref.indices}
    dims_b = {ref.indices.index(b.bound(op.id)) for op in b_ops for ref in op.refs
              if ref.name == tensor and b.bound(op.id) in ref.indices}
    return bool(dims_a & dims_b)


def _edges(children) -> dict[tuple[int, int], bool]:
    """Dependence edges ``(a, b) -> fusion_preventing`` between sibling positions."""
    edges: dict[tuple[int, int], bool] = {}
    ops = [ops_under(c) for c in children]
    writes = [_writes(c) for c in children]
    reads = [_reads(c) for c in children]
    for a in range(len(children)):
        for b in range(a + 1, len(children)):
            flow = writes[a] & reads[b]
            shared = (reads[a] & reads[b]) - writes[a] - writes[b]
            if not flow and not shared:
                continue
            x, y = children[a], children[b]
            ok = (isinstance(x, Loop) and isinstance(y, Loop) and x.extent == y.extent
                  and x.mask == y.mask)
            if flow:
                edges[(a, b)] = not (ok and all(_aligned(x, y, ops[a], ops[b], t) for t in flow))
            elif ok and any(_shared_input_aligned(x, y, ops[a], ops[b], t) for t in shared):
                # An input dependence never constrains legality; it is an edge
                # (a reason to fuse, for locality) only when both loops walk
                # the shared input along the same dimension.
                edges[(a, b)] = False
    return edges


def find_fusion_groups(n: int, edges: dict[tuple[int, int], bool]) -> list[list[int]]:
    """Algorithm 1: fusible groups of ``n`` nodes in topological (program) order.

    A node joins its predecessor's group along a non-preventing edge unless
    another path connects them (fusing would create a cycle).

    >>> find_fusion_groups(3, {(0, 1): True, (1, 2): False, (0, 2): False})  # Listing 9
    [[0], [1, 2]]
    """
    head = list(range(n))
    # the graph of groups, kept up to date as groups merge (each node its
    # own group at first): successor and predecessor groups per group root
    gsucc: dict[int, set[int]] = {v: set() for v in range(n)}
    gpred: dict[int, set[int]] = {v: set() for v in range(n)}
    for a, b in edges:
        if a != b:
            gsucc[a].add(b)
            gpred[b].add(a)
    preventing = [e for e, p in edges.items() if p]
    ordered = sorted(edges.items())

    def find(x):
        while head[x] != x:
            x = head[x]
        return x

    def other_path(src, dst):
        # Is dst reachable from src without taking the direct edge src -> dst?
        stack = [s for s in gsucc[src] if s != dst]
        seen = set(stack)
        while stack:
            v = stack.pop()
            if v == dst:
                return True
            for w in gsucc[v]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        return False

    def merge(g, gb):
        head[gb] = g
        for p in gpred.pop(gb):
            gsucc[p].discard(gb)
            if p != g:
                gsucc[p].add(g)
                gpred[g].add(p)
        for q in gsucc.pop(gb):
            gpred[q].discard(gb)
            if q != g:
                gpred[q].add(g)
                gsucc[g].add(q)
        gsucc[g].discard(gb)
        gpred[g].discard(gb)

    # The answers for a pair of groups change only when groups merge, so a
    # refused pair is not checked again until then (an adjoint's hundreds of
    # ops re-walked the whole graph for every edge between two groups).
    for node in range(n):
        g = find(node)
        refused: set[int] = set()
        for (a, b), prevents in ordered:
            if prevents or find(a) != g:
                continue
            gb = find(b)
            if gb == g or gb in refused:
                continue
            # every edge between the two groups must be fusible
            if any({find(x), find(y)} == {g, gb} for x, y in preventing) or other_path(g, gb):
                refused.add(gb)
                continue
            merge(g, gb)
            refused.clear()
    groups: dict[int, list[int]] = {}
    for v in range(n):
        groups.setdefault(find(v), []).append(v)
    return sorted(groups.values(), key=lambda m: m[0])


def _topological(groups: list[list[int]], edges) -> list[list[int]]:
    """Order groups so every edge goes forward (stable by first member)."""
    gid = {v: k for k, g in enumerate(groups) for v in g}
    preds = {k: {gid[a] for (a, b) in edges if gid[b] == k and gid[a] != k} for k in range(len(groups))}
    done: list[int] = []
    remaining = list(range(len(groups)))
    while remaining:
        k = next(k for k in remaining if preds[k] <= set(done))
        done.append(k)
        remaining.remove(k)
    return [groups[k] for k in done]


def _fuse_children(children) -> tuple:
    edges = _edges(children)
    out: list = []
    for group in _topological(find_fusion_groups(len(children), edges), edges):
        host = children[group[0]]
        if len(group) == 1 or not isinstance(host, Loop):
            out.extend(children[g] for g in group)
            continue
        kids = list(host.children)
        binds = set(host.binds)
        for g in group[1:]:
            kids.extend(children[g].children)
            binds |= children[g].binds
        host = replace(host, children=_fuse_children(tuple(kids)), binds=frozenset(binds))
        out.append(host)
    return tuple(out)


def trie_fuse(root: Root) -> Root:
    """Algorithm 2 applied from the root down.

    >>> from spfuse.ir.ops import Ref, UnitOp
    >>> from spfuse.ir.masks import TRUE
    >>> from spfuse.ir.tree import loop_shape
    >>> p = UnitOp(0, "T", ("i",), "*", (Ref("B", ("i",)), Ref("C", ("i",))))
    >>> c = UnitOp(1, "A", ("i",), "+", (Ref("T", ("i",)), Ref("D", ("i",))))
    >>> def chain(op): return Loop("i", 4, TRUE, frozenset({(op.id, "i")}), (Compute(op),))
    >>> loop_shape(trie_fuse(Root((chain(p), chain(c)))))
    [('i', ['T', 'A'])]
    """
    return Root(_fuse_children(root.children))
