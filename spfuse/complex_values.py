"""Complex operands and results around a real-valued run.

spfuse's tensors and kernels hold real values.  A call with complex
operands (complex64 or complex128 numpy arrays, scipy.sparse matrices,
pydata ``sparse`` arrays, Python complex scalars) runs as follows:

1. each complex operand becomes two real :class:`~spfuse.tensor.Tensor`
   operands, its real and imaginary values over one pattern: a sparse
   operand's two tensors share the caller's index arrays (no copy when they
   are canonical, as for real operands); only the values are de-interleaved;
2. the program is rewritten into real arithmetic by
   :func:`spfuse.passes.complex_split.split_complex`;
3. the real program runs through the ordinary call path (planner, template
   kernels or the loop-tree executor), in float64;
4. each complex result is recombined from its two real results, in the
   caller's world (numpy, scipy.sparse with the same flavour, pydata), with
   dtype ``numpy.result_type`` of the operands: complex64 operands give a
   complex64 result, computed in float64 and then rounded.

A complex N-d sparse result that would come back as a
:class:`~spfuse.tensor.Tensor` (which holds real values) comes back as a
scipy ``coo_array`` instead.

Long double (``complex256``) is refused: spfuse computes in float64 at most,
and does not return a lower-precision answer unasked (cast to complex128
first if that is acceptable).  :func:`spfuse.einsum` answers long double
calls only when float64 is provably exact (see :mod:`spfuse.numpy_einsum`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from spfuse.errors import UnsupportedError
from spfuse.frontend.ast import Access, Literal, Program
from spfuse.interop import is_pydata, to_scipy_coo
from spfuse.passes.complex_split import (
    ComplexSplit,
    NeedsExtents,
    TermExpansion,
    expand_terms,
    split_complex,
    with_distinct_binders,
)
from spfuse.tensor import Tensor, as_tensor

__all__ = ["is_complex", "complex_parts", "combine_parts", "run_complex"]

_FLOAT64 = np.dtype(np.float64)


def is_complex(obj: Any) -> bool:
    """Whether ``obj`` is an operand with complex values.

    >>> is_complex(np.ones(2, np.complex64)), is_complex(np.ones(2)), is_complex(1j)
    (True, False, True)
    """
    dtype = getattr(obj, "dtype", None)
    if dtype is None:
        return isinstance(obj, complex)
    return getattr(dtype, "kind", "") == "c"


def _check_precision(dtype: np.dtype, name: str) -> None:
    if dtype.itemsize > 16:
        raise UnsupportedError(f"operand {name!r}: {dtype} (long double) values are not supported: spfuse computes "
                               "in float64 at most and does not return a lower-precision answer unasked. "
                               f"Hint: cast to complex128 first ({name}.astype(np.complex128)) if that is acceptable")


def _canonical_sparse(m: Any) -> Any:
    """A scipy matrix in CSR/CSC/COO without duplicate entries (a copy only when needed)."""
    if m.format not in ("csr", "csc", "coo"):
        m = m.tocsr()
    if not m.has_canonical_format:
        m = m.copy()
        m.sum_duplicates()
    return m


def _placeholder(obj: Any, values: np.ndarray) -> Any:
    """``obj``'s container and index arrays with real ``values`` (1..nnz: where each entry came from)."""
    if sp.issparse(obj):
        if obj.format == "coo":
            return type(obj)((values, tuple(obj.coords)), shape=obj.shape)
        return type(obj)((values, obj.indices, obj.indptr), shape=obj.shape)
    import sparse
    if isinstance(obj, sparse.GCXS):
        return sparse.GCXS((values, obj.indices, obj.indptr), shape=obj.shape, compressed_axes=obj.compressed_axes)
    return sparse.COO(obj.coords, values, shape=obj.shape, has_duplicates=False, sorted=False)


