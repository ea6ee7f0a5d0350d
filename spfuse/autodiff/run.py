"""Running adjoint programs: :func:`vjp` (vector-Jacobian products).

The adjoint program from :func:`~spfuse.autodiff.transform.adjoint` is
evaluated by the ordinary :func:`spfuse.evaluate` (planner, fusion,
executor), with its extra operands built here: cotangents, ones on each
sparse operand's pattern, ones vectors, and the forward temporaries kept.
"""
from __future__ import annotations

import functools
import time
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from spfuse.autodiff.transform import Adjoint, adjoint, split_reducing_terms
from spfuse.errors import ProgramError
from spfuse.frontend.ast import Program
from spfuse.frontend.check import check_program, result_shapes
from spfuse.frontend.parser import parse_program
from spfuse.lowering.transposes import sharing_copies, transposed_csr
from spfuse.memo import attached_dict
from spfuse.tensor import Tensor, as_tensor, values_at

_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)

__all__ = ["cached_adjoint", "execution_choices", "ExecutionChoice", "pattern_values", "run_adjoint", "run_forward",
           "vjp"]


@functools.lru_cache(maxsize=256)
def cached_adjoint(program: Program, wrt: tuple, cotangents: tuple, sparse: frozenset,
                   temporaries: str) -> Adjoint:
    """:func:`adjoint`, memoised (programs are immutable and hashable).

    >>> from spfuse.frontend.parser import parse_program
    >>> p = parse_program("y[i] = A[i,j] * x[j]")
    >>> cached_adjoint(p, ("x",), ("y",), frozenset(), "auto") is cached_adjoint(
    ...     p, ("x",), ("y",), frozenset(), "auto")
    True
    """
    return adjoint(program, wrt, cotangents, sparse, temporaries)


def _is_sparse(t: Tensor) -> bool:
    return not t.format.is_dense


def pattern_values(result: Any, pattern: Tensor) -> np.ndarray:
    """The values of ``result`` (any operand kind) at ``pattern``'s stored
    coordinates, in ``pattern``'s storage order; zero where ``result`` stores nothing.

    >>> import numpy as np
    >>> P = Tensor.from_numpy([[0.0, 5.0], [7.0, 0.0]], "csr")
    >>> pattern_values(np.array([[1.0, 2.0], [3.0, 4.0]]), P)
    array([2., 3.])
    """
    return values_at(result, pattern.coords, pattern.shape)


#: Adjoint programs longer than this always run one statement per
#: evaluate() call (each statement still planned and fused on its own).
#: Measured: the sparse-attention adjoint (22 statements, n = 200) took 10.7 s
#: as one program and 0.1 s statement by statement -- the whole-program plan
#: of such long programs is not yet good (a planner matter).  Shorter ones are
#: timed both ways on their first calls (see :class:`ExecutionChoice`).
SPLIT_ABOVE = 10


@functools.lru_cache(maxsize=256)
def _statements(program: Program) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """Per statement: its target, its text and the names it reads (made once
    per program); a sum of reducing terms split (:func:`~spfuse.autodiff.transform.split_reducing_terms`)."""
    from spfuse.frontend.ast import iter_accesses
    from spfuse.frontend.canonical import to_text
    taken = {a.name for st in program.statements for a in iter_accesses(st.value)} | {
        st.target.name for st in program.statements}
    out = []
    for whole in program.statements:
        for st in split_reducing_terms(whole, taken):
            text = to_text(st)
            out.append((st.target.name, text, tuple(parse_program(text).inputs)))
    return tuple(out)


_savings: dict = {}


def _saving_program(adj: Adjoint, with_results: bool) -> Program | None:
    """``adj.saving_program(with_results)``, made once per adjoint (it prints
    and parses a program); keyed by what it depends on (an Adjoint holds dicts)."""
    key = (adj.forward, tuple(adj.kept), tuple(sorted(adj.saved.items())), with_results)
    found = _savings.get(key)
    if found is None:
        if len(_savings) >= 256:
            _savings.pop(next(iter(_savings)))
        found = _savings[key] = adj.saving_program(with_results=with_results)
    return found


