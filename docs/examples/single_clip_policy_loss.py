"""A new policy loss: PPO's clipped surrogate without the dual clip
(``actor_rollout_ref.actor.policy_loss.loss_mode=single_clip``)."""

from typing import Any

import torch

from hybridflow.algos import register_policy_loss
from hybridflow.algos.policy_losses import (
    DEFAULT_CONFIG,
    PolicyLossConfig,
    aggregate_policy_loss,
    fraction,
    loss_metrics,
    ppo_kl,
)


@register_policy_loss("single_clip")
def compute_policy_loss_single_clip(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Any = None,
    global_seq_count: Any = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``L = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))`` per token (arXiv:1707.06347,
    eq. 7), with ``r = exp(log_prob - old_log_prob)``; all tensors [B, T]."""
    low, high = config.clip_ratio_low, config.clip_ratio_high  # unset ones already fell back to actor.clip_ratio
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(unclipped, clipped)
    loss = aggregate_policy_loss(
        pg_losses, response_mask, config, rollout_is_weights, global_token_count, global_seq_count
    )
    # The metrics every loss returns: actor/pg_clipfrac, actor/ppo_kl, actor/pg_clipfrac_lower.
    return loss, loss_metrics(fraction(clipped > unclipped, response_mask), ppo_kl(log_ratio, response_mask), 0.0)
