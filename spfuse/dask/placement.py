"""Tasks pinned to the workers the communication cost model places them on.

Dask decides at run time where a task runs (the holder of one of its
inputs with the least occupancy + missing bytes / bandwidth, then work
stealing), so the bytes a call moves vary from run to run.  Pinned with
``workers`` annotations the placement is the model's, and the bytes are
the predicted ones (:func:`spfuse.dask.cost.predict_bytes`).

Two things stand in the way of pins in normal use, and this module handles both:

* Dask's array optimisation (``dask.array.optimization.optimize``) fuses
  the graph into a plain dict (``ensure_dict``), which drops every layer's
  annotations; the result arrays are therefore :class:`PlacedArray`, whose
  optimiser runs Dask's and puts the pins back on the optimised graph
  (fusion keeps the key of a chain's last task, which the model placed too);
* annotating the caller's graph layers would change the caller's operand
  arrays: :func:`pin` annotates copies of the layers.

``strict`` pins (``allow_other_workers=False``) are never stolen, so the
bytes are exact, but a task pinned to a worker that has left waits for it
forever; loose pins (what a plain call on a current client uses) fall back
to any worker then, and a pinned task may be stolen by an idle worker.

>>> import dask.array as da
>>> x = da.ones(4, chunks=2)
>>> y = pin(x + 1, {((x + 1).name, 0): "tcp://w0"}, strict=True)
>>> type(y).__name__, y.dask.layers[y.name].annotations["workers"]((y.name, 0))
('PlacedArray', ['tcp://w0'])
>>> (x + 1).dask.layers[y.name].annotations is None  # the caller's graph is not annotated
True
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import dask.array as da
from dask.base import dont_optimize
from dask.context import globalmethod
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

__all__ = ["PlacedArray", "pin"]


@dataclass(frozen=True)
class _WorkerOf:
    """A ``workers`` annotation: key -> [its worker's address], ``None`` (no restriction) if not placed."""

    where: Mapping

    def __call__(self, key: Any) -> list | None:
        addr = self.where.get(key)
        return None if addr is None else [addr]

    def __iter__(self):
        # Dask's blockwise fusion intersects the worker lists of the layers it fuses (for an
        # array derived from a pinned one); a per-key pin has no such list: the fused tasks are
        # left unpinned rather than failing
        return iter(())


def _optimize_keeping_pins(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """Dask's array optimisation, with the ``workers`` / ``allow_other_workers``
    annotations of the input graph's layers put back on the optimised graph.

    >>> import dask.array as da
    >>> y = pin(da.ones(4, chunks=2) + 1, {}, strict=False)
    >>> out = _optimize_keeping_pins(y.dask, y.__dask_keys__())
    >>> sorted(next(iter(out.layers.values())).annotations)
    ['allow_other_workers', 'workers']
    """
    from dask.array.optimization import optimize
    where, loose = {}, False
    if isinstance(dsk, HighLevelGraph):
        # taken off first: Dask's blockwise fusion merges plain lists of workers, not callables
        layers = {}
        for name, layer in dsk.layers.items():
            ann = layer.annotations or {}
            pins = ann.get("workers")
            if isinstance(pins, _WorkerOf):
                where.update(pins.where)
                loose = loose or bool(ann.get("allow_other_workers"))
                layer = copy.copy(layer)
                rest = {k: v for k, v in ann.items() if k not in ("workers", "allow_other_workers")}
                layer.annotations = rest or None
            layers[name] = layer
        dsk = HighLevelGraph(layers, dsk.dependencies)
    out = optimize(dsk, keys, **kwargs)
    if isinstance(out, HighLevelGraph):  # not fused (optimization.fuse.active=False): one layer per old one
        out = dict(out)
    where = {**where, **_fused_pins(out, where)}
    name = f"spfuse-placed-{id(out)}"
    layer = MaterializedLayer(dict(out), annotations={"workers": _WorkerOf(where), "allow_other_workers": loose})
    return HighLevelGraph({name: layer}, {name: set()})


def _fused_pins(graph: Mapping, where: Mapping) -> dict:
    """Pins of the tasks Dask's linear fusion made: a fused chain is a new key (its
    names joined) that runs the chain's tasks as a subgraph; it runs where the
    model placed the chain's last task (else any of its tasks)."""
    try:  # Dask internals (dask 2025+): if they change, fused chains go unpinned rather than fail
        from dask._task_spec import Task, _execute_subgraph
    except ImportError:
        return {}
    pins = {}
    for key, task in graph.items():
        if key in where or not (isinstance(task, Task) and task.func is _execute_subgraph):
            continue
        try:
            inner, last = task.args[0], task.args[1]
            placed = [where[k] for k in (last, *inner) if k in where]
        except (IndexError, TypeError):
            continue
        if placed:
            pins[key] = placed[0]
    return pins


class PlacedArray(da.Array):
    """A dask array whose tasks carry spfuse's worker pins through Dask's graph
    optimisation (see the module docstring).  Arrays derived from it are plain
    dask arrays: Dask places their tasks as usual.

    >>> import dask.array as da
    >>> y = pin(da.ones(4, chunks=2), {}, strict=False)
    >>> isinstance(y, da.Array), y.sum().compute(scheduler="sync")
    (True, np.float64(4.0))
    """

    # as dask.array.Array's: the ``array_optimize`` setting still overrides it
    __dask_optimize__ = globalmethod(_optimize_keeping_pins, key="array_optimize", falsey=dont_optimize)


def pin(arr: da.Array, where: Mapping, *, strict: bool) -> PlacedArray:
    """``arr`` with its tasks pinned: key -> worker address in ``where`` (other keys
    unrestricted); ``strict``: ``allow_other_workers=False``.  The layers of
    ``arr``'s graph are annotated as copies.

    >>> import dask.array as da
    >>> y = pin(da.ones(2, chunks=1), {}, strict=True)
    >>> y.dask.layers[y.name].annotations["allow_other_workers"]
    False
    """
    annotations = {"workers": _WorkerOf(dict(where)), "allow_other_workers": not strict}
    layers = {}
    for name, layer in arr.dask.layers.items():
        layer = copy.copy(layer)
        layer.annotations = {**(layer.annotations or {}), **annotations}
        layers[name] = layer
    graph = HighLevelGraph(layers, dict(arr.dask.dependencies))
    out = PlacedArray(graph, arr.name, arr.chunks, meta=arr._meta)
    out._meta = arr._meta  # as given (a Tensor meta Dask cannot slice stays a Tensor)
    return out