def _forward_programs(adj: Adjoint, with_results: bool) -> tuple[Program | None, Program | None]:
    """The saving program and the same without its copies (statement by
    statement), per adjoint object (remembered on it): a training loop's
    every forward pass asks, and the content-keyed caches below cost a key
    built per call."""
    ways = attached_dict(adj, "_forward_ways")
    found = ways.get(with_results)
    if found is None:
        saving = _saving_program(adj, with_results)
        statements = None if saving is None else _without_copies(saving, frozenset(adj.saved[t] for t in adj.kept))
        found = ways[with_results] = (saving, statements)
    return found


@functools.lru_cache(maxsize=256)
def _without_copies(saving: Program, copies: frozenset) -> Program:
    """A saving program without its ``T_saved = T`` statements."""
    from spfuse.frontend.canonical import to_text
    return parse_program(to_text(Program(tuple(st for st in saving.statements if st.target.name not in copies))))


@functools.lru_cache(maxsize=256)
def _result_shapes(program: Program, shapes: tuple) -> dict:
    """``result_shapes`` (once per program and operand shapes: it checks the whole program)."""
    return result_shapes(program, dict(shapes))


@functools.lru_cache(maxsize=256)
def _extents(program: Program, shapes: tuple) -> list:
    """Per statement, each index's extent (``check_program``, once per program and shapes)."""
    return check_program(program, dict(shapes))


def _evaluate(text: str, operands: Mapping[str, Any], fusion: str, num_threads: int | None,
              trusted: Container[str]) -> Any:
    """:func:`spfuse.evaluate`, without scanning again the operands named in
    ``trusted`` (validated when this call began, or made by spfuse since),
    its results as spfuse makes them (ndarrays and Tensors, a sparse one
    sharing its pattern with the operand it lives on): the next statement
    reads them without a conversion, a copy or a scan, and a transposed
    pattern is found again by its arrays."""
    from spfuse import api
    return api._run(api._parse(text), operands, None, fusion, num_threads, trusted, raw=True)


def _run_statements(program: Program, env: dict, fusion: str, num_threads: int | None,
                    trusted: Iterable[str]) -> dict:
    """Run ``program`` one statement per call on ``env`` (updated in place)."""
    made = set(trusted)
    for target, text, reads in _statements(program):
        env[target] = _evaluate(text, {n: env[n] for n in reads}, fusion, num_threads, made)
        made.add(target)   # spfuse's own result
    return env


def _run_split(program: Program, ops: Mapping[str, Any], fusion: str, num_threads: int | None,
               trusted: Iterable[str] = ()) -> dict:
    env = _run_statements(program, dict(ops), fusion, num_threads, trusted)
    return {n: env[n] for n in program.results}


def _run_fused(program: Program, ops: Mapping[str, Any], fusion: str, num_threads: int | None,
               trusted: Iterable[str] = ()) -> dict:
    reads = set(program.inputs)
    raw = _evaluate(program.text, {n: v for n, v in ops.items() if n in reads}, fusion, num_threads, set(trusted))
    return raw if isinstance(raw, dict) else {program.results[0]: raw}