def complex_parts(obj: Any, name: str = "operand") -> tuple[Tensor, Tensor]:
    """A complex operand as two real float64 tensors (real part, imaginary part).

    Sparse operands give two tensors over the same index arrays -- the
    caller's own when they are canonical.

    >>> import scipy.sparse as sp
    >>> m = sp.csr_array(np.array([[1 + 2j, 0], [0, 3j]]))
    >>> re, im = complex_parts(m, "m")
    >>> re.values.tolist(), im.values.tolist(), re.levels[1].crd is im.levels[1].crd
    ([1.0, 0.0], [2.0, 3.0], True)
    >>> np.shares_memory(re.levels[1].crd, m.indices)
    True
    """
    if sp.issparse(obj) or is_pydata(obj):
        dtype = np.dtype(obj.dtype)
        _check_precision(dtype, name)
        if sp.issparse(obj):
            obj = _canonical_sparse(obj)
        else:
            fill = obj.fill_value
            if fill != 0:
                as_tensor(obj, name=name)  # words the non-zero fill_value error
        data = np.asarray(obj.data).reshape(-1)
        where_from = np.arange(1, data.size + 1, dtype=np.float64)  # >0: no conversion drops one as a zero
        pattern = as_tensor(_placeholder(obj, where_from), name=name)
        if pattern.values.size != data.size:
            raise AssertionError(f"operand {name!r}: the pattern changed while splitting complex values")
        if not np.shares_memory(pattern.values, where_from):
            data = data[pattern.values.astype(np.int64) - 1]  # the conversion reordered the entries
        parts = (pattern._with_kernel_values(np.ascontiguousarray(data.real, dtype=_FLOAT64)),
                 pattern._with_kernel_values(np.ascontiguousarray(data.imag, dtype=_FLOAT64)))
        for part in parts:
            part.origin = pattern.origin
        return parts
    arr = np.asarray(obj)
    _check_precision(arr.dtype, name)
    return (as_tensor(np.array(arr.real, dtype=_FLOAT64, order="C"), name=name),
            as_tensor(np.array(arr.imag, dtype=_FLOAT64, order="C"), name=name))


def _same_pattern(x: Any, y: Any) -> bool:
    if type(x) is not type(y) or x.shape != y.shape:
        return False
    if sp.issparse(x):
        if x.format != y.format:
            return False
        if x.format == "coo":
            return all(np.array_equal(a, b) for a, b in zip(x.coords, y.coords, strict=True))
        return np.array_equal(x.indptr, y.indptr) and np.array_equal(x.indices, y.indices)
    if hasattr(x, "indptr"):  # pydata GCXS
        return (tuple(x.compressed_axes) == tuple(y.compressed_axes) and np.array_equal(x.indptr, y.indptr)
                and np.array_equal(x.indices, y.indices))
    return np.array_equal(x.coords, y.coords)  # pydata COO


def _with_data(x: Any, data: np.ndarray) -> Any:
    """The sparse container ``x`` with ``data`` over its own index arrays."""
    if sp.issparse(x):
        if x.format == "coo":
            return type(x)((data, x.coords), shape=x.shape)
        return type(x)((data, x.indices, x.indptr), shape=x.shape)
    import sparse
    if isinstance(x, sparse.GCXS):
        return sparse.GCXS((data, x.indices, x.indptr), shape=x.shape, compressed_axes=x.compressed_axes)
    return sparse.COO(x.coords, data, shape=x.shape, has_duplicates=False, sorted=True)


def combine_parts(re: Any, im: Any, dtype: np.dtype) -> Any:
    """``re + 1j*im`` of ``dtype``, in the world the parts came back in (``None`` is a zero part).

    >>> z = combine_parts(np.array([1.0, 2.0]), np.array([0.5, 0.0]), np.dtype(np.complex64))
    >>> z.tolist(), z.dtype
    ([(1+0.5j), (2+0j)], dtype('complex64'))
    >>> import scipy.sparse as sp
    >>> combine_parts(sp.csr_array(np.eye(2)), None, np.dtype(np.complex128)).dtype
    dtype('complex128')
    """
    dtype = np.dtype(dtype)
    if isinstance(re, Tensor):
        re = to_scipy_coo(re)  # a Tensor holds real values: N-d complex sparse comes back as a coo_array
    if isinstance(im, Tensor):
        im = to_scipy_coo(im)
    if im is None or re is None:
        part = re if im is None else im
        scale = 1 if im is None else 1j
        if sp.issparse(part) or is_pydata(part):
            return _with_data(part, (np.asarray(part.data) * scale).astype(dtype))
        return (np.asarray(part) * scale).astype(dtype)[()]
    sparse_re, sparse_im = sp.issparse(re) or is_pydata(re), sp.issparse(im) or is_pydata(im)
    if sparse_re and sparse_im:
        if _same_pattern(re, im):
            data = np.empty(np.asarray(re.data).shape, dtype)
            data.real, data.imag = re.data, im.data
            return _with_data(re, data)
        if sp.issparse(re):
            out = (re.astype(dtype) + im.astype(dtype) * 1j).asformat(re.format)
            return out
        import sparse
        out = sparse.COO(re).astype(dtype) + sparse.COO(im).astype(dtype) * 1j
        return out if isinstance(re, sparse.COO) else sparse.GCXS(out, compressed_axes=re.compressed_axes)
    # a dense part: the sum is dense
    re = re.toarray() if sp.issparse(re) else (re.todense() if sparse_re else np.asarray(re))
    im = im.toarray() if sp.issparse(im) else (im.todense() if sparse_im else np.asarray(im))
    out = np.empty(np.broadcast_shapes(re.shape, im.shape), dtype)
    out.real, out.imag = re, im
    return out[()]


