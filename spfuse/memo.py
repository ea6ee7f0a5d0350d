"""Caches kept on the objects they are about.

A plan, a fused group or an adjoint is immutable (a frozen dataclass) and
lives as long as the caches that depend on it should: work derived from it
alone (its lowering, its per-group sub-plans, its fallback plan) is kept in
a dict attached to it, and dies with it -- no process-wide table keyed by
``id()`` to bound or to keep in step.
"""
from __future__ import annotations

from typing import Any

__all__ = ["attached_dict"]


def attached_dict(obj: Any, name: str) -> dict:
    """The dict stored on ``obj`` as attribute ``name``, made empty on first
    use (also on a frozen dataclass: set through ``object.__setattr__``).

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class P:
    ...     x: int
    >>> p = P(1)
    >>> attached_dict(p, "_memo")["k"] = 2
    >>> attached_dict(p, "_memo"), p == P(1)
    ({'k': 2}, True)
    """
    found = obj.__dict__.get(name)
    if found is None:
        found = {}
        object.__setattr__(obj, name, found)
    return found
