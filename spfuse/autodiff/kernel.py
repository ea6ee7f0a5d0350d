"""Gradients of a compiled :class:`spfuse.Kernel` (what ``Kernel.vjp`` runs)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spfuse.autodiff.run import cached_adjoint, execution_choices, vjp
from spfuse.autodiff.transform import Adjoint
from spfuse.tensor import as_tensor

__all__ = ["kernel_vjp", "kernel_adjoint", "kernel_explain_vjp"]


def _wrt(kernel, wrt) -> tuple:
    if wrt is None:
        return tuple(kernel.program.inputs)
    return (wrt,) if isinstance(wrt, str) else tuple(wrt)


def kernel_adjoint(kernel, wrt=None, temporaries: str = "auto") -> Adjoint:
    """The adjoint of ``kernel``'s program, operands with a declared sparse
    format getting their gradient on their pattern.

    >>> import spfuse
    >>> k = spfuse.compile("y[i] = A[i,j] * x[j]", A="csr")
    >>> print(kernel_adjoint(k, ("A",)).text)
    grad_A[i, j] = pattern_A[i, j] * (grad_y[i] * x[j])
    """
    wrt = _wrt(kernel, wrt)
    sparse = frozenset(n for n, f in kernel._formats.items() if not f.is_dense)
    return cached_adjoint(kernel.program, wrt, tuple(kernel.program.results), sparse, temporaries)


def kernel_vjp(kernel, cotangent: Any, wrt, temporaries: str, operands: Mapping[str, Any]) -> dict:
    """:func:`spfuse.vjp` of ``kernel``'s program; an operand given in another
    format than declared is converted first (its gradient is then a Tensor).

    >>> import numpy as np, spfuse
    >>> k = spfuse.compile("y[i] = A[i,j] * x[j]", A="csr")
    >>> g = k.vjp(np.ones(2), wrt=("A",), A=np.eye(2), x=np.array([1.0, 2.0]))
    >>> g["A"].format.name, g["A"].values.tolist()
    ('csr', [1.0, 2.0])
    """
    operands = {**kernel._examples, **operands}
    converted = {}
    for name, value in operands.items():
        fmt = kernel._formats.get(name)
        if fmt is not None and fmt.name != "coo":
            t = as_tensor(value, name=name)
            if t.format != fmt:
                value = t.asformat(fmt)
        converted[name] = value
    return vjp(kernel.program, cotangent, _wrt(kernel, wrt), temporaries=temporaries,
               fusion=kernel.fusion, num_threads=kernel.num_threads, **converted)


def kernel_explain_vjp(kernel, wrt=None, temporaries: str = "auto") -> str:
    """:func:`kernel_adjoint`'s description, with the fused-or-split choices
    measured so far by :meth:`Kernel.vjp` calls (one per operand signature).

    >>> import numpy as np, spfuse
    >>> k = spfuse.compile("y[i] = A[i,j] * x[j] + x[i]", A="csr")
    >>> print(kernel_explain_vjp(k, ("x",)).splitlines()[-1])
      grad_x[j] = sum(i, grad_y[i] * A[i, j]) + grad_y[j]
    """
    adj = kernel_adjoint(kernel, wrt, temporaries)
    lines = [adj.describe()]
    if adj.program is not None:
        lines.extend(c.describe() for c in execution_choices(adj.program) if c.split is not None)
    return "\n".join(lines)
