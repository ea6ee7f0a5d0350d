"""Public entry points: :func:`evaluate`, :func:`compile`, :func:`einsum`.

Data flows one way: text → :mod:`spfuse.frontend` (parse, check; accesses
with a repeated index rewritten by :mod:`spfuse.frontend.diagonals`) →
operands validated into :class:`~spfuse.tensor.Tensor` (:mod:`spfuse.binding`)
→ :mod:`spfuse.planner` (cached) → :mod:`spfuse.lowering` → :mod:`spfuse.runtime`
→ results back in the caller's world (:mod:`spfuse.results`: scipy in → scipy
out, numpy in → numpy out, N-d sparse → ``Tensor``).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import threading
from collections.abc import Container, Mapping
from typing import Any

import numpy as np

from spfuse import binding
from spfuse._kernels import _result_pool as result_pool
from spfuse.errors import IndexCheckFailed, ProgramError, UnsupportedError
from spfuse.formats import Format
from spfuse.frontend.ast import Program, iter_accesses
from spfuse.frontend.check import check_program
from spfuse.frontend.diagonals import has_diagonal, without_diagonals
from spfuse.frontend.parser import parse_program
from spfuse.ir.ops import TensorInfo
from spfuse.lowering.fibres import shared_fibres
from spfuse.lowering.looptree import lower_cached, lowering_key
from spfuse.lowering.templates import PARALLEL_MIN_WORK
from spfuse.planner import FUSION_STRATEGIES, Plan, bind_aliases, plan_program, try_plan
from spfuse.results import OUT_FORMATS, owned, result_dtype, result_world, same_sparse_world, to_callers_world
from spfuse.runtime import looptree as lt
from spfuse.tensor import Tensor, as_tensor, shared_patterns
from spfuse.threads import threads_for_call

__all__ = ["evaluate", "compile", "einsum", "Kernel", "clear_cache", "cache_info"]

_plan_cache: dict = {}
_dispatch_cache: dict = {}
_cache_lock = threading.Lock()
_MAX_CACHED = 512


@functools.lru_cache(maxsize=512)
def _parse(text: str) -> Program:
    return parse_program(text)


def clear_cache() -> None:
    """Forget every cached plan (and parsed program), and free the memory
    the result pool keeps for large results and per-call operand copies
    (``spfuse._kernels._result_pool``).

    >>> import spfuse
    >>> spfuse.clear_cache(); spfuse.cache_info()["plans"]
    0
    """
    with _cache_lock:
        _plan_cache.clear()
        _dispatch_cache.clear()
    _parse.cache_clear()
    result_pool.release()


def cache_info() -> dict:
    """Sizes of the plan and parse caches.

    >>> import spfuse
    >>> sorted(spfuse.cache_info())
    ['parsed', 'plans']
    """
    return {"plans": len(_plan_cache), "parsed": _parse.cache_info().currsize}


def _info(name: str, t: Tensor) -> TensorInfo:
    return TensorInfo.of(name, t)


def _infos_of(tensors: Mapping[str, Tensor], patterns: tuple) -> dict[str, TensorInfo]:
    """The planning facts of ``tensors``, with the patterns they share
    (:func:`~spfuse.tensor.shared_patterns` of these tensors)."""
    shared = dict(patterns)
    return {n: dataclasses.replace(_info(n, t), pattern=shared[n]) if n in shared else _info(n, t)
            for n, t in tensors.items()}


def _cached_plan(program: Program, infos: Mapping[str, TensorInfo], fusion: str,
                 propagate: bool = True) -> Plan:
    # nnz enters by its power of two: cost-based choices (association, separate
    # kernels) depend on it, but a plan should not be remade for every matrix.
    key = (program.text, fusion, propagate,
           tuple(sorted((n, i.levels, i.mode_order, i.shape, (i.nnz or 0).bit_length(), i.pattern)
                        for n, i in infos.items())))
    plan = _plan_cache.get(key)
    if plan is None:
        plan = plan_program(program, infos, fusion, propagate)
        with _cache_lock:
            if len(_plan_cache) >= _MAX_CACHED:
                _plan_cache.pop(next(iter(_plan_cache)))
            _plan_cache[key] = plan
    return plan


def _check_choice(value, valid, what):
    if value not in valid:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, valid))}, got {value!r}")


@functools.lru_cache(maxsize=1024)
def _checked(program: Program, shapes: tuple) -> None:
    """``check_program`` once per (program, operand shapes): a repeat call is a dict hit."""
    check_program(program, dict(shapes))


def _execute_generic(plan: Plan, tensors: Mapping[str, Tensor], threads: int, deferred: tuple = (),
                     key: tuple | None = None):
    """Run ``plan`` on the generic loop-tree executor.

    ``deferred`` names operands whose indices are not scanned yet: they are
    scanned before anything reads them (:class:`IndexCheckFailed` when one is
    not valid and canonical); the executor then reads them as they are
    (int32 or int64).
    ``key``: the tensors' lowering signature when the caller knows it."""
    if threads > 1 and sum(t.values.size for t in tensors.values()) + _result_elements(plan) < PARALLEL_MIN_WORK:
        threads = 1  # waking a thread team costs more than this much work
    prepare = (lambda: binding.scan_deferred(tensors, deferred, threads)) if deferred else None
    lowered = lower_cached(plan, tensors, prepare, key)
    return lowered.results(lt.run(lowered.plan, num_threads=threads))


