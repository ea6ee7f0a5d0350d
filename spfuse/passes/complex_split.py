"""Complex values as pairs of real values: a program over complex operands
rewritten into a program over their real and imaginary parts.

This is the standard complex lowering compilers use (MLIR's
``complex-to-standard``): every complex operand ``X`` becomes two real
operands ``X__re`` and ``X__im``, every complex statement ``T = e`` becomes
``T__re = re(e)`` and ``T__im = im(e)``, and the caller recombines the two
real results.  The rewritten program is ordinary spfuse index notation, so
it runs on every existing planner pass and kernel unchanged.

Rules (``x = a + bi``, ``y = c + di``; a part that is structurally zero is
dropped, so a real factor costs 2 products, not 4)::

    x + y, x - y   ->  (a ± c) + (b ± d)i
    x * y          ->  (ac - bd) + (ad + bc)i
    x / y          ->  ((ac + bd) + (bc - ad)i) / (c*c + d*d)
    -x             ->  -a - bi
    sum(k, x)      ->  sum(k, a) + sum(k, b)i
    abs(x)         ->  sqrt(a*a + b*b)          (a real result)
    where(r, x, y) ->  where(r, a, c) + where(r, b, d)i   (r real)

A product needs each part of each factor twice.  A factor that is not a
plain access or literal is therefore first bound to a temporary statement
(two statements for a complex one), so a chain of ``k`` complex factors
costs ``4(k-1)`` real products, not ``2**k`` copies of the chain.  In
practice the bound factors are reductions (``sum(k, A*X)`` in ``A*X*W``),
which the three-address decomposition makes temporaries of anyway.

Everything else applied to a complex value (``exp log relu sigmoid tanh
sqrt``, ``max``/``min`` reductions, a complex ``where`` condition) raises
:class:`~spfuse.errors.UnsupportedError` naming the function and the dtype.

Division and ``abs`` use the textbook formulas: unlike numpy (Smith's
division, ``hypot``) they overflow when ``|y|**2`` or ``|x|**2`` exceeds the
float64 range (about ``1e154``), and ``x / 0`` gives ``nan`` parts where
numpy may give ``inf``.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from spfuse.errors import UnsupportedError
from spfuse.frontend.ast import Access, Assignment, Binary, Expr, Literal, Program, Reduce, Unary, Where, iter_accesses
from spfuse.frontend.canonical import to_text
from spfuse.frontend.parser import parse_program
from spfuse.frontend.reductions import children, free_indices
from spfuse.passes.rename import distinct_binders

__all__ = ["ComplexSplit", "NeedsExtents", "TermExpansion", "expand_terms", "split_complex", "part_names",
           "with_distinct_binders"]

#: a value as its (real, imaginary) parts; ``None`` is a part known to be zero
Parts = tuple  # tuple[Expr | None, Expr | None]


@dataclass(frozen=True)
class ComplexSplit:
    """A complex program lowered to real arithmetic.

    ``program``: the real program (parsed, reductions explicit).
    ``inputs``: per complex input, the names its real and imaginary parts are
    read under.  ``results``: per result of the original program, in order,
    the result names of its real and imaginary parts in ``program`` (``None``
    for a part that is identically zero).  ``complex_results``: the results
    whose value is complex (the others, such as ``abs(z)``, are real).
    """

    program: Program
    inputs: Mapping[str, tuple[str, str]]
    results: Mapping[str, tuple[str | None, str | None]]
    complex_results: frozenset[str]
    #: part results that hold only some of their result's modes (constant along the others), with the
    #: positions they hold: ``R[i,j] = E[i] + F[i,j]`` with real ``F`` has ``R__im[i] = E__im[i]``
    kept: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


class NeedsExtents(LookupError):
    """:func:`split_complex` needs the index extents of the program (see its ``extents``)."""


def with_distinct_binders(program: Program) -> Program:
    """``program`` with every reduction index distinct from the other index names of its statement
    (:func:`~spfuse.passes.rename.distinct_binders`), so a sub-expression bound to a temporary never
    has an index both free and summed.

    >>> from spfuse.frontend.parser import parse_program
    >>> from spfuse.frontend.canonical import to_text
    >>> to_text(with_distinct_binders(parse_program("R[i,k] = sum(j, A[i,j]) - B[i,j,k]")))
    'R[i, k] = sum(j1, A[i, j1]) - sum(j2, B[i, j2, k])'
    """
    return Program(tuple(Assignment(s.target, distinct_binders(s), s.span) for s in program.statements),
                   program.text)


def part_names(name: str, taken: Iterable[str]) -> tuple[str, str]:
    """The names of ``name``'s real and imaginary parts, unused in ``taken``.

    >>> part_names("A", {"A", "B"})
    ('A__re', 'A__im')
    >>> part_names("A", {"A", "A__re"})
    ('A___re', 'A___im')
    """
    taken = set(taken)
    sep = "__"
    while f"{name}{sep}re" in taken or f"{name}{sep}im" in taken:
        sep += "_"
    return f"{name}{sep}re", f"{name}{sep}im"


def _atomic(e: Expr | None) -> bool:
    return e is None or isinstance(e, (Access, Literal))


def _add(x: Expr | None, y: Expr | None) -> Expr | None:
    if y is None:
        return x
    return y if x is None else Binary("+", x, y)


def _sub(x: Expr | None, y: Expr | None) -> Expr | None:
    if y is None:
        return x
    return _neg(y) if x is None else Binary("-", x, y)


def _neg(x: Expr | None) -> Expr | None:
    return None if x is None else Unary("neg", x)


def _mul(x: Expr | None, y: Expr | None) -> Expr | None:
    return None if x is None or y is None else Binary("*", x, y)


def _required(x: Expr | None) -> Expr:
    """``x``, known not to be a zero part here."""
    assert x is not None
    return x


def _div(x: Expr | None, y: Expr) -> Expr | None:
    return None if x is None else Binary("/", x, y)


class _Splitter:
    """One walk over a program, emitting the real statements in order."""

    def __init__(self, program: Program, complex_inputs: frozenset[str], dtype: str,
                 extents: Sequence[Mapping[str, int]] | None):
        self.dtype = dtype
        self.extents = extents
        self.statement_number = 0
        taken = set(program.inputs) | set(program.assigned)
        for s in program.statements:
            taken.update(a.name for a in iter_accesses(s.value))
        self.taken = taken
        #: name -> (real part name or None, imaginary part name or None) for complex names
        self.parts: dict[str, tuple[str | None, str | None]] = {}
        #: part name -> positions of its name's indices it holds, when not all of them
        self.kept: dict[str, tuple[int, ...]] = {}
        self.inputs: dict[str, tuple[str, str]] = {}
        for name in program.inputs:
            if name in complex_inputs:
                self.inputs[name] = self.parts[name] = self._fresh_parts(name)
        self.statements: list[Assignment] = []
        self._temps = (f"_cx{n}" for n in itertools.count() if f"_cx{n}" not in taken)

    def _fresh_parts(self, name: str) -> tuple[str, str]:
        re_name, im_name = part_names(name, self.taken)
        self.taken.update((re_name, im_name))
        return re_name, im_name

    def unsupported(self, what: str) -> UnsupportedError:
        return _unsupported(what, self.dtype)

    # -- values ------------------------------------------------------------
    def split(self, e: Expr) -> Parts:
        """``e`` as (real part, imaginary part)."""
        if isinstance(e, Access):
            if e.name not in self.parts:
                return e, None
            return tuple(None if part is None else Access(part, self._held(part, e.indices))
                         for part in self.parts[e.name])
        if isinstance(e, Literal):
            value = complex(e.value)
            if value.imag == 0:
                return Literal(value.real), None
            return (Literal(value.real) if value.real != 0 else None), Literal(value.imag)
        if isinstance(e, Binary):
            return self.binary(e)
        if isinstance(e, Unary):
            return self.unary(e)
        if isinstance(e, Reduce):
            re, im = self.split(e.body)
            if im is not None and e.op != "sum":
                raise self.unsupported(f"{e.op}() reduction")
            return self.reduce(e, re), self.reduce(e, im)
        if isinstance(e, Where):
            cond, cond_im = self.split(e.cond)
            if cond_im is not None:
                raise self.unsupported("where() condition")
            then, other = self.split(e.then), self.split(e.other)
            if then[1] is None and other[1] is None:
                return Where(cond, then[0], other[0]), None
            cond = self.bound((cond, None), e.cond)[0]
            pick = lambda a, b: None if a is None and b is None else Where(  # noqa: E731
                cond, Literal(0.0) if a is None else a, Literal(0.0) if b is None else b)
            return pick(then[0], other[0]), pick(then[1], other[1])
        raise TypeError(f"expected an expression node, got {type(e).__name__}")

    def reduce(self, e: Reduce, part: Expr | None) -> Expr | None:
        if part is None:
            return None
        if e.index in free_indices(part):
            return Reduce(e.op, e.index, part)
        # sum(k, E[i] + F[i,k]) with real F: the imaginary part does not use k, and sums
        # extent(k) copies of E__im[i] (a reduction over an unused index is no program)
        if self.extents is None:
            raise NeedsExtents(e.index)
        return Binary("*", Literal(float(self.extents[self.statement_number][e.index])), part)

    def binary(self, e: Binary) -> Parts:
        x, y = self.split(e.left), self.split(e.right)
        if e.op == "+":
            return _add(x[0], y[0]), _add(x[1], y[1])
        if e.op == "-":
            return _sub(x[0], y[0]), _sub(x[1], y[1])
        if x[1] is None and y[1] is None:
            return Binary(e.op, x[0], y[0]), None
        if e.op == "*":
            # each part of one factor meets every non-zero part of the other
            if y[1] is not None and y[0] is not None:
                x = self.bound(x, e.left)
            if x[1] is not None and x[0] is not None:
                y = self.bound(y, e.right)
            (a, b), (c, d) = x, y
            return _sub(_mul(a, c), _mul(b, d)), _add(_mul(a, d), _mul(b, c))
        assert e.op == "/"
        if y[1] is None:  # complex / real
            if x[0] is not None and x[1] is not None:
                y = self.bound(y, e.right)
            return _div(x[0], y[0]), _div(x[1], y[0])
        # x / y = x * conj(y) / |y|**2
        x, y = self.bound(x, e.left), self.bound(y, e.right)
        (a, b), (c, d) = x, y
        norm = self.bound((_add(_mul(c, c), _mul(d, d)), None), e.right)[0]
        return _div(_add(_mul(a, c), _mul(b, d)), norm), _div(_sub(_mul(b, c), _mul(a, d)), norm)

    def unary(self, e: Unary) -> Parts:
        re, im = self.split(e.arg)
        if e.fn == "neg":
            return _neg(re), _neg(im)
        if im is None:
            return Unary(e.fn, re), None
        if e.fn == "abs":
            re, im = self.bound((re, im), e.arg)
            return Unary("sqrt", _required(_add(_mul(re, re), _mul(im, im)))), None
        raise self.unsupported(f"{e.fn}()")

    def bound(self, parts: Parts, origin: Expr) -> Parts:
        """``parts`` as plain accesses: a compound part becomes a temporary
        statement over its own free indices (so it is computed once however
        often it is read)."""
        if all(_atomic(p) for p in parts):
            return parts
        name = next(self._temps)
        names = self._fresh_parts(name) if parts[1] is not None else (name, None)
        self.taken.add(name)
        out = []
        for part, part_name in zip(parts, names, strict=True):
            if _atomic(part):
                out.append(part)
                continue
            indices = free_indices(part)
            assert part_name is not None  # only a zero part has no name, and it is atomic
            self.statements.append(Assignment(Access(part_name, indices), part))
            out.append(Access(part_name, indices))
        return tuple(out)

    def _held(self, part: str, indices: tuple[str, ...]) -> tuple[str, ...]:
        kept = self.kept.get(part)
        return indices if kept is None else tuple(indices[p] for p in kept)

    # -- statements --------------------------------------------------------
    def statement(self, s: Assignment) -> None:
        target = s.target
        re, im = self.split(s.value)
        if im is None:
            self.parts.pop(target.name, None)  # reassigned with a real value
            self.statements.append(Assignment(target, re))
            return
        names: tuple[str | None, str | None] = self._fresh_parts(target.name)
        if re is None:
            names = (None, names[1])
        self.parts[target.name] = names
        for part, name in zip((re, im), names, strict=True):
            if part is not None and name is not None:
                # A part may not use every index of the target (the terms that did are real, or
                # purely imaginary): it is stored without them and read as constant along them.
                used = set(free_indices(part))
                kept = tuple(p for p, k in enumerate(target.indices) if k in used)
                if len(kept) < len(target.indices):
                    self.kept[name] = kept
                self.statements.append(Assignment(Access(name, self._held(name, target.indices)), part))


def split_complex(program: Program, complex_inputs: Iterable[str], dtype: str = "complex",
                  extents: Sequence[Mapping[str, int]] | None = None) -> ComplexSplit:
    """Rewrite ``program`` over complex ``complex_inputs`` into real arithmetic.

    ``program`` comes from :func:`~spfuse.frontend.parser.parse_program`;
    ``dtype`` only words the errors.  ``extents`` (per statement, as
    :func:`~spfuse.frontend.check.check_program` returns them for
    :func:`with_distinct_binders` of the program) is needed only
    when a part of a sum does not use the summed index (an explicit
    ``sum(k, E[i] + F[i,k])`` with complex ``E`` and real ``F``); without
    it, such a program raises :class:`NeedsExtents`.  A pure function: the
    same arguments give an equal :class:`ComplexSplit`.

    >>> from spfuse.frontend.parser import parse_program
    >>> s = split_complex(parse_program("y[i] = A[i,j] * x[j]"), {"A", "x"})
    >>> print(s.program.text)
    y__re[i] = sum(j, A__re[i, j] * x__re[j] - A__im[i, j] * x__im[j])
    y__im[i] = sum(j, A__re[i, j] * x__im[j] + A__im[i, j] * x__re[j])
    >>> dict(s.results), s.inputs["A"]
    ({'y': ('y__re', 'y__im')}, ('A__re', 'A__im'))
    >>> print(split_complex(parse_program("y[i] = A[i,j] * x[j]"), {"x"}).program.text)
    y__re[i] = sum(j, A[i, j] * x__re[j])
    y__im[i] = sum(j, A[i, j] * x__im[j])
    >>> split_complex(parse_program("y[i] = exp(x[i])"), {"x"}, "complex64")
    Traceback (most recent call last):
    ...
    spfuse.errors.UnsupportedError: exp() of a complex64 value is not supported: spfuse computes complex values \
