"""Samples generated across several calls: verl's V1 partial rollout (``docs/advance/v1_async_trainer.md``).

A call continues every unfinished sample and ends, aborting the rest, once ``groups_needed`` more prompt groups
have finished (and every group marked ``required``). An aborted sample keeps the tokens and log-probs it drew;
the next call continues it from its prompt and those tokens, which are prefilled again with the weights of that
call (verl rebuilds the KV cache of the retained prefix the same way), so one sample may span weight versions.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hybridflow.rollout.config import SamplingParams
from hybridflow.rollout.requests import FINISH_ABORT, GenerationRequest, GenerationResult
from hybridflow.rollout.sequences import sample_seed


@dataclass
class PartialSample:
    """One sample of a prompt group, as far as it got. ``seed``: its own, fixed when its prompt was added;
    ``group``: its prompt group's number (its ``n`` samples share it); ``required``: its group must finish in
    this call (the ``wait`` strategy); ``finish_reason``: None (or ``abort``) while it can go on."""

    prompt_ids: list[int]
    seed: int
    group: int
    required: bool = False
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason not in (None, FINISH_ABORT)


def continuation(sample: PartialSample, sampling: SamplingParams) -> GenerationRequest:
    """The request that goes on from ``sample``'s tokens: its prompt and them as the prompt, the tokens left of
    ``max_new_tokens``, and a seed of its own for each length it resumes at."""
    drawn = len(sample.token_ids)
    params = dataclasses.replace(
        sampling, max_new_tokens=sampling.max_new_tokens - drawn, seed=sample_seed(sample.seed, drawn)
    )
    return GenerationRequest(prompt_ids=sample.prompt_ids + sample.token_ids, sampling=params)


def extended(sample: PartialSample, result: GenerationResult) -> PartialSample:
    return dataclasses.replace(
        sample,
        token_ids=sample.token_ids + result.token_ids,
        log_probs=sample.log_probs + result.log_probs,
        finish_reason=result.finish_reason,
        required=False,
    )


def split_groups(loads: list[int], parts: int, needed: int) -> tuple[list[list[int]], list[int]]:
    """Groups (by their ``loads``, samples left to draw) over ``parts`` decoders or ranks, each group to the part
    with the least load so far, and how many of each part's groups must finish: ``needed`` split by the parts'
    shares of the groups, rounded up."""
    shares: list[list[int]] = [[] for _ in range(parts)]
    totals = [0] * parts
    for index, load in enumerate(loads):
        part = totals.index(min(totals))
        shares[part].append(index)
        totals[part] += load
    quotas = [min(len(share), math.ceil(needed * len(share) / max(1, len(loads)))) for share in shares]
    return shares, quotas


class GroupQuota:
    """A decoder's ``stop_when`` rule: ``needed`` of its groups have finished, and every required one.
    ``futures_by_group``: the futures of each group's samples decoding in this call."""

    def __init__(self, futures_by_group: dict[int, list[Future]], needed: int, required: set[int]):
        self.futures_by_group = futures_by_group
        self.needed = needed
        self.required = required

    def __call__(self) -> bool:
        done = {group for group, futures in self.futures_by_group.items() if all(f.done() for f in futures)}
        return len(done) >= self.needed and self.required <= done


def continue_samples(
    samples: list[PartialSample], sampling: SamplingParams, groups_needed: int, decoders: list[Any]
) -> list[PartialSample]:
    """Continue the unfinished ``samples`` on ``decoders`` (``DecodeScheduler``s of one model) until
    ``groups_needed`` of their groups have finished and every ``required`` group has; the rest stop as far as
    they got. Each decoder takes whole groups and its share of ``groups_needed``, and stops its own at the step
    its rule holds, so where a sample stops does not depend on timing. Returns every sample, in order."""
    todo = [i for i, sample in enumerate(samples) if not sample.finished]
    by_group: dict[int, list[int]] = {}
    for i in todo:
        by_group.setdefault(samples[i].group, []).append(i)
    groups = list(by_group)
    shares, quotas = split_groups([len(by_group[g]) for g in groups], len(decoders), groups_needed)
    futures: dict[int, Future] = {}
    for decoder, share, quota in zip(decoders, shares, quotas):
        required = {groups[j] for j in share if any(samples[i].required for i in by_group[groups[j]])}
        if not share or (quota == 0 and not required):
            continue
        indices = [i for j in share for i in by_group[groups[j]]]
        rule = GroupQuota({}, quota, required)
        with decoder.paused():  # no step checks the rule before it knows every future
            submitted = decoder.submit_all([continuation(samples[i], sampling) for i in indices], stop_when=rule)
            for i, future in zip(indices, submitted):
                rule.futures_by_group.setdefault(samples[i].group, []).append(future)
                futures[i] = future
    concurrent.futures.wait(list(futures.values()))
    out = list(samples)
    for i, future in futures.items():
        out[i] = extended(samples[i], future.result())
    return out
