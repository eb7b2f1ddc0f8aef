"""Step metrics that only some runs have the inputs for, as verl logs them: GDPO's reward components and
the gradient-variance proxies of ``sum_pi_squared``. Each is a step hook, attached at start-up when its
input exists, that adds its metrics to the step's before they are logged.
"""

from __future__ import annotations

import numpy as np
import torch

from hybridflow.algos.masked_stats import masked_mean, masked_sum
from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names


def reward_component_metrics(batch: DataProto, keys: list[str]) -> dict[str, float]:
    """``gdpo/<key>/mean|std|max|min`` over the batch's samples for each GDPO reward component (population
    std, as verl's ``np.std``)."""
    metrics = {}
    for key in keys:
        values = np.asarray(batch.non_tensor_batch[key], dtype=np.float64)
        for reduction, reduce in (("mean", np.mean), ("std", np.std), ("max", np.max), ("min", np.min)):
            metrics[names.stat(f"{names.GDPO_PREFIX}{key}", reduction)] = float(reduce(values))
    return metrics


def variance_proxy_metrics(
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    grad_norm: float | None,
) -> dict[str, float]:
    """verl's ``compute_variance_proxy_metrics`` (on-policy form): how noisy the step's policy gradient is.

    With ``W_i = sum_t (1 - 2 pi_t + sum pi^2)`` (the path-variance proxy of the optimal token baseline) and
    ``a_i`` the mean advantage of sample ``i`` over its tokens: ``proxy2_total_power = mean_i(a_i^2 max(W_i,
    0))`` estimates ``E||g_i||^2``; ``proxy1_signal_strength = grad_norm^2`` is ``||g||^2`` of the mean gradient;
    ``proxy3_pure_noise = max(0, (proxy2 - proxy1) / (N - 1))`` the variance of the mean (0 without a grad
    norm or with one sample). Also ``expected_a_squared = mean(a^2)`` and ``expected_w = mean(W)``.
    """
    variance = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    per_sample_advantage = masked_mean(advantages, response_mask, dim=-1)
    weights = masked_sum(variance, response_mask, dim=-1)
    total_power = (per_sample_advantage**2 * weights.clamp_min(0)).mean().item()
    signal = 0.0 if grad_norm is None else grad_norm**2
    samples = per_sample_advantage.numel()
    noise = max(0.0, (total_power - signal) / (samples - 1)) if grad_norm is not None and samples > 1 else 0.0
    return {
        names.VARIANCE_PROXY_SIGNAL: signal,
        names.VARIANCE_PROXY_TOTAL_POWER: total_power,
        names.VARIANCE_PROXY_NOISE: noise,
        names.VARIANCE_PROXY_EXPECTED_A_SQUARED: (per_sample_advantage**2).mean().item(),
        names.VARIANCE_PROXY_EXPECTED_W: weights.mean().item(),
    }


class RewardComponentMetrics:
    """Step hook: GDPO's reward components (``algorithm.gdpo_reward_keys``) as ``gdpo/<key>/*``."""

    def __init__(self, keys: list[str]):
        self.keys = list(keys)

    def after_step(self, global_step: int, batch: DataProto, metrics: dict[str, float]) -> None:
        metrics.update(reward_component_metrics(batch, self.keys))


class VarianceProxyMetrics:
    """Step hook: ``variance_proxy/*`` from the step's ``sum_pi_squared`` (``actor.calculate_sum_pi_squared``)
    and the actor's mean ``grad_norm``."""

    def after_step(self, global_step: int, batch: DataProto, metrics: dict[str, float]) -> None:
        tensors = batch.batch
        grad_norm = metrics.get(f"{names.ACTOR_PREFIX}grad_norm")
        metrics.update(
            variance_proxy_metrics(
                tensors["advantages"],
                tensors["response_mask"],
                tensors["old_log_probs"],
                tensors["sum_pi_squared"],
                grad_norm,
            )
        )
