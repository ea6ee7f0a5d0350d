"""The training loop the examples share, and the comparison of backends.

A model is a dict of backends ``{"spfuse": loss_fn, "torch.sparse": loss_fn,
"dense": loss_fn}``; each ``loss_fn(params)`` returns a 0-d torch tensor.
Every backend starts from the same parameters and runs the same Adam steps.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Mapping

__all__ = ["train", "compare", "BACKENDS"]

BACKENDS = ("spfuse", "torch.sparse", "dense")


def train(loss_fn: Callable, params: Mapping, epochs: int, lr: float = 0.01) -> tuple[list[float], list[float]]:
    """Adam on clones of ``params`` for ``epochs`` steps; the losses and the
    seconds each epoch (forward, backward and step) took.

    >>> import torch
    >>> w = {"w": torch.tensor([3.0], dtype=torch.float64)}
    >>> losses, _ = train(lambda p: (p["w"] ** 2).sum(), w, 3, lr=0.5)
    >>> [round(x, 3) for x in losses]
    [9.0, 6.25, 4.018]
    """
    import torch
    p = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.Adam(p.values(), lr=lr)
    losses, seconds = [], []
    for _ in range(epochs):
        start = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(p)
        loss.backward()
        opt.step()
        seconds.append(time.perf_counter() - start)
        losses.append(float(loss.detach()))
    return losses, seconds


def compare(model: Mapping[str, Callable], params: Mapping, epochs: int, lr: float = 0.01,
            backends=BACKENDS) -> dict:
    """Train every backend; per backend its losses and median ms per epoch
    (first epoch excluded: it plans), and the largest loss difference to spfuse.

    >>> import torch
    >>> m = {"spfuse": lambda p: (p["w"] ** 2).sum(), "dense": lambda p: (p["w"] * p["w"]).sum()}
    >>> r = compare(m, {"w": torch.ones(2, dtype=torch.float64)}, 3, backends=("spfuse", "dense"))
    >>> r["dense"]["max_loss_diff"] < 1e-12
    True
    """
    import statistics
    out = {}
    for name in backends:
        if name not in model:
            continue
        losses, seconds = train(model[name], params, epochs, lr)
        out[name] = {"losses": losses,
                     "ms_per_epoch": 1e3 * statistics.median(seconds[1:] or seconds)}
    ref = out.get("spfuse")
    for r in out.values():
        if ref is not None:
            r["max_loss_diff"] = max((abs(a - b) for a, b in zip(r["losses"], ref["losses"], strict=True)), default=0.0)
    return out


def report(title: str, results: Mapping) -> str:
    """A small table: backend, ms/epoch, first and last loss, largest difference to spfuse."""
    lines = [title, f"  {'backend':<13} {'ms/epoch':>9} {'loss[0]':>11} {'loss[-1]':>11} {'max |Δloss|':>12}"]
    for name, r in results.items():
        lines.append(f"  {name:<13} {r['ms_per_epoch']:>9.2f} {r['losses'][0]:>11.6f} {r['losses'][-1]:>11.6f} "
                     f"{r.get('max_loss_diff', 0.0):>12.2e}")
    return "\n".join(lines)
