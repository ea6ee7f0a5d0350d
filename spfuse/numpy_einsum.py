"""``numpy.einsum``'s calling convention on top of spfuse's planner.

:func:`spfuse.einsum` takes what ``numpy.einsum`` takes -- subscripts or the
interleaved operand/sublist form, ``out=``, ``dtype=``, ``order=``,
``casting=``, ``optimize=`` -- and answers as numpy does: the same values,
shape and dtype, and the same exception classes with numpy's wording.
This module holds that convention:

1. arguments checked (order, casting, dtype, out) before any work;
2. subscripts resolved (:mod:`spfuse.frontend.einsum`), size-1 axes that
   broadcast dropped from their operands;
3. the result dtype is ``numpy.result_type`` of the operands (or ``dtype``),
   every operand must cast to it under ``casting``;
4. the value dtype the kernels compute in is chosen
   (:func:`compute_dtype`): float32/float64 as they are, float16 in float32;
   bool and integers in float64 *only when exact*: the magnitude bound
   ``prod(max|operand|) * (terms per output element)`` stays below 2**53, so
   every partial sum is an exactly representable integer and the result
   wrapped to the integer dtype equals numpy's modular arithmetic.  Complex,
   long double, object and string operands, and integers past that bound,
   are refused with :class:`~spfuse.errors.UnsupportedError`;
5. the program runs through spfuse's call path; the result is cast, laid out
   (``order``) and written to ``out``.

``optimize`` is accepted and ignored: spfuse's planner chooses the
contraction order.  ``order="K"`` returns C order (numpy matches the
operands' strides; values are the same).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from spfuse.errors import ProgramError, UnsupportedError
from spfuse.frontend.ast import Program
from spfuse.frontend.einsum import (
    broadcast_labels,
    labels_to_program,
    parse_subscripts,
    subscripts_from_sublists,
)
from spfuse.interop import is_pydata
from spfuse.tensor import Tensor, as_tensor

__all__ = ["einsum_call", "compute_dtype", "needs_exactness", "CASTINGS", "ORDERS"]

CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")
ORDERS = ("C", "F", "A", "K")
#: Integers below this magnitude are exact in float64.
_EXACT_FLOAT64 = 2 ** 53


def _check_keywords(out: Any, dtype: Any, order: Any, casting: Any) -> tuple[np.dtype | None, str]:
    """numpy's checks of einsum's keyword arguments, in numpy's words."""
    if not (isinstance(order, str) and order.upper() in ORDERS):
        raise ValueError(f"order must be one of 'C', 'F', 'A', or 'K' (got {order!r})")
    if casting not in CASTINGS:
        raise ValueError(f"casting must be one of {', '.join(map(repr, CASTINGS))} (got {casting!r})")
    if out is not None and not isinstance(out, np.ndarray):
        raise TypeError(f"keyword parameter out must be an array for einsum, got {type(out).__name__}")
    return (None if dtype is None else np.dtype(dtype)), order.upper()


def _is_operand(obj: Any) -> bool:
    return isinstance(obj, (np.ndarray, Tensor)) or sp.issparse(obj) or is_pydata(obj)


def compute_dtype(result: np.dtype, what: str = "einsum") -> np.dtype:
    """The value dtype spfuse computes a ``result``-typed einsum in.

    float32/float64 as they are, float16 in float32, complex64/complex128 in
    complex128 (pairs of float64 parts, :mod:`spfuse.complex_values`).
    Integers, bool and long double compute in float64 (complex long double
    in complex128) and the caller must check exactness
    (:func:`needs_exactness`); other dtypes are refused.

    >>> compute_dtype(np.dtype(np.float16)), compute_dtype(np.dtype(np.int32))
    (dtype('float32'), dtype('float64'))
    >>> compute_dtype(np.dtype(np.complex64))
    dtype('complex128')
    >>> compute_dtype(np.dtype(object))
    Traceback (most recent call last):
    ...
    spfuse.errors.UnsupportedError: einsum: object values are not supported (spfuse computes in float32/float64 \
and complex128; int, bool and long double only when exact in float64)
    """
    if result.kind == "f" and result.itemsize <= 8:
        return np.dtype(np.float32) if result.itemsize <= 4 else np.dtype(np.float64)
    if result.kind in "biu" or result.kind == "f":
        return np.dtype(np.float64)
    if result.kind == "c":
        return np.dtype(np.complex128)
    raise UnsupportedError(f"{what}: {result} values are not supported (spfuse computes in float32/float64 and "
                           "complex128; int, bool and long double only when exact in float64)")


