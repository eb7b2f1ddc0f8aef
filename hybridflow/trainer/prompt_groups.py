"""The prompt groups of verl's V1 replay buffer, as the single controller holds them (``colocate_async``).

A group is one prompt and its ``n`` samples (:class:`~hybridflow.rollout.partial_samples.PartialSample`), with the
step that started it and, per sample, the first and last weight versions that drew its tokens. Version ``v`` is
the weights after ``v`` updates, so a step ``s`` generates with version ``s - 1`` (verl's ``global_steps`` tags).
verl's metrics of a sample trained at step ``s`` (``verl/trainer/ppo/v1/trainer_base.py``): its span (versions
that drew it, last - first + 1), its staleness ((s - 1) - last) and worst staleness ((s - 1) - first); a group's
age at step ``s`` is s - started + 1, which ``trainer.v1.sampler.max_off_policy_threshold`` bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hybridflow.protocol import DataProto
from hybridflow.rollout.partial_samples import PartialSample
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.metrics import value_stats


@dataclass(eq=False)
class PromptGroup:
    """``prompt``: its row (prompt columns and ``uid``); ``first_versions`` / ``last_versions``: per sample, the
    weight versions of its first and last tokens (None before its first token). Groups compare by identity."""

    prompt: DataProto
    started: int
    samples: list[PartialSample]
    first_versions: list[int | None] = field(init=False)
    last_versions: list[int | None] = field(init=False)

    def __post_init__(self) -> None:
        self.first_versions = [None] * len(self.samples)
        self.last_versions = [None] * len(self.samples)

    @property
    def finished(self) -> bool:
        return all(sample.finished for sample in self.samples)

    def age(self, step: int) -> int:
        """verl's span of a prompt at step ``step``: the versions since it started, its own included."""
        return step - self.started + 1

    def advance(self, samples: list[PartialSample], version: int) -> None:
        """Take ``samples`` (these samples, further on), their new tokens drawn with weight version ``version``."""
        for i, sample in enumerate(samples):
            if len(sample.token_ids) > len(self.samples[i].token_ids):
                if self.first_versions[i] is None:
                    self.first_versions[i] = version
                self.last_versions[i] = version
        self.samples = samples


def off_policy_metrics(groups: list[PromptGroup], step: int) -> dict[str, float]:
    """verl's ``training/off_policy/trajectory_*`` of the samples of ``groups``, trained at step ``step``."""
    first = torch.tensor([v for g in groups for v in g.first_versions if v is not None], dtype=torch.float64)
    last = torch.tensor([v for g in groups for v in g.last_versions if v is not None], dtype=torch.float64)
    if not len(last):
        return {}
    current = step - 1
    return {
        **value_stats(names.OFF_POLICY_SPANS, last - first + 1),
        **value_stats(names.OFF_POLICY_STALENESS, current - last),
        **value_stats(names.OFF_POLICY_STALENESS_WORST, current - first),
    }


def eviction_metrics(ages: list[int]) -> dict[str, float]:
    """verl's ``training/off_policy/evicted_samples*``: the groups dropped as too old this step, and their ages."""
    if not ages:
        return {}
    ages_tensor = torch.tensor(ages, dtype=torch.float64)
    return {names.OFF_POLICY_EVICTED: float(len(ages)), **value_stats(names.OFF_POLICY_EVICTED_STALENESS, ages_tensor)}
