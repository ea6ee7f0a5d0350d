"""One training step through ``spfuse.torch`` on a graph small enough that the
call path is all there is to time: the 2-layer GCN of
:mod:`spfuse.examples.gcn` on the karate club (34 nodes), forward and
backward, beside the same step in torch.sparse.  Skipped without torch."""
from __future__ import annotations


class KarateGCNStep:
    """Forward + backward of the GCN layer pair, one call per sample."""

    params = (["spfuse", "torch.sparse"],)
    param_names = ["backend"]

    def setup(self, backend):
        try:
            import torch  # noqa: F401
        except ImportError as e:   # (asv skips a benchmark whose setup raises NotImplementedError)
            raise NotImplementedError("torch is not installed") from e
        from spfuse.examples import gcn
        A, y = gcn.karate()
        losses, params = gcn.model(A, y)
        self.loss = losses[backend]
        self.params = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        self.time_step(backend)   # warm-up: plans and measures the forward and backward ways

    def time_step(self, backend):
        for p in self.params.values():
            p.grad = None
        self.loss(self.params).backward()