def _result_elements(plan: Plan) -> int:
    """Elements of the plan's dense results (worked out once per plan)."""
    n = plan.__dict__.get("_result_elements")
    if n is None:
        n = sum(math.prod(e or 0 for e in plan.shapes[r]) for r in plan.results)
        object.__setattr__(plan, "_result_elements", n)
    return n


def _template(plan: Plan):
    """The plan's template kernel, matched once and remembered on the plan."""
    from spfuse.lowering.templates import match_template
    if "_template" not in plan.__dict__:
        object.__setattr__(plan, "_template", match_template(plan))
    return plan.__dict__["_template"]


def _run(program: Program, operands: Mapping[str, Any], out_format, fusion, num_threads,
         trusted: Container[str] = frozenset(), defer: bool = True, raw: bool = False):
    """:func:`evaluate` on a parsed program.  ``trusted``: see :func:`~spfuse.binding.bind_operands`;
    ``raw``: results as spfuse makes them (see :meth:`_Dispatch.__call__`)."""
    _check_choice(fusion, FUSION_STRATEGIES, "fusion")
    if out_format is not None:
        _check_choice(out_format, OUT_FORMATS, "out_format")
    if binding.any_complex(operands.values()):
        from spfuse.complex_values import run_complex  # real and imaginary parts through this same path
        return run_complex(program, operands, out_format, fusion, num_threads, _run)
    tensors, unscanned = binding.bind_operands(program, operands, trusted, defer and not has_diagonal(program),
                                               num_threads)
    dispatch = _dispatch(program, tensors, fusion, out_format)
    if not unscanned:
        return dispatch(tensors, num_threads, raw=raw)
    # Indices of scipy operands not scanned yet: SpMV and SpMM check them as
    # they read them (saving a pass over the largest array); the generic
    # executor's are scanned just before it reads them as they are;
    # every other operand is scanned now.  Anything amiss -- unsorted,
    # duplicated or out-of-range indices -- sends the call down the
    # validating path, which canonicalises a copy or words the error.
    deferred: tuple = ()
    if dispatch.template is None and not dispatch.conversions:
        deferred = tuple(unscanned)
    else:
        kernel_checks = dispatch.template.checks_indices if dispatch.template is not None else ()
        if dispatch.conversions:
            kernel_checks = ()  # a conversion reads every index before any kernel does
        for name in unscanned:
            if name not in kernel_checks and not binding.scan_ok(tensors[name], num_threads):
                return _run(program, operands, out_format, fusion, num_threads, trusted, defer=False, raw=raw)
    try:
        return dispatch(tensors, num_threads, deferred, raw=raw)
    except IndexCheckFailed:
        return _run(program, operands, out_format, fusion, num_threads, trusted, defer=False, raw=raw)


