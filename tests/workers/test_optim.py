"""Learning-rate schedules: linear warmup, then constant or cosine decay."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.workers.config import OptimConfig, WorkerConfigError
from hybridflow.workers.optim import build_lr_scheduler, build_optimizer, lr_multiplier, warmup_steps


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