class ExecutionChoice:
    """How one adjoint program runs for one operand signature: as one fused
    program or one statement at a time, decided by timing both.

    Neither is better in general (measured, 2000-node inputs, one thread:
    the GCN adjoint 25 ms fused vs 7 ms split -- the fused plan turns two
    GEMMs into per-row outer products; MTTKRP's 12 ms fused vs 108 ms
    split), and the planner's cost model does not yet price the difference.
    A backward pass repeats with one signature, so its first call measures:
    each way runs once to plan, then up to :data:`ROUNDS` timed rounds
    alternating the ways, and the faster one's result is returned -- by that call and
    every later one, so repeated calls give bit-identical gradients (the two
    ways may differ in rounding order).  A way whose first run (planning
    included) took over :data:`HOPELESS` times the fastest way's, and
    :data:`HOPELESS_SLACK` seconds more, is not run again: a fused adjoint
    whose contractions fell to the generic executor took 400-850 ms a run
    against 15-40 ms statement by statement (medium SDDMM family), and its
    three timed rounds made a first ``vjp`` call of 2-3 s.

    The choice must not depend on what else the machine runs: the clock is
    the calling thread's CPU time (time spent descheduled on a busy machine
    does not count, where it swung wall-clock choices -- the autoencoder's
    forward and adjoint flipped between runs), each way counts its best
    round, and statement by statement must win by :data:`MARGIN` (a near
    tie goes to the one fused program: fewer calls, one plan).  The calling
    thread takes its share of every parallel region, so its CPU time
    follows the elapsed time of the work; the whole process's would count
    every worker's, and the workers' spinning between regions: it charged
    SDDMM-div's fused adjoint (128 ms elapsed, two threads) 610 ms, against
    290 ms for statements that took 141-183 ms.

    An adjoint with an :attr:`~spfuse.autodiff.transform.Adjoint.alternative`
    measures four ways, ``(shared, split)``: the first way (its own program,
    fused) is kept unless another wins by :data:`MARGIN` (here 4.7 against 5
    does not).

    The rounds alternate the ways' order, the first in reverse of the
    first runs': right after the first runs, the next run of a way still
    paid for memory the process touched for the first time (SDDMM-div's
    fused adjoint at 100k rows: 0.73 s in that slot, 0.12-0.16 s later,
    which chose the statements, 25% slower), and in reverse it is the way
    planned last -- never the one fused program -- that takes the slot.

    The clock readings below are a first run of each way, then the rounds:

    >>> c = ExecutionChoice()
    >>> c.measure(lambda split: "split" if split else "fused",
    ...           clock=iter([0, 6, 0, 3, 0, 1, 0, 5]).__next__)
    'split'
    >>> c.split, c.describe()
    (True, 'execution: statement by statement (measured 5e+03 ms fused, 1e+03 ms statement by statement)')
    >>> c = ExecutionChoice(((False, False), (True, True)))
    >>> c.measure(lambda way: way, clock=iter([0, 5, 0, 5, 0, 4.7, 0, 5]).__next__)
    (False, False)
    >>> print(c.describe())  # doctest: +ELLIPSIS
    execution: as one fused program (measured 5e+03 ms as one fused program, 4.7e+03 ms shared contractions, ...

    Ways skipped before measuring (their plans leave contractions to the
    generic executor) leave no fused program to favour: the fastest wins.

    >>> c = ExecutionChoice(((False, True), (True, True)), skipped=((False, False), (True, False)))
    >>> c.measure(lambda way: way, clock=iter([0, 5, 0, 5, 0, 4.7, 0, 5]).__next__)
    (True, True)

    A hopeless first run (9 s against 1 s) is not repeated:

    >>> c = ExecutionChoice()
    >>> c.measure(lambda split: split, clock=iter([0, 9, 0, 1, 0, 1.5]).__next__)
    True
    >>> c.seconds
    {False: 9, True: 1.5}

    A hopeless first run short enough to have been the process's
    first-time costs (0.09 s against 0.2 ms) is run once more before it
    counts; here it then wins:

    >>> c = ExecutionChoice()
    >>> c.measure(lambda split: split, clock=iter([0, .09, 0, .0002, 0, .00015, 0, .0002, 0, .00015, 0, .0002,
    ...                                            0, .00015, 0, .0002, 0, .00015]).__next__)
    False

    The rounds stop once they have taken :data:`ROUND_BUDGET` seconds,
    as timed (one round at least; the first runs, which planned, are not
    counted): above, each way took seconds, so one round each.  Ways of a
    few milliseconds get all :data:`ROUNDS`:

    >>> c = ExecutionChoice()
    >>> c.measure(lambda split: split, clock=iter([0, .006, 0, .004, 0, .003, 0, .005, 0, .005, 0, .002, 0, .004,
    ...                                            0, .005]).__next__)
    True
    >>> c.seconds[False], c.seconds[True]
    (0.005, 0.002)
    """

    #: timed rounds per way, at most
    ROUNDS = 3
    #: seconds (the calling thread's CPU time) after which no further timed
    #: round starts: fewer rounds when the ways are slow (at least one).
    #: Estimated from the first runs, which include planning, adjoints of
    #: 20-90 ms got a single round (SDDMM-SpMM-GEMM at 20k rows: 380 ms of
    #: first runs, 180 ms a round), and one reading of each way chose
    ROUND_BUDGET = 0.2
    #: how much faster statement by statement must be to be chosen
    MARGIN = 0.1
    #: a way whose first run took more than this many times the fastest
    #: way's (and HOPELESS_SLACK seconds more) is not timed further
    HOPELESS = 3.0
    HOPELESS_SLACK = 0.05
    #: a hopeless first run shorter than this (seconds) is run once more
    #: before it counts: the process's first kernel call, thread team and
    #: imports land on whichever way runs first (84 ms of a GCN forward whose
    #: fused way then runs in 0.18 ms)
    RERUN_BELOW = 0.25

    def __init__(self, ways: tuple = (False, True), skipped: tuple = ()):
        self.ways = tuple(ways)   # split, or (shared, split); the first is the default
        #: ways not run at all: planned to leave contractions to the generic executor
        self.skipped = tuple(skipped)
        self.seconds: dict[Any, float] = {}
        self.way: Any = None
        self.split: bool | None = None

    def measure(self, run: Callable[[Any], Any], clock: Callable[[], float] = time.thread_time) -> Any:
        """Run ``run(way)`` every way: once to plan, then :data:`ROUNDS` timed
        rounds alternating the ways that were not hopeless on their first run
        (the best of each counts; a hopeless way counts its first run); the
        winner's result."""
        results = {}
        first_run = {}
        for way in self.ways:
            start = clock()
            results[way] = run(way)  # plans
            first_run[way] = clock() - start
        if len(self.ways) == 1:   # (the others skipped: nothing to compare)
            (way,) = self.ways
            self.seconds[way], self.way = first_run[way], way
            self.split = way[1] if isinstance(way, tuple) else way
            return results[way]
        fastest = min(first_run.values())
        for way in self.ways:   # (the way run first also paid the process's first-time costs)
            if self.HOPELESS * fastest + self.HOPELESS_SLACK < first_run[way] < self.RERUN_BELOW:
                start = clock()
                results[way] = run(way)
                first_run[way] = min(first_run[way], clock() - start)
        fastest = min(first_run.values())
        timed = [w for w in self.ways if first_run[w] <= self.HOPELESS * fastest + self.HOPELESS_SLACK]
        self.seconds.update({w: first_run[w] for w in self.ways if w not in timed})
        spent = 0.0   # (the rounds' own times: the first runs also planned)
        for r in range(self.ROUNDS):
            if r and spent >= self.ROUND_BUDGET:
                break
            for way in (timed[::-1] if r % 2 == 0 else timed):
                start = clock()
                results[way] = run(way)
                took = clock() - start
                spent += took
                self.seconds[way] = min(self.seconds.get(way, float("inf")), took)
        first = self.ways[0]
        best = min(self.ways, key=self.seconds.__getitem__)
        # (the margin favours the one fused program; with the fused ways
        # skipped, the statements' ways are compared as measured)
        if not self.skipped and not self.seconds[best] < (1.0 - self.MARGIN) * self.seconds[first]:
            best = first
        self.way = best
        self.split = best[1] if isinstance(best, tuple) else best
        return results[best]

    @staticmethod
    def _label(way) -> str:
        if isinstance(way, tuple):
            shared, split = way
            return ("shared contractions, " if shared else "") + ExecutionChoice._label(split)
        return "statement by statement" if way else "as one fused program"

    def describe(self) -> str:
        """The measurement and the choice, in words."""
        if self.split is None:
            return "execution: not measured yet"
        skipped = "" if not self.skipped else (
            f"; not run: {', '.join(self._label(w) for w in self.skipped)}, whose plan leaves contractions "
            "to the generic executor")
        if self.ways == (False, True):
            return (f"execution: {self._label(self.split)} (measured {1e3 * self.seconds[False]:.3g} ms fused, "
                    f"{1e3 * self.seconds[True]:.3g} ms statement by statement)")
        measured = ", ".join(f"{1e3 * self.seconds[w]:.3g} ms {self._label(w)}" for w in self.ways)
        return f"execution: {self._label(self.way)} (measured {measured}{skipped})"


