"""One rank's share of a batch cut and trained: mini-batches, micro-batches and loss counts; the learning-rate
schedules (linear warmup, then constant or cosine decay); what a training method hands back to its worker
group (the update loop itself is tested via the actor)."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.workers.config import OptimConfig, WorkerConfigError
from hybridflow.workers.training import (
    MicroBatching,
    build_lr_scheduler,
    build_optimizer,
    iter_mini_batches,
    loss_counts,
    lr_multiplier,
    metrics_output,
    mini_batch_size_per_rank,
    run_in_micro_batches,
    warmup_steps,
)

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
    generator = torch.Generator().manual_seed(0)
    shuffled = [mini.batch["row"].tolist() for mini in iter_mini_batches(batch, 3, 2, True, generator)]
    assert sorted(shuffled[0] + shuffled[1]) == sorted(shuffled[2] + shuffled[3]) == list(range(6))
    assert shuffled[0] + shuffled[1] != list(range(6)) or shuffled[2] + shuffled[3] != list(range(6))


@pytest.mark.parametrize(
    "batching",
    [MicroBatching(), MicroBatching(micro_batch_size=3), MicroBatching(use_dynamic_bsz=True, max_token_len=20)],
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


def test_constant_schedule_warms_up_linearly_then_holds():
    multiplier = lr_multiplier(OptimConfig(lr_warmup_steps=4))
    assert [multiplier(step) for step in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_schedule_decays_to_min_lr_ratio():
    config = OptimConfig(warmup_style="cosine", lr_warmup_steps_ratio=0.2, total_training_steps=10, min_lr_ratio=0.1)
    multiplier = lr_multiplier(config)
    assert warmup_steps(config) == 2
    assert multiplier(0) == 0.5 and multiplier(2) == 1.0
    # Halfway through the 8 decay steps the cosine is at the middle of [min_lr_ratio, 1].
    assert multiplier(6) == pytest.approx(0.55)
    assert multiplier(10) == pytest.approx(0.1) and multiplier(50) == pytest.approx(0.1)
    decay = [multiplier(step) for step in range(2, 11)]
    assert all(a > b for a, b in zip(decay, decay[1:]))


def test_scheduler_scales_the_optimizer_lr_once_per_step():
    param = torch.nn.Parameter(torch.zeros(2))
    config = OptimConfig(lr=0.1, warmup_style="cosine", total_training_steps=4, lr_warmup_steps=1)
    optimizer = build_optimizer([param], config)
    scheduler = build_lr_scheduler(optimizer, config)
    lrs = []
    for _ in range(5):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    # Step 0 warms up to the peak; steps 1..4 decay over total - warmup = 3 steps.
    expected = [0.1] + [0.1 * 0.5 * (1 + math.cos(math.pi * k / 3)) for k in range(4)]
    assert lrs == pytest.approx(expected, abs=1e-12)


def test_bad_schedules_say_what_to_change():
    with pytest.raises(WorkerConfigError, match=r"warmup_style='linear'.*\['constant', 'cosine'\]"):
        lr_multiplier(OptimConfig(warmup_style="linear"))
    with pytest.raises(WorkerConfigError, match="total_training_steps > warmup"):
        lr_multiplier(OptimConfig(warmup_style="cosine"))


def test_rank_zero_alone_reports_the_all_reduced_metrics():
    metrics = {"pg_loss": [0.5, 0.25], "lr": 1e-3}
    outputs = [metrics_output(metrics, rank) for rank in range(3)]
    assert outputs[0].meta_info == {"metrics": metrics}
    assert outputs[1].meta_info == {} and outputs[2].meta_info == {}
    assert DataProto.concat(outputs).meta_info == {"metrics": {"pg_loss": [[0.5, 0.25]], "lr": [1e-3]}}
