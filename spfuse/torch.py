"""PyTorch integration: an spfuse program as a differentiable torch function.

:func:`function` wraps a program as a ``torch.autograd.Function``: the
forward pass runs the program through spfuse's planner and executor, the
backward pass runs its adjoint program (:mod:`spfuse.autodiff`).  Inputs are
CPU torch tensors -- dense (strided), sparse CSR or sparse COO -- converted
without copying where the layouts allow (``Tensor.numpy()``, CSR's
``crow_indices``/``col_indices``/``values``; a coalesced COO's indices and
values).  Dense results come back dense, sparse ones as sparse CSR.  A sparse
input's gradient lives on its stored pattern, with its own layout and
indices, as torch gives it for sparse leaves.

torch is imported when a function is first made, never by ``import spfuse``.

>>> import torch, spfuse.torch
>>> spmm = spfuse.torch.function("Y[i,k] = A[i,j] * X[j,k]")
>>> A = torch.tensor([[0.0, 2.0], [1.0, 0.0]], dtype=torch.float64).to_sparse_csr()
>>> X = torch.ones(2, 3, dtype=torch.float64, requires_grad=True)
>>> Y = spmm(A, X)
>>> Y.sum().backward()
>>> X.grad
tensor([[1., 1., 1.],
        [2., 2., 2.]], dtype=torch.float64)
"""
from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
import scipy.sparse as sp

from spfuse.autodiff.run import cached_adjoint, run_adjoint, run_forward
from spfuse.frontend.ast import Program
from spfuse.frontend.parser import parse_program
from spfuse.lowering.transposes import transposed_csr
from spfuse.tensor import Tensor, as_tensor, values_at

__all__ = ["function", "SpfuseFunction", "to_spfuse", "to_torch"]


def _torch():
    import torch
    return torch


def _cpu_array(t: Any, torch: Any) -> np.ndarray | None:
    """A strided CPU tensor's ndarray (zero-copy), or None for anything else:
    the per-call path of a training loop's inputs and cotangents."""
    if isinstance(t, torch.Tensor) and t.layout == torch.strided and t.is_cpu:
        return (t.detach() if t.requires_grad else t).numpy()
    return None


def to_spfuse(t: Any, name: str = "operand") -> Any:
    """A CPU torch tensor as an spfuse operand, sharing memory where possible:
    dense → ``ndarray``; sparse CSR → ``scipy.sparse.csr_array``; sparse COO
    (coalesced first) → ``scipy.sparse.coo_array`` when 2-d, else an
    :class:`spfuse.Tensor`.  Anything else is returned unchanged.

    >>> import torch
    >>> to_spfuse(torch.eye(2).to_sparse_csr()).toarray()
    array([[1., 0.],
           [0., 1.]], dtype=float32)
    """
    torch = _torch()
    if not isinstance(t, torch.Tensor):
        return t
    if t.device.type != "cpu":
        raise ValueError(f"operand {name!r}: spfuse runs on the CPU; got a tensor on {t.device} "
                         "(Hint: .cpu() it first)")
    t = t.detach()
    if t.layout == torch.strided:
        return t.numpy()
    if t.layout == torch.sparse_csr:
        return sp.csr_array((t.values().numpy(), t.col_indices().numpy(), t.crow_indices().numpy()),
                            shape=tuple(t.shape))
    if t.layout == torch.sparse_coo:
        t = t.coalesce()
        idx, vals = t.indices().numpy(), t.values().numpy()
        if t.ndim == 2:
            return sp.coo_array((vals, (idx[0], idx[1])), shape=tuple(t.shape))
        return Tensor.from_coo(idx, vals, tuple(t.shape), format="csf" if t.ndim else "dense", name=name)
    raise TypeError(f"operand {name!r}: unsupported torch layout {t.layout} "
                    "(expected strided, sparse_csr or sparse_coo)")