def _dispatch(program: Program, tensors: Mapping[str, Tensor], fusion: str, out_format: str | None) -> _Dispatch:
    """What a call of ``program`` on ``tensors`` runs, planned once per
    operand signature: everything decided from the operands' formats,
    shapes, dtypes and origins is remembered, so a repeat call validates its
    operands, then only runs."""
    patterns = shared_patterns(tensors)
    key = (program, fusion, out_format,
           tuple((n, t._format, t._shape, t._values.dtype, t._index_dtype, t.origin, len(t._values).bit_length())
                 for n, t in tensors.items()), patterns)
    dispatch = _dispatch_cache.get(key)
    if dispatch is None:
        dispatch = _Dispatch(program, tensors, fusion, out_format, patterns)
        if not dispatch.diagonal:  # diagonal operands are rebuilt per call: nothing to keep
            with _cache_lock:
                if len(_dispatch_cache) >= _MAX_CACHED:
                    _dispatch_cache.pop(next(iter(_dispatch_cache)))
                _dispatch_cache[key] = dispatch
    return dispatch


def interprets_contractions(program: Program, operands: Mapping[str, Any], fusion: str = "auto",
                            trusted: Container[str] = frozenset()) -> bool:
    """Would a call of ``program`` on ``operands`` leave a contraction (a
    sum of products) to the generic executor, element by element (planned
    now, run later; the plan is the call's)?  ``trusted``: see
    :func:`~spfuse.binding.bind_operands`.

    >>> import numpy as np, scipy.sparse as sp
    >>> A = sp.random_array((30, 30), density=0.2, format="csr", rng=0)
    >>> interprets_contractions(_parse("y[i] = A[i,j] * x[j]"), {"A": A, "x": np.ones(30)})
    False
    >>> interprets_contractions(_parse("y[i] = max(j, A[i,j] * x[j])"), {"A": A, "x": np.ones(30)})
    False

    An SDDMM-like gradient fused whole runs as a pattern program (the dot,
    ``exp`` and ``gC``'s rows in one pass) and a scatter over ``P`` handed on
    sparse; with ``P`` on two operands' patterns (maybe not one), the sums
    over it go to the generic executor (statement by statement they are
    SpMMs):

    >>> grads = ("P[i,j] = B[i,j] * exp(C[i,k] * D[k,j]); gC[i,k] = sum(j, P[i,j] * D[k,j]); "
    ...          "gD[k,j] = sum(i, P[i,j] * C[i,k])")
    >>> interprets_contractions(_parse(grads), {"B": A, "C": np.ones((30, 4)), "D": np.ones((4, 30))})
    False
    >>> G = sp.random_array((30, 30), density=0.2, format="csr", rng=1)
    >>> interprets_contractions(_parse(grads.replace("B[i,j] *", "B[i,j] * G[i,j] *")),
    ...                         {"B": A, "G": G, "C": np.ones((30, 4)), "D": np.ones((4, 30))})
    True
    """
    tensors, _ = binding.bind_operands(program, operands, trusted, False)
    dispatch = _dispatch(program, tensors, fusion, None)
    if dispatch.fibres is not None:
        return False   # (flattened: the program over fibres decides, when it runs)
    if dispatch.template is None:
        from spfuse.lowering.groups import sums_products
        return sums_products(dispatch.plan.ops)
    return dispatch.template.interpreted