def needs_exactness(result: np.dtype) -> bool:
    """Whether a ``result``-typed einsum is computed in float64 only when exact:
    integers, bool and long double (real or complex), which float64 cannot
    hold in general; spfuse does not return a less precise answer unasked.

    >>> needs_exactness(np.dtype(np.int64)), needs_exactness(np.dtype(np.longdouble)), \
needs_exactness(np.dtype(np.complex128))
    (True, True, False)
    """
    return result.kind in "biu" or (result.kind == "f" and result.itemsize > 8) or \
        (result.kind == "c" and result.itemsize > 16)


def _max_abs(obj: Any) -> float | None:
    """max |value| of an operand's real and imaginary parts (0 when empty), without
    densifying a sparse one; ``None`` when some value is not an integer."""
    if isinstance(obj, np.ndarray):
        vals = obj
    elif isinstance(obj, Tensor):
        vals = obj.values
    else:  # scipy or pydata
        vals = np.asarray(obj.data)
    if vals.size == 0:
        return 0.0
    if vals.dtype.kind == "b":
        return float(vals.any())
    if vals.dtype.kind == "c":
        parts = [_max_abs(vals.real), _max_abs(vals.imag)]
        return None if None in parts else max(parts)  # type: ignore[type-var]
    if vals.dtype.kind == "f" and not (np.isfinite(vals).all() and (vals == np.trunc(vals)).all()):
        return None
    return float(max(abs(int(vals.max())), abs(int(vals.min()))))


def _check_exact(operands: Sequence[Any], terms: int, result: np.dtype) -> None:
    """Refuse an integer, bool or long double einsum whose float64 evaluation might not be exact.

    Every operand must hold integers.  ``terms`` products are summed per
    output element; with every operand's magnitude bounded by
    ``max(1, max|operand|)``, so is every partial sum of any association
    order.  A complex factor's parts are bounded by twice the bound of its
    parts (the products ``ac - bd`` of the complex lowering), and the
    difference of two such sums by twice their bound.  Then every partial
    result is an integer below 2**53, exact in float64 -- and in numpy's
    wider type -- so both compute the same answer."""
    bound = float(terms) * (2.0 if result.kind == "c" else 1.0)
    for obj in operands:
        largest = _max_abs(obj)
        if largest is None:
            raise UnsupportedError(f"einsum: {result} values that are not all integers are not supported: spfuse "
                                   "computes in float64 at most and does not return a lower-precision answer "
                                   "unasked. Hint: pass dtype=np.float64 (or complex128) if that is acceptable")
        bound *= max(1.0, largest) * (2.0 if result.kind == "c" else 1.0)
    if bound >= _EXACT_FLOAT64:
        raise UnsupportedError(f"einsum: {result} operands whose result could reach {bound:.3g} in magnitude "
                               "are not supported yet (spfuse computes integers in float64, exact only below "
                               "2**53)")


@dataclass(frozen=True)
class _Resolved:
    """Everything an einsum call decides from its subscripts, shapes and dtypes (cached)."""

    program: Program
    names: list
    dropped: tuple          # per operand: the size-1 axes that broadcast (dropped before the run)
    out_shape: tuple
    result: np.dtype        # numpy's result dtype
    computed: np.dtype      # the dtype the kernels compute in
    recast: bool            # some operand is not of the result dtype
    terms: int              # products summed per output element