_choices: dict = {}
_MAX_CHOICES = 256


def _signature(ops: Mapping[str, Any]) -> tuple:
    # (per call: the objects themselves, hashable, rather than their texts; in
    # the operands' order, which each caller builds the same way every call)
    sig = []
    for n, v in ops.items():
        kind = type(v)
        if kind is Tensor:
            sig.append((n, kind, v._shape, v._format))
        elif kind is np.ndarray:
            sig.append((n, kind, v.shape, None))
        else:
            sig.append((n, kind, getattr(v, "shape", ()), getattr(v, "format", None)))
    return tuple(sig)


def execution_choices(program: Program) -> list[ExecutionChoice]:
    """The fused-or-split measurements made so far for an adjoint program.

    >>> execution_choices(parse_program("y[i] = x[i]"))
    []
    """
    return [c for key, c in list(_choices.items()) if key[0] == program]


#: operands holding fewer values than this are measured every way, even a
#: fused program leaving contractions to the generic executor (it is fast enough there)
INTERPRETED_MIN_VALUES = 1 << 16


def _interpreted(program: Program, ops: Mapping[str, Any], fusion: str, trusted: Iterable[str]) -> bool:
    """Would ``program``, run as one fused program on ``ops``, leave large
    contractions to the generic executor (planned, not run)?  Such a run
    took 400-850 ms where the statements took 15-40 ms (medium SDDMM
    family): it is not measured at all."""
    reads = set(program.inputs)
    values = sum(v._values.size if type(v) is Tensor else getattr(v, "size", 1) for n, v in ops.items() if n in reads)
    if values < INTERPRETED_MIN_VALUES:
        return False
    from spfuse import api
    return api.interprets_contractions(program, {n: v for n, v in ops.items() if n in reads}, fusion,
                                       frozenset(trusted))


