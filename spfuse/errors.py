"""Exceptions raised by spfuse.

All of them derive from :class:`SpfuseError` *and* from the builtin a caller
would naturally catch (``ValueError`` or ``TypeError``), so ``except
ValueError`` keeps working for code that does not know spfuse.
"""
from __future__ import annotations

__all__ = [
    "SpfuseError",
    "InvalidOperandError",
    "OperandTypeError",
    "ProgramError",
    "UnsupportedError",
    "format_caret",
]


class SpfuseError(Exception):
    """Base class of every error spfuse raises on purpose."""


class InvalidOperandError(SpfuseError, ValueError):
    """An operand's arrays are malformed (bad indptr, out-of-range index, ...)."""


class IndexCheckFailed(InvalidOperandError):
    """A self-checking kernel met a column index outside its operand's range.

    The call path catches it and validates the operands the slow way, which
    words the error; it only escapes if an operand changed in between."""

    def __init__(self, name: str, position: int):
        super().__init__(f"operand {name!r}: column index at position {position} is out of range")
        self.name, self.position = name, position


class OperandTypeError(SpfuseError, TypeError):
    """An operand has a type or dtype spfuse cannot use."""


class ProgramError(SpfuseError, ValueError):
    """A program text is invalid: syntax, names, arities, extents.

    ``text`` and ``position`` locate the offending token; the message already
    shows the text with a caret under it.
    """

    def __init__(self, message: str, text: str | None = None, position: int | None = None):
        self.text = text
        self.position = position
        if text is not None and position is not None:
            message = f"{message}\n{format_caret(text, position)}"
        super().__init__(message)


class UnsupportedError(SpfuseError, ValueError):
    """A legal request that spfuse cannot perform as asked (e.g. a
    ``spfuse.dask`` program that sums over its partitioned index, or a
    function of a complex value with no complex kernel)."""


def format_caret(text: str, position: int) -> str:
    """Show the line of ``text`` holding ``position`` with a caret under it.

    >>> print(format_caret("A[i] = B[q]", 9))
      A[i] = B[q]
               ^
    """
    position = max(0, min(position, len(text)))
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    end = len(text) if end < 0 else end
    return f"  {text[start:end]}\n  {' ' * (position - start)}^"
