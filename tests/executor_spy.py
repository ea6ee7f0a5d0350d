"""Which loop-tree plans the generic executor runs: shared by the tests that
check a program takes the executor path they are written for."""
import contextlib
from collections.abc import Iterator

from spfuse.runtime import looptree as lt


@contextlib.contextmanager
def executor_plans() -> Iterator[list]:
    """The plans :func:`spfuse.runtime.looptree.run` executes inside the block
    (appended as they run)."""
    plans: list = []
    real = lt.run

    def spy(plan, num_threads=None, *, blocks=True):
        plans.append(plan)
        return real(plan, num_threads=num_threads, blocks=blocks)

    lt.run = spy
    try:
        yield plans
    finally:
        lt.run = real