def to_torch(value: Any) -> Any:
    """An spfuse result as a torch tensor: dense → dense (zero-copy), a sparse
    matrix (scipy or :class:`spfuse.Tensor`) → sparse CSR, an N-d sparse
    Tensor → sparse COO, a float → a 0-d tensor.

    >>> import numpy as np, scipy.sparse as sp
    >>> to_torch(sp.csr_array(np.eye(2))).layout
    torch.sparse_csr
    """
    torch = _torch()
    if type(value) is np.ndarray and value.flags.c_contiguous:
        return torch.from_numpy(value)
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if sp.issparse(value):
        m = value.tocsr()
        idx_dtype = np.result_type(m.indptr.dtype, m.indices.dtype)
        return torch.sparse_csr_tensor(torch.from_numpy(m.indptr.astype(idx_dtype, copy=False)),
                                       torch.from_numpy(m.indices.astype(idx_dtype, copy=False)),
                                       torch.from_numpy(m.data), size=m.shape)
    if isinstance(value, Tensor):
        if value.format.is_dense:
            return torch.from_numpy(value.todense())
        if value.ndim == 2:
            return to_torch(value.to_scipy())
        return torch.sparse_coo_tensor(torch.from_numpy(value.coords.astype(np.int64)),
                                       torch.from_numpy(np.array(value.values)), size=value.shape).coalesce()
    return torch.tensor(float(value), dtype=torch.float64)


class _CSRArrays:
    """A torch CSR tensor's arrays in the attributes a scipy CSR matrix has."""

    format = "csr"

    def __init__(self, t: Any):
        self.indptr = t.crow_indices().numpy()
        self.indices = t.col_indices().numpy()
        self.data = t.values().numpy()
        shape = t.shape
        self.shape = (int(shape[0]), int(shape[1]))


#: torch CSR tensors converted lately: id -> (weak reference, version,
#: Tensor, what was made from that Tensor: its transpose)
_converted: dict[int, tuple[Any, int, Tensor, dict]] = {}
#: how many conversions :data:`_converted` keeps (the operands of a few models)
MAX_CONVERTED = 32


def _csr_tensor(t: Any) -> Tensor | None:
    """A canonical torch CSR tensor as an spfuse Tensor, zero-copy, after the
    one-pass index scan (no scipy object on the way: the per-call path of a
    training loop); None when anything is unusual (the general path decides).

    A training loop passes the same adjacency every step, so the Tensor is
    remembered per tensor object and handed out again while the tensor's
    version counter is unchanged.  torch bumps that counter on every
    in-place change of the tensor, its values or its indices (as autograd
    relies on for saved tensors), so a changed pattern is scanned again; the
    Tensor's values are views of the tensor's own memory either way.  Like
    torch's, this cannot see writes made through a NumPy view of the index
    arrays (``t.col_indices().numpy()[0] = ...``).

    >>> import torch
    >>> a = torch.eye(3, dtype=torch.float64).to_sparse_csr()
    >>> _csr_tensor(a) is _csr_tensor(a)
    True
    >>> b = _csr_tensor(a); _ = a.values().mul_(2); _csr_tensor(a) is b
    False
    """
    key = id(t)
    found = _converted.get(key)
    version = t._version
    if found is not None and found[0]() is t and found[1] == version:
        return found[2]
    source = t.detach() if t.requires_grad else t
    if source.ndim != 2:
        return None
    tensor = Tensor._fast_compressed(_CSRArrays(source), "sparray")
    if tensor is not None:
        if len(_converted) >= MAX_CONVERTED:   # (another thread may drop the same entry first)
            _converted.pop(next(iter(_converted), None), None)
        _converted[key] = (weakref.ref(t, lambda _, key=key: _converted.pop(key, None)), version, tensor, {})
    return tensor


