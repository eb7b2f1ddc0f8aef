"""Phases 1, 2 and 8 of fully async training: a bounded queue of finished prompt groups the rollout pool keeps
filling.

verl's fully async policy (``async_training``; see :mod:`hybridflow.config.fully_async_options` for the keys)
on the single controller: the rollout pool runs one generation call at a time, of at most ``concurrent``
prompts, and the driver starts the next as soon as one finishes and the staleness budget allows, so the pool
generates while the actor trains. A training step takes the oldest ``required`` prompt groups from the queue;
its phase 8, every ``steps_per_sync`` steps, puts the actor's weights into the pool, and the budget of the new
weight version is ``max_required`` prompts less those already queued or in flight. Without partial rollout the
call in flight is waited for first (its samples join the queue); with it (verl's ``partial_rollout``) the weights
land between its decode steps, its samples go on with them, and each token's ``rollout_weight_versions`` says
which drew it.

Kill -9: checkpoints fall on weight syncs (the trainer saves every ``save_freq`` versions) and first wait for the
call in flight; they hold the queue, the budget and the counters, so a resumed run trains on exactly the samples
an uninterrupted one would (with partial rollout, on the same prompts: where a sync lands in a running call
depends on timing), none twice and none lost.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.protocol import DataProto
from hybridflow.protocol.prompt_padding import concat_left_padded
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.one_step_off import RolloutWeightSync
from hybridflow.trainer.phases import StepTimer
from hybridflow.trainer.rollout_collection import (
    EndOfData,
    Generation,
    PendingGeneration,
    PromptSource,
    RewardScorer,
    assign_uids,
)


class FullyAsyncCollector:
    """The queue, the staleness budget and the weight syncs of fully async training.

        ``required``: prompt groups per step; ``max_required``: prompts the pool may start per weight version, those
        queued or in flight at its sync included; ``concurrent``: prompts per generation call, at most;
        ``steps_per_sync``: steps between syncs; ``total_steps``: the run's steps, each of ``required`` prompts (no more
    are generated, and no sync follows the last step);
        ``partial_rollout``: syncs land in the call in flight instead of waiting for it.
    """

    # What a checkpoint keeps: the queue and each group's weight version, the budget and the counters.
    STATE = (
        "queued",
        "queued_versions",
        "param_version",
        "staleness_samples",
        "started_prompts",
        "stale_prompts_trained",
        "chunks",
    )

    def __init__(
        self,
        generate: Generation,
        score: RewardScorer,
        sync: RolloutWeightSync,
        *,
        required: int,
        max_required: int,
        concurrent: int,
        steps_per_sync: int,
        total_steps: int,
        partial_rollout: bool = False,
    ):
        self.generate = generate
        self.score = score
        self.sync = sync
        self.required = required
        self.max_required = max_required
        self.concurrent = concurrent
        self.steps_per_sync = steps_per_sync
        self.total_steps = total_steps
        self.total_prompts = total_steps * required
        self.partial_rollout = partial_rollout
        self.running: PendingGeneration | None = None
        self.running_version = 0
        # Finished samples not trained on yet, oldest first, and the weight version of each prompt group
        self.queued: DataProto | None = None
        self.queued_versions = np.zeros(0, dtype=np.int64)
        self.param_version = 0
        self.staleness_samples = 0  # verl's count: prompts started this version, plus those queued at its sync
        self.started_prompts = 0
        self.stale_prompts_trained = 0
        self.chunks = 0

    # ------------------------------------------------------------------------------------------ steps
    def collect(self, source: PromptSource, timer: StepTimer, step: int) -> tuple[DataProto, dict[str, float]]:
        """Phases 1 and 2: the oldest ``required`` prompt groups of the queue (waiting for the pool while it has
        fewer), scored, with the next generation call started meanwhile."""
        with timer(names.PHASE_GEN):  # the trainer's wait for samples (verl's trainer idle time)
            while not self._ready(step):
                if self.running is None and not self._start(source):
                    raise EndOfData(f"the rollout has no prompts left for step {step}")
                self._wait()
        batch, versions = self._take(self.required)
        self._start(source)  # the pool generates while the actor trains on this batch
        with timer(names.PHASE_REWARD):
            batch, _, metrics = self.score(batch)
        return batch, {**metrics, **self._taken_metrics(batch, versions)}

    def _ready(self, step: int) -> bool:
        """Whether the queue holds a step's groups."""
        return self._queued_prompts() >= self.required

    def _taken_metrics(self, batch: DataProto, versions: np.ndarray) -> dict[str, float]:
        """verl's ``fully_async/*`` counts after taking ``batch`` (its groups of weight ``versions``)."""
        self.stale_prompts_trained += int(np.sum(self.param_version - versions >= 1))
        samples_per_prompt = len(batch) // self.required
        return {
            names.FULLY_ASYNC_STALE_SAMPLES: float(self.stale_prompts_trained),
            names.FULLY_ASYNC_STALE_TRAJECTORIES: float(self.stale_prompts_trained * samples_per_prompt),
            names.FULLY_ASYNC_PARAM_VERSION: float(self.param_version),
            names.FULLY_ASYNC_GENERATED_SAMPLES: float(self.started_prompts),
            **partial_metrics(batch),
        }

    def sync_weights(self, step: int, timer: StepTimer) -> dict[str, float]:
        """Phase 8, every ``steps_per_sync`` steps but after the last: a new weight version (:meth:`_new_version`);
        no metrics besides timings."""
        if step % self.steps_per_sync == 0 and step < self.total_steps:
            self._new_version(step, timer)
        return {}

    def use_current_weights(self, step: int) -> None:
        """Before a validation (after a sync, or after the last step): the call in flight finishes and its samples
        are queued, then the pool holds the actor's weights after step ``step``."""
        self._wait()
        self.sync(step, StepTimer(), version=self.param_version + 1)

    def sync_before_first_step(self, step: int) -> None:
        """Before the run's first step: the pool gets the actor's weights after step ``step`` as the current weight
        version (a fresh run's pool holds them already)."""
        self.sync(step, StepTimer(), version=self.param_version)

    def state_dict(self) -> dict[str, Any]:
        """The queue (the call in flight waited for), the budget and the counters."""
        self._wait()
        return {name: getattr(self, name) for name in self.STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.STATE:
            setattr(self, name, state[name])
        self.sync.synced_step = None  # the pool started from the model folder

    # ---------------------------------------------------------------------------------------- helpers
    def _new_version(self, step: int, timer: StepTimer) -> None:
        """After step ``step``'s update: the pool gets the new weights (after the call in flight finishes, or
        between its decode steps with partial rollout), and the new version's budget counts the prompts already
        queued or in flight (verl's ``reset_staleness``)."""
        if not self.partial_rollout:
            with timer(names.PHASE_GEN):
                self._wait()
        self.param_version += 1
        self.sync(step, timer, version=self.param_version)
        self.staleness_samples = self._queued_prompts() + (len(self.running.prompts) if self.running else 0)

    def _start(self, source: PromptSource) -> bool:
        """Start a generation call unless one runs, the version's budget or the run's prompts are spent, or the
        data ran out; whether one runs now."""
        if self.running is not None:
            return True
        size = min(
            self.concurrent, self.max_required - self.staleness_samples, self.total_prompts - self.started_prompts
        )
        prompts = self._prompts(source, size)
        if prompts is None:
            return False
        self.running = self.generate.start(prompts)
        self.running_version = self.param_version
        return True

    def _prompts(self, source: PromptSource, size: int) -> DataProto | None:
        """Up to ``size`` prompts for a generation call, counted against the budget (None: there are none)."""
        batches = []  # single prompts (data.gen_batch_size=1)
        try:
            for _ in range(size):
                batches.append(source.next())
        except EndOfData:
            pass  # generate what there is; the step that finds the queue short stops the run
        if not batches:
            return None
        prompts = concat_left_padded(batches, self.generate.pad_token_id)
        self.staleness_samples += len(prompts)
        self.started_prompts += len(prompts)
        self.chunks += 1
        return assign_uids(prompts, f"chunk{self.chunks - 1}")

    def _wait(self) -> None:
        if self.running is None:
            return
        prompts, version = len(self.running.prompts), self.running_version
        samples, self.running = self.generate.finish(self.running), None
        self._queue(samples, prompts, version)

    def _queue(self, samples: DataProto, prompts: int, version: int) -> None:
        """A call's samples (of ``prompts`` groups, started with weight ``version``) join the queue."""
        samples.meta_info = {}  # its timings are counted; each call's seed differs, and calls are joined
        pad = self.generate.pad_token_id
        self.queued = samples if self.queued is None else concat_left_padded([self.queued, samples], pad)
        self.queued_versions = np.concatenate([self.queued_versions, np.full(prompts, version, dtype=np.int64)])

    def _queued_prompts(self) -> int:
        return len(self.queued_versions)

    def _take(self, prompts: int) -> tuple[DataProto, np.ndarray]:
        """The oldest ``prompts`` groups of the queue and their weight versions."""
        samples_per_prompt = len(self.queued) // len(self.queued_versions)
        rows = prompts * samples_per_prompt
        batch, versions = self.queued[:rows], self.queued_versions[:prompts]
        self.queued = self.queued[rows:] if rows < len(self.queued) else None
        self.queued_versions = self.queued_versions[prompts:]
        return batch, versions


def partial_metrics(batch: DataProto) -> dict[str, float]:
    """verl's ``fully_async/partial/*`` of the step's samples, from the weight version of each response token
    (``rollout_weight_versions``, -1 on padding; present with partial rollout)."""
    if "rollout_weight_versions" not in batch.batch.keys():
        return {}
    first, last, has_tokens = token_version_range(batch.batch["rollout_weight_versions"])
    span = torch.where(has_tokens, last - first, 0)
    partial = span > 0
    return {
        names.FULLY_ASYNC_PARTIAL_SAMPLES: float(partial.sum()),
        names.FULLY_ASYNC_PARTIAL_RATIO: float(partial.float().mean()) if len(span) else 0.0,
        names.FULLY_ASYNC_MAX_PARTIAL_SPAN: float(span.max()) if len(span) else 0.0,
    }


def token_version_range(versions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample of ``versions`` [B, R] (each token's weight version, -1 on padding): the first and the last version
    that drew a token, and whether it has a token (where it has none, first and last mean nothing)."""
    drawn = versions >= 0
    first = torch.where(drawn, versions, torch.iinfo(versions.dtype).max).amin(dim=-1)
    return first, versions.amax(dim=-1), drawn.any(dim=-1)


class TrainerIdleRatio:
    """``fully_async/trainer/idle_ratio``: the share of the step the trainer waited for samples (verl's
    ``timing_s/gen`` over ``timing_s/step``)."""

    def after_step(self, global_step: int, batch: DataProto, metrics: dict[str, float]) -> None:
        step_seconds = metrics.get(names.timing(names.PHASE_STEP), 0.0)
        if step_seconds > 0:
            metrics[names.FULLY_ASYNC_TRAINER_IDLE_RATIO] = (
                metrics.get(names.timing(names.PHASE_GEN), 0.0) / step_seconds
            )
