"""Storage formats: TACO's per-level format model.

A tensor of order ``n`` is stored as ``n`` *levels*, outermost first.  Level
``l`` holds tensor mode ``mode_order[l]`` and is either

* ``"dense"``: every coordinate ``0 .. size-1`` exists under every parent
  position (no index arrays), or
* ``"compressed"``: only the stored coordinates exist, described by a ``pos``
  array (segment bounds per parent position) and a ``crd`` array (coordinates).

Familiar formats are compositions of the two (Chou, Kjolstad & Amarasinghe,
*Format Abstraction for Sparse Tensor Algebra Compilers*, and the TACO paper):

========  =========================  ==========
name      levels                     mode_order
========  =========================  ==========
dense     dense, ..., dense          identity
csr       dense, compressed          (0, 1)
csc       dense, compressed          (1, 0)
dcsr      compressed, compressed     (0, 1)
dcsc      compressed, compressed     (1, 0)
csf       compressed, ..., compressed  identity (or any permutation)
========  =========================  ==========

``"coo"`` is accepted as an *input* name only: :meth:`Format.named` turns it
into ``csr`` for matrices and ``csf`` otherwise, because this runtime iterates
levels, not coordinate lists.

>>> Format.csr()
Format(levels=('dense', 'compressed'), mode_order=(0, 1))
>>> Format.named("csc", 2).name
'csc'
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

__all__ = ["DENSE", "COMPRESSED", "LEVEL_KINDS", "FORMAT_NAMES", "INPUT_ONLY_NAMES",
           "Format", "as_format"]

DENSE = "dense"
COMPRESSED = "compressed"
LEVEL_KINDS = (DENSE, COMPRESSED)
#: Names :meth:`Format.named` understands and :attr:`Format.name` can return.
FORMAT_NAMES = ("dense", "csr", "csc", "dcsr", "dcsc", "csf")
#: Names accepted when *reading* a request, converted on the way in.
INPUT_ONLY_NAMES = ("coo",)

_LETTER = {DENSE: "d", COMPRESSED: "c"}


@dataclass(frozen=True)
class Format:
    """How each level of a tensor is stored, and which mode each level holds.

    ``levels[l]`` is ``"dense"`` or ``"compressed"``; storage level ``l``
    holds tensor mode ``mode_order[l]``.  ``mode_order`` defaults to the
    identity.  Instances are immutable and hashable (usable as cache keys).

    >>> f = Format(("dense", "compressed"), (1, 0))
    >>> f.name, f.ndim, f.storage_shape((4, 5))
    ('csc', 2, (5, 4))
    >>> Format(("compressed", "dense")).name
    'cd'
    """

    levels: tuple[str, ...]
    mode_order: tuple[int, ...] = None  # type: ignore[assignment]  # filled in __post_init__

    def __post_init__(self) -> None:
        levels = tuple(self.levels) if not isinstance(self.levels, str) else (self.levels,)
        for kind in levels:
            if kind not in LEVEL_KINDS:
                raise ValueError(
                    f"invalid level kind {kind!r}\n  expected: one of {LEVEL_KINDS}\n"
                    f"  got: levels={levels!r}")
        order = tuple(range(len(levels))) if self.mode_order is None else self.mode_order
        try:
            order = tuple(int(m) for m in order)
        except TypeError:
            raise ValueError(f"mode_order must be a sequence of ints, got {self.mode_order!r}") from None
        if sorted(order) != list(range(len(levels))):
            raise ValueError(
                f"invalid mode_order {order!r}\n  expected: a permutation of "
                f"0..{len(levels) - 1} (one entry per level)\n  got: {order!r}")
        object.__setattr__(self, "levels", levels)
        object.__setattr__(self, "mode_order", order)
        # Formats key the per-call caches: hash the fields once, not per lookup
        object.__setattr__(self, "_hash", hash((levels, order)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __reduce__(self):
        # rebuilt through __init__: string hashes differ between processes
        return (type(self), (self.levels, self.mode_order))

    # -- named constructors -------------------------------------------------
    @classmethod
    def dense(cls, ndim: int) -> Format:
        """All levels dense, identity mode order.

        >>> Format.dense(3).levels
        ('dense', 'dense', 'dense')
        """
        return _dense(_check_ndim(ndim))

    @classmethod
    @functools.cache  # formats are immutable: share one per name
    def csr(cls) -> Format:
        """Compressed sparse row: ``(dense, compressed)``, order ``(0, 1)``.

        >>> Format.csr().name
        'csr'
        """
        return cls((DENSE, COMPRESSED), (0, 1))

    @classmethod
    @functools.cache  # formats are immutable: share one per name
    def csc(cls) -> Format:
        """Compressed sparse column: ``(dense, compressed)``, order ``(1, 0)``.

        >>> Format.csc().mode_order
        (1, 0)
        """
        return cls((DENSE, COMPRESSED), (1, 0))

    @classmethod
    @functools.cache  # formats are immutable: share one per name
    def dcsr(cls) -> Format:
        """Doubly compressed sparse row: both levels compressed, order ``(0, 1)``.

        >>> Format.dcsr().levels
        ('compressed', 'compressed')
        """
        return cls((COMPRESSED, COMPRESSED), (0, 1))

    @classmethod
    @functools.cache  # formats are immutable: share one per name
    def dcsc(cls) -> Format:
        """Doubly compressed sparse column: both compressed, order ``(1, 0)``.

        >>> Format.dcsc().name
        'dcsc'
        """
        return cls((COMPRESSED, COMPRESSED), (1, 0))

    @classmethod
    def csf(cls, order: int | Sequence[int]) -> Format:
        """Compressed sparse fiber: every level compressed.

        ``order`` is either the number of modes (identity mode order) or the
        mode order itself (any permutation).

        >>> Format.csf(3).name
        'csf'
        >>> Format.csf((2, 0, 1)).name
        'csf(2,0,1)'
        """
        if not isinstance(order, (tuple, list)) and not hasattr(order, "__len__"):
            return cls((COMPRESSED,) * _check_ndim(order))
        modes = tuple(cast(Sequence[int], order))  # anything with a length: tuple, list, numpy array
        return cls((COMPRESSED,) * len(modes), modes)

    @classmethod
    def named(cls, name: str, ndim: int) -> Format:
        """The named format ``name`` for a tensor with ``ndim`` modes.

        ``"coo"`` is accepted as an input name and becomes ``csr`` (2-D) or
        ``csf`` (other orders).  Unknown names raise ``ValueError`` listing the
        valid ones; ``csr``/``csc``/``dcsr``/``dcsc`` require ``ndim == 2``.

        >>> Format.named("coo", 2).name, Format.named("coo", 3).name
        ('csr', 'csf')
        >>> Format.named("csx", 2)
        Traceback (most recent call last):
          ...
        ValueError: unknown format name 'csx'
          expected: one of 'dense', 'csr', 'csc', 'dcsr', 'dcsc', 'csf' (or 'coo' as input)
          got: 'csx'
        """
        ndim = _check_ndim(ndim)
        key = name.lower() if isinstance(name, str) else name
        if key == "coo":
            key = "csr" if ndim == 2 else "csf"
        if key == "dense":
            return cls.dense(ndim)
        if key == "csf":
            return cls.csf(ndim)
        if key in ("csr", "csc", "dcsr", "dcsc"):
            if ndim != 2:
                raise ValueError(
                    f"format {name!r} is for matrices\n  expected: ndim == 2\n  got: ndim == {ndim}\n"
                    f"  Hint: use 'csf' (all levels compressed) or 'dense' for {ndim}-d tensors")
            return getattr(cls, key)()
        valid = ", ".join(repr(n) for n in FORMAT_NAMES)
        raise ValueError(f"unknown format name {name!r}\n  expected: one of {valid} (or 'coo' as input)\n"
                         f"  got: {name!r}")

    # -- properties ----------------------------------------------------------
    @property
    def ndim(self) -> int:
        """Number of modes (= number of levels).

        >>> Format.csr().ndim
        2
        """
        return len(self.levels)

    @functools.cached_property
    def name(self) -> str:
        """The conventional name when one applies, else a descriptive string.

        Descriptive strings are one letter per level (``d``/``c``) followed by
        the mode order when it is not the identity, e.g. ``'cd'`` or
        ``'dcc(0,2,1)'``; all-compressed permutations read ``'csf(2,0,1)'``.

        >>> Format.named("dcsr", 2).name, Format(("dense",) * 2, (1, 0)).name
        ('dcsr', 'dd(1,0)')
        """
        identity = self.mode_order == tuple(range(self.ndim))
        if all(k == DENSE for k in self.levels) and identity:
            return "dense"
        if self.ndim == 2:
            for key in ("csr", "csc", "dcsr", "dcsc"):
                if self == getattr(Format, key)():
                    return key
        order = ",".join(str(m) for m in self.mode_order)
        if all(k == COMPRESSED for k in self.levels):
            return "csf" if identity else f"csf({order})"
        letters = "".join(_LETTER[k] for k in self.levels)
        return letters if identity else f"{letters}({order})"

    @functools.cached_property
    def is_dense(self) -> bool:
        """True when every level is dense (any mode order).

        >>> Format.dense(2).is_dense, Format.csr().is_dense
        (True, False)
        """
        return all(k == DENSE for k in self.levels)

    @functools.cached_property
    def is_identity_order(self) -> bool:
        """True when storage level ``l`` holds mode ``l``.

        >>> Format.csc().is_identity_order
        False
        """
        return self.mode_order == tuple(range(self.ndim))

    @property
    def inverse_order(self) -> tuple[int, ...]:
        """``inverse_order[m]`` is the storage level holding mode ``m``.

        >>> Format.csf((2, 0, 1)).inverse_order
        (1, 2, 0)
        """
        inv = [0] * self.ndim
        for level, mode in enumerate(self.mode_order):
            inv[mode] = level
        return tuple(inv)

    def storage_shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The tensor shape permuted into storage (level) order.

        >>> Format.csc().storage_shape((3, 7))
        (7, 3)
        """
        if len(shape) != self.ndim:
            raise ValueError(f"shape {tuple(shape)} has {len(shape)} modes, format {self.name!r} has {self.ndim}")
        return tuple(shape[m] for m in self.mode_order)

    def __str__(self) -> str:
        return self.name