class _Dispatch:
    """What one (program, operand signature) call runs: the plan, its template
    kernel (or the generic executor) and how results are returned."""

    def __init__(self, program: Program, tensors: Mapping[str, Tensor], fusion: str,
                 out_format: str | None, patterns: tuple = ()):
        _checked(program, tuple((n, t.shape) for n, t in tensors.items()))
        self.diagonal = has_diagonal(program)
        self.program = program
        if self.diagonal:
            program, tensors = self._diagonal_operands(tensors)
            patterns = ()
        # (``patterns``: shared_patterns of these operands, part of the call's signature)
        infos = _infos_of(tensors, patterns)
        self.plan = plan = _cached_plan(program, infos, fusion)
        if plan.__dict__.get("_has_max") is not False:
            _check_empty_max(plan)
        self.template = template = _template(plan)
        # the template's run for this signature alone (binds what it decides on its first call)
        self.run = None if template is None else (template.run if template.bind is None else template.bind())
        # operands the planner chose to read in another storage order
        # (planner.with_storage_orders), whole or for one read (an alias):
        # converted before anything runs
        self.conversions = {n: Format(tuple(plan.inputs[n].levels), tuple(plan.inputs[n].mode_order))
                            for n, t in bind_aliases(plan, tensors).items()
                            if n in plan.inputs and tuple(t.format.mode_order) != plan.inputs[n].mode_order}
        self.out_format = out_format
        self.flavour, self.dtype = result_world(tensors), result_dtype(tensors)
        self.all_sparse = same_sparse_world(tensors)
        # the signature the generic executor's lowering is cached under (the
        # tensors a call hands it are these, bound and converted alike)
        bound = bind_aliases(plan, tensors)
        self.lowering_key = lowering_key({n: _Signature(self.conversions.get(n, t._format), t._shape, t._values)
                                          for n, t in bound.items()})
        # work besides the operands' values, for the one-thread decision of
        # __call__: the plan's estimated iterations, else every result and
        # temporary as if dense (an upper bound: SDDMM's sparse result counted
        # whole sent a 1200-entry call to look for free cores, 8 us of /proc)
        estimate = plan.report.estimate if plan.report is not None else None
        self.fixed_work = estimate if estimate is not None and math.isfinite(estimate) else sum(
            math.prod(e or 0 for e in shape) for name, shape in plan.shapes.items() if name not in plan.inputs)
        # sums over fibres the sparse operands share, run over one fibre index when they do
        self.fusion = fusion
        # (the operands' own formats: the plan's may be a storage order it converts to)
        self.fibres = None if self.diagonal else _fibres(plan, {n: t.format for n, t in tensors.items()})

    def _diagonal_operands(self, tensors: Mapping[str, Tensor]):
        """The program with ``A[i,i]`` accesses rewritten, and the operands it reads."""
        tensors = dict(tensors)
        program = without_diagonals(self.program, tensors)
        used = set(program.inputs)
        return program, {n: t for n, t in tensors.items() if n in used}

    def __call__(self, tensors: Mapping[str, Tensor], num_threads: int | None, deferred: tuple = (),
                 raw: bool = False):
        """Run on validated ``tensors`` (``deferred``: see :func:`_execute_generic`).

        ``raw``: results in the result dtype but as spfuse makes them -- a
        dense ``ndarray``, a sparse :class:`Tensor` that may share index
        arrays with an operand -- not in the caller's world: for spfuse's
        own next statement (a differentiated program's), which reads them
        without a conversion, a copy of the pattern or a scan."""
        if self.diagonal:
            tensors = self._diagonal_operands(tensors)[1]
        if self.fibres is not None:
            flat = self.fibres.operands(tensors)
            if flat is not None:
                return self._results(self._on_fibres(flat, num_threads), tensors, raw)
        # every kernel runs less work than this on one thread anyway
        threads = threads_for_call(num_threads, worthwhile=sum(t._values.size for t in tensors.values())
                                   + self.fixed_work >= PARALLEL_MIN_WORK)
        plan = self.plan
        tensors = bind_aliases(plan, tensors)
        if self.conversions:
            tensors = {n: _stored_as(t, self.conversions[n], threads) if n in self.conversions else t
                       for n, t in tensors.items()}
        raw_values = self.run(tensors, threads) if self.run is not None else \
            _execute_generic(plan, tensors, threads, deferred, self.lowering_key)
        return self._results(raw_values, tensors, raw)

    def _on_fibres(self, flat: Mapping[str, Tensor], num_threads: int | None) -> dict:
        """The flattened program's results (:mod:`spfuse.lowering.fibres`), dense as the plan stores them."""
        assert self.fibres is not None
        program = self.fibres.program
        values = _run(program, flat, None, self.fusion, num_threads, trusted=frozenset(flat), raw=True)
        values = values if isinstance(values, dict) else {program.results[0]: values}
        return {n: np.asarray(v.todense() if isinstance(v, Tensor) else v) for n, v in values.items()}

    def _results(self, raw_values: Mapping[str, Any], tensors: Mapping[str, Tensor], raw: bool):
        plan = self.plan
        results = {}
        if raw:
            for name in plan.results:
                value = raw_values[name]
                if isinstance(value, np.ndarray):
                    value = value.astype(self.dtype, copy=False)
                    results[name] = value[()] if value.ndim == 0 else value
                else:
                    results[name] = value.astype(self.dtype) if value.dtype != self.dtype else value
            return results[plan.results[0]] if len(results) == 1 else results
        for name in plan.results:
            value = raw_values[name]
            if (self.all_sparse and self.out_format is None and isinstance(value, np.ndarray)
                    and (value.ndim == 2 or (value.ndim > 2 and self.flavour != "spmatrix"))):
                # sparse in -> sparse out (scipy: 2-d CSR/CSC, N-d coo_array; pydata: its type)
                value = Tensor.from_numpy(value.astype(self.dtype, copy=False), "csr" if value.ndim == 2 else "csf")
            results[name] = owned(to_callers_world(value, self.out_format, self.flavour, self.dtype), tensors)
        return results[plan.results[0]] if len(results) == 1 else results


