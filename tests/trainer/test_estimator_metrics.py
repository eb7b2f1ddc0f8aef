"""GDPO's reward-component metrics and the variance proxies of sum_pi_squared: hand-computed cases."""

import math

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.trainer.estimator_metrics import (
    RewardComponentMetrics,
    VarianceProxyMetrics,
    reward_component_metrics,
    variance_proxy_metrics,
)

LN = math.log


def _variance_batch() -> DataProto:
    # Sample 0: 2 tokens, advantage 1 each, pi = 0.5 and sum pi^2 = 0.5 -> 1 - 2 pi + sum pi^2 = 0.5 per token.
    # Sample 1: 1 token (then padding holding other values), advantage -2, pi = 0.25, sum pi^2 = 0.25 -> 0.75.
    return DataProto.from_dict(
        {
            "advantages": torch.tensor([[1.0, 1.0], [-2.0, 5.0]]),
            "response_mask": torch.tensor([[1, 1], [1, 0]]),
            "old_log_probs": torch.tensor([[LN(0.5), LN(0.5)], [LN(0.25), LN(0.9)]]),
            "sum_pi_squared": torch.tensor([[0.5, 0.5], [0.25, 0.9]]),
        }
    )


def test_variance_proxies_hand_case():
    tensors = _variance_batch().batch
    inputs = [tensors[key] for key in ("advantages", "response_mask", "old_log_probs", "sum_pi_squared")]
    metrics = variance_proxy_metrics(*inputs, grad_norm=1.0)
    # a = [1, -2], W = [1, 0.75]: total power mean(1 * 1, 4 * 0.75) = 2; signal 1^2; noise (2 - 1) / (2 - 1)
    assert metrics == pytest.approx(
        {
            "variance_proxy/proxy1_signal_strength": 1.0,
            "variance_proxy/proxy2_total_power": 2.0,
            "variance_proxy/proxy3_pure_noise": 1.0,
            "variance_proxy/expected_a_squared": 2.5,
            "variance_proxy/expected_w": 0.875,
        },
        rel=1e-6,
    )
    without_grad_norm = variance_proxy_metrics(*inputs, grad_norm=None)
    assert without_grad_norm["variance_proxy/proxy1_signal_strength"] == 0.0
    assert without_grad_norm["variance_proxy/proxy3_pure_noise"] == 0.0


def test_variance_proxy_hook_reads_the_actors_grad_norm():
    metrics = {"actor/grad_norm": 1.5}
    VarianceProxyMetrics().after_step(1, _variance_batch(), metrics)
    # noise = max(0, (2 - 2.25) / 1) = 0
    assert metrics["variance_proxy/proxy1_signal_strength"] == 2.25
    assert metrics["variance_proxy/proxy3_pure_noise"] == 0.0 and metrics["actor/grad_norm"] == 1.5


def test_reward_component_metrics_hand_case():
    batch = DataProto.from_dict(
        {"response_mask": torch.ones(4, 1)},
        non_tensors={"format_reward": np.array([0, 1, 1, 2], dtype=object), "acc": np.array([1.0, 1.0, 0.0, 0.0])},
    )
    assert reward_component_metrics(batch, ["format_reward"]) == pytest.approx(
        {
            "gdpo/format_reward/mean": 1.0,
            "gdpo/format_reward/std": math.sqrt(0.5),  # population std: mean of squared deviations (1 + 0 + 0 + 1) / 4
            "gdpo/format_reward/max": 2.0,
            "gdpo/format_reward/min": 0.0,
        }
    )
    metrics = {}
    RewardComponentMetrics(["format_reward", "acc"]).after_step(1, batch, metrics)
    assert metrics["gdpo/acc/mean"] == 0.5 and metrics["gdpo/acc/std"] == 0.5 and len(metrics) == 8
