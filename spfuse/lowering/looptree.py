"""Lower a :class:`~spfuse.planner.Plan` to the generic loop-tree executor.

Every loop of the final index tree becomes a loop of the executor: dense when
its iteration mask is ``true``, an intersection (∧) or union (∨) over the
accesses that realise its mask otherwise.  A mask can name a tensor the
statement never reads (SDDMM's ``C·D`` is restricted to B's pattern by
propagation): the loop then co-iterates an extra *mask access* of that
tensor, bound through the consumer that propagated it.  Temporaries become
dense buffers of their kept dimensions (thread-private when dimension-reduced);
results become dense buffers, outputs sharing an input's pattern (SDDMM), or
coordinate lists canonicalised afterwards (SpGEMM, SpAdd).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from spfuse.formats import Format, as_format
from spfuse.ir.ops import Const, Ref
from spfuse.ir.tree import Compute, Loop, Reset, iter_nodes
from spfuse.memo import attached_dict
from spfuse.passes.iteration_space import sparse_reduction
from spfuse.passes.mask_drivers import MaskDrivers
from spfuse.passes.memory import RESET_VALUE
from spfuse.runtime import looptree as lt
from spfuse.tensor import Tensor

__all__ = ["LoweredProgram", "Binding", "lower_to_looptree", "lower_cached", "OutputSpec"]


_INT32, _INT64, _FLOAT64 = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float64)


@dataclass(frozen=True)
class OutputSpec:
    """How a result comes out of the executor: ``kind`` is dense, pattern or coo."""

    name: str
    kind: str
    shape: tuple[int, ...]
    pattern_of: Any | None = None  # the Tensor whose pattern a "pattern" output shares


@dataclass(frozen=True)
class Binding:
    """Where a lowered program's arrays come from: the call's operands.

    ``sources`` are ``(operand name, mode order it is converted to or None)``;
    ``index_slots`` ``(slot, source, level, 2 pos | 3 crd)``; ``value_slots``
    ``(slot, source)``; ``patterns`` ``(buffer, source)`` for pattern outputs
    (sized by the source's stored entries); ``pattern_specs`` ``(output
    position, source)``.  With it a lowering is reused for every call with
    the same plan and operand signature: only the arrays change."""

    sources: tuple
    index_slots: tuple
    value_slots: tuple
    patterns: tuple
    pattern_specs: tuple
    scalars: tuple = ()   # (buffer, operand name): 0-d operands, read from their buffers' initial values


@dataclass(frozen=True)
class LoweredProgram:
    plan: Any  # LoopTreePlan
    outputs: tuple[OutputSpec, ...]
    transposed: tuple[str, ...]  # operands converted to a concordant mode order
    binding: Binding | None = None
    #: the plan's index each executor variable loops over (``"i0" -> "i"``)
    indices: Mapping[str, str] = field(default_factory=dict)

    def rebind(self, operands: Mapping[str, Any]) -> LoweredProgram:
        """This lowering over another call's operands (same signature).
        Index arrays are taken as they are (the executor reads int32 and
        int64), values as float64."""
        b = self.binding
        if b is None:
            raise ValueError("only a lowering with a Binding (lower_cached's) can be rebound")
        tensors = []
        for name, want in b.sources:
            t = operands[name]
            if want is not None:
                t = t.asformat(Format(tuple(t.format.levels), want))
            tensors.append(t)
        # spfuse Tensors (every operand of a call) are read directly; anything
        # else goes through the runtime's general normalisation
        levels = [None if isinstance(t, Tensor) else lt.as_level_tensor(t, check=False) for t in tensors]
        index = list(self.plan.index_arrays)
        values = list(self.plan.value_arrays)
        for slot, src, lev, k in b.index_slots:
            lt_src = levels[src]
            if lt_src is not None:
                index[slot] = lt_src.levels[lev][k]
                continue
            level = tensors[src]._levels[lev]
            arr = level.pos if k == 2 else level.crd
            # (a Tensor's arrays are 1-D and contiguous: only the dtype may differ)
            index[slot] = arr if arr.dtype == _INT64 or arr.dtype == _INT32 else arr.astype(_INT64)
        for slot, src in b.value_slots:
            lt_src = levels[src]
            if lt_src is not None:
                values[slot] = lt_src.values
            else:
                arr = tensors[src]._values
                values[slot] = arr if arr.dtype == _FLOAT64 else arr.astype(_FLOAT64)
        sizes, shapes = self.plan.buf_size, self.plan.buf_shapes
        if b.patterns:
            sizes, shapes = sizes.copy(), list(shapes)
            for buf, src in b.patterns:
                src_values = tensors[src]._values if levels[src] is None else levels[src].values
                sizes[buf] = len(src_values)
                shapes[buf] = (int(sizes[buf]),)
            shapes = tuple(shapes)
        inits = None
        if b.scalars:
            scalar_inits = list(self.plan.buf_inits)
            for buf, name in b.scalars:
                scalar_inits[buf] = float(np.asarray(operands[name].todense()))
            inits = tuple(scalar_inits)
        plan = lt.rebound(self.plan, tuple(index), tuple(values), sizes, shapes, inits)
        outputs = self.outputs
        if b.pattern_specs:
            specs = list(outputs)
            for k, src in b.pattern_specs:
                specs[k] = replace(specs[k], pattern_of=tensors[src])
            outputs = tuple(specs)
        bound = object.__new__(LoweredProgram)  # (frozen: __init__ would setattr field by field)
        bound.__dict__.update(plan=plan, outputs=outputs, transposed=self.transposed, binding=b)
        return bound

    def results(self, raw: Mapping[str, Any]) -> dict:
        """The executor's raw outputs (``lt.run``'s dict) as arrays and Tensors."""
        out = {}
        for spec in self.outputs:
            v = raw[spec.name]
            if spec.kind == "dense":
                out[spec.name] = np.asarray(v)
            elif spec.kind == "pattern":
                out[spec.name] = spec.pattern_of.with_values(np.asarray(v))
            elif isinstance(v, lt.RowsResult) and len(spec.shape) == 2:
                out[spec.name] = _compressed_from_rows(v)
            else:  # canonical coordinates, sorted in the order the executor emitted them
                base = as_format("csr" if len(spec.shape) == 2 else "csf", len(spec.shape))
                fmt = Format(tuple(base.levels), v.order)
                coords = np.asarray(v.coords).reshape(len(spec.shape), -1)
                out[spec.name] = Tensor._assemble(coords[list(v.order)], np.asarray(v.values), spec.shape,
                                                  fmt, None, presorted=True)
        return out


def _compressed_from_rows(rows: lt.RowsResult):
    """A 2-D workspace result as CSR (rows flushed by row) or CSC (by column):
    the row pointer from the flushed rows' counts, no coordinate sort."""
    from spfuse.tensor import CompressedLevel, DenseLevel, Tensor
    outer, inner = (rows.shape[d] for d in rows.order)
    indptr = np.zeros(outer + 1, dtype=np.int64)
    indptr[rows.heads[:, 0] + 1] = rows.counts
    np.cumsum(indptr, out=indptr)
    levels = (DenseLevel(outer), CompressedLevel(inner, indptr, rows.ks))
    return Tensor._trusted(rows.shape, Format(("dense", "compressed"), rows.order), levels, rows.values)