def _measured(key: tuple, run: Callable[[Any], Any], ways: tuple = (False, True),
              skip: Callable[[Any], bool] | None = None) -> Any:
    """``run(way)`` the way measured for ``key`` (measuring ``ways`` on the
    first call, but those ``skip`` rules out, unless it rules out all)."""
    choice = _choices.get(key)
    if choice is None:
        if len(_choices) >= _MAX_CHOICES:
            _choices.pop(next(iter(_choices)))
        skipped = tuple(w for w in ways if skip is not None and skip(w))
        if len(skipped) == len(ways):
            skipped = ()
        choice = _choices[key] = ExecutionChoice(tuple(w for w in ways if w not in skipped), skipped)
        return choice.measure(run)
    return run(choice.way)


@sharing_copies   # (its statements' kernels share transposed copies of the operands)
def run_forward(program: Program, adj: Adjoint | None, ops: Mapping[str, Any], *, fusion: str = "auto",
                num_threads: int | None = None, results: bool = True,
                trusted: Iterable[str] = ()) -> tuple[dict, dict]:
    """The forward pass of a differentiated program: ``(results, saved)``, the
    program's results and the forward temporaries ``adj`` keeps.

    Two ways, measured on the first call of each operand signature
    (:class:`ExecutionChoice`): the saving program (the program plus a copy
    ``T_saved = T`` per kept temporary) as one fused program, or the program
    one statement at a time, the kept temporaries being statement results
    there (no copies).  As for adjoints, neither wins in general -- the fused
    plan of a multi-statement forward can be slower than its statements
    planned alone, each of which may reach a template kernel.
    ``results=False``: only what the kept temporaries need is run.
    ``trusted``: operands validated by the caller in this call (their
    indices are not scanned again per statement).

    >>> import numpy as np
    >>> from spfuse.autodiff import adjoint
    >>> p = parse_program("T[i] = relu(x[i]); y = sum(i, T[i] * T[i])")
    >>> adj = adjoint(p, ("x",), ("y",), frozenset(), "keep")
    >>> out, saved = run_forward(p, adj, {"x": np.array([-1.0, 2.0])})
    >>> float(out["y"]), saved["T"].tolist()
    (4.0, [0.0, 2.0])
    """
    trusted = set(trusted)
    kept = adj.kept if adj is not None else ()
    saving, statements = _forward_programs(adj, results) if adj is not None and kept else (None, None)
    if saving is None:
        raw = _run_fused(program, ops, fusion, num_threads, trusted)
        return raw, {}
    assert statements is not None and adj is not None   # (a saving program comes with both)

    def run(split: bool):
        if split:
            env = _run_statements(statements, dict(ops), fusion, num_threads, trusted)
            return ({r: env[r] for r in program.results} if results else {}), {t: env[t] for t in kept}
        raw = _run_fused(saving, ops, fusion, num_threads, trusted)
        return ({r: raw[r] for r in program.results} if results else {}), {t: raw[adj.saved[t]] for t in kept}

    return _measured((saving, _signature(ops), fusion, num_threads), run,
                     skip=lambda split: not split and _interpreted(saving, ops, fusion, trusted))