def _stored_as(t: Tensor, fmt: Format, num_threads: int | None = None) -> Tensor:
    """``t`` converted to ``fmt`` for one call, through the reordering
    remembered for its pattern (:func:`~spfuse.lowering.transposes.stored_as`:
    one gather of the values per call, where a conversion sorts the indices
    again every call).

    >>> t = Tensor.from_numpy([[0.0, 1.0], [2.0, 3.0]], "csr")
    >>> c = _stored_as(t, Format.csc()); c.format.name, c.todense().tolist()
    ('csc', [[0.0, 1.0], [2.0, 3.0]])
    """
    from spfuse.lowering.transposes import stored_as
    return stored_as(t, fmt, num_threads)


class _Signature:
    """What :func:`~spfuse.lowering.looptree.lowering_key` reads of a tensor,
    for a tensor not made yet (an operand converted per call)."""

    __slots__ = ("_format", "_shape", "_values")

    def __init__(self, format: Format, shape: tuple, values: np.ndarray):
        self._format, self._shape, self._values = format, shape, values


def _check_empty_max(plan: Plan) -> None:
    from spfuse.ir.tree import paths_to_computes
    if not any(op.reduction in ("max", "min") for op in plan.ops):
        object.__setattr__(plan, "_has_max", False)
        return
    for op_id, path in paths_to_computes(plan.tree).items():
        op = next(o for o in plan.ops if o.id == op_id)
        if op.reduction in ("max", "min"):
            for loop in path:
                if loop.bound(op_id) in op.reduced and loop.extent == 0:
                    raise ValueError(f"{op.reduction}() over index {loop.bound(op_id)!r} of extent 0 has "
                                     "no identity (numpy raises too)")


