"""Weight loads that land between two steps of a generation in flight at the same step on every rank of a
tensor-parallel group (fully async's partial rollout on a split engine).

Each rank's load arrives on its own thread at its own time, and each rank's engine steps on its own: left alone,
one rank would compute a step with the new shards while another still holds the old (the step's all-reduces then
add halves of two models) and their schedulers would recompute the requests in flight at different steps. So
before each step the ranks agree on how many loads must have landed (the most any rank has been asked for,
all-reduced over the group), every rank lets its own land up to that count and waits for them, and no load lands
otherwise while a generation runs. The driver sends every load to every rank, so the count is reached on each.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

import torch
import torch.distributed as dist

from hybridflow.errors import HybridflowError


class UnagreedLoadError(HybridflowError, RuntimeError):
    """A load reached a split engine's generation in flight, but its ranks had no agreement to land it at."""


class GroupLanding:
    """The loads of one rank of ``group`` (a gloo group of the tensor-parallel ranks), gated to the agreed steps.
    ``lock`` is the engine's: held for each step and by a landing load."""

    def __init__(self, lock: threading.RLock, group: Any):
        self.group = group
        self._landing = threading.Condition(lock)
        self._asked = 0  # loads this rank was sent (written by the loading thread only)
        self._landed = 0
        self._allowed = 0
        self._generating = False

    @contextmanager
    def loading(self) -> Iterator[None]:
        """A load: it lands once no generation runs, or at the step where the group agreed it lands."""
        self._asked += 1
        with self._landing:
            self._landing.wait_for(lambda: not self._generating or self._landed < self._allowed)
            yield
            self._landed += 1
            self._landing.notify_all()

    @contextmanager
    def generating(self) -> Iterator[None]:
        """A generation's steps; loads asked for meanwhile land only at :meth:`before_step`."""
        with self._landing:
            self._generating = True
        try:
            yield
        finally:
            with self._landing:
                self._generating = False
                self._landing.notify_all()

    def before_step(self) -> None:
        """Called holding the engine's lock, before each step: every load any rank was asked for lands here
        first (the wait releases the lock to the loading thread)."""
        asked = torch.tensor([self._asked])
        dist.all_reduce(asked, op=dist.ReduceOp.MAX, group=self.group)
        if int(asked) == self._allowed:
            return
        self._allowed = int(asked)
        self._landing.notify_all()
        self._landing.wait_for(lambda: self._landed >= self._allowed)
        # The ranks that landed first wait here, not spinning in the step's first all-reduce.
        dist.barrier(group=self.group)