@dataclass(frozen=True)
class _Static:
    """What :func:`run_adjoint` needs of an adjoint (with or without its
    alternative) besides the operands: worked out once, not per call."""

    #: the ones vectors either program reads: name -> (statement, index)
    ones: Mapping[str, tuple]
    #: (result, cotangent name) of the cotangents either program reads
    cotangents_read: tuple[tuple[str, str], ...]
    #: with an alternative: the (shared, split) ways measured, each program
    #: one statement at a time when long
    ways: tuple


def _static(adj: Adjoint, alternative: Adjoint | None) -> _Static:
    made = attached_dict(adj, "_run_static")
    found = made.get(alternative is not None)
    if found is None:
        variants = (adj,) if alternative is None else (adj, alternative)
        programs = [v.program for v in variants if v.program is not None]
        reads = {n for p in programs for n in p.inputs}
        ways: tuple = ()
        if alternative is not None and alternative.program is not None and adj.program is not None:
            ways = tuple((shared, s) for shared, p in ((False, adj.program), (True, alternative.program))
                         for s in (False, True)
                         if not (s and len(p.statements) < 2) and not (not s and len(p.statements) > SPLIT_ABOVE))
        found = made[alternative is not None] = _Static(
            {n: k for v in variants for n, k in v.ones.items()},
            tuple((r, c) for r, c in adj.cotangents.items() if c in reads), ways)
    return found


