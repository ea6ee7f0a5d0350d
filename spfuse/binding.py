"""Bind: a call's operands as validated :class:`~spfuse.tensor.Tensor` objects.

Every operand is checked before anything compiled reads it: a dense array
is wrapped as it is, a scipy CSR/CSC matrix after a one-pass scan of its
index arrays (or, for kernels that check indices as they read them, its
``indptr`` only: the scan is deferred), a caller's own ``Tensor`` scanned
again (its arrays may be views the caller can still write), anything else
through :func:`~spfuse.tensor.as_tensor`, which canonicalises a copy or
words the error.

>>> import numpy as np, scipy.sparse as sp
>>> from spfuse.frontend.parser import parse_program
>>> A = sp.csr_array(np.eye(2))
>>> tensors, deferred = bind_operands(parse_program("y[i] = A[i,j] * x[j]"), {"A": A, "x": np.ones(2)}, defer=True)
>>> sorted(tensors), deferred
(['A', 'x'], ['A'])
"""
from __future__ import annotations

import functools
from collections.abc import Container, Mapping
from typing import Any, cast

import numpy as np
import scipy.sparse as sp

from spfuse import validation as V
from spfuse.errors import IndexCheckFailed, ProgramError
from spfuse.formats import Format
from spfuse.frontend.ast import Program
from spfuse.tensor import CompressedLevel, Tensor, as_tensor

__all__ = ["any_complex", "bind_operands", "in_format", "input_names", "rechecked", "scan_deferred", "scan_ok"]


@functools.lru_cache(maxsize=1024)
def input_names(program: Program) -> frozenset:
    return frozenset(program.inputs)


def bind_operands(program: Program, operands: Mapping[str, Any], trusted: Container[str] = frozenset(),
                  defer: bool = False, num_threads: int | None = 1):
    """The operands as validated tensors (the program is checked by ``_Dispatch``).

    A ``Tensor`` the caller passes in may share index arrays with objects the
    caller can still write to (``Tensor.from_scipy`` is zero-copy), so it is
    checked again -- the one-pass scan -- unless this call made it
    (``trusted``); a trusted scipy CSR/CSC operand (a result spfuse made
    earlier in the same call: a differentiated program's statements) is
    wrapped without a scan too.

    With ``defer``, a scipy CSR/CSC operand is wrapped with its ``indptr``
    checked but its ``indices`` not yet scanned; such names are returned
    too, and ``_run`` either hands them to a kernel that checks indices as
    it reads them or scans them before anything else reads them.
    ``num_threads``: the call's, for the scans of large levels."""
    if not isinstance(program, Program):
        raise TypeError(f"expected a program text, got {type(program).__name__}")
    inputs = program.inputs
    known = input_names(program)
    extra = sorted(n for n in operands if n not in known)
    if extra:
        raise ProgramError(f"operand(s) {', '.join(map(repr, extra))} not used by the program "
                           f"(it reads {', '.join(inputs) or 'nothing'})")
    tensors: dict[str, Tensor] = {}
    unscanned = []
    for name in inputs:
        if name not in operands:
            # check_program names the position of the unknown operand
            break
        obj = operands[name]
        if type(obj) is np.ndarray and (fast := Tensor._fast_dense(obj)) is not None:
            tensors[name] = fast  # the common dense operand, without as_tensor's dispatch
            continue
        if isinstance(obj, Tensor):
            if name not in trusted and "compressed" in obj.format.levels:
                obj = rechecked(obj, name, num_threads)
            tensors[name] = obj   # (as_tensor returns a Tensor as it is)
            continue
        elif name in trusted and sp.issparse(obj) and obj.format in ("csr", "csc"):
            t = Tensor._fast_compressed(obj, "sparray" if isinstance(obj, sp.sparray) else "spmatrix",
                                        scan=False)   # (spfuse made it this call: its indices were checked)
            if t is not None:
                tensors[name] = t
                continue
            tensors[name] = as_tensor(obj, name=name)
            continue
        elif defer and sp.issparse(obj) and obj.format in ("csr", "csc"):
            t = Tensor._fast_compressed(obj, "sparray" if isinstance(obj, sp.sparray) else "spmatrix",
                                        scan=False)
            if t is not None:
                tensors[name] = t
                unscanned.append(name)
                continue
        tensors[name] = as_tensor(obj, name=name)
    return tensors, unscanned


def rechecked(t: Tensor, name: str, num_threads: int | None = 1) -> Tensor:
    """A caller's sparse Tensor scanned again (its index arrays may be views
    of arrays the caller can still write): the same object when it is still
    valid and canonical, else rebuilt by the validating constructor, which
    canonicalises a copy or words the error.  A large level is scanned by
    the call's ``num_threads`` (None: the setting of :mod:`spfuse.threads`)."""
    npos = 1
    for lv in t.levels:
        if isinstance(lv, CompressedLevel):
            pos, crd = lv.pos, lv.crd
            if (len(pos) != npos + 1 or pos[0] != 0 or pos[-1] != len(crd)
                    or V.scan_status(pos, crd, lv.size, num_threads) != 0):
                break
            npos = len(crd)
        else:
            npos *= lv.size
    else:
        if len(t.values) == npos:
            return t
    return Tensor(t.shape, t.format, t.levels, t.values, origin=t.origin, name=name)


def scan_ok(t: Tensor, num_threads: int | None) -> bool:
    """Whether a deferred tensor's compressed level is valid and canonical."""
    lv = cast(CompressedLevel, t.levels[1])  # deferred tensors are csr/csc
    return V.scan_status(lv.pos, lv.crd, lv.size, num_threads) == 0


def scan_deferred(tensors: Mapping[str, Tensor], deferred: tuple, threads: int) -> None:
    """Scan the deferred operands' indices before anything reads them; raise
    :class:`IndexCheckFailed` (the caller then takes the validating path)
    unless every one is valid and canonical.  The executor reads int32 and
    int64 indices as they are, so this scan is the one extra pass."""
    for name in deferred:
        if not scan_ok(tensors[name], threads):
            raise IndexCheckFailed(name, -1)


def any_complex(values) -> bool:
    """Whether any operand holds complex numbers (they run as real and imaginary parts)."""
    for o in values:
        kind = type(o)
        if kind is Tensor:
            continue   # (float32 or float64 by construction)
        if kind is np.ndarray:
            if o.dtype.kind == "c":
                return True
        elif getattr(getattr(o, "dtype", None), "kind", "") == "c" or isinstance(o, complex):
            return True
    return False


def in_format(value: Any, fmt: Format) -> bool:
    """Whether a declared operand is already stored as ``fmt`` (a scipy CSR/CSC
    matrix or a C-ordered ndarray; or absent, which the call path words)."""
    if value is None:
        return True
    if type(value) is np.ndarray:
        return fmt.is_dense and fmt.is_identity_order and value.flags.c_contiguous
    if sp.issparse(value) and value.format in ("csr", "csc"):
        return fmt == (Format.csr() if value.format == "csr" else Format.csc())
    return False
