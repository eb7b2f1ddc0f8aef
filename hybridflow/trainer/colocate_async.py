"""Phases 1 and 2 of verl's V1 ``colocate_async`` (``trainer.v1.trainer_mode``): partial rollout across steps.

verl's ``PPOTrainerColocateAsync`` (``verl/trainer/ppo/v1/trainer_colocate_async.py``, its replay buffer in
``replay_buffer.py``), on the actor's own processes, which generate and train by turns:

- each step adds one batch of ``data.train_batch_size`` prompts, the first step ``num_warmup_batches`` more;
- the rollout continues every unfinished prompt group and stops once enough have finished for a training batch,
  aborting the rest (each keeps the tokens and log-probs it drew: ``rollout/partial_samples.py``);
- the step trains on the ``train_batch_size`` finished groups started earliest; after its weight sync the
  unfinished ones go on with the new weights, so a sample may span weight versions (``training/off_policy/*``);
- ``trainer.v1.sampler``: with ``drop``, a finished group older than ``max_off_policy_threshold`` versions is
  dropped and one new prompt replaces it; with ``wait``, a step first waits for every unfinished group that
  reached the threshold.

The speed-up is the long tail's: a step waits for the first ``train_batch_size`` groups to finish, not the last.
No batch is added once the run's steps have had theirs, so the run trains on the prompts a synchronous one does
(less the groups dropped as too old, plus their replacements).
A checkpoint holds every group as far as it got and the prompts taken from the loader but not started, so a
resumed run goes on from exactly where the saved one stood.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from hybridflow.protocol import DataProto
from hybridflow.protocol.columns import PROMPT_KEYS
from hybridflow.protocol.prompt_padding import concat_left_padded
from hybridflow.rollout.partial_samples import PartialSample, split_groups
from hybridflow.rollout.sequences import pack_outputs, prompt_token_lists, sample_seed
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.phases import StepTimer, union_columns
from hybridflow.trainer.prompt_groups import PromptGroup, eviction_metrics, off_policy_metrics
from hybridflow.trainer.rollout_collection import EndOfData, Generation, PromptSource, RewardScorer, RolloutCollector


class ColocateAsyncCollector(RolloutCollector):
    """See the module docstring. ``threshold``: ``max_off_policy_threshold`` (None: no limit); ``strategy``:
    ``drop`` or ``wait``; ``total_steps``: the run's steps (one batch added for each, at most)."""

    STATE = ("groups", "spare", "batches_added", "groups_added")

    def __init__(
        self,
        generate: Generation,
        score: RewardScorer,
        *,
        train_batch_size: int,
        warmup_batches: int,
        threshold: int | None,
        strategy: str,
        total_steps: int,
        response_length: int,
        with_log_probs: bool,
    ):
        super().__init__(generate, score, baseline=None)
        self.train_batch_size = train_batch_size
        self.warmup_batches = warmup_batches
        self.threshold = threshold
        self.strategy = strategy
        self.total_steps = total_steps
        self.response_length = response_length
        self.with_log_probs = with_log_probs
        self.groups: list[PromptGroup] = []  # in the order they started
        self.spare: DataProto | None = None  # prompts taken from the loader, not started yet
        self.batches_added = 0
        self.groups_added = 0

    def collect(self, source: PromptSource, timer: StepTimer, step: int) -> tuple[DataProto, dict[str, float]]:
        """Phases 1 and 2 of step ``step``: its training batch of finished groups, scored."""
        with timer(names.PHASE_GEN):
            first = self.batches_added == 0
            for _ in range(1 + (self.warmup_batches if first else 0)):
                self._add_batch(source, step)
            chosen, evicted_ages = self._sample(source, step)
        batch = self._pack(chosen)
        with timer(names.PHASE_REWARD):
            batch, _, metrics = self.score(batch)
        return batch, {**metrics, **off_policy_metrics(chosen, step), **eviction_metrics(evicted_ages)}

    def state_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.STATE}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.STATE:
            setattr(self, name, state[name])

    # ------------------------------------------------------------------------------------------ helpers
    def _add_batch(self, source: PromptSource, step: int) -> None:
        """One batch of prompts started at step ``step``, unless every step has had its batch or the data ran out."""
        if self.batches_added >= self.total_steps:
            return
        try:
            self._add_prompts(source, step, self.train_batch_size)
        except EndOfData:
            return
        self.batches_added += 1

    def _add_prompts(self, source: PromptSource, step: int, count: int) -> None:
        """``count`` prompts from the spare ones, then the loader; their samples' seeds fixed by the call count."""
        while self.spare is None or len(self.spare) < count:
            batch = source.next()
            pad = self.generate.pad_token_id
            self.spare = batch if self.spare is None else concat_left_padded([self.spare, batch], pad)
        prompts = self.spare[:count]
        self.spare = self.spare[count:] if count < len(self.spare) else None
        seed = self.generate.seed + self.generate.calls
        self.generate.calls += 1
        tokens = prompt_token_lists(prompts.batch["input_ids"], prompts.batch["attention_mask"])
        n = self.generate.n
        for row, prompt_ids in enumerate(tokens):
            prompt = prompts[row : row + 1]
            prompt.meta_info = {}
            prompt.non_tensor_batch["uid"] = np.array([f"group{self.groups_added}"], dtype=object)
            samples = [PartialSample(prompt_ids, sample_seed(seed, row * n + k), group=0) for k in range(n)]
            self.groups.append(PromptGroup(prompt, step, samples))
            self.groups_added += 1

    def _sample(self, source: PromptSource, step: int) -> tuple[list[PromptGroup], list[int]]:
        """verl's replay-buffer sampling: drop (and replace) what is too old, generate until a batch has finished
        (and, with ``wait``, every group at the threshold), then take the groups started earliest."""
        evicted_ages: list[int] = []
        while True:
            stale = [g for g in self.groups if g.finished and self._too_old(g, step)]
            if stale:
                evicted_ages += [g.age(step) for g in stale]
                self.groups = [g for g in self.groups if g not in stale]
                self._refill(source, step, len(stale))
                continue
            finished = [g for g in self.groups if g.finished]
            waited_for = [g for g in self.groups if not g.finished and self._must_wait_for(g, step)]
            if len(finished) >= self.train_batch_size and not waited_for:
                break
            if all(g.finished for g in self.groups):
                raise EndOfData(f"the rollout has no prompts left for step {step}")
            self._generate(step, max(0, self.train_batch_size - len(finished)), waited_for)
        chosen = finished[: self.train_batch_size]  # the groups started earliest: self.groups keeps that order
        self.groups = [g for g in self.groups if g not in chosen]
        return chosen, evicted_ages

    def _too_old(self, group: PromptGroup, step: int) -> bool:
        return self.strategy == "drop" and self.threshold is not None and group.age(step) > self.threshold

    def _must_wait_for(self, group: PromptGroup, step: int) -> bool:
        return self.strategy == "wait" and self.threshold is not None and group.age(step) >= self.threshold

    def _refill(self, source: PromptSource, step: int, count: int) -> None:
        """One new prompt per dropped group (none once the data ran out)."""
        try:
            self._add_prompts(source, step, count)
        except EndOfData:
            pass

    def _generate(self, step: int, needed: int, waited_for: list[PromptGroup]) -> None:
        """One generation call over the actor's ranks: every unfinished group continues until ``needed`` more have
        finished, and every group of ``waited_for``; the weights are version ``step - 1``."""
        unfinished = [g for g in self.groups if not g.finished]
        group = self.generate.actor_rollout
        loads = [sum(not sample.finished for sample in g.samples) for g in unfinished]
        shares, quotas = split_groups(loads, group.world_size, needed)
        inputs = [
            [
                dataclasses.replace(sample, group=local, required=unfinished[i] in waited_for)
                for local, i in enumerate(share)
                for sample in unfinished[i].samples
            ]
            for share in shares
        ]
        outputs = group.continue_samples(inputs, quotas, [self.generate.meta_info] * group.world_size)
        n = self.generate.n
        for share, output in zip(shares, outputs):
            for local, i in enumerate(share):
                unfinished[i].advance(output[local * n : (local + 1) * n], version=step - 1)

    def _pack(self, chosen: list[PromptGroup]) -> DataProto:
        """The chosen groups as a training batch: their prompt columns next to each sample's padded response."""
        prompts = concat_left_padded([g.prompt for g in chosen], self.generate.pad_token_id)
        prompt_tensors = prompts.pop(batch_keys=list(PROMPT_KEYS))
        outputs = [(s.token_ids, [1] * len(s.token_ids), s.log_probs) for g in chosen for s in g.samples]
        tensors = pack_outputs(
            prompt_tensors.batch,
            outputs,
            self.generate.n,
            self.response_length,
            self.generate.pad_token_id,
            self.with_log_probs,
        )
        return union_columns(prompts.repeat(self.generate.n, interleave=True), DataProto.from_dict(tensors))
