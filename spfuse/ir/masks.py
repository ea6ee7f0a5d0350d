"""Iteration masks: Boolean formulas over sparse tensor levels (ReACT 4.2).

An atom ``"B"`` in the mask of index ``j`` means "coordinates where B's level
for ``j`` is stored".  ``*`` and ``/`` intersect (∧), ``+`` and ``-`` unite
(∨), a dense level is ``TRUE``.  Masks are kept in disjunctive normal form --
a frozenset of conjunctions, each a frozenset of atoms -- and simplified by
absorption, so equal iteration spaces compare equal.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Mask", "TRUE", "FALSE", "atom"]


@dataclass(frozen=True)
class Mask:
    """A Boolean formula in DNF over sparse-level atoms.

    >>> B, D, F = atom("B"), atom("D"), atom("F")
    >>> print(B & (D | F))
    B ∧ D ∨ B ∧ F
    >>> (B | (B & D)) == B          # absorption
    True
    >>> (B & TRUE) == B and (B | TRUE) == TRUE
    True
    """

    terms: frozenset  # frozenset[frozenset[str]]

    def __and__(self, other: Mask) -> Mask:
        return Mask(_absorb(frozenset(a | b for a in self.terms for b in other.terms)))

    def __or__(self, other: Mask) -> Mask:
        return Mask(_absorb(self.terms | other.terms))

    @property
    def is_true(self) -> bool:
        return frozenset() in self.terms

    @property
    def is_false(self) -> bool:
        return not self.terms

    @property
    def is_dense(self) -> bool:
        return self.is_true

    @property
    def atoms(self) -> frozenset:
        return frozenset().union(*self.terms) if self.terms else frozenset()

    @property
    def single_conjunction(self) -> bool:
        """True when the mask is one intersection of atoms (co-iterate by ∧)."""
        return len(self.terms) == 1

    def rename(self, mapping: dict) -> Mask:
        return Mask(_absorb(frozenset(frozenset(mapping.get(a, a) for a in t) for t in self.terms)))

    def __str__(self) -> str:
        if self.is_true:
            return "true"
        if self.is_false:
            return "false"
        return " ∨ ".join(" ∧ ".join(sorted(t)) for t in sorted(self.terms, key=lambda t: (len(t), sorted(t))))


def _absorb(terms: frozenset) -> frozenset:
    """Drop every conjunction that contains another one (A ∨ A∧B = A)."""
    return frozenset(t for t in terms if not any(o < t for o in terms))


TRUE = Mask(frozenset([frozenset()]))
FALSE = Mask(frozenset())


def atom(name: str) -> Mask:
    """The mask of one sparse level."""
    return Mask(frozenset([frozenset([name])]))
