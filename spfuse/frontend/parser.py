"""Recursive-descent parser: program text → :class:`~spfuse.frontend.ast.Program`.

Grammar (statements are separated by newlines or ``;``)::

    program    := statement (SEP statement)*
    statement  := target '=' expr
    target     := NAME '[' [NAME (',' NAME)*] ']' | NAME
    expr       := term (('+' | '-') term)*            # left associative
    term       := unary (('*' | '/') unary)*          # left associative
    unary      := '-' unary | primary                  # -x is Unary("neg", x)
    primary    := NUMBER | NAME '[' [NAME (',' NAME)*] ']' | NAME
                | '(' expr ')'
                | FN '(' expr ')'                      # relu sigmoid ... neg
                | 'where' '(' expr ',' expr ',' expr ')'
                | RED '(' NAME (',' NAME)* ',' expr ')' # sum max min, nested
                | RED '(' NAME 'in' access ',' expr ')' # over access's stored pattern

A name followed by ``(`` is a function call; otherwise it is an operand, so a
tensor may be called ``exp`` or ``sum``. :func:`parse` does not touch implicit
reductions; :func:`parse_program` (the public entry) also makes them explicit.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NoReturn

from spfuse.errors import ProgramError
from spfuse.frontend.ast import (
    REDUCTIONS,
    UNARY_FUNCTIONS,
    Access,
    Assignment,
    Binary,
    Expr,
    Literal,
    Program,
    Reduce,
    Span,
    Unary,
    Where,
)
from spfuse.frontend.lexer import tokenize
from spfuse.frontend.patterns import lower_pattern_reductions
from spfuse.frontend.reductions import make_reductions_explicit

__all__ = ["parse", "parse_program", "parse_expression"]

_UNARY = frozenset(UNARY_FUNCTIONS)
_REDUCTIONS = frozenset(REDUCTIONS)
_FUNCTIONS = ", ".join((*UNARY_FUNCTIONS, "where", *REDUCTIONS))


def _describe(tok) -> str:
    kind = tok[0]
    if kind == "eof":
        return "end of input"
    if kind == "newline":
        return "end of line" if tok[1] == "\n" else "';'"
    return repr(tok[1])


class _Parser:
    __slots__ = ("text", "toks", "pos")

    def __init__(self, text: str):
        self.text = text
        self.toks = tokenize(text)
        self.pos = 0

    # -- helpers -----------------------------------------------------------
    def error(self, message: str, tok=None) -> NoReturn:
        tok = self.toks[self.pos] if tok is None else tok
        raise ProgramError(f"{message}, got {_describe(tok)}", self.text, tok[2])

    def expect(self, kind: str, what: str):
        tok = self.toks[self.pos]
        if tok[0] != kind:
            self.error(f"expected {what}")
        self.pos += 1
        return tok

    # -- statements --------------------------------------------------------
    def program(self) -> Program:
        toks = self.toks
        statements = []
        while toks[self.pos][0] != "eof":
            statements.append(self.statement())
            kind = toks[self.pos][0]
            if kind == "newline":
                self.pos += 1
            elif kind != "eof":
                self.error("expected an operator or the end of the statement")
        if not statements:
            raise ProgramError("the program has no statements", self.text, 0)
        return Program(tuple(statements), self.text)

    def statement(self) -> Assignment:
        target = self.target()
        self.expect("=", "'=' after the assigned tensor")
        value = self.expr()
        return Assignment(target, value, Span(target.span.start, self.toks[self.pos - 1][3]))

    def target(self) -> Access:
        tok = self.expect("name", "the name of the assigned tensor")
        if self.toks[self.pos][0] != "[":
            return Access(tok[1], (), Span(tok[2], tok[3]), ())
        acc = self.access(tok)
        seen: dict[str, Span] = {}
        for name, span in zip(acc.indices, acc.index_spans, strict=True):
            if name in seen:
                raise ProgramError(f"index {name!r} repeated on the left side",
                                   self.text, span.start)
            seen[name] = span
        return acc

    def access(self, name_tok) -> Access:
        # current token is '['
        toks = self.toks
        self.pos += 1
        indices: list[str] = []
        spans: list[Span] = []
        tok = toks[self.pos]
        if tok[0] == "]":
            self.pos += 1
            return Access(name_tok[1], (), Span(name_tok[2], tok[3]), ())
        while True:
            tok = toks[self.pos]
            if tok[0] != "name":
                self.error(f"expected an index name in {name_tok[1]}[...]")
            indices.append(tok[1])
            spans.append(Span(tok[2], tok[3]))
            tok = toks[self.pos + 1]
            self.pos += 2
            if tok[0] == "]":
                return Access(name_tok[1], tuple(indices), Span(name_tok[2], tok[3]),
                              tuple(spans))
            if tok[0] != ",":
                self.pos -= 1
                self.error("expected ',' or ']' after an index name")

    # -- expressions -------------------------------------------------------
    def expr(self) -> Expr:
        toks = self.toks
        start = toks[self.pos][2]  # spans include parentheses around operands
        left = self.term()
        while True:
            op = toks[self.pos][0]
            if op != "+" and op != "-":
                return left
            self.pos += 1
            right = self.term()
            left = Binary(op, left, right, Span(start, toks[self.pos - 1][3]))

    def term(self) -> Expr:
        toks = self.toks
        start = toks[self.pos][2]  # spans include parentheses around operands
        left = self.unary()
        while True:
            op = toks[self.pos][0]
            if op != "*" and op != "/":
                return left
            self.pos += 1
            right = self.unary()
            left = Binary(op, left, right, Span(start, toks[self.pos - 1][3]))

    def unary(self) -> Expr:
        tok = self.toks[self.pos]
        if tok[0] == "-":
            self.pos += 1
            arg = self.unary()
            return Unary("neg", arg, Span(tok[2], self.toks[self.pos - 1][3]))
        return self.primary()

    def primary(self) -> Expr:
        toks = self.toks
        tok = toks[self.pos]
        kind = tok[0]
        if kind == "name":
            nxt = toks[self.pos + 1][0]
            if nxt == "[":
                self.pos += 1
                return self.access(tok)
            if nxt == "(":
                return self.call(tok)
            self.pos += 1
            return Access(tok[1], (), Span(tok[2], tok[3]), ())
        if kind == "number":
            self.pos += 1
            return Literal(float(tok[1]), Span(tok[2], tok[3]))
        if kind == "(":
            self.pos += 1
            inner = self.expr()
            self.expect(")", "')' to close the '(' at column "
                        f"{tok[2] - self.text.rfind(chr(10), 0, tok[2])}")
            return inner
        self.error("expected an expression")

    def call(self, name_tok) -> Expr:
        fn = name_tok[1]
        self.pos += 2  # name and '('
        if fn in _UNARY:
            arg = self.expr()
            if self.toks[self.pos][0] == ",":
                self.error(f"{fn}() takes exactly one argument: expected ')'")
            end = self.expect(")", f"')' to close {fn}(")
            return Unary(fn, arg, Span(name_tok[2], end[3]))
        if fn == "where":
            args = [self.expr()]
            for _ in range(2):
                self.expect(",", "',': where() takes three arguments (cond, then, else)")
                args.append(self.expr())
            end = self.expect(")", "')': where() takes three arguments (cond, then, else)")
            return Where(args[0], args[1], args[2], Span(name_tok[2], end[3]))
        if fn in _REDUCTIONS:
            toks = self.toks
            if (toks[self.pos][0] == "name" and toks[self.pos + 1][:2] == ("name", "in")
                    and toks[self.pos + 2][0] == "name"):
                return self.pattern_reduction(name_tok)
            indices: list[tuple] = []  # the index name tokens
            while True:
                tok = toks[self.pos]
                if tok[0] != "name" or toks[self.pos + 1][0] != ",":
                    if not indices:
                        self.error(f"expected an index name as the first argument of {fn}(")
                    break
                indices.append(tok)
                self.pos += 2
            body = self.expr()
            end = self.expect(")", f"')' to close {fn}(")
            # innermost first; inner reductions span from their index token
            for k, tok in enumerate(reversed(indices)):
                start = name_tok[2] if k == len(indices) - 1 else tok[2]
                body = Reduce(fn, tok[1], body, Span(start, end[3]))
            return body
        raise ProgramError(f"unknown function {fn!r}; expected one of {_FUNCTIONS}",
                           self.text, name_tok[2])

    def pattern_reduction(self, name_tok) -> Expr:
        """``op(j in A[i,j], body)``: a reduction over ``A``'s stored pattern."""
        fn, toks = name_tok[1], self.toks
        index_tok = toks[self.pos]
        pattern_tok = toks[self.pos + 2]
        self.pos += 3
        if toks[self.pos][0] != "[":
            self.error(f"expected '[' after {pattern_tok[1]}: write {fn}({index_tok[1]} in "
                       f"{pattern_tok[1]}[...], ...)")
        pattern = self.access(pattern_tok)
        if index_tok[1] not in pattern.indices:
            raise ProgramError(f"index {index_tok[1]!r} of {fn}() does not appear in the pattern "
                               f"{pattern.name}[{', '.join(pattern.indices)}]", self.text, index_tok[2])
        self.expect(",", f"',' after the pattern of {fn}(")
        body = self.expr()
        end = self.expect(")", f"')' to close {fn}(")
        return Reduce(fn, index_tok[1], body, Span(name_tok[2], end[3]), pattern=pattern)


