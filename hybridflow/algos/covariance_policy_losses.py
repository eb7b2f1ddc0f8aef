"""Clip-Cov and KL-Cov (Cui et al., arXiv:2505.22617): entropy-preserving PPO variants.

Both rank tokens by the covariance between their advantage and their log-probability, the quantity that
drives entropy collapse, and treat a small fraction of the highest-covariance tokens differently:
Clip-Cov drops their gradient, KL-Cov adds a ``|log ratio|`` penalty on them. Signature and metrics:
:mod:`hybridflow.algos.policy_losses`. As in verl, log-ratios are not clamped here.

Neither is registered ``zero_at_zero_advantage``: both pick their tokens by a covariance taken over the
whole micro-batch, so a zero-advantage row changes which tokens of the other rows are picked, and KL-Cov's
penalty applies whatever the advantage.
"""

from __future__ import annotations

import torch

from hybridflow.algos.masked_stats import Count, masked_mean
from hybridflow.algos.policy_losses import (
    DEFAULT_CONFIG,
    PolicyLossConfig,
    aggregate_policy_loss,
    fraction,
    loss_metrics,
    ppo_kl,
    register_policy_loss,
)


def _token_covariance(advantages: torch.Tensor, log_prob: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``(A - mean A) * (log_prob - mean log_prob)`` per token, means over the masked tokens, no gradient."""
    advantages, log_prob = advantages.detach(), log_prob.detach()
    return (advantages - masked_mean(advantages, response_mask)) * (log_prob - masked_mean(log_prob, response_mask))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov: PPO's clipped loss, with the gradient of a few high-covariance tokens set to zero.

    Among masked tokens not already clipped by PPO whose covariance lies in
    ``(clip_cov_lb, clip_cov_ub)``, ``max(1, int(clip_cov_ratio * masked tokens))`` are picked at random
    (torch's global generator) and their loss is multiplied by 0. ``pg_clipfrac`` is the share picked.
    """
    low, high = config.clip_ratio_low, config.clip_ratio_high
    cov_ratio, cov_lb, cov_ub = config.clip_cov_ratio, config.clip_cov_lb, config.clip_cov_ub
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    masked_in = response_mask.bool()
    covariance = _token_covariance(advantages, log_prob, response_mask)
    eligible = masked_in & ~(clipped > unclipped) & (covariance > cov_lb) & (covariance < cov_ub)
    candidates = torch.nonzero(eligible)
    num_to_cut = max(int(cov_ratio * int(masked_in.sum().item())), 1)
    chosen = candidates[torch.randperm(len(candidates), device=candidates.device)[:num_to_cut]]
    keep = torch.ones_like(advantages)
    keep[chosen[:, 0], chosen[:, 1]] = 0
    pg_losses = torch.maximum(unclipped, clipped) * keep
    loss = aggregate_policy_loss(
        pg_losses, response_mask, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(fraction(keep == 0, response_mask), ppo_kl(log_ratio, response_mask), 0.0)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov: the unclipped surrogate ``-A r``, plus ``ppo_kl_coef * |log r|`` on the top-covariance tokens.

    The ``max(1, int(kl_cov_ratio * masked tokens))`` masked tokens with the largest covariance get the
    penalty. Its ``ppo_kl`` metric is the mean ``|log r|`` (as in verl); there is no clipping.
    """
    cov_ratio, kl_coef = config.kl_cov_ratio, config.ppo_kl_coef
    log_ratio = log_prob - old_log_prob
    abs_log_ratio = log_ratio.abs()
    pg_losses = -advantages * torch.exp(log_ratio)
    masked_in = response_mask.bool()
    num_masked_in = int(masked_in.sum().item())
    if num_masked_in > 0:
        # Covariance over masked tokens only, each centred on the masked-token mean.
        covariance = _token_covariance(advantages, log_prob, response_mask)
        flat_positions = torch.nonzero(masked_in.reshape(-1), as_tuple=True)[0]
        num_penalised = max(1, int(num_masked_in * cov_ratio))
        top = torch.topk(covariance.reshape(-1)[flat_positions], num_penalised).indices
        penalised = torch.zeros(masked_in.numel(), dtype=torch.bool, device=masked_in.device)
        penalised[flat_positions[top]] = True
        pg_losses = torch.where(penalised.view_as(pg_losses), pg_losses + kl_coef * abs_log_ratio, pg_losses)
    loss = aggregate_policy_loss(
        pg_losses, response_mask, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(0.0, masked_mean(abs_log_ratio.detach(), response_mask), 0.0)
