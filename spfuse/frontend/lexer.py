"""Tokens of the index-notation language.

A token is a plain tuple ``(kind, value, start, end)`` (cheap to build; the
parser is on the plan-cache miss path and must stay fast). ``kind`` is one of
``"name"``, ``"number"``, ``"newline"`` (a line break or ``;`` outside
brackets), ``"eof"``, or the punctuation character itself
(``[ ] ( ) , = + - * /``). Newlines inside ``(...)`` or ``[...]`` are
whitespace, so long expressions may span lines; ``#`` starts a comment.
"""
from __future__ import annotations

import re

from spfuse.errors import ProgramError

__all__ = ["Token", "tokenize"]

Token = tuple  # (kind: str, value: str, start: int, end: int)

# (leading blanks, token); the token's first character decides its kind.
_TOKEN_RE = re.compile(
    r"([ \t\r\f\v]*)"
    r"(\#[^\n]*"
    r"|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?"
    r"|[A-Za-z_][A-Za-z_0-9]*"
    r"|.|$)",
    re.DOTALL,
)
_KIND = {c: "name" for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_"}
_KIND.update({c: "number" for c in "0123456789."})
_KIND.update({c: c for c in "[](),=+-*/"})
_KIND.update({"\n": "newline", ";": "newline", "#": "comment"})
_OPEN = {"(": ")", "[": "]"}
_CLOSE = {")": "(", "]": "["}


def tokenize(text: str) -> list[Token]:
    """Split ``text`` into tokens, ending with an ``"eof"`` token.

    Consecutive separators collapse into one ``"newline"`` token and leading
    ones are dropped, so blank lines and comment lines cost nothing later.

    >>> [t[:2] for t in tokenize("y[i] = 2.5e-1 * x  # scale")]
    ... # doctest: +NORMALIZE_WHITESPACE
    [('name', 'y'), ('[', '['), ('name', 'i'), (']', ']'), ('=', '='),
     ('number', '2.5e-1'), ('*', '*'), ('name', 'x'), ('eof', '')]
    >>> tokenize("a = $")
    Traceback (most recent call last):
    ...
    spfuse.errors.ProgramError: unexpected character '$'
      a = $
          ^
    """
    tokens: list[Token] = []
    append = tokens.append
    depth = 0  # open brackets: newlines inside them are whitespace
    last_kind = "newline"
    pos = 0
    kinds = _KIND
    for blanks, tok in _TOKEN_RE.findall(text):
        pos += len(blanks)
        if not tok:
            break
        end = pos + len(tok)
        kind = kinds.get(tok[0], "error")
        if kind == "name" or kind == "number":
            if tok == ".":
                kind = "error"
        elif kind == "newline":
            if depth or last_kind == "newline":
                pos = end
                continue
        elif kind == "comment":
            pos = end
            continue
        elif kind == "(" or kind == "[":
            depth += 1
        elif kind == ")" or kind == "]":
            if depth:
                depth -= 1
        if kind == "error":
            raise ProgramError(f"unexpected character {tok!r}", text, pos)
        append((kind, tok, pos, end))
        last_kind = kind
        pos = end
    append(("eof", "", len(text), len(text)))
    return tokens