as pairs of real parts and only lowers + - * /, neg, abs, sum() and where() with a real condition
    """
    complex_inputs = frozenset(complex_inputs)
    unknown = complex_inputs - set(program.inputs)
    if unknown:
        raise ValueError(f"complex_inputs {sorted(unknown)} are not inputs of the program {program.text!r}")
    splitter = _Splitter(program, complex_inputs, dtype, extents)
    for n, s in enumerate(with_distinct_binders(program).statements):
        splitter.statement_number = n
        splitter.statement(s)
    real = Program(tuple(splitter.statements))
    real = parse_program(to_text(real))  # text, spans and explicit reductions consistent with the nodes
    results = {}
    for name in program.results:
        results[name] = splitter.parts.get(name, (name, None))
    complex_results = frozenset(n for n in program.results if n in splitter.parts)
    kept = {n: splitter.kept[n] for parts in results.values() for n in parts if n in splitter.kept}
    return ComplexSplit(real, dict(splitter.inputs), results, complex_results, kept)


# -- one statement as a sum of real terms ---------------------------------------------------------------------

#: a value as signed real terms: ((coefficient, real expression), ...) per part
Terms = tuple  # tuple[tuple[float, Expr], ...]


@dataclass(frozen=True)
class TermExpansion:
    """A one-statement complex program as sums of real one-statement programs.

    ``real`` and ``imag``: ``(coefficient, program)`` pairs; the real part of
    the result is ``sum(c * run(p))``.  Each program has one statement whose
    target holds the modes ``kept[n]`` of the result (all of them unless the
    term is constant along some).  Each term has the shape of the original
    statement (the same reductions and factors, each factor replaced by one
    of its parts), so it runs on the kernel the real program would -- a
    template kernel where there is one -- at the price of ``2**k`` terms for
    ``k`` complex factors, against ``4(k-1)`` products for
    :func:`split_complex`.
    """

    target: Access
    real: tuple[tuple[float, Program], ...]
    imag: tuple[tuple[float, Program], ...]
    kept: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


class _Expander:
    def __init__(self, complex_names: frozenset[str], parts: Mapping[str, tuple[str, str]], dtype: str,
                 extents: Mapping[str, int] | None):
        self.complex_names, self.parts, self.dtype, self.extents = complex_names, parts, dtype, extents

    def is_real(self, e: Expr) -> bool:
        if isinstance(e, Literal):
            return complex(e.value).imag == 0
        return not any(a.name in self.complex_names for a in iter_accesses(e)) and all(
            self.is_real(c) for c in _literals(e))

    def combine(self, terms: Terms) -> Expr | None:
        out: Expr | None = None
        for c, t in terms:
            t = t if c in (1.0, -1.0) else Binary("*", Literal(abs(c)), t)
            out = (t if c > 0 else _neg(t)) if out is None else Binary("+" if c > 0 else "-", out, t)
        return out

    def expand(self, e: Expr) -> tuple[Terms, Terms]:
        if self.is_real(e):
            return ((1.0, e),), ()
        if isinstance(e, Access):
            re_name, im_name = self.parts[e.name]
            return ((1.0, Access(re_name, e.indices)),), ((1.0, Access(im_name, e.indices)),)
        if isinstance(e, Literal):
            v = complex(e.value)
            return (((1.0, Literal(v.real)),) if v.real else ()), ((1.0, Literal(v.imag)),)
        if isinstance(e, Binary):
            x, y = self.expand(e.left), self.expand(e.right)
            if e.op in "+-":
                s = 1.0 if e.op == "+" else -1.0
                return x[0] + tuple((s * c, t) for c, t in y[0]), x[1] + tuple((s * c, t) for c, t in y[1])
            if e.op == "*":
                prod = lambda p, q, s: tuple((s * c * d, Binary("*", t, u)) for c, t in p for d, u in q)  # noqa: E731
                return prod(x[0], y[0], 1.0) + prod(x[1], y[1], -1.0), prod(x[0], y[1], 1.0) + prod(x[1], y[0], 1.0)
            if not y[1]:  # complex / real
                den = _required(self.combine(y[0]))
                return (tuple((c, Binary("/", t, den)) for c, t in x[0]),
                        tuple((c, Binary("/", t, den)) for c, t in x[1]))
            c_, d_ = self.combine(y[0]), self.combine(y[1])
            den = _required(_add(_mul(c_, c_), _mul(d_, d_)))
            over = lambda p, q, s: tuple((s * a * b, Binary("/", Binary("*", t, u), den))  # noqa: E731
                                         for a, t in p for b, u in q)
            return over(x[0], y[0], 1.0) + over(x[1], y[1], 1.0), over(x[1], y[0], 1.0) + over(x[0], y[1], -1.0)
        if isinstance(e, Unary):
            if e.fn == "neg":
                x = self.expand(e.arg)
                return tuple((-c, t) for c, t in x[0]), tuple((-c, t) for c, t in x[1])
            if e.fn == "abs":
                x = self.expand(e.arg)
                re, im = self.combine(x[0]), self.combine(x[1])
                return ((1.0, Unary("sqrt", _required(_add(_mul(re, re), _mul(im, im))))),), ()
            raise _unsupported(f"{e.fn}()", self.dtype)
        if isinstance(e, Reduce):
            if e.op != "sum":
                raise _unsupported(f"{e.op}() reduction", self.dtype)
            x = self.expand(e.body)
            return tuple(self.reduce(e, c, t) for c, t in x[0]), tuple(self.reduce(e, c, t) for c, t in x[1])
        if isinstance(e, Where):
            if not self.is_real(e.cond):
                raise _unsupported("where() condition", self.dtype)
            a, b = self.expand(e.then), self.expand(e.other)
            pick = lambda p, q: tuple((c, Where(e.cond, t, Literal(0.0))) for c, t in p) + tuple(  # noqa: E731
                (c, Where(e.cond, Literal(0.0), t)) for c, t in q)
            return pick(a[0], b[0]), pick(a[1], b[1])
        raise TypeError(f"expected an expression node, got {type(e).__name__}")

    def reduce(self, e: Reduce, c: float, t: Expr) -> tuple[float, Expr]:
        if e.index in free_indices(t):
            return c, Reduce("sum", e.index, t)
        if self.extents is None:
            raise NeedsExtents(e.index)
        return c * self.extents[e.index], t


def _literals(e: Expr):
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, Literal):
            yield node
        stack.extend(children(node))


def _unsupported(what: str, dtype: str) -> UnsupportedError:
    return UnsupportedError(f"{what} of a {dtype} value is not supported: spfuse computes complex values "
                            "as pairs of real parts and only lowers + - * /, neg, abs, sum() and where() "
                            "with a real condition")


def expand_terms(program: Program, complex_inputs: Iterable[str], dtype: str = "complex",
                 extents: Sequence[Mapping[str, int]] | None = None, max_terms: int = 16) -> TermExpansion | None:
    """A one-statement program over complex inputs as signed sums of real one-statement programs,
    or ``None`` when the program has several statements or more than ``max_terms`` terms
    (then :func:`split_complex` is the way).

    >>> from spfuse.frontend.parser import parse_program
    >>> e = expand_terms(parse_program("y[i] = A[i,j] * x[j]"), {"A", "x"})
    >>> [(c, p.text) for c, p in e.real]
    [(1.0, 'y__re0[i] = sum(j, A__re[i, j] * x__re[j])'), (-1.0, 'y__re1[i] = sum(j, A__im[i, j] * x__im[j])')]
    >>> len(e.imag)
    2
    """
    if len(program.statements) != 1:
        return None
    complex_inputs = frozenset(complex_inputs)
    statement = with_distinct_binders(program).statements[0]
    taken = set(program.inputs) | set(program.assigned)
    parts = {}
    for name in program.inputs:
        if name in complex_inputs:
            parts[name] = part_names(name, taken)
            taken.update(parts[name])
    expander = _Expander(complex_inputs, parts, dtype, None if extents is None else extents[0])
    re_terms, im_terms = expander.expand(statement.value)
    if len(re_terms) + len(im_terms) > max_terms:
        return None
    target = statement.target
    kept: dict[str, tuple[int, ...]] = {}
    out = []
    for terms, base in ((re_terms, part_names(target.name, taken)[0]), (im_terms, part_names(target.name, taken)[1])):
        programs = []
        for n, (coef, term) in enumerate(terms):
            name = f"{base}{n}"
            used = set(free_indices(term))
            held = tuple(p for p, k in enumerate(target.indices) if k in used)
            if len(held) < len(target.indices):
                kept[name] = held
            one = Program((Assignment(Access(name, tuple(target.indices[p] for p in held)), term),))
            programs.append((float(coef), parse_program(to_text(one))))
        out.append(tuple(programs))
    return TermExpansion(target, out[0], out[1], kept)