def _result_shape(program: Program, operands: Mapping[str, Any], name: str) -> tuple[int, ...]:
    from spfuse.frontend.check import check_program
    extents = check_program(program, {n: np.shape(o) for n, o in operands.items()})
    for statement, ext in zip(reversed(program.statements), reversed(extents), strict=True):
        if statement.target.name == name:
            return tuple(ext[k] for k in statement.target.indices)
    raise KeyError(name)


def _broadcast(part: Any, kept: tuple[int, ...] | None, shape: tuple[int, ...]) -> Any:
    """A part result computed over the modes ``kept`` of ``shape`` only, spread along the others (dense)."""
    if part is None or kept is None:
        return part
    if isinstance(part, Tensor):
        part = part.todense()
    dense = part.toarray() if sp.issparse(part) else (part.todense() if is_pydata(part) else np.asarray(part))
    missing = [p for p in range(len(shape)) if p not in kept]
    return np.broadcast_to(np.expand_dims(dense, missing), shape)


@functools.lru_cache(maxsize=512)
def _split(program: Program, complex_inputs: frozenset[str], dtype: str) -> ComplexSplit:
    return split_complex(program, complex_inputs, dtype)


@functools.lru_cache(maxsize=512)
def _expansion(program: Program, complex_inputs: frozenset[str], dtype: str) -> TermExpansion | None:
    """The term expansion when it is the faster way: one statement, at most 16 terms, and some term
    is a real computation (not a bare operand, which the n-way sums of the split program serve)."""
    try:
        expansion = expand_terms(program, complex_inputs, dtype)
    except NeedsExtents:
        return None
    if expansion is None:
        return None
    terms = expansion.real + expansion.imag
    if all(isinstance(p.statements[0].value, (Access, Literal)) for _, p in terms):
        return None
    return expansion


def _signed_sum(terms: list[tuple[float, Any]], out_format: str | None) -> Any:
    """``sum(c * v)`` over term results, in their world (dense when the worlds differ)."""
    values = [to_scipy_coo(v) if isinstance(v, Tensor) else v for _, v in terms]
    coefs = [c for c, _ in terms]
    if len(values) == 1 and coefs[0] == 1.0:
        return values[0]
    if all(sp.issparse(v) for v in values):
        total = _sparse_sum(values, coefs)
        return total.asformat(out_format or values[0].format)
    if all(is_pydata(v) for v in values):
        import sparse
        total = _sparse_sum([sparse.COO(v) for v in values], coefs)
        return total if isinstance(values[0], sparse.COO) else sparse.GCXS(
            total, compressed_axes=values[0].compressed_axes)
    dense = [v.toarray() if sp.issparse(v) else (v.todense() if is_pydata(v) else np.asarray(v)) for v in values]
    total = dense[0] * coefs[0]
    for c, v in zip(coefs[1:], dense[1:], strict=True):
        total = total + v * c
    return total


def _sparse_sum(values: list, coefs: list[float]) -> Any:
    total = values[0] * coefs[0] if coefs[0] != 1.0 else values[0]
    for c, v in zip(coefs[1:], values[1:], strict=True):
        total = total + v if c == 1.0 else (total - v if c == -1.0 else total + v * c)
    return total


def _run_terms(expansion: TermExpansion, real_operands: Mapping[str, Any], made: frozenset[str],
               program: Program, operands: Mapping[str, Any], out_format: str | None, fusion: str,
               num_threads: int | None, run: Callable[..., Any], dtype: np.dtype) -> Any:
    """The result of a term expansion, each term a call of ``run``."""
    parts = []
    for terms in (expansion.real, expansion.imag):
        values = []
        for coef, term in terms:
            used = {n: o for n, o in real_operands.items() if n in term.inputs}
            value = run(term, used, out_format, fusion, num_threads, made & frozenset(used))
            name = term.statements[0].target.name
            if name in expansion.kept:
                value = _broadcast(value, expansion.kept[name], _result_shape(program, operands, program.results[0]))
            values.append((coef, value))
        parts.append(values)
    if not parts[1]:  # a real result (abs)
        value = _signed_sum(parts[0], out_format)
        return value.astype(np.dtype(dtype.char.lower()) if dtype.kind == "c" else dtype)
    if all(isinstance(v, (np.ndarray, np.generic)) for _, v in parts[0] + parts[1]):
        return _assemble_dense(parts[0], parts[1], dtype)
    return combine_parts(_signed_sum(parts[0], out_format) if parts[0] else None,
                         _signed_sum(parts[1], out_format), dtype)