@functools.lru_cache(maxsize=1024)
def _resolve(subscripts: str, shapes: tuple, dtypes: tuple, want_dtype: np.dtype | None, casting: str) -> _Resolved:
    labels = parse_subscripts(subscripts, [len(s) for s in shapes])
    labels, dropped, extents = broadcast_labels(labels, shapes)
    result = np.result_type(*dtypes) if want_dtype is None else want_dtype
    rule: Any = casting
    for n, d in enumerate(dtypes):
        if not np.can_cast(d, result, rule):
            raise TypeError(f"Iterator operand {n} dtype could not be cast from dtype('{d}') to dtype('{result}') "
                            f"according to the rule '{casting}'")
    computed = compute_dtype(result)
    program, names = labels_to_program(labels)
    summed = {c for t in labels.inputs for c in t} - set(labels.output)
    return _Resolved(program, names, dropped if any(dropped) else (), tuple(extents[c] for c in labels.output),
                     result, computed, any(d != result for d in dtypes), math.prod(extents[c] for c in summed))


def _drop_axes(obj: Any, axes: tuple[int, ...], name: str) -> Any:
    """``obj`` without its size-1 ``axes`` (numpy: a view; sparse: a tensor without those modes)."""
    if not axes:
        return obj
    if not isinstance(obj, (np.ndarray, Tensor)) and not _tensor_dtype(obj.dtype):
        obj = _dense(obj)  # complex or long double: no real Tensor to drop modes from
    if isinstance(obj, np.ndarray):
        return obj[tuple(0 if a in axes else slice(None) for a in range(obj.ndim))]
    t = as_tensor(obj, name=name)
    keep = [a for a in range(t.ndim) if a not in axes]
    shape = tuple(t.shape[a] for a in keep)
    if t.format.is_dense:
        return t.todense().reshape(shape)
    dropped = Tensor.from_coo(t.coords[keep], t.values, shape, "csr" if len(shape) == 2 else "csf", name=name)
    dropped.origin = t.origin
    return dropped


def _tensor_dtype(dtype: Any) -> bool:
    """Whether a :class:`Tensor` can hold (a conversion of) ``dtype`` values."""
    dtype = np.dtype(dtype)
    return dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize <= 8)


def _cast(obj: Any, dtype: np.dtype, name: str) -> Any:
    """``obj`` with values of ``dtype`` (no copy when they already are).

    For a complex ``dtype``, complex64/complex128 operands are kept (their
    parts are split out in float64) and real ones become float64, not complex:
    a real factor then costs two real products, not four."""
    if dtype.kind == "c":
        kind = np.dtype(obj.dtype).kind
        if kind == "c" and np.dtype(obj.dtype).itemsize <= 16:
            return obj
        if kind != "c":
            dtype = np.dtype(np.float64)
        if not isinstance(obj, (np.ndarray, Tensor)) and obj.dtype != dtype:
            return obj.astype(dtype)  # scipy or pydata, in its own world
    if not isinstance(obj, (np.ndarray, Tensor)) and not _tensor_dtype(obj.dtype):
        return obj.astype(dtype)  # long double scipy or pydata (exactness checked)
    if isinstance(obj, np.ndarray):
        return obj.astype(dtype, copy=False)
    if isinstance(obj, Tensor):
        return obj.astype(dtype)
    if obj.dtype == dtype:
        return obj
    t = as_tensor(obj, name=name)
    return t.astype(dtype) if t.dtype != dtype else t


def _layout(result: np.ndarray, order: str, operands: Sequence[Any]) -> np.ndarray:
    if result.ndim < 2 or order == "K":
        return result
    if order == "A":
        dense = [o for o in operands if isinstance(o, np.ndarray) and o.ndim >= 2]
        fortran = bool(dense) and all(o.flags.f_contiguous and not o.flags.c_contiguous for o in dense)
        order = "F" if fortran else "C"
    return np.asfortranarray(result) if order == "F" else np.ascontiguousarray(result)


