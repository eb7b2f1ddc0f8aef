"""Proof that a weight sync took: the rollout engine's own weights against the ones it was sent.

After every ``weight_sync_check_freq``-th sync, and after every wake, the engine's exact checksum
(``models/weight_checksum.py``) must equal the sender's; otherwise the run stops in one line naming the engine,
the sync and the weight version, instead of training on samples of weights the actor never had (verl #7495, a
LoRA rollout that sampled the initial policy for two months; TRL #5312, weights lost across sleep and wake).
"""

from __future__ import annotations

import time
from typing import Iterable

import torch

from hybridflow.errors import HybridflowError
from hybridflow.models.weight_checksum import ChecksummedWeights
from hybridflow.rollout.base import RolloutEngine


class WeightSyncError(HybridflowError, RuntimeError):
    """A rollout engine does not serve the weights a sync sent it."""


class WeightSyncCheck:
    """Checks one engine's syncs. ``mode`` names the sync in the error (e.g. "hybrid engine, adapter-only LoRA");
    ``dtype``: the engine's weight dtype, in which both sides sum; ``adapter_only``: the syncs carry a LoRA
    adapter alone. ``seconds``: the time the checks took since the last :meth:`take_seconds`."""

    def __init__(self, engine: RolloutEngine, freq: int, mode: str, dtype: torch.dtype, adapter_only: bool):
        self.engine = engine
        self.freq = freq if engine.weights_readable else 0  # the config check's start-up line says so
        self.mode = mode
        self.dtype = dtype
        self.adapter_only = adapter_only
        self.syncs = 0
        self.expected: tuple[int, int] | None = None  # (version, checksum) of the last checked sync
        self.seconds = 0.0

    def due(self) -> bool:
        """Whether the next sync is checked; every rank of a group answers the same (it counts the same syncs)."""
        self.syncs += 1
        return self.freq > 0 and self.syncs % self.freq == 0

    def sent(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], first_rank: int | None = None
    ) -> ChecksummedWeights:
        """``named_tensors`` passed through while their checksum adds up (this rank's part; see
        ``models/weight_checksum.part_checksum`` for ``first_rank``)."""
        return ChecksummedWeights(named_tensors, self.dtype, first_rank)

    def after_sync(self, version: int, checksum: int) -> None:
        """The engine has just loaded weight version ``version``, whose checksum is ``checksum``."""
        self.expected = (version, checksum)
        self._verify("sync")

    def after_wake(self) -> None:
        """The engine has just woken: it must still serve the last checked sync's weights."""
        if self.freq > 0 and self.expected is not None:
            self._verify("sync and a wake")

    def take_seconds(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds

    def _verify(self, event: str) -> None:
        start = time.perf_counter()
        served = self.engine.weights_checksum(self.adapter_only)
        self.seconds += time.perf_counter() - start
        version, expected = self.expected
        if served != expected:
            raise WeightSyncError(
                f"weight sync check: the {self.engine.config.name} rollout engine does not serve weight version "
                f"{version} after the {self.mode} {event} (checksum {served} of its weights, {expected} of those "
                "sent); the run stops rather than train on samples of weights the actor never had"
            )