class _Lowerer:
    def __init__(self, plan, operands: Mapping[str, Any]):
        self.plan = plan
        self.operands = operands
        self.b = lt.LoopTreeBuilder()
        self.ops = {op.id: op for op in plan.ops}
        self.vars: dict[int, Any] = {}          # id(Loop) -> Var
        self.op_vars: dict[int, dict[str, Any]] = {}
        self.paths: dict[int, list] = {}
        self.accesses: dict[tuple, Any] = {}
        self.converted: dict[tuple, Any] = {}
        self.transposed: list[str] = []
        self.sources: dict[int, tuple] = {}   # id(tensor accessed) -> (operand, conversion)
        self.scalars: dict[str, Any] = {}     # 0-d operand -> the 0-d buffer holding its value
        self.buffers: dict[str, Any] = {}
        self.targets: dict[str, Any] = {}
        self.outputs: list[OutputSpec] = []
        # Which accesses iterate the masks: the planner's decision, asked again
        # of the operands' planned storage (an operand stored otherwise is
        # converted to it by _concordant, so a propagated mask stays exact).
        self.drivers = MaskDrivers.of(plan)

    # -- variables ----------------------------------------------------------
    def declare_vars(self, nodes, path):
        for node in nodes:
            if isinstance(node, Loop):
                var = self.b.var(f"{node.index}{len(self.vars)}", node.extent)
                self.vars[id(node)] = var
                for op_id, ix in node.binds:
                    self.op_vars.setdefault(op_id, {})[ix] = var
                self.declare_vars(node.children, path + [node])
            elif isinstance(node, Compute):
                self.paths[node.op.id] = path

    # -- operands -----------------------------------------------------------
    def _concordant(self, name: str, ref_indices, op_id: int):
        """The operand with its modes stored in the order the loops visit them."""
        tensor = self.operands[name]
        want = self.drivers.visiting_order(op_id, ref_indices)
        have = tuple(tensor.format.mode_order)
        if want == have:
            self.sources[id(tensor)] = (name, None)
            return tensor
        key = (name, want)
        if key not in self.converted:
            self.converted[key] = tensor.asformat(Format(tuple(tensor.format.levels), want))
            self.sources[id(self.converted[key])] = (name, want)
            # the loop order was chosen with this transposition's cost (Plan.transpositions)
            planned = (name, have, want) in getattr(self.plan, "transpositions", {}).get(op_id, ())
            self.transposed.append(f"{name}: mode order {have} → {want}" + ("" if planned else " (unplanned)"))
        return self.converted[key]

    def access(self, op_id: int, ref: Ref):
        # One access per (tensor, loop variables): fused operations reading
        # the same tensor under the same loops share its positions.
        vars_ = tuple(self.op_vars[op_id][ix] for ix in ref.indices)
        key = (ref.name, tuple(v.id for v in vars_))
        if key not in self.accesses:
            tensor = self._concordant(ref.name, ref.indices, op_id)
            self.accesses[key] = self.b.access(tensor, vars_, name=ref.name, check=False)
        return self.accesses[key]

    # -- buffers and outputs -------------------------------------------------
    def declare_storage(self):
        plan = self.plan
        for op in plan.ops:
            shape = tuple(plan.shapes[op.out])
            if op.out in plan.temporaries:
                t = plan.temporaries[op.out]
                kept_shape = tuple(e for d, e in zip(t.dims, shape, strict=True) if d in t.kept)
                reduced = t.kept != t.dims
                init = 0.0 if t.reset_under is not None else RESET_VALUE[op.reduction]
                self.buffers[op.out] = self.b.buffer(kept_shape, name=op.out, private=reduced, init=init)
                continue
            self.targets[op.out] = self._result_target(op, shape)

    def _result_target(self, op, shape):
        path = self.paths[op.id]
        loops = {lp.bound(op.id): lp for lp in path}
        sparse_out = any(not loops[ix].mask.is_true for ix in op.out_indices)
        decided = self.plan.formats.get(op.out)
        if decided is not None and all(lv == "dense" for lv in decided.levels):
            sparse_out = False  # the formats pass stores it dense (a whole-result scatter)
        if not sparse_out:
            init = RESET_VALUE[op.reduction]
            buf = self.b.buffer(shape, name=op.out, init=init)
            self.outputs.append(OutputSpec(op.out, "dense", shape))
            self.buffers[op.out] = buf
            return None
        if op.reduction is None:
            # A result inside an input's pattern shares that pattern (SDDMM,
            # or x[i]*A[i,j]*x[j] through its product temporary): an operand
            # whose atom over the output's indices is in every mask term.
            sparse_loops = [loops[ix] for ix in op.out_indices if not loops[ix].mask.is_true]
            candidates = dict.fromkeys(
                Ref(self.plan.atoms[a][1], op.out_indices) for lp in sparse_loops for a in lp.mask.atoms
                if self.plan.atoms[a][0] == op.statement and self.plan.atoms[a][2] == op.out_indices)
            for r in tuple(op.refs) + tuple(candidates):
                tensor = self.operands.get(r.name)
                if tensor is None or r.indices != op.out_indices or "compressed" not in tensor.format.levels:
                    continue
                mine = {a for a, ref in self.plan.atoms.items() if ref[:3] == (op.statement, r.name, r.indices)}
                if all(all(term & mine for term in loops[ix].mask.terms) for ix in op.out_indices
                       if not loops[ix].mask.is_true):
                    acc = self.access(op.id, r)
                    pattern_tensor = self._concordant(r.name, r.indices, op.id)
                    self.outputs.append(OutputSpec(op.out, "pattern", shape, pattern_tensor))
                    return self.b.pattern_output(acc, name=op.out)
        out = self.b.coo_output(tuple(self.op_vars[op.id][ix] for ix in op.out_indices), name=op.out)
        self.outputs.append(OutputSpec(op.out, "coo", shape))
        return out

    # -- tree ----------------------------------------------------------------
    def leaf(self, op_id: int, leaf):
        if isinstance(leaf, Const):
            return lt.const(leaf.value)
        if leaf.name in self.buffers and leaf.name not in self.operands:
            return self.buffer_ref(op_id, leaf.name, leaf.indices)
        if not leaf.indices:  # a 0-d operand: a read-only 0-d buffer, set per call (see rebind)
            buf = self.scalars.get(leaf.name)
            if buf is None:
                value = float(np.asarray(self.operands[leaf.name].todense()))
                buf = self.scalars[leaf.name] = self.b.buffer((), name=f"{leaf.name}.scalar", init=value)
            return lt.BufferRef(buf, ())
        return self.access(op_id, leaf)

    def buffer_ref(self, op_id: int, name: str, indices):
        buf = self.buffers[name]
        t = self.plan.temporaries.get(name)
        kept = indices if t is None else tuple(ix for d, ix in zip(t.dims, indices, strict=True) if d in t.kept)
        vars_ = tuple(self.op_vars[op_id][ix] for ix in kept)
        return buf[vars_] if vars_ else buf[()]

    def ast_expr(self, op_id: int, e):
        """Lower a whole-statement AST (maximal fusion) to an executor expression."""
        from spfuse.frontend.ast import Access, Binary, Literal, Unary, Where
        if isinstance(e, Access):
            return self.leaf(op_id, Ref(e.name, e.indices))
        if isinstance(e, Literal):
            return lt.const(float(e.value))
        if isinstance(e, Binary):
            a, b = self.ast_expr(op_id, e.left), self.ast_expr(op_id, e.right)
            return {"+": a.__add__, "-": a.__sub__, "*": a.__mul__, "/": a.__truediv__}[e.op](b)
        if isinstance(e, Unary):
            return lt.unary(e.fn, self.ast_expr(op_id, e.arg))
        if isinstance(e, Where):
            return lt.where(*(self.ast_expr(op_id, c) for c in (e.cond, e.then, e.other)))
        raise TypeError(f"cannot lower {type(e).__name__} inside a fused statement")

    def expr(self, op):
        if hasattr(op, "expr"):
            return self.ast_expr(op.id, op.expr)
        args = [self.leaf(op.id, a) for a in op.args]
        o = op.operator
        if o is None:
            return args[0]
        if o == "+":
            return _linear(args, op.coefficients)
        if o == "-":
            return args[0] - args[1]
        if o == "*":
            return args[0] * args[1]
        if o == "/":
            return args[0] / args[1]
        if o == "where":
            return lt.where(*args)
        return lt.unary(o, args[0])

    def target(self, op):
        target = self.targets.get(op.out)
        return target if target is not None else self.buffer_ref(op.id, op.out, op.out_indices)

    def emit(self, nodes, bound: set):
        for node in nodes:
            if isinstance(node, Reset):
                self.reset(node, bound)
            elif isinstance(node, Compute):
                op = node.op
                self.b.statement(self.target(op), op.reduction or "assign", self.expr(op))
            else:
                var = self.vars[id(node)]
                kwargs = self._iteration(node, bound)
                fills = self._fills(node)
                for _, count in fills:
                    self.b.reset(count, 0.0)
                with self.b.loop(var, **kwargs):
                    self.emit(node.children, bound | {id(node)})
                    for _, count in fills:
                        self.b.statement(count, "sum", lt.const(1.0))
                for op, count in fills:
                    # the implicit zeros the loop skipped take part once, if there are any
                    skipped = lt.compare("<", count, lt.const(float(node.extent)))
                    self.b.statement(self.target(op), op.reduction,
                                     lt.where(skipped, lt.const(0.0), lt.const(RESET_VALUE[op.reduction])))

    def _fills(self, loop: Loop) -> list:
        """The max/min reductions over ``loop`` that iterate only where their
        body is stored (:func:`~spfuse.passes.iteration_space.sparse_reduction`),
        each with a counter of the visited positions."""
        if loop.mask.is_true:
            return []
        out = []
        for child in loop.children:
            if (isinstance(child, Compute) and sparse_reduction(child.op)
                    and loop.bound(child.op.id) == child.op.reduced[0]):
                out.append((child.op, self.b.buffer((), name=f"{child.op.out}__visited", private=True)))
        return out

    def reset(self, node: Reset, bound: set):
        """Clear a temporary; a sparsified one only on its stored positions
        (O(nnz of the row), not O(extent))."""
        t = self.plan.temporaries[node.tensor]
        buf = self.buffers[node.tensor]
        if all(m.is_true for m in t.masks) or not self.drivers.strict:
            # Unless every mask is iterated exactly (strict), a reader may
            # visit positions outside this iteration's pattern that an earlier
            # iteration wrote: clear the whole buffer.
            self.b.reset(buf, node.value)
            return
        loops = self.drivers.clearing_loops(t)

        def nest(k, bound):
            if k == len(loops):
                self.b.statement(self.buffer_ref(t.op_id, t.name, t.dims), "assign", lt.const(node.value))
                return
            loop, whole = loops[k]
            with self.b.loop(self.vars[id(loop)], **({} if whole else self._iteration(loop, bound))):
                nest(k + 1, bound | {id(loop)})

        nest(0, bound)

    def _iteration(self, loop: Loop, bound: set) -> dict:
        """The executor's iteration of ``loop`` (the enclosing loops ``bound``)."""
        way = self.drivers.iteration(loop, bound)
        if way is None:   # (plan_program planned without propagation where this happens)
            raise AssertionError(f"spfuse bug: the planner found no exact driver for the mask {loop.mask}")
        kind, drivers = way
        if kind == "dense":
            return {}
        accesses = []
        for d in drivers:
            access = self.access(d.op_id, d.ref)
            if access not in accesses:
                accesses.append(access)
        return {kind: accesses}


