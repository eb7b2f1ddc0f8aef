"""verl's V1 ``separate_async`` (``trainer.v1.trainer_mode``): a rollout pool of its own, trained mini-batch by
mini-batch.

verl's ``PPOTrainerSeparateAsync`` (``verl/trainer/ppo/v1/trainer_separate_async.py``, its sampler in
``replay_buffer.py``), on the single controller:

- the rollout pool generates while the actor trains, with partial rollout: a weight sync lands between the decode
  steps of the generation in flight, which goes on with the new weights (``rollout_weight_versions`` tags each
  token);
- a step is ``parameter_sync_step`` mini-batches of ``ppo_mini_batch_size`` prompt groups, each trained through
  phases 3 to 7 as soon as the pool has finished it (:func:`merge_passes` makes one step of them, with verl's
  ``MetricsAggregator`` rules), then one weight sync;
- the pool runs at most ``num_warmup_batches`` batches of ``train_batch_size`` prompts ahead of training (verl adds
  one batch a step and the warm-up's before the first), one batch per generation call;
- ``trainer.v1.sampler``: a prompt's age at step ``s`` is s - (the step it started in) + 1; with ``drop`` a finished
  group older than ``max_off_policy_threshold`` is dropped and one more prompt is generated in its place; with
  ``wait`` a mini-batch first waits for the generation in flight once its prompts reached the threshold;
- ``hybrid_rollout.enable_switch``: between steps the actor's processes generate too (:mod:`.step_switch`).

The queue, budget, syncs and checkpoints are fully async training's
(:class:`~hybridflow.trainer.fully_async_collection.FullyAsyncCollector`); the old log-probs of a step's mini-batches
are its starting weights' (:class:`~hybridflow.trainer.phases.StepStartOldLogProbs`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from hybridflow.protocol import DataProto
from hybridflow.protocol.prompt_padding import concat_left_padded
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.fully_async_collection import FullyAsyncCollector, token_version_range
from hybridflow.trainer.metrics import value_stats
from hybridflow.trainer.one_step_off import RolloutWeightSync
from hybridflow.trainer.phases import StepTimer
from hybridflow.trainer.prompt_groups import eviction_metrics
from hybridflow.trainer.rollout_collection import Generation, PromptSource, RewardScorer
from hybridflow.trainer.step_switch import StepSwitch

# How often the driver looks at the pool's call while the actor's lent call runs
POLL_SECONDS = 0.01

# verl's MetricsAggregator: these summed or taken from the last mini-batch; by name the rest (see _aggregate)
SUMMED = {names.OFF_POLICY_EVICTED}
LAST = {names.GLOBAL_STEP}


class SeparateAsyncCollector(FullyAsyncCollector):
    """See the module docstring. ``threshold``: ``max_off_policy_threshold`` (None: no limit); ``strategy``:
    ``drop`` or ``wait``; ``total_steps``: the run's steps, each of ``train_batch_size`` prompts; ``switch`` and
    ``actor``: step switching's decision and the actor's group it lends (None: no switching)."""

    STATE = FullyAsyncCollector.STATE + ("total_prompts",)

    def __init__(
        self,
        generate: Generation,
        score: RewardScorer,
        sync: RolloutWeightSync,
        *,
        mini_batch_size: int,
        train_batch_size: int,
        warmup_batches: int,
        threshold: int | None,
        strategy: str,
        total_steps: int,
        switch: StepSwitch | None = None,
        actor: Any = None,
    ):
        super().__init__(
            generate,
            score,
            sync,
            required=mini_batch_size,
            max_required=(1 + warmup_batches) * train_batch_size,
            concurrent=train_batch_size,
            steps_per_sync=1,
            total_steps=total_steps,
            partial_rollout=True,
        )
        self.total_prompts = total_steps * train_batch_size
        self.threshold = threshold
        self.strategy = strategy
        self.evicted_ages: list[int] = []  # of the groups dropped since the last mini-batch was taken
        self.switch = switch
        self.actor = actor
        self.step = 0  # the step of the last mini-batch taken

    def collect(self, source: PromptSource, timer: StepTimer, step: int) -> tuple[DataProto, dict[str, float]]:
        """A mini-batch (:meth:`FullyAsyncCollector.collect`); with step switching, a step's first one starts by
        lending the actor's processes where the last decision said so."""
        if self.switch is None:
            return super().collect(source, timer, step)
        if step != self.step and self.switch.lend_next:
            self._lend(source, timer, step)
        self.step = step
        self._collect_finished()
        ready = self._ready_groups(step)
        waited = timer.seconds.get(names.PHASE_GEN, 0.0)
        batch, metrics = super().collect(source, timer, step)
        self.switch.sampling(ready, timer.seconds.get(names.PHASE_GEN, 0.0) - waited)
        return batch, metrics

    def sync_weights(self, step: int, timer: StepTimer) -> dict[str, float]:
        """Phase 8; with step switching first the decision whether the next step starts by lending, whose metrics
        are returned (verl's ``separate_async/switch|decision/*``)."""
        metrics = {}
        if self.switch is not None:
            self._collect_finished()
            metrics = self.switch.end_step(self._ready_groups(step + 1), steps_left=step < self.total_steps)
        return {**super().sync_weights(step, timer), **metrics}

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        return state if self.switch is None else {**state, "switch": self.switch.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.switch is not None and "switch" in state:  # a run that switched before
            self.switch.load_state_dict(state["switch"])
            self.step = state["step"]

    def _lend(self, source: PromptSource, timer: StepTimer, step: int) -> None:
        """The actor's processes generate the prompt groups the threshold lacks now, within the staleness budget,
        with the actor's weights (the current version); the pool takes what the budget leaves, and its calls go on
        meanwhile (verl's load balancer shares the requests between the two)."""
        self._collect_finished()
        missing = self.switch.threshold() - self._ready_groups(step)
        size = min(missing, self.max_required - self.staleness_samples, self.total_prompts - self.started_prompts)
        prompts = self._prompts(source, size)
        if prompts is None:
            return
        with timer(names.PHASE_SWITCH_TO_ROLLOUT):
            timer.add(names.CHECK_WEIGHT_SYNC, max(self.actor.update_weights()))
            lent = self.generate.start(prompts, engine=self.actor)
        self._start(source)
        with timer(names.PHASE_SWITCH_WAIT):
            while not lent.future.done():
                if self.running is not None and self.running.future.done():
                    self._wait()
                    self._start(source)
                time.sleep(POLL_SECONDS)
        with timer(names.PHASE_SWITCH_TO_TRAINER):
            samples = self.generate.finish(lent)
            # every token was drawn by the actor's weights, the current version (its engine numbers none)
            tags = samples.batch["rollout_weight_versions"]
            samples.batch["rollout_weight_versions"] = torch.where(tags >= 0, self.param_version, tags)
            self._queue(samples, len(lent.prompts), self.param_version)
        # a step lends once, so each switch phase's seconds are this lending's
        self.switch.switched(timer.seconds[names.PHASE_SWITCH_TO_ROLLOUT], timer.seconds[names.PHASE_SWITCH_TO_TRAINER])

    def _collect_finished(self) -> None:
        """The pool's call, queued if it has finished."""
        if self.running is not None and self.running.future.done():
            self._wait()

    def _ready_groups(self, step: int) -> int:
        """Queued groups that step ``step`` may train on (with ``drop``, those within the threshold)."""
        if self.strategy == "drop" and self.threshold is not None:
            return int(np.sum(step - self.queued_versions <= self.threshold))
        return self._queued_prompts()

    # A prompt started with weight version v started in step v + 1: its age (verl's span) at step s is s - v.
    def _ready(self, step: int) -> bool:
        """Drop what is too old; ready when a mini-batch is queued and, with ``wait``, the generation in flight
        has not reached the threshold."""
        self._drop_stale(step)
        waiting = (
            self.strategy == "wait"
            and self.threshold is not None
            and self.running is not None
            and step - self.running_version >= self.threshold
        )
        return super()._ready(step) and not waiting

    def _taken_metrics(self, batch: DataProto, versions: np.ndarray) -> dict[str, float]:
        metrics = {**off_policy_metrics(batch, self.param_version), **eviction_metrics(self.evicted_ages)}
        self.evicted_ages = []
        return metrics

    def _drop_stale(self, step: int) -> None:
        """With ``drop``: the queued groups older than the threshold leave, and as many more prompts may start."""
        if self.strategy != "drop" or self.threshold is None or not self._queued_prompts():
            return
        ages = step - self.queued_versions
        stale = ages > self.threshold
        dropped = int(stale.sum())
        if not dropped:
            return
        samples_per_prompt = len(self.queued) // len(self.queued_versions)
        kept = np.flatnonzero(np.repeat(~stale, samples_per_prompt))
        self.queued = self.queued[kept] if len(kept) else None
        self.queued_versions = self.queued_versions[~stale]
        self.evicted_ages += ages[stale].tolist()
        self.total_prompts += dropped  # verl refills one prompt per dropped group
        self.staleness_samples -= dropped


def off_policy_metrics(batch: DataProto, current_version: int) -> dict[str, float]:
    """verl's ``training/off_policy/trajectory_*`` of a mini-batch from each token's weight version
    (``rollout_weight_versions``, -1 on padding): per sample, its span (last - first + 1), its staleness (current -
    last) and its worst staleness (current - first), the current version being the trainer's."""
    first, last, has_tokens = token_version_range(batch.batch["rollout_weight_versions"])
    first, last = first[has_tokens].double(), last[has_tokens].double()
    if not len(last):
        return {}
    return {
        **value_stats(names.OFF_POLICY_SPANS, last - first + 1),
        **value_stats(names.OFF_POLICY_STALENESS, current_version - last),
        **value_stats(names.OFF_POLICY_STALENESS_WORST, current_version - first),
    }


def merge_passes(
    passes: list[tuple[DataProto, DataProto | None, dict[str, float]]], pad_token_id: int
) -> tuple[DataProto, DataProto | None, dict[str, float]]:
    """A step of several mini-batch passes (each its batch, the part that trained or None, its metrics) as one:
    the batches joined (their prompts left-padded alike), and the metrics by verl's ``MetricsAggregator``
    (``verl/trainer/ppo/v1/utils.py``)."""
    batches = [batch for batch, _, _ in passes]
    trained = [train_batch for _, train_batch, _ in passes if train_batch is not None]
    for part in batches + trained:
        part.meta_info = {}  # each pass's own (generation seeds, worker metrics): reported through its metrics
    values: dict[str, list[float]] = {}
    weights: dict[str, list[float]] = {}
    for batch, _, metrics in passes:
        for name, value in metrics.items():
            values.setdefault(name, []).append(float(value))
            weights.setdefault(name, []).append(_weight(name, metrics, len(batch)))
    merged = {name: _aggregate(name, values[name], weights[name]) for name in values}
    joined = concat_left_padded(batches, pad_token_id)
    return joined, concat_left_padded(trained, pad_token_id) if trained else None, merged


def _weight(name: str, metrics: dict[str, float], samples: int) -> float:
    """A pass's weight in an average: its samples, or for the dropped groups' age, how many it dropped."""
    if name == names.stat(names.OFF_POLICY_EVICTED_STALENESS, "mean"):
        return metrics.get(names.OFF_POLICY_EVICTED, samples)
    return samples


def _aggregate(name: str, values: list[float], weights: list[float]) -> float:
    lower = name.lower()
    if name in LAST or lower.endswith(("/lr", "_lr")):
        return values[-1]
    if name in SUMMED or lower.startswith((names.TIMING_PREFIX, names.TIMING_PER_TOKEN_PREFIX)):
        return sum(values)
    if "max" in lower:
        return max(values)
    if "min" in lower:
        return min(values)
    if "sum" in lower or "total" in lower:
        return sum(values)
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights)) / total if total else sum(values) / len(values)