def parse(text: str) -> Program:
    """Parse index-notation ``text`` into a :class:`Program` (syntax only).

    Implicit reductions stay implicit; use :func:`parse_program` to get the
    AST the rest of spfuse consumes.

    >>> parse("y[i] = A[i,j] * x[j]").statements[0].value
    ... # doctest: +NORMALIZE_WHITESPACE
    Binary(op='*', left=Access(name='A', indices=('i', 'j'), span=Span(start=7, end=13),
    index_spans=(Span(start=9, end=10), Span(start=11, end=12))),
    right=Access(name='x', indices=('j',), span=Span(start=16, end=20),
    index_spans=(Span(start=18, end=19),)), span=Span(start=7, end=20))
    >>> parse("y[i] = A[i j]")
    Traceback (most recent call last):
    ...
    spfuse.errors.ProgramError: expected ',' or ']' after an index name, got 'j'
      y[i] = A[i j]
                 ^
    """
    return _Parser(text).program()


def parse_expression(text: str) -> Expr:
    """Parse a single right-hand side expression (no assignment).

    >>> parse_expression("-x + 2") == Binary("+", Unary("neg", Access("x", ())), Literal(2.0))
    True
    """
    p = _Parser(text)
    e = p.expr()
    if p.toks[p.pos][0] != "eof":
        p.error("expected an operator or the end of the expression")
    return e


def parse_program(text: str) -> Program:
    """Parse ``text`` and make implicit reductions explicit (the public entry).

    Results are memoised by text (nodes are immutable), so evaluating the
    same program again skips parsing.

    >>> from spfuse.frontend.canonical import to_text
    >>> print(to_text(parse_program("y[i] = A[i,j] * x[j]")))
    y[i] = sum(j, A[i, j] * x[j])
    """
    return _parse_program_cached(text)


@lru_cache(maxsize=1024)
def _parse_program_cached(text: str) -> Program:
    return lower_pattern_reductions(make_reductions_explicit(parse(text)))