def _linear(args, coefs):
    """``c0*a0 + c1*a1 + ...`` evaluated left to right in one statement (the
    executor's union loop co-iterates every term at once); a -1 coefficient
    subtracts and a 1 adds, rounding exactly like the text's ``-``/``+``."""
    out = None
    for a, c in zip(args, coefs, strict=True):
        if out is None:
            out = a if c == 1.0 else -a if c == -1.0 else lt.const(c) * a
        elif c == 1.0:
            out = out + a
        elif c == -1.0:
            out = out - a
        else:
            out = out + lt.const(c) * a
    return out


def lower_to_looptree(plan, operands: Mapping[str, Any]) -> LoweredProgram:
    """Build the executor plan for ``plan`` over the call's (validated) operands
    (an operand stored in another mode order than ``plan`` reads it is
    converted)."""
    lo = _Lowerer(plan, operands)
    lo.declare_vars(plan.tree.children, [])
    lo.declare_storage()
    lo.emit(plan.tree.children, set())
    built = lo.b.build()
    indices = {lo.vars[id(node)].name: node.index for node in iter_nodes(plan.tree)
               if isinstance(node, Loop) and id(node) in lo.vars}
    return LoweredProgram(built, tuple(lo.outputs), tuple(lo.transposed), _binding(lo, built), indices)