def _transposed(t: Any) -> Tensor | None:
    """The transpose (as CSR) of the Tensor :func:`_csr_tensor` holds for
    ``t``, made once per version of ``t`` (a backward pass reads ``Aᵀ``
    every step: a values gather and two index comparisons each time
    otherwise), or None when none is held.

    >>> import torch
    >>> a = torch.tensor([[0.0, 2.0], [1.0, 0.0]], dtype=torch.float64).to_sparse_csr()
    >>> _ = _csr_tensor(a); _transposed(a).todense().tolist()
    [[0.0, 1.0], [2.0, 0.0]]
    >>> _transposed(a) is _transposed(a)
    True
    """
    found = _converted.get(id(t))
    if found is None or found[0]() is not t or found[1] != t._version:
        return None
    made = found[3]
    if "T" not in made:
        made["T"] = transposed_csr(found[2])
    return made["T"]


class _Input:
    """One converted input: the spfuse operand and how to hand its gradient back."""

    def __init__(self, name: str, source: Any, torch: Any = None):
        torch = torch or _torch()
        self.source = source
        self.layout = layout = source.layout if isinstance(source, torch.Tensor) else None
        tensor = None
        # the common layouts without the general conversion (per input per call)
        if (array := _cpu_array(source, torch)) is not None:
            tensor = Tensor._fast_dense(array)
        elif layout == torch.sparse_csr and source.is_cpu:
            tensor = _csr_tensor(source)
        self.tensor = tensor if tensor is not None else as_tensor(to_spfuse(source, name), name=name)

    @property
    def sparse(self) -> bool:
        return not self.tensor.format.is_dense

    def gradient(self, raw: Any) -> Any:
        """The gradient in the input's layout (values on its own stored pattern)."""
        torch = _torch()
        src = self.source
        if not self.sparse:
            g = torch.from_numpy(np.ascontiguousarray(raw))
            # (a torch reshape costs microseconds per gradient per call: only when the shapes differ)
            return g.reshape(src.shape) if isinstance(src, torch.Tensor) and g.shape != src.shape else g
        if self.layout == torch.sparse_csr:
            rows = np.repeat(np.arange(src.shape[0]), np.diff(src.crow_indices().numpy()))
            coords = np.stack([rows, src.col_indices().numpy()])
            vals = values_at(self.tensor.with_values(raw), coords, self.tensor.shape)
            return torch.sparse_csr_tensor(src.crow_indices(), src.col_indices(), torch.from_numpy(vals),
                                           size=src.shape)
        coalesced = src.detach().coalesce()
        vals = values_at(self.tensor.with_values(raw), coalesced.indices().numpy(), self.tensor.shape)
        return torch.sparse_coo_tensor(coalesced.indices(), torch.from_numpy(vals), size=src.shape,
                                       is_coalesced=True)


@functools.lru_cache(maxsize=1)
def _autograd_function():
    torch = _torch()

    class _ProgramFunction(torch.autograd.Function):
        """forward(ctx, spec, *inputs); spec is the :class:`SpfuseFunction`."""

        @staticmethod
        def forward(ctx, spec, *sources):
            inputs = {n: _Input(n, s, torch) for n, s in zip(spec.names, sources, strict=True)}
            wrt = tuple(n for n, need in zip(spec.names, ctx.needs_input_grad[1:], strict=True) if need)
            program = spec.program
            adj = None
            if wrt:
                sparse = frozenset(n for n, i in inputs.items() if i.sparse)
                adj = cached_adjoint(program, wrt, program.results, sparse, spec.temporaries)
            values, saved = spec.forward(adj, {n: i.tensor for n, i in inputs.items()})
            ctx.spfuse = (spec, adj, inputs, saved)
            outs = tuple(to_torch(values[r]) for r in program.results)
            return outs if len(outs) > 1 else outs[0]

        @staticmethod
        def backward(ctx, *grads):
            spec, adj, inputs, saved = ctx.spfuse
            if adj is None:
                return (None,) * (1 + len(spec.names))
            cotangents = {}
            for r, g in zip(spec.program.results, grads, strict=True):
                if g is None:
                    continue
                c = _cpu_array(g, torch)
                if c is None:
                    c = to_spfuse(g, f"cotangent of {r}")
                cotangents[r] = float(c) if np.ndim(c) == 0 and isinstance(c, np.ndarray) else c
            transposes = {}
            for n in adj.read_transposed:
                if inputs[n].layout == torch.sparse_csr and (made := _transposed(inputs[n].source)) is not None:
                    transposes[n] = made
            # inputs were validated when converted, saved temporaries are spfuse's own
            raw = run_adjoint(adj, {n: i.tensor for n, i in inputs.items()}, cotangents, saved,
                              fusion=spec.fusion, num_threads=spec.num_threads, trusted=(*inputs, *saved),
                              transposes=transposes)
            return (None, *(inputs[n].gradient(raw[n]) if n in adj.wrt else None for n in spec.names))

    return _ProgramFunction