def _assemble_dense(real: list[tuple[float, Any]], imag: list[tuple[float, Any]], dtype: np.dtype) -> Any:
    """``sum(c*v for real) + 1j*sum(c*v for imag)`` of dense term results, summed in place in the output."""
    shape = np.shape(real[0][1]) if real else np.shape(imag[0][1])
    out = np.zeros(shape, np.complex128)
    for view, terms in ((out.real, real), (out.imag, imag)):
        for coef, value in terms:
            if coef == 1.0:
                np.add(view, value, out=view)
            elif coef == -1.0:
                np.subtract(view, value, out=view)
            else:
                view += coef * np.asarray(value)
    return out.astype(dtype, copy=False)[()]


def run_complex(program: Program, operands: Mapping[str, Any], out_format: str | None, fusion: str,
                num_threads: int | None, run: Callable[..., Any]) -> Any:
    """Evaluate ``program`` with complex ``operands`` through the real ``run`` (``spfuse.api._run``).

    >>> from spfuse.api import _run, _parse
    >>> A = np.array([[1j, 0], [2, 1 - 1j]], np.complex64)
    >>> x = np.array([1.0, 1j], np.complex64)
    >>> y = run_complex(_parse("y[i] = A[i,j] * x[j]"), {"A": A, "x": x}, None, "auto", None, _run)
    >>> y.tolist(), y.dtype
    ([1j, (3+1j)], dtype('complex64'))
    """
    if out_format == "csf":
        raise UnsupportedError("out_format='csf' gives a spfuse.Tensor, which holds real values; complex results "
                               "can come back as 'dense', 'csr', 'csc' or 'coo'")
    dtypes = []
    for name, obj in operands.items():
        dt = getattr(obj, "dtype", None)
        dtypes.append(np.dtype(dt) if dt is not None else np.result_type(obj))
        if dtypes[-1].kind == "c":
            _check_precision(dtypes[-1], name)
    result = np.result_type(*dtypes)
    complex_inputs = frozenset(n for n, o in operands.items() if is_complex(o))
    try:
        split = _split(program, complex_inputs & frozenset(program.inputs), str(result))
    except NeedsExtents:  # rare: a sum whose imaginary part does not use its index (not cached)
        from spfuse.frontend.check import check_program
        extents = check_program(with_distinct_binders(program), {n: np.shape(o) for n, o in operands.items()})
        split = split_complex(program, complex_inputs & frozenset(program.inputs), str(result), extents)
    real_operands: dict[str, Any] = {}
    for name, obj in operands.items():
        if name in split.inputs:
            re, im = complex_parts(obj, name)
            re_input, im_input = split.inputs[name]
            real_operands[re_input], real_operands[im_input] = re, im
        else:
            real_operands[name] = obj
    expansion = _expansion(program, complex_inputs & frozenset(program.inputs), str(result))
    if expansion is not None:  # one statement: each term on the kernel the real program would use
        made = frozenset(n for n in real_operands if n not in operands)
        return _run_terms(expansion, real_operands, made, program, operands, out_format, fusion, num_threads, run,
                          result)
    used = set(split.program.inputs)
    real_operands = {n: o for n, o in real_operands.items() if n in used}
    made = frozenset(n for n in real_operands if n not in operands)  # validated just now
    values = run(split.program, real_operands, out_format, fusion, num_threads, made)
    if not isinstance(values, dict):
        values = {split.program.results[0]: values}
    real_dtype = np.dtype(result.char.lower()) if result.kind == "c" else result
    out = {}
    for result_name, (re_name, im_name) in split.results.items():
        re_value = values[re_name] if re_name is not None else None
        im_value = values[im_name] if im_name is not None else None
        if re_name in split.kept or im_name in split.kept:
            shape = _result_shape(program, operands, result_name)
            re_value = _broadcast(re_value, split.kept.get(re_name or ""), shape)
            im_value = _broadcast(im_value, split.kept.get(im_name or ""), shape)
        if result_name in split.complex_results:
            out[result_name] = combine_parts(re_value, im_value, result)
        else:
            out[result_name] = re_value.astype(real_dtype) if re_value is not None else re_value
    return out[next(iter(out))] if len(out) == 1 else out
