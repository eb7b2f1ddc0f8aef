"""Cutting a rank's batch into mini-batches and micro-batches, and the mini-batch loss counts."""

from __future__ import annotations

import pytest
import torch

from hybridflow.workers.batching import (
    MicroBatching,
    iter_mini_batches,
    loss_counts,
    mini_batch_size_per_rank,
    run_in_micro_batches,
)
from hybridflow.workers.config import WorkerConfigError

from .helpers import rollout_batch

CPU = torch.device("cpu")


def test_mini_batch_size_counts_prompts_times_samples_over_ranks():
    assert mini_batch_size_per_rank(4, rollout_n=2, world_size=2, key="actor.ppo_mini_batch_size") == 4
    with pytest.raises(WorkerConfigError, match=r"actor.ppo_mini_batch_size=3 \(x rollout.n=1 = 3 samples\)"):
        mini_batch_size_per_rank(3, rollout_n=1, world_size=2, key="actor.ppo_mini_batch_size")


def test_mini_batches_cover_every_row_once_per_epoch():
    batch = rollout_batch(6)
    batch.batch["row"] = torch.arange(6)
    plain = [mini.batch["row"].tolist() for mini in iter_mini_batches(batch, 4, 2, False, torch.Generator())]
    assert plain == [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [4, 5]]
    shuffled = [mini.batch["row"].tolist() for mini in iter_mini_batches(batch, 3, 2, True, torch.Generator().manual_seed(0))]
    assert sorted(shuffled[0] + shuffled[1]) == sorted(shuffled[2] + shuffled[3]) == list(range(6))
    assert shuffled[0] + shuffled[1] != list(range(6)) or shuffled[2] + shuffled[3] != list(range(6))


@pytest.mark.parametrize(
    "batching", [MicroBatching(), MicroBatching(micro_batch_size=3), MicroBatching(use_dynamic_bsz=True, max_token_len=20)]
)
def test_micro_batch_outputs_come_back_in_row_order(process_group, batching):
    batch = rollout_batch(7, seed=1)
    batch.batch["row"] = torch.arange(7)
    calls = []

    def forward(micro):
        calls.append(len(micro))
        return micro.batch["row"] * 10, micro.batch["attention_mask"].sum(dim=1)

    rows, lengths = run_in_micro_batches(batch, batching, CPU, forward)
    assert torch.equal(rows, torch.arange(7) * 10)
    assert torch.equal(lengths, batch.batch["attention_mask"].sum(dim=1))
    if batching.use_dynamic_bsz:
        assert len(calls) > 1
    assert sum(calls) == 7


def test_loss_counts_are_tokens_and_non_empty_sequences(process_group):
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    counts = loss_counts(mask)
    assert (counts.global_token_count, counts.global_seq_count) == (3.0, 2.0)