class SpfuseFunction:
    """A program as a differentiable torch function (see :func:`function`)."""

    def __init__(self, program: str | Program, formats: Mapping[str, str], fusion: str = "auto",
                 num_threads: int | None = None, temporaries: str = "auto"):
        self.program = parse_program(program) if isinstance(program, str) else program
        self.names = tuple(self.program.inputs)
        unknown = sorted(set(formats) - set(self.names))
        if unknown:
            raise ValueError(f"formats given for {', '.join(map(repr, unknown))}, not read by the program; "
                             f"inputs: {', '.join(self.names)}")
        self.formats = dict(formats)
        self.fusion = fusion
        self.num_threads = num_threads
        self.temporaries = temporaries
        _autograd_function()  # imports torch now, not at the first call

    def forward(self, adj, tensors: Mapping[str, Tensor]) -> tuple[dict, dict]:
        """The results, and the temporaries ``adj`` keeps for the backward pass
        (:func:`spfuse.autodiff.run.run_forward`)."""
        ops = {n: (t.asformat(self.formats[n]) if n in self.formats else t) for n, t in tensors.items()}
        # (the tensors were validated when converted from torch, this call)
        return run_forward(self.program, adj, ops, fusion=self.fusion, num_threads=self.num_threads,
                           trusted=tuple(ops))

    def __call__(self, *args: Any, **kwargs: Any):
        if len(args) > len(self.names):
            raise TypeError(f"expected at most {len(self.names)} positional operands "
                            f"({', '.join(self.names)}), got {len(args)}")
        given = dict(zip(self.names, args, strict=False))  # positional operands may be a prefix of the names
        for name, value in kwargs.items():
            if name not in self.names:
                raise TypeError(f"unexpected operand {name!r}; the program reads {', '.join(self.names)}")
            if name in given:
                raise TypeError(f"operand {name!r} given twice")
            given[name] = value
        missing = [n for n in self.names if n not in given]
        if missing:
            raise TypeError(f"missing operand(s) {', '.join(map(repr, missing))}")
        return _autograd_function().apply(self, *(given[n] for n in self.names))

    def __repr__(self) -> str:
        return f"<spfuse.torch.function {self.program.text!r}>"


def function(program: str, *, fusion: str = "auto", num_threads: int | None = None,
             temporaries: str = "auto", **formats: str) -> SpfuseFunction:
    """Wrap ``program`` as a differentiable function of CPU torch tensors.

    Call it with the operands positionally (in the order the program first
    reads them) or by name.  ``formats`` converts an operand before the run
    (``A="csr"``); ``temporaries`` chooses how the backward pass gets forward
    temporaries (see :func:`spfuse.autodiff.adjoint`).  Several results come
    back as a tuple in the program's result order.

    >>> import torch, spfuse.torch
    >>> f = spfuse.torch.function("s = sum(i, relu(x[i]) * w[i])")
    >>> x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    >>> f(x, w=torch.tensor([0.5, 0.5, 2.0])).backward()
    >>> x.grad
    tensor([0.5000, 0.0000, 2.0000])
    """
    return SpfuseFunction(program, formats, fusion, num_threads, temporaries)