def evaluate(program: str, /, *, out_format: str | None = None, fusion: str = "auto",
             num_threads: int | None = None, **operands: Any):
    """Evaluate an index-notation program over the given operands.

    Results come back in the caller's world: scipy.sparse in → scipy.sparse
    out (same array/matrix flavour), numpy in → numpy out.  One result is
    returned as is; several as a dict in assignment order.

    >>> import numpy as np, scipy.sparse as sp, spfuse
    >>> B = sp.csr_array(np.array([[1.0, 0.0], [0.0, 2.0]]))
    >>> C, D = np.ones((2, 3)), np.ones((3, 2))
    >>> spfuse.evaluate("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", B=B, C=C, D=D).toarray()
    array([[3., 0.],
           [0., 6.]])
    """
    if not isinstance(program, str):
        raise TypeError(f"program must be a str, got {type(program).__name__}")
    return _run(_parse(program), operands, out_format, fusion, num_threads)


def einsum(*operands: Any, out: np.ndarray | None = None, dtype: Any = None, order: str = "K",
           casting: str = "safe", optimize: Any = False, out_format: str | None = None, fusion: str = "auto",
           num_threads: int | None = None) -> Any:
    """``numpy.einsum`` over sparse and dense operands: same calls, same answers.

    ``einsum(subscripts, *operands, ...)`` or the interleaved form
    ``einsum(op0, sublist0, op1, sublist1, ..., [sublist_out])``; ellipsis,
    size-1 broadcasting, diagonals, and numpy's ``out``, ``dtype``,
    ``order``, ``casting`` and ``optimize`` (accepted; spfuse's planner
    chooses the contraction order).  Errors are numpy's exception classes
    with numpy's wording.  Results come back in the caller's world (see
    :func:`evaluate`); see :mod:`spfuse.numpy_einsum` for the dtype rules.

    >>> import numpy as np, scipy.sparse as sp, spfuse
    >>> A = sp.csr_array(np.array([[1.0, 2.0], [0.0, 3.0]]))
    >>> spfuse.einsum("ij,j->i", A, np.array([1.0, 1.0]))
    array([3., 3.])
    >>> spfuse.einsum(np.ones((2, 2, 3)), [Ellipsis, 1], np.arange(3.0), [1], [Ellipsis])
    array([[3., 3.],
           [3., 3.]])
    """
    from spfuse.numpy_einsum import einsum_call
    return einsum_call(operands, _run, out=out, dtype=dtype, order=order, casting=casting, optimize=optimize,
                       out_format=out_format, fusion=fusion, num_threads=num_threads)


def describe_execution(plan: Plan) -> str:
    """How a plan runs: the template kernel it matches, or the generic executor."""
    from spfuse.lowering.templates import match_template
    m = match_template(plan)
    if m is None:
        how = "generic loop-tree executor (Cython, nogil): one interpreter walk of the fused tree"
    else:
        roles = ", ".join(f"{n}={k}" for n, k in m.roles.items())
        how = f"template kernel '{m.kernel}' ({m.why}; {roles})" if roles else f"template kernel '{m.kernel}' ({m.why})"
    flat = _fibres(plan, {n: Format(tuple(i.levels), tuple(i.mode_order)) for n, i in plan.inputs.items()})
    return how if flat is None else f"{how}; over shared fibres, {flat.describe()}"


def describe_parallel(plan: Plan, operands: Mapping[str, Any] | None = None) -> str:
    """How a plan's loops run over threads, as execution decides it: inside
    each template kernel, or per top-level loop when the generic executor
    lowers the tree for ``operands`` (without them, where that is decided).

    >>> import numpy as np, spfuse
    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.ir.ops import TensorInfo
    >>> plan = plan_program(parse_program("y[i] = max(j, X[i,j] + Z[i,j])"),
    ...                     {n: TensorInfo.dense(n, (3, 4)) for n in "XZ"})
    >>> describe_parallel(plan, {"X": np.ones((3, 4)), "Z": np.ones((3, 4))})
    'i: blocks of iterations over the threads'
    """
    if _template(plan) is not None:
        return ("inside each kernel (see execution; a generic loop nest among its groups decides "
                "per top-level loop when it is lowered)")
    pending = "decided per top-level loop when the generic executor lowers the tree for the operands"
    if not operands or any(n not in operands for n in plan.program.inputs) or has_diagonal(plan.program):
        return pending + " (pass them to explain() to see it)"
    tensors, _ = binding.bind_operands(plan.program, operands)
    from spfuse.lowering.looptree import lower_to_looptree
    lowered = lower_to_looptree(plan, bind_aliases(plan, tensors))
    return "; ".join(f"{lowered.indices.get(var, var)}: {how}" for var, how in lowered.plan.parallel) or "no loop"