def _as_result_dtype(value: Any, result: np.dtype, computed: np.dtype) -> Any:
    """A computed result (array, scalar or sparse) in the numpy result dtype."""
    if result == computed:
        return value
    if result.kind == "b":
        return value != 0 if not isinstance(value, Tensor) else value.todense() != 0
    if result.kind in "iu":
        if isinstance(value, Tensor):
            value = value.todense()
        if isinstance(value, np.ndarray) or np.isscalar(value):
            # exact integers in float64 -> int64 (exact) -> result dtype (wraps like numpy)
            return np.asarray(value).astype(np.int64).astype(result)[()]
        return value.astype(np.int64).astype(result)
    if isinstance(value, Tensor):
        value = value.todense()
    if isinstance(value, np.ndarray) or np.isscalar(value):
        return np.asarray(value).astype(result)[()]
    return value.astype(result)


def _dense(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, Tensor):
        return value.todense()
    if sp.issparse(value):
        return value.toarray()
    if is_pydata(value):
        return value.todense()
    return np.asarray(value)


def einsum_call(args: Sequence[Any], run: Callable[..., Any], *, out: np.ndarray | None = None,
                dtype: Any = None, order: str = "K", casting: str = "safe", optimize: Any = False,
                out_format: str | None = None, fusion: str = "auto", num_threads: int | None = None) -> Any:
    """``numpy.einsum(*args, ...)`` evaluated by ``run(program, operands, out_format, fusion, num_threads)``.

    The body of :func:`spfuse.einsum`; see the module docstring.

    >>> from spfuse.api import _run
    >>> einsum_call(["i,i", np.arange(3), np.arange(3)], _run)
    np.int64(5)
    >>> einsum_call([np.ones((2, 3)), [0, 1], np.ones(3), [1], [0]], _run, dtype=np.float32, casting="same_kind")
    array([3., 3.], dtype=float32)
    """
    want_dtype, order = _check_keywords(out, dtype, order, casting)
    del optimize  # spfuse's planner decides the contraction order
    if not args:
        raise ProgramError("must specify the einstein sum subscripts string and at least one operand, or at "
                           "least one operand and its corresponding subscripts list")
    if isinstance(args[0], str):
        subscripts, operands = args[0], list(args[1:])
    else:
        subscripts, operands = subscripts_from_sublists(args)
    operands = given = [o if _is_operand(o) else np.asarray(o) for o in operands]
    shapes = tuple(tuple(int(e) for e in o.shape) for o in operands)
    dtypes = tuple(np.dtype(o.dtype) for o in operands)
    call = _resolve(subscripts, shapes, dtypes, want_dtype, casting)
    result, computed = call.result, call.computed
    if out is not None:
        if out.ndim != len(call.out_shape):
            raise ValueError(f"out parameter does not have the correct number of dimensions, has {out.ndim} but "
                             f"should have {len(call.out_shape)}")
        if out.shape != call.out_shape:
            raise ValueError(f"out parameter has shape {out.shape} but the einsum result has shape {call.out_shape}")
        rule: Any = casting  # one of CASTINGS (checked above); numpy's stubs want the Literal
        if not np.can_cast(result, out.dtype, rule):
            raise TypeError(f"Iterator requested dtype could not be cast from dtype('{result}') to "
                            f"dtype('{out.dtype}'), the out operand dtype, according to the rule '{casting}'")
    if call.recast:
        # numpy casts every operand to the result dtype first (dtype=..., casting="unsafe" truncates)
        operands = [o.astype(result) if d != result and not isinstance(o, Tensor) else o
                    for o, d in zip(operands, dtypes, strict=True)]
    if call.dropped:
        operands = [_drop_axes(o, axes, name) for name, o, axes in zip(call.names, operands, call.dropped, strict=True)]
    if needs_exactness(result):
        _check_exact(operands, call.terms, result)
    ready = {name: _cast(o, computed, name) for name, o in zip(call.names, operands, strict=True)}
    program = call.program
    value = run(program, ready, out_format, fusion, num_threads)
    value = _as_result_dtype(value, result, computed)
    if out is not None:
        np.copyto(out, _dense(value), casting="unsafe")
        return out
    if isinstance(value, np.ndarray):
        value = _layout(value, order, given)
    return value
