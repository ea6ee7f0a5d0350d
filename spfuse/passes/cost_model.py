"""Machine cost model for the loop order of a unit operation (Scorch §III-C, seed 001).

The cost of visiting an operation's indices in an order ``L`` is, as in
Scorch's ``COSTTOPUSH``, ``computation + workspace + transposition``, here in
nanoseconds with constants measured on this machine
(:mod:`spfuse.bench.calibrate`, ``python -m spfuse calibrate``):

* **computation** -- every loop level ``k`` is charged for the iterations it
  makes, ``steps_k``, times the cost of one: a *sparse step* (read a
  coordinate, gather the dense operands it indexes) when a compressed level
  drives the loop, a *streamed dense multiply-add* when the loop is dense,
  plus a sparse step per compressed level the loop has to locate (galloping
  search of a level it does not drive).  Iteration counts follow Scorch's
  effective-cardinality model: a loop driven by a tensor's compressed level
  makes ``Q_T(bound ∪ {i}) / Q_T(bound)`` steps per parent iteration, where
  ``Q_T(B) = min(Π extents of B, nnz(T))`` estimates how many distinct
  coordinates T stores over the modes ``B`` (uniform sparsity; nnz known at
  call time, else :data:`DEFAULT_DENSITY` × size, and unknown extents are
  :data:`DEFAULT_EXTENT`).  A loop whose mask cannot be driven (the tensor's
  level for it is dense in the visiting order) is dense: the filter is lost.
  A temporary or result visited out of its (row-major) storage order
  cannot be transposed -- it is being produced -- so it pays a cache-miss
  penalty per visit of its last index instead.
* **workspace** -- a sparse result scattered into under a reduction (an
  output index nested inside a reduced one, Gustavson's ``k`` under ``j``)
  pays a scatter + reset per insertion and workspace dimension (Scorch's
  ``c_insert · N_insert · D``).
* **transposition** -- an operand visited out of its storage order is
  converted first (the lowering makes a concordant copy): ``nnz ×`` the
  per-entry cost of a sparse mode permutation, or ``size ×`` the per-element
  cost of a dense transposed copy.
* **gathers** -- a dense matrix (or higher) larger than :data:`CACHE_BYTES`
  read at a coordinate a sparse loop drives, one element per coordinate
  (the gathered index is its last one visited: ``D[k,j]`` under ``i, k, j``),
  misses the cache at every step: it pays ``strided`` per step, on top of
  the computation.  Gathering whole rows (``Dt[j,k]`` under ``i, j, k``) pays
  one miss per row, which streaming the row hides.

A mask naming a tensor the op does not read (SDDMM's ``C·D`` restricted to
``B`` by propagation, or an operand's producer pattern) filters like an own
operand, but the lowering iterates it as stored (never a transposed copy),
so an order is admissible only when that tensor's storage prefix is bound
first (:meth:`OpModel.feasible_step`).

>>> from spfuse.ir.ops import Ref, UnitOp, TensorInfo
>>> from spfuse.ir.masks import TRUE, atom
>>> A = TensorInfo("A", 2, ("dense", "compressed"), (0, 1), (100, 100), nnz=500)
>>> spmv = UnitOp(0, "y", ("i",), "*", (Ref("A", ("i", "j")), Ref("x", ("j",))), "sum", ("j",))
>>> m = OpModel(spmv, {"A": A}, {"i": TRUE, "j": atom("A_j")}, {"A_j": (0, "A", ("i", "j"), 1)})
>>> c = m.cost(("i", "j"))
>>> c.transposition, c.computation > 0
(0.0, True)
>>> m.cost(("j", "i")).transposed   # CSR visited column-first: a CSC copy
(('A', (0, 1), (1, 0)),)
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

from spfuse.ir.masks import Mask
from spfuse.ir.ops import Ref, TensorInfo, UnitOp

__all__ = ["CostConstants", "DEFAULTS", "ENV_VAR", "DEFAULT_EXTENT", "DEFAULT_DENSITY", "CACHE_BYTES",
           "load_constants", "active_constants", "OrderCost", "OpModel"]

#: Extent assumed for an index whose extent is unknown (``compile()`` without shapes).
DEFAULT_EXTENT = 1000
#: nnz / size assumed for a sparse operand whose nnz is unknown.
DEFAULT_DENSITY = 0.01
#: Environment variable naming a JSON file of constants that overrides :data:`DEFAULTS`.
ENV_VAR = "SPFUSE_COST_MODEL"


#: Bytes a dense operand may take before an element gathered from it at a
#: sparse coordinate is taken to miss the cache (about this machine's L2 + a
#: share of L3: a vector of 100k float64 still hits).
CACHE_BYTES = 4 << 20

#: Comparison steps of sorting a coordinate stream that cost one workspace
#: insertion (``scatter``): a stream of n products costs about
#: ``n * scatter * log2(n) / SORT_STEPS_PER_SCATTER`` to canonicalise.
SORT_STEPS_PER_SCATTER = 4.0


@dataclass(frozen=True)
class CostConstants:
    """Nanoseconds per unit of work (single thread).

    >>> DEFAULTS.sparse_step > 0 and DEFAULTS.source.startswith("measured")
    True
    """

    dense_madd: float        # one streamed dense multiply-add (axpy of a dense row)
    sparse_step: float       # one sparse co-iteration step: crd read + gather
    scatter: float           # one insertion into a workspace, with its reset and drain
    transpose_sparse: float  # one stored entry of a CSR→CSC transposition
    transpose_csf: float     # one stored entry of a CSF mode permutation (3+ modes)
    transpose_dense: float   # one element of a dense transposed copy
    strided: float           # extra cost of a strided (cache-missing) inner access
    source: str = "measured"

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The numeric fields, in order."""
        return tuple(f.name for f in fields(cls) if f.name != "source")

    def as_dict(self) -> dict:
        """The numeric fields as a JSON-ready dict.

        >>> sorted(DEFAULTS.as_dict()) == sorted(CostConstants.names())
        True
        """
        return {n: getattr(self, n) for n in self.names()}

    @classmethod
    def from_mapping(cls, data, source: str) -> CostConstants:
        """Validated constants from a mapping (a parsed JSON object).

        Every field of :meth:`names` must be present, finite and positive; a
        ``"meta"`` entry (how they were measured) is allowed and ignored.

        >>> CostConstants.from_mapping({**DEFAULTS.as_dict(), "meta": {}}, "test").source
        'test'
        >>> CostConstants.from_mapping({"dense_madd": 1.0}, "x.json")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: x.json: missing cost constants: sparse_step, scatter, transpose_sparse, ..., strided
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{source}: expected a JSON object of cost constants, got {type(data).__name__}")
        names = cls.names()
        unknown = sorted(set(data) - set(names) - {"meta"})
        if unknown:
            raise ValueError(f"{source}: unknown cost constants: {', '.join(unknown)} (valid: {', '.join(names)})")
        missing = [n for n in names if n not in data]
        if missing:
            raise ValueError(f"{source}: missing cost constants: {', '.join(missing)}")
        values = {}
        for n in names:
            v = data[n]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"{source}: {n} must be a number (ns), got {v!r}")
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"{source}: {n} must be finite and > 0 (ns), got {v!r}")
            values[n] = float(v)
        return cls(**values, source=source)


# Measured on this machine (2-core AMD EPYC VM, 1 MiB L2 per core, one thread)
# on 2026-11-23 03:39 UTC with
#   python -m spfuse calibrate --rounds 5 --json costs.json
# (spfuse/bench/calibrate.py: SpMV, SpMM and SpGEMM kernels of spfuse._kernels,
# Tensor.asformat transpositions, numpy strided gathers; each constant the
# best of 5 rounds × 5 runs, as other processes shared the 2 cores).
# Override with SPFUSE_COST_MODEL=path.json (the JSON `calibrate --json` writes).
DEFAULTS = CostConstants(
    dense_madd=0.6394,
    sparse_step=1.497,
    scatter=15.36,
    transpose_sparse=15.92,
    transpose_csf=111.2,
    transpose_dense=10.67,
    strided=8.802,
    source="measured on this machine, 2026-11-23 (python -m spfuse calibrate --rounds 5)",
)

_loaded: dict[tuple, CostConstants] = {}


def load_constants(path: str) -> CostConstants:
    """Constants from a JSON file (as ``python -m spfuse calibrate --json`` writes).

    >>> import json, os, tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    ...     json.dump(DEFAULTS.as_dict(), f)
    >>> load_constants(f.name) == CostConstants(**DEFAULTS.as_dict(), source=f.name)
    True
    >>> os.unlink(f.name)
    """
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"{ENV_VAR}={path}: cannot read the cost-model file ({e.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    return CostConstants.from_mapping(data, path)


def active_constants() -> CostConstants:
    """:data:`DEFAULTS`, or the file named by ``$SPFUSE_COST_MODEL`` (read once per modification).

    >>> active_constants() is DEFAULTS or os.environ.get(ENV_VAR) is not None
    True
    """
    path = os.environ.get(ENV_VAR)
    if not path:
        return DEFAULTS
    try:
        key: tuple[str, int | None] = (path, os.stat(path).st_mtime_ns)
    except OSError:
        key = (path, None)
    if key not in _loaded:
        _loaded.clear()
        _loaded[key] = load_constants(path)
    return _loaded[key]


# -- the cost of one order ---------------------------------------------------

@dataclass(frozen=True)
class OrderCost:
    """Cost (ns) of one loop order, by Scorch's three terms.

    ``transposed`` lists ``(operand, storage mode order, visiting mode order)``
    for every operand the order visits out of storage order.
    """

    order: tuple[str, ...]
    computation: float
    workspace: float
    transposition: float
    transposed: tuple = ()

    @property
    def total(self) -> float:
        return self.computation + self.workspace + self.transposition

    def text(self) -> str:
        """``12.3 µs = computation 10 µs + workspace 2 µs + transposition 0``."""
        return (f"{fmt_ns(self.total)} = computation {fmt_ns(self.computation)} + workspace "
                f"{fmt_ns(self.workspace)} + transposition {fmt_ns(self.transposition)}")


def fmt_ns(ns: float) -> str:
    """A duration in ns, readably.

    >>> fmt_ns(0), fmt_ns(512.0), fmt_ns(2.5e4), fmt_ns(3e9)
    ('0', '512 ns', '25 µs', '3 s')
    """
    if ns == 0:
        return "0"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


class _Operand:
    """An access the order must visit: its indices in storage order and sizes."""

    __slots__ = ("label", "name", "indices", "storage", "levels", "nnz", "size", "bits", "after",
                 "sparse", "mode_order", "csf", "qcache", "buffer", "complete")

    def __init__(self, ref, info: TensorInfo, bit: Mapping[str, int], extent: Mapping[str, float],
                 buffer: bool = False):
        self.buffer = buffer  # a temporary or result: produced here, never transposed
        self.name = name = ref.name
        self.indices = indices = tuple(ref.indices)
        self.label = f"{name}[{','.join(indices)}]"
        self.mode_order = mode_order = tuple(info.mode_order)
        self.storage = tuple(indices[m] for m in mode_order)
        self.levels = levels = tuple(info.levels)
        self.sparse = "compressed" in levels
        self.csf = len(indices) >= 3
        # a mask tensor may have modes the op does not loop over (MTTKRP's X
        # seen from the consumer of X·C): those never get bound
        self.complete = True
        size = 1.0
        for ix, s in zip(indices, info.shape, strict=True):
            e = extent.get(ix)
            if e is None:
                self.complete = False
                e = float(s or DEFAULT_EXTENT)
            size *= e
        self.size = size
        # at least one entry: estimates divide by coordinate counts (empty operands run anyway)
        self.nnz = max(float(info.nnz), 1.0) if info.nnz is not None and self.sparse else (
            max(1.0, DEFAULT_DENSITY * self.size) if self.sparse else self.size)
        # after[ix]: indices stored below ix -- visiting one of them before ix
        # breaks concordance (one pass from the last stored mode up).
        self.after, below = {}, 0
        for ix in reversed(self.storage):
            self.after[ix] = below
            below |= bit.get(ix, 0)
        self.bits = below
        self.qcache: dict[int, float] = {}

    def q(self, bits: int, extent_bits: Mapping[int, float]) -> float:
        """Estimated distinct coordinates stored over the modes in ``bits``."""
        bits &= self.bits
        v = self.qcache.get(bits)
        if v is None:
            if bits == 0:
                v = 1.0
            elif bits == self.bits and self.complete:
                v = self.nnz
            else:
                v = min(math.prod(e for b, e in extent_bits.items() if b & bits), self.nnz)
            self.qcache[bits] = v
        return v


_MASK_OPERANDS: dict[tuple, _Operand] = {}


class OpModel:
    """Everything the cost of an order of ``op`` depends on, precomputed once.

    ``infos`` describe the inputs (temporaries have none: they are dense
    buffers), ``masks`` the op's iteration mask per index, ``atoms`` the mask
    atom table (``atom → (statement, tensor, indices, mode)``), ``shapes``
    the extents of every tensor when the planner knows them.
    """

    def __init__(self, op: UnitOp, infos: Mapping[str, TensorInfo], masks: Mapping[str, Mask],
                 atoms: Mapping[str, tuple] = {}, shapes: Mapping[str, tuple] | None = None,
                 constants: CostConstants | None = None, forward: Mapping[str, Mask] | None = None):
        self.op = op
        self.c = constants or active_constants()
        refs = op.refs
        seen: list[str] = []
        for idx in [r.indices for r in refs] + [op.out_indices, op.indices]:
            seen.extend(ix for ix in idx if ix not in seen)
        self.indices = tuple(seen)  # appearance order: DFS tries it first, so it wins ties
        self.bit = {ix: 1 << n for n, ix in enumerate(self.indices)}
        self.full = (1 << len(self.indices)) - 1
        self.extent = self._extents(op, infos, shapes)
        #: stored entries of the sparse inputs (the formats pass's measure of a result's size)
        self.stored = sum(i.nnz or 0 for i in infos.values() if i.is_sparse)
        out_shape = (shapes or {}).get(op.out)
        #: the output's elements when the planner knows its shape (the formats pass decides only then)
        self.out_size = (math.prod(int(e) for e in out_shape)
                         if out_shape is not None and None not in out_shape else None)
        self.extent_bits = {self.bit[ix]: e for ix, e in self.extent.items()}
        self.sparse: list[_Operand] = []
        self.dense: list[_Operand] = []
        self.buffers: list[_Operand] = []
        for ref in refs + (Ref(op.out, op.out_indices),):
            info = infos.get(ref.name) if ref.name != op.out else None
            if info is None or info.ndim != len(ref.indices):
                # a temporary or the result: a row-major buffer
                if len(ref.indices) >= 2 and all(o.label != str(ref) for o in self.buffers):
                    shape = tuple(self.extent[ix] for ix in ref.indices)
                    self.buffers.append(_Operand(ref, TensorInfo.dense(ref.name, shape), self.bit,
                                                 self.extent, buffer=True))
                continue
            opnd = _Operand(ref, info, self.bit, self.extent)
            if opnd.sparse:
                if all(o.label != opnd.label for o in self.sparse):
                    self.sparse.append(opnd)
            elif info.ndim >= 2 and all(o.label != opnd.label for o in self.dense):
                self.dense.append(opnd)
        self.tracked = self.sparse + self.dense + self.buffers
        self.tcost = [0.0 if o.buffer else self.transposition_cost(o) for o in self.tracked]
        # per loop: (position, operand, storage-below bits, transposition cost) of the accesses it binds
        self.by_ix = {ix: [(k, o, o.after[ix], self.tcost[k]) for k, o in enumerate(self.tracked)
                           if ix in o.after] for ix in self.indices}
        self.foreign_constraints: list[tuple[str, int, int]] = []  # (atom, ix bit, prefix bits)
        forward = masks if forward is None else forward
        self._own_by_key = {(o.name, o.indices): o for o in self.sparse}
        self.loop_masks = {ix: self._mask_terms(ix, masks.get(ix), forward.get(ix), atoms, infos)
                           for ix in self.indices}
        # Output dimensions stored compressed: filtered by an operand's pattern
        # (demand from consumers is not credited, so not charged either).
        self.sparse_out = frozenset(ix for ix in op.out_indices for term in self.loop_masks[ix] or ()
                                    for atom in term if atom[0] != "demand")
        self._step_cache: dict[tuple, tuple] = {}
        self._needs: dict | None = None

    # -- setup ----------------------------------------------------------------
    def _extents(self, op, infos, shapes) -> dict[str, float]:
        ext: dict[str, float] = {}
        for ref in op.refs + (Ref(op.out, op.out_indices),):
            shape = (shapes or {}).get(ref.name)
            if shape is None and ref.name in infos:
                shape = infos[ref.name].shape
            if shape is None or len(shape) != len(ref.indices):
                continue
            for ix, e in zip(ref.indices, shape, strict=True):
                if e is not None and ix not in ext:
                    ext[ix] = float(max(int(e), 1))
        return {ix: ext.get(ix, float(DEFAULT_EXTENT)) for ix in self.indices}

    def _mask_terms(self, ix, mask, forward, atoms, infos):
        """The mask of loop ``ix`` as DNF terms; None when dense.

        Each atom is ``("own", operand)`` -- a sparse operand of the op, which
        the lowering may transpose --, ``("value", tensor, prefix bits)`` -- the
        pattern of an operand's producer (forward iteration space) -- or
        ``("demand", tensor, prefix bits)`` -- pruning propagated from a
        consumer.  Both filter like an own operand, but mask tensors are
        iterated as stored, so ``prefix`` (their storage levels above ``ix``)
        must be bound first; only forward patterns make an output compressed."""
        if mask is None or mask.is_true or mask.is_false:
            return None
        statement_of_op = self.op.statement
        value_atoms = forward.atoms if forward is not None else frozenset()
        own_by_key = self._own_by_key
        terms = []
        for term in mask.terms:
            out = []
            for a in sorted(term):
                ref = atoms.get(a)
                if ref is None:
                    continue
                statement, tensor, indices, mode = ref
                own = own_by_key.get((tensor, tuple(indices)))
                if own is not None and statement == statement_of_op:
                    out.append(("own", own))
                    continue
                info = infos.get(tensor)
                if info is None or statement != statement_of_op or indices[mode] != ix:
                    continue  # bound through another statement: the lowering finds its path
                names = [indices[m] for m in info.mode_order[:info.level_of_mode(mode)]]
                if not all(n in self.bit for n in names):
                    continue
                prefix = sum(self.bit[n] for n in set(names))
                self.foreign_constraints.append((a, self.bit[ix], prefix))
                out.append(("value" if a in value_atoms else "demand", self._mask_operand(tensor, indices, info),
                            prefix))
            terms.append(out)
        return terms

    def _mask_operand(self, tensor: str, indices, info: TensorInfo) -> _Operand:
        """The mask tensor's model, shared by the ops of a plan that see it
        under the same index bits and extents (SpAdd's unions name the same
        tensors in every op)."""
        indices = tuple(indices)
        key = (info, indices, tuple(self.bit.get(ix) for ix in indices),
               tuple(self.extent.get(ix) for ix in indices))
        o = _MASK_OPERANDS.get(key)
        if o is None:
            if len(_MASK_OPERANDS) > 512:
                _MASK_OPERANDS.clear()
            o = _MASK_OPERANDS[key] = _Operand(Ref(tensor, indices), info, self.bit, self.extent)
        return o

    # -- one loop level -------------------------------------------------------
    def step(self, bound: int, ix: str) -> tuple[float, float, float]:
        """``(steps per parent iteration, surviving iterations per parent,
        ns per step)`` of loop ``ix`` under the indices ``bound``."""
        key = (bound, ix)
        hit = self._step_cache.get(key)
        if hit is not None:
            return hit
        c = self.c
        bit = self.bit[ix]
        E = self.extent[ix]
        drivers, located = {}, 0
        for o in self.sparse:
            if not o.bits & bit:
                continue
            rank = bin(bound & o.bits).count("1")
            if o.levels[rank] == "compressed":
                # steps per stored parent: distinct coordinates one level down
                drivers[o.label] = o.q(bound | bit, self.extent_bits) / o.q(bound, self.extent_bits)
        terms = self.loop_masks[ix]
        driving: set[str] = set()
        steps, surv = E, E
        if terms:
            sels, fibers, ok = [], [], True
            for term in terms:
                best, sel, any_driver = None, 1.0, False
                for atom in term:
                    kind, x = atom[0], atom[1]
                    if kind == "own":
                        if x.label not in drivers:
                            continue  # its level for ix is dense in the visiting order
                        f = drivers[x.label]
                    elif atom[2] & bound != atom[2]:
                        continue  # the mask tensor's levels above ix are not bound yet
                    else:  # a producer's pattern or a consumer's demand, iterated as stored:
                        # its level under ix depends on the levels above only
                        f = x.q(atom[2] | bit, self.extent_bits) / x.q(atom[2], self.extent_bits)
                    sel *= min(f / E, 1.0)
                    any_driver = True
                    if best is None or f < best[1]:
                        best = (x.label, f)
                if not any_driver:
                    ok = False
                    break
                sels.append(sel)
                fibers.append(best)
            if ok:
                if len(terms) == 1:
                    steps = fibers[0][1] if fibers[0] else E
                    surv = E * sels[0]
                else:  # union: a k-way merge of one driver per term
                    steps = min(sum(f[1] if f else E for f in fibers), E)
                    surv = E * (1.0 - math.prod(1.0 - s for s in sels))
                driving = {f[0] for f in fibers if f}
        located = len(set(drivers) - driving)
        unit = (c.sparse_step if driving else c.dense_madd) + located * c.sparse_step
        out = (steps, min(surv, steps) if driving else surv, unit)
        self._step_cache[key] = out
        return out

    def feasible_step(self, bound: int, ix: str) -> bool:
        """A propagated mask on ``ix`` stays iterable: its tensor's storage
        prefix is bound before ``ix`` (mask tensors are never transposed)."""
        need = self.needs.get(ix, 0)
        return need & bound == need

    @property
    def needs(self) -> dict[str, int]:
        """Per loop, the indices propagated masks need bound before it."""
        if self._needs is None:
            self._needs = {}
            for ix, b in self.bit.items():
                for _, bb, prefix in self.foreign_constraints:
                    if bb == b:
                        self._needs[ix] = self._needs.get(ix, 0) | prefix
        return self._needs

    # -- whole orders -----------------------------------------------------------
    def transposition_cost(self, o: _Operand) -> float:
        if o.sparse:
            return o.nnz * (self.c.transpose_csf if o.csf else self.c.transpose_sparse)
        return o.size * self.c.transpose_dense

    def extend(self, bound: int, n: float, flags: int, ix: str, forbid: int = 0) -> tuple | None:
        """Visit loop ``ix`` after the indices ``bound`` (``n`` iterations reach it).

        Returns ``(computation, transposition, iterations below, flags, steps)``
        added by this loop, or None when it would visit an operand in
        ``forbid`` (bit per :attr:`tracked` operand) out of storage order.
        ``flags`` marks the tracked operands already visited out of order:
        an input is then transposed once; a buffer, which cannot be, pays a
        cache miss per visit of its last index instead."""
        steps, surv, unit = self.step(bound, ix)
        total = n * steps
        comp, trans = total * unit, 0.0
        nb = bound | self.bit[ix]
        if unit >= self.c.sparse_step:      # a sparse-driven (or located) loop: gathers
            for o in self.dense:
                if (o.bits & self.bit[ix] and not o.bits & ~nb and len(o.indices) >= 2
                        and o.size * 8 > CACHE_BYTES):
                    comp += total * self.c.strided
        for k, o, below, tc in self.by_ix[ix]:
            if below & bound and not (flags >> k) & 1:
                if (forbid >> k) & 1:
                    return None
                flags |= 1 << k
                trans += tc
            if o.buffer and (flags >> k) & 1 and not o.bits & ~nb:
                comp += total * self.c.strided
        return comp, trans, n * surv, flags, total

    def workspace(self, order: tuple[str, ...], inner_steps: float) -> float:
        """Scatter cost of compressed output dimensions written under a reduction."""
        op = self.op
        if not (self.sparse_out and op.reduced):
            return 0.0
        pos = {ix: n for n, ix in enumerate(order)}
        first_red = min(pos[r] for r in op.reduced if r in pos)
        # a dense dimension under the reduction is a streamed accumulate (SpMM's
        # k), a compressed one a scatter into a workspace (SpGEMM's k)
        dims = sum(1 for ix in self.sparse_out if pos.get(ix, -1) > first_red)
        if (dims and order[-1] in op.out_indices and order[-1] not in self.sparse_out
                and self._scattered_dense(pos, first_red)):
            # the formats pass stores it dense and the innermost loop runs along
            # a dense row of it: a row accumulate at a scattered row, no
            # workspace (an element-wise scatter, SpGEMM's outer product, still
            # pays one per insertion)
            return 0.0
        cost = inner_steps * dims * self.c.scatter
        if dims and sum(1 for ix in op.out_indices if pos.get(ix, -1) > first_red) >= 2:
            # no loops over the result's leading indices outside the reduction,
            # so no row workspace: one coordinate per product, sorted afterwards
            cost *= max(1.0, math.log2(max(inner_steps, 2.0)) / SORT_STEPS_PER_SCATTER)
        return cost

    def _scattered_dense(self, pos: Mapping[str, int], first_red: int) -> bool:
        """Would the formats pass store the output dense in this order
        (:func:`spfuse.passes.formats.scattered_dense`)?"""
        from spfuse.passes.formats import scattered_dense
        if self.out_size is None:
            return False
        whole = all(pos.get(ix, -1) > first_red for ix in self.op.out_indices)
        return scattered_dense(self.out_size, whole, self.stored)

    def visiting_order(self, o: _Operand, order: tuple[str, ...]) -> tuple[int, ...]:
        pos = {ix: n for n, ix in enumerate(order)}
        return tuple(sorted(range(len(o.indices)), key=lambda m: pos[o.indices[m]]))

    def cost(self, order: tuple[str, ...]) -> OrderCost:
        """The cost of visiting the op's indices in ``order`` (every index once)."""
        if sorted(order) != sorted(self.indices):
            raise ValueError(f"order {order} is not a permutation of {self.indices}")
        bound, n, flags, comp, trans, inner = 0, 1.0, 0, 0.0, 0.0, 1.0
        for ix in order:
            dc, dt, n, flags, inner = self.extend(bound, n, flags, ix)
            comp, trans = comp + dc, trans + dt
            bound |= self.bit[ix]
        transposed = tuple((o.name, o.mode_order, self.visiting_order(o, order))
                           for k, o in enumerate(self.tracked) if (flags >> k) & 1 and not o.buffer)
        return OrderCost(tuple(order), comp, self.workspace(order, inner), trans, transposed)