def _fibres(plan: Plan, formats: Mapping[str, Format]):
    """The plan's program over the fibres its sparse operands (stored as
    ``formats``) share (:mod:`spfuse.lowering.fibres`), when its results are
    stored dense (the flattened program's results are returned in their place)."""
    if not all(plan.formats[r].format_name == "dense" for r in plan.results if r in plan.formats):
        return None
    return shared_fibres(plan.program, formats)


class Kernel:
    """A program planned once and run many times (see :func:`compile`).

    >>> import spfuse
    >>> k = spfuse.compile("y[i] = A[i,j] * x[j]", A="csr")
    >>> k
    <spfuse.Kernel 'y[i] = A[i,j] * x[j]' fusion='auto' formats: A=csr>
    """

    def __init__(self, program: str, declared: Mapping[str, Any], fusion: str, out_format: str | None,
                 num_threads: int | None):
        _check_choice(fusion, FUSION_STRATEGIES, "fusion")
        self.text = program
        self.program = _parse(program)
        self.fusion = fusion
        self.out_format = out_format
        self.num_threads = num_threads
        self.declared = dict(declared)
        unknown = sorted(set(declared) - set(self.program.inputs))
        if unknown:
            raise ProgramError(f"compile(): {', '.join(map(repr, unknown))} not read by the program")
        self._examples = {n: v for n, v in declared.items() if not isinstance(v, (str, Format))}
        self._formats: dict[str, Format] = {}
        for name, spec in declared.items():
            if isinstance(spec, (str, Format)):
                from spfuse.formats import as_format
                ndim = self._ndim(name)
                self._formats[name] = as_format(spec, ndim)

    def _ndim(self, name: str) -> int:
        for s in self.program.statements:
            for a in iter_accesses(s.value):
                if a.name == name:
                    return len(a.indices)
        raise ProgramError(f"{name!r} is not read by the program")

    def _tensors(self, operands):
        """Operands converted to the declared formats, and the names this call
        converted itself (those need no second check)."""
        out, made = {}, set()
        for name, value in operands.items():
            fmt = self._formats.get(name)
            t = as_tensor(value, name=name)
            if t is not value:
                made.add(name)
            if fmt is not None and t.format != fmt and fmt.name != "coo":
                t = t.asformat(fmt)
                made.add(name)
            out[name] = t
        return out, frozenset(made)

    def __call__(self, **operands: Any):
        """Run the kernel on ``operands`` (declared operands may be omitted)."""
        if self._examples:
            operands = {**self._examples, **operands}
        if (not self._formats or binding.any_complex(operands.values())  # (complex: see complex_values)
                or all(binding.in_format(operands.get(n), f) for n, f in self._formats.items())):
            # nothing to convert: validated (and scanned once) like undeclared operands
            return _run(self.program, operands, self.out_format, self.fusion, self.num_threads)
        tensors, made = self._tensors(operands)
        return _run(self.program, tensors, self.out_format, self.fusion, self.num_threads, made)

    def _infos(self, operands=None) -> dict:
        given = {n: v for n, v in self.declared.items() if not isinstance(v, (str, Format))}
        given.update(operands or {})
        tensors = {n: as_tensor(given[n], name=n) for n in self.program.inputs if n in given}
        infos = _infos_of(tensors, shared_patterns(tensors))
        for name in self.program.inputs:
            if name not in infos:
                fmt = self._formats.get(name) or Format(("dense",) * self._ndim(name))
                infos[name] = TensorInfo(name, fmt.ndim, tuple(fmt.levels), tuple(fmt.mode_order),
                                         (None,) * fmt.ndim)
        return infos

    def plans(self, **operands: Any) -> dict:
        """The plan of every fusion strategy (or the error a strategy raised)."""
        infos = self._infos(operands)
        return {m: try_plan(self.program, infos, m) for m in FUSION_STRATEGIES}

    def explain(self, *, picture: str | os.PathLike[str] | None = None, **operands: Any) -> str:
        """The report of :mod:`spfuse.explain` (shapes from ``operands`` when given).

        ``picture="plan.svg"`` (or ``.png``, ``.pdf``) also draws the index
        trees before and after fusion, the temporaries and the kernel
        (:mod:`spfuse.explain_picture`; needs the ``plot`` extra).

        >>> import spfuse
        >>> print(spfuse.compile("y[i] = A[i,j] * x[j]", A="csr").explain().splitlines()[0][:33])
        spfuse plan  (fusion='auto', plan
        """
        from spfuse.explain import explain_plans
        plans = self.plans(**operands)
        if isinstance(plans[self.fusion], UnsupportedError):
            raise plans[self.fusion]
        execution = describe_execution(plans[self.fusion])
        if picture is not None:
            from spfuse.explain_picture import draw_plan
            draw_plan(plans[self.fusion], picture, execution)
        given = {**self._examples, **operands}
        parallel = describe_parallel(plans[self.fusion], self._tensors(given)[0] if self._formats else given)
        return explain_plans(plans, self.fusion, execution, parallel)

    def _repr_html_(self) -> str:
        """Jupyter shows the kernel as its explain() report.

        >>> import spfuse
        >>> spfuse.compile("y[i] = A[i,j] * x[j]", A="csr")._repr_html_()[:47]
        '<div class="spfuse-kernel"><b>&lt;spfuse.Kernel'
        """
        import html
        try:
            body = self.explain()
        except UnsupportedError as exc:
            body = f"not plannable with fusion={self.fusion!r}: {exc}"
        return (f'<div class="spfuse-kernel"><b>{html.escape(repr(self))}</b>'
                f"<pre>{html.escape(body)}</pre></div>")

    def vjp(self, cotangent: Any, wrt: Any = None, *, temporaries: str = "auto", **operands: Any) -> dict:
        """Gradients through this kernel (:func:`spfuse.vjp` with the declared formats)."""
        from spfuse.autodiff.kernel import kernel_vjp
        return kernel_vjp(self, cotangent, wrt, temporaries, operands)

    def explain_vjp(self, wrt: Any = None, *, temporaries: str = "auto") -> str:
        """The adjoint program :meth:`vjp` runs, with its keep/recompute choices."""
        from spfuse.autodiff.kernel import kernel_explain_vjp
        return kernel_explain_vjp(self, wrt, temporaries)

    def __repr__(self) -> str:
        fmts = ", ".join(f"{n}={f.name}" for n, f in self._formats.items())
        return f"<spfuse.Kernel {self.text!r} fusion={self.fusion!r}" + (f" formats: {fmts}>" if fmts else ">")


def compile(program: str, /, *, fusion: str = "auto", out_format: str | None = None,
            num_threads: int | None = None, **declared: Any) -> Kernel:
    """Plan ``program`` once; call the result with operands to run it.

    ``declared`` gives each operand's format (``B="csr"``) or an example
    operand (whose format, shape and dtype are then known to ``explain``).

    >>> import numpy as np, scipy.sparse as sp, spfuse
    >>> k = spfuse.compile("y[i] = A[i,j] * x[j]", A="csr")
    >>> k(A=sp.csr_array(np.eye(2)), x=np.array([1.0, 2.0]))
    array([1., 2.])
    """
    if not isinstance(program, str):
        raise TypeError(f"program must be a str, got {type(program).__name__}")
    return Kernel(program, declared, fusion, out_format, num_threads)
