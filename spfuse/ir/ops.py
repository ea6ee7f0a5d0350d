"""Unit operations: the three-address form of a program (ReACT 4.1.3).

A :class:`UnitOp` computes ``out[out_indices] = reduce_{reduced} expr`` where
``expr`` applies at most ONE operator (``+ - * /``, a unary function, or
``where``) to leaf operands (accesses of inputs / temporaries, or scalar
constants).  A pure copy or reduction of one access has ``operator=None``.

A sum is ONE operation however many terms it has: ``operator="+"`` with n
arguments and a scalar coefficient per argument (``coefs``; ``A - 2*B`` is
``A`` with 1 and ``B`` with -2).  Co-iterating all terms at once is TACO's
n-way merge lattice; a chain of binary adds would store n-2 temporaries and
visit the union of the first terms once per link.

:class:`TensorInfo` is what planning knows about a tensor: its name, rank,
storage format and (when known) shape -- planning works from this alone, so
``spfuse.compile`` can plan before seeing any data.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from spfuse.frontend.ast import Span

__all__ = ["Leaf", "Const", "Ref", "UnitOp", "TensorInfo", "Role"]


@dataclass(frozen=True)
class Ref:
    """Access of a tensor by index names, e.g. ``C[i,k]``."""

    name: str
    indices: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.name}[{','.join(self.indices)}]" if self.indices else self.name


@dataclass(frozen=True)
class Const:
    """A scalar constant operand."""

    value: float

    @property
    def indices(self) -> tuple[str, ...]:
        return ()

    def __str__(self) -> str:
        return repr(self.value) if self.value != int(self.value) else str(int(self.value))


Leaf = Ref | Const


@dataclass(frozen=True)
class UnitOp:
    """One unit operation ``out[out_indices] = reduce_{reduced}( operator(args) )``.

    ``reduction`` is ``"sum"``, ``"max"`` or ``"min"`` when ``reduced`` is not
    empty.  ``operator`` is one of ``+ - * /``, a unary function name,
    ``"where"``, or ``None`` (a copy/reduction of the single argument).
    """

    id: int
    out: str
    out_indices: tuple[str, ...]
    operator: str | None
    args: tuple[Leaf, ...]
    reduction: str | None = None
    reduced: tuple[str, ...] = ()
    statement: int = 0
    span: Span = field(default=Span(0, 0), compare=False)
    #: Per-argument scalar coefficients of an n-ary ``+`` (empty: all 1).
    coefs: tuple[float, ...] = ()

    @property
    def coefficients(self) -> tuple[float, ...]:
        """The coefficient of every argument (1.0 unless ``coefs`` says otherwise).

        >>> op = UnitOp(0, "C", ("i",), "+", (Ref("A", ("i",)), Ref("B", ("i",))), coefs=(1.0, -2.0))
        >>> op.coefficients, str(op)
        ((1.0, -2.0), 'C[i] = A[i] - 2*B[i]')
        """
        return self.coefs or (1.0,) * len(self.args)

    @property
    def indices(self) -> tuple[str, ...]:
        """Every index the operation loops over: outputs, then reductions,
        then indices only its operands use (broadcast) in appearance order."""
        seen = dict.fromkeys(self.out_indices)
        seen.update(dict.fromkeys(self.reduced))
        for a in self.args:
            seen.update(dict.fromkeys(a.indices))
        return tuple(seen)

    @property
    def refs(self) -> tuple[Ref, ...]:
        return tuple(a for a in self.args if isinstance(a, Ref))

    def expr_text(self) -> str:
        args = [str(a) for a in self.args]
        if self.operator is None:
            body = args[0]
        elif self.operator == "+":
            body = _linear_text(args, self.coefficients)
        elif self.operator in ("-", "*", "/"):
            body = f" {self.operator} ".join(args)
        else:
            body = f"{self.operator}({', '.join(args)})"
        for idx in reversed(self.reduced):
            body = f"{self.reduction}({idx}, {body})"
        return body

    def __str__(self) -> str:
        return f"{Ref(self.out, self.out_indices)} = {self.expr_text()}"


def _coef_text(c: float) -> str:
    return str(int(c)) if c == int(c) else repr(c)


def _linear_text(args: list[str], coefs: tuple[float, ...]) -> str:
    """``A + B - 2*C``: each term with its coefficient's sign."""
    out = ""
    for n, (a, c) in enumerate(zip(args, coefs, strict=True)):
        mag = abs(c)
        term = a if mag == 1 else f"{_coef_text(mag)}*{a}"
        if n == 0:
            out = term if c >= 0 else f"-{term}"
        else:
            out += f" - {term}" if c < 0 else f" + {term}"
    return out


class Role:
    INPUT = "input"
    TEMPORARY = "temporary"
    RESULT = "result"


@dataclass(frozen=True)
class TensorInfo:
    """What planning knows about one tensor.

    ``levels`` are ``"dense"``/``"compressed"`` in storage order and
    ``mode_order[l]`` is the mode stored at level ``l`` (TACO's format model).
    ``shape`` entries may be ``None`` when only formats were declared.
    ``pattern`` names an earlier input storing the same coordinates (a
    gradient's cotangent and the operand it lives on), when the caller
    checked that for the operands the plan is made for
    (:func:`spfuse.tensor.shared_patterns`).
    """

    name: str
    ndim: int
    levels: tuple[str, ...]
    mode_order: tuple[int, ...]
    shape: tuple[int | None, ...]
    role: str = Role.INPUT
    nnz: int | None = None
    pattern: str | None = None

    @property
    def is_sparse(self) -> bool:
        return "compressed" in self.levels

    def level_of_mode(self, mode: int) -> int:
        return self.mode_order.index(mode)

    def mode_is_compressed(self, mode: int) -> bool:
        return self.levels[self.level_of_mode(mode)] == "compressed"

    @property
    def format_name(self) -> str:
        if not self.is_sparse:
            return "dense"
        if self.ndim == 2 and self.levels == ("dense", "compressed"):
            return "csr" if self.mode_order == (0, 1) else "csc"
        if all(lv == "compressed" for lv in self.levels):
            if self.ndim == 2:
                return "dcsr" if self.mode_order == (0, 1) else "dcsc"
            return "csf" if self.mode_order == tuple(range(self.ndim)) else f"csf{self.mode_order}"
        return "(" + ",".join(f"{lv}:{m}" for lv, m in zip(self.levels, self.mode_order, strict=True)) + ")"

    @staticmethod
    def dense(name: str, shape: tuple, role: str = Role.INPUT) -> TensorInfo:
        n = len(shape)
        return TensorInfo(name, n, ("dense",) * n, tuple(range(n)), tuple(shape), role)

    @staticmethod
    def of(name: str, tensor) -> TensorInfo:
        """The planning facts of a stored tensor (an :class:`spfuse.Tensor`):
        its levels, mode order, shape and number of stored entries.

        >>> import numpy as np, spfuse
        >>> i = TensorInfo.of("A", spfuse.Tensor.from_numpy(np.eye(3), "csr")); i.format_name, i.nnz
        ('csr', 3)
        """
        return TensorInfo(name, tensor.ndim, tuple(tensor.format.levels), tuple(tensor.format.mode_order),
                          tuple(tensor.shape), nnz=int(tensor.nnz))