@sharing_copies
def run_adjoint(adj: Adjoint, tensors: Mapping[str, Tensor], cotangents: Mapping[str, Any],
                saved: Mapping[str, Any] | None = None, *, fusion: str = "auto",
                num_threads: int | None = None, split: bool | None = None,
                trusted: Iterable[str] = (), transposes: Mapping[str, Tensor] | None = None) -> dict[str, Any]:
    """Evaluate ``adj`` and return, per ``wrt`` name, the raw gradient: a dense
    ``ndarray`` of the operand's shape, or for a sparse operand the values
    array on its pattern (storage order of ``tensors[name]``).

    ``tensors`` are the forward operands as :class:`Tensor`; ``saved`` the kept
    forward temporaries (computed here from ``tensors`` when not given).
    ``split``: run the adjoint program as one fused program (False) or one
    statement at a time (True); by default split when it has more than
    :data:`SPLIT_ABOVE` statements, else measured (:class:`ExecutionChoice`);
    an adjoint with an ``alternative`` (contractions shared) measures both
    programs both ways, unless ``split`` is given (``adj.program`` then runs).
    ``trusted``: names in ``tensors`` validated by the caller in this call
    (not scanned again per statement); the operands made here from them,
    the kept temporaries and the transposes are trusted too.
    ``transposes``: sparse operands' transposes as CSR the caller already
    holds (name -> Tensor, see :attr:`Adjoint.read_transposed`), used
    instead of making them here.
    """
    trusted = set(trusted)
    # (float32 only when every operand is: a Tensor holds float32 or float64; np.result_type costs µs per call)
    dtype = _F32 if tensors and all(t._values.dtype == _F32 for t in tensors.values()) else _F64
    out: dict[str, Any] = {}
    if adj.program is not None:
        if adj.kept and saved is None:
            used = set(_saving_program(adj, False).inputs)
            _, saved = run_forward(adj.forward, adj, {n: t for n, t in tensors.items() if n in used},
                                   fusion=fusion, num_threads=num_threads, results=False, trusted=trusted)
            trusted |= set(saved)   # made here
        ops: dict[str, Any] = dict(tensors)
        ops.update({adj.cotangents[r]: v for r, v in cotangents.items() if r in adj.cotangents})
        for name, pattern in adj.patterns.items():
            t = tensors[name]
            ops[pattern] = t.with_values(np.ones(t.nnz, dtype=t.dtype))
            if name in trusted:   # (its index arrays)
                trusted.add(pattern)
        # the alternative (shared contractions) reads the same operands, maybe not all of them
        alternative = adj.alternative if split is None else None
        variants = (adj,) if alternative is None else (adj, alternative)
        for v in variants:
            for name, transposed in v.transposed.items():
                if transposed not in ops:
                    ops[transposed] = (transposes[name] if transposes and name in transposes
                                       else transposed_csr(tensors[name], num_threads))
                    if name in trusted:
                        trusted.add(transposed)
        static = _static(adj, alternative)
        if static.ones:
            extents = _extents(adj.forward, tuple(sorted((n, t.shape) for n, t in tensors.items())))
            for name, (statement, index) in static.ones.items():
                ops[name] = np.ones(extents[statement][index], dtype=dtype)
        if saved:
            ops.update(saved)
        program = adj.program
        for result, name in static.cotangents_read:
            if name not in ops:   # a result without a cotangent contributes nothing
                shapes = tuple(sorted((n, t.shape) for n, t in tensors.items()))
                ops[name] = np.zeros(_result_shapes(adj.forward, shapes)[result], dtype=dtype)
        if alternative is not None:
            assert alternative.program is not None
            programs = {False: program, True: alternative.program}
            raw = _measured((program, _signature(ops), fusion, num_threads), lambda way: (
                _run_split if way[1] else _run_fused)(programs[way[0]], ops, fusion, num_threads, trusted),
                static.ways, skip=lambda way: not way[1] and _interpreted(programs[way[0]], ops, fusion, trusted))
        elif split is not None or len(program.statements) < 2:
            raw = (_run_split if split else _run_fused)(program, ops, fusion, num_threads, trusted)
        elif len(program.statements) > SPLIT_ABOVE:
            raw = _run_split(program, ops, fusion, num_threads, trusted)
        else:
            raw = _measured((program, _signature(ops), fusion, num_threads), lambda split: (
                _run_split if split else _run_fused)(program, ops, fusion, num_threads, trusted),
                skip=lambda split: not split and _interpreted(program, ops, fusion, trusted))
        for name, gname in adj.gradients.items():
            out[name] = raw[gname]
    for name in adj.wrt:
        t = tensors[name]
        if _is_sparse(t):
            out[name] = (pattern_values(out[name], t) if name in out
                         else np.zeros(t.nnz, dtype=t.dtype)).astype(t.dtype, copy=False)
        elif name in out:
            g = out[name]
            if type(g) is np.ndarray and g.dtype == t._values.dtype and g.shape == t._shape:
                continue   # (the common case: already the operand's dtype and shape)
            g = g.toarray() if sp.issparse(g) else (g.todense() if isinstance(g, Tensor) else g)
            out[name] = np.asarray(g, dtype=t.dtype).reshape(t.shape)
        else:
            out[name] = np.zeros(t.shape, dtype=t.dtype)
    return out