def _binding(lo: _Lowerer, built) -> Binding | None:
    """How ``built``'s arrays come from the operands, or None when some do not."""
    index_slot = {id(a): k for k, a in enumerate(built.index_arrays)}
    value_slot = {id(a): k for k, a in enumerate(built.value_arrays)}
    source_of: dict = {}
    of_level_tensor: dict = {}
    index_slots, value_slots = [], []
    for obj, level_tensor in lo.b._tensors.values():
        src = lo.sources.get(id(obj))
        if src is None:
            return None
        k = source_of.setdefault(src, len(source_of))
        of_level_tensor[id(level_tensor)] = k
        for n, lev in enumerate(level_tensor.levels):
            if lev[0] == "compressed":
                index_slots += [(index_slot[id(lev[2])], k, n, 2), (index_slot[id(lev[3])], k, n, 3)]
        value_slots.append((value_slot[id(level_tensor.values)], k))
    if ({s for s, *_ in index_slots} != set(range(len(built.index_arrays)))
            or {s for s, _ in value_slots} != set(range(len(built.value_arrays)))):
        return None
    patterns = tuple((p.buffer.id, of_level_tensor[id(p.access.tensor)]) for p in lo.b._patterns)
    specs = []
    for n, spec in enumerate(lo.outputs):
        if spec.kind == "pattern":
            src = lo.sources.get(id(spec.pattern_of))
            if src is None or src not in source_of:
                return None
            specs.append((n, source_of[src]))
    scalars = tuple((buf.id, name) for name, buf in lo.scalars.items())
    return Binding(tuple(source_of), tuple(index_slots), tuple(value_slots), patterns, tuple(specs), scalars)


def lowering_key(operands: Mapping[str, Any]) -> tuple:
    """The operand signature a lowering is cached under: names, formats, shapes, dtypes."""
    return tuple((n, t._format, t._shape, t._values.dtype) for n, t in sorted(operands.items()))


def lower_cached(plan, operands: Mapping[str, Any], prepare: Any = None, key: tuple | None = None) -> LoweredProgram:
    """:func:`lower_to_looptree`, done once per plan and operand signature
    (formats, shapes, dtypes) and rebound to each call's arrays after that.

    ``prepare()``, when given, runs before any operand array is read (the
    call path scans unscanned operands there).
    ``key``: the operands' :func:`lowering_key`, when the caller knows it."""
    cache = attached_dict(plan, "_lowered")
    if key is None:
        key = lowering_key(operands)
    hit = cache.get(key)
    if prepare is not None:
        prepare()
    if hit is not None:
        return hit.rebind(operands)
    lowered = lower_to_looptree(plan, operands)
    if lowered.binding is not None and len(cache) < 16:
        bare = [replace(o, pattern_of=None) for o in lowered.outputs]
        cache[key] = LoweredProgram(lt.without_arrays(lowered.plan), tuple(bare), lowered.transposed,
                                    lowered.binding)
    return lowered