def as_format(fmt: str | Format | None, ndim: int, default: str = "dense") -> Format:
    """Coerce a name, a :class:`Format` or ``None`` (→ ``default``) for ``ndim`` modes.

    >>> as_format("csr", 2) == Format.csr()
    True
    >>> as_format(None, 3).name
    'dense'
    """
    if fmt is None:
        fmt = default
    if isinstance(fmt, Format):
        if fmt.ndim != ndim:
            raise ValueError(f"format {fmt.name!r} has {fmt.ndim} levels\n  expected: {ndim} levels "
                             f"(one per mode)\n  got: {fmt.ndim}")
        return fmt
    if isinstance(fmt, str):
        return _named(fmt, ndim)
    raise TypeError(f"format must be a name or spfuse.Format, got {type(fmt).__name__}")


@functools.lru_cache(maxsize=64)
def _dense(ndim: int) -> Format:
    return Format((DENSE,) * ndim)  # one shared (immutable) Format per ndim


@functools.lru_cache(maxsize=256)
def _named(name: str, ndim: int) -> Format:
    return Format.named(name, ndim)  # one shared (immutable) Format per name and ndim


def _check_ndim(ndim: object) -> int:
    try:
        value = operator.index(ndim)  # type: ignore[arg-type]
    except TypeError:
        value = -1
    if isinstance(ndim, bool) or value < 0:
        raise ValueError(f"ndim must be a non-negative int, got {ndim!r}")
    return value