def _in_world(original: Any, t: Tensor, grad: np.ndarray) -> Any:
    """A raw gradient in the world its operand came from."""
    if _is_sparse(t):
        g = t.with_values(grad)
        if sp.issparse(original):
            return g.to_scipy(t.origin).asformat(original.format)
        return g
    if isinstance(original, Tensor):
        return Tensor.from_numpy(grad, original.format) if original.format.is_dense else grad
    if np.ndim(original) == 0 and not isinstance(original, np.ndarray):
        return float(grad)
    return grad


def vjp(program: str | Program, cotangent: Any, wrt: Iterable[str] | None = None, *,
        temporaries: str = "auto", fusion: str = "auto", num_threads: int | None = None,
        **operands: Any) -> dict[str, Any]:
    """Vector-Jacobian product: the gradients of ``<cotangent, program(operands)>``.

    ``cotangent`` has the result's shape: an ndarray for a dense result, a
    float for a scalar one, a sparse array (on the result's pattern) for a
    sparse one; a dict ``{result: cotangent}`` when the program has several
    results (a result left out contributes nothing).  ``wrt`` names the
    operands to differentiate (default: every input).  Returns ``{name:
    gradient}``: a dense operand's gradient is dense with its shape; a
    sparse operand's lives on its stored pattern (same indices, the values'
    gradient), in the operand's own world (scipy in, scipy out).
    ``temporaries="keep"|"recompute"`` overrides the choice for forward
    temporaries (see :func:`spfuse.autodiff.adjoint`).

    >>> import numpy as np, scipy.sparse as sp, spfuse
    >>> B = sp.csr_array(np.array([[1.0, 0.0], [0.0, 2.0]]))
    >>> C, D = np.ones((2, 3)), np.ones((3, 2))
    >>> g = spfuse.vjp("A[i,j] = B[i,j] * (C[i,k] * D[k,j])", B, wrt=("B", "C"), B=B, C=C, D=D)
    >>> g["B"].toarray()          # on B's pattern: dA * (C @ D)
    array([[3., 0.],
           [0., 6.]])
    >>> g["C"]                    # (dA * B) @ D.T
    array([[1., 1., 1.],
           [4., 4., 4.]])
    """
    if isinstance(program, str):
        program = parse_program(program)
    elif not isinstance(program, Program):
        raise TypeError(f"program must be a str or a Program, got {type(program).__name__}")
    results = program.results
    if isinstance(cotangent, Mapping):
        cotangents = dict(cotangent)
        unknown = sorted(set(cotangents) - set(results))
        if unknown:
            raise ValueError(f"cotangent given for {', '.join(map(repr, unknown))}, not a result of the "
                             f"program; results: {', '.join(results)}")
    elif len(results) == 1:
        cotangents = {results[0]: cotangent}
    else:
        raise TypeError(f"the program has {len(results)} results ({', '.join(results)}): "
                        "give the cotangent as a dict {result: cotangent}")
    missing = sorted(set(program.inputs) - set(operands))
    if missing:
        raise ProgramError(f"vjp(): operand(s) {', '.join(map(repr, missing))} not given")
    tensors = {n: as_tensor(v, name=n) for n, v in operands.items()}
    shapes = _result_shapes(program, tuple(sorted((n, t.shape) for n, t in tensors.items())))
    for name, value in cotangents.items():
        shape = tuple(np.shape(value)) if not hasattr(value, "shape") else tuple(value.shape)
        if shape != shapes[name]:
            raise ValueError(f"cotangent of {name!r}: expected shape {shapes[name]} (the result's), "
                             f"got {shape}")
    wrt = tuple(program.inputs) if wrt is None else ((wrt,) if isinstance(wrt, str) else tuple(wrt))
    sparse = frozenset(n for n, t in tensors.items() if _is_sparse(t))
    adj = cached_adjoint(program, wrt, tuple(cotangents), sparse, temporaries)
    # operands as_tensor made are validated now; a caller's own Tensor is scanned per call as evaluate() does
    made = [n for n, v in operands.items() if not isinstance(v, Tensor)]
    raw = run_adjoint(adj, tensors, cotangents, fusion=fusion, num_threads=num_threads, trusted=made)
    return {n: _in_world(operands[n], tensors[n], raw[n]) for n in wrt}
