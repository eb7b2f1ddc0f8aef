"""Clipped-ratio and plain policy-gradient losses: PPO (dual-clip, DAPO bounds), GSPO, GMPO, SAPO, CISPO,
REINFORCE/GPG, DRO. Signature and metrics: :mod:`hybridflow.algos.policy_loss_registry`.

Each function keeps verl's formula (``verl/trainer/ppo/core_algos.py``); the paper is in its docstring.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algos.masked_stats import Count, masked_sum
from hybridflow.algos.policy_loss_config import PolicyLossConfigError, clip_bounds, loss_option
from hybridflow.algos.policy_loss_registry import (
    LOG_RATIO_BOUND,
    aggregate_policy_loss,
    fraction,
    loss_metrics,
    ppo_kl,
    register_policy_loss,
)


def _clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return (log_prob - old_log_prob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


@register_policy_loss("vanilla", zero_at_zero_advantage=True)
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (Schulman et al., arXiv:1707.06347, eq. 7) with dual clip and asymmetric bounds.

    ``r = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``L = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))`` (DAPO's clip-higher when the
    bounds differ, arXiv:2503.14476); for ``A < 0`` also ``L = min(L, -A clip_ratio_c)`` (dual-clip
    PPO, Ye et al., arXiv:1912.09729). Config: ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``,
    ``clip_ratio_c``, ``loss_scale_factor``. Metrics: ``pg_clipfrac`` (share of tokens where the clip
    binds), ``pg_clipfrac_lower`` (share where the dual clip binds), ``ppo_kl``.

    Differs from the paper: the log-ratio is clamped to [-20, 20] before ``exp`` (numerical guard).
    """
    low, high = clip_bounds(config)
    clip_ratio_c = float(loss_option(config, "clip_ratio_c"))
    if clip_ratio_c <= 1.0:
        raise PolicyLossConfigError(f"clip_ratio_c={clip_ratio_c} must be > 1 for dual-clip PPO (arXiv:1912.09729)")
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clip_max = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(dual_bound, clip_max), clip_max)
    loss = aggregate_policy_loss(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(
        fraction(clipped > unclipped, response_mask),
        ppo_kl(log_ratio, response_mask),
        fraction((clip_max > dual_bound) & negative, response_mask),
    )


@register_policy_loss("gspo", zero_at_zero_advantage=True)
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al., arXiv:2507.18071): PPO clipping on the sequence-level ratio.

    ``s_i = exp(mean_t log(pi / pi_old))`` over the sequence's masked tokens; per token the ratio is
    ``sg[s_i] * pi / sg[pi]`` (log-clamped at 10), which has the value ``s_i`` and GSPO's token gradient.
    Always aggregated with ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says (as in verl).
    """
    low, high = clip_bounds(config)
    log_ratio = log_prob - old_log_prob
    tokens_per_seq = response_mask.to(log_ratio.dtype).sum(dim=-1).clamp_min(1)
    seq_log_ratio = masked_sum(log_ratio, response_mask, dim=-1) / tokens_per_seq
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(token_log_ratio.clamp(max=10.0))
    unclipped = -advantages * seq_ratio
    clipped = -advantages * torch.clamp(seq_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(unclipped, clipped)
    loss = aggregate_policy_loss(
        pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights, global_token_count,
        global_seq_count,
    )
    return loss, loss_metrics(fraction(clipped > unclipped, response_mask), ppo_kl(log_ratio, response_mask), 0.0)


@register_policy_loss("geo_mean", zero_at_zero_advantage=True)
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (Zhao et al., arXiv:2507.20673): the geometric mean of token ratios, clipped per token.

    Token log-ratios are clipped to ``[-clip_ratio_low, clip_ratio_high]`` on the side the advantage's
    sign makes harmful; the sequence ratio is ``exp(mean_t clipped log-ratio)`` and the loss per
    sequence ``-mean_t(A) * ratio``. Importance weights enter as their per-sequence geometric mean.
    Sequences are averaged (``global_seq_count`` if given, else the rows of the batch) whatever
    ``loss_agg_mode`` says, as in verl. ``pg_clipfrac`` counts clipped tokens with ``A > 0``,
    ``pg_clipfrac_lower`` those with ``A < 0``.
    """
    low, high = clip_bounds(config)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    log_ratio_clamped = torch.clamp(log_ratio, -low, high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * log_ratio_clamped)
    tokens_per_seq = response_mask.to(log_ratio.dtype).sum(dim=-1)
    seq_ratio = torch.exp(masked_sum(clipped_log_ratio, response_mask, dim=-1) / (tokens_per_seq + 1e-8))
    seq_advantage = masked_sum(advantages, response_mask, dim=-1) / (tokens_per_seq + 1e-8)
    seq_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        log_weights = torch.log(rollout_is_weights + 1e-10)
        seq_losses = seq_losses * torch.exp(masked_sum(log_weights, response_mask, dim=-1) / (tokens_per_seq + 1e-8))
    loss = seq_losses.sum() / (seq_losses.shape[0] if global_seq_count is None else global_seq_count)
    was_clipped = log_ratio != log_ratio_clamped
    return loss, loss_metrics(
        fraction(was_clipped & (advantages > 0), response_mask),
        ppo_kl(log_ratio, response_mask),
        fraction(was_clipped & (advantages < 0), response_mask),
    )


@register_policy_loss("sapo", zero_at_zero_advantage=True)
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO (Gao et al., arXiv:2511.20347): a smooth sigmoid gate instead of a hard clip.

    ``L = -A * (4 / tau) * sigmoid(tau (r - 1))`` with ``tau = tau_pos`` where ``A > 0`` and ``tau_neg``
    elsewhere; the gate's slope is 1 at ``r = 1`` and decays as the ratio drifts. Always aggregated with
    ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says (as in verl).
    """
    tau_pos = float(loss_option(config, "tau_pos"))
    tau_neg = float(loss_option(config, "tau_neg"))
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gate * advantages
    loss = aggregate_policy_loss(
        pg_losses, response_mask, "seq-mean-token-mean", config, rollout_is_weights, global_token_count,
        global_seq_count,
    )
    return loss, loss_metrics(0.0, ppo_kl(log_ratio, response_mask), 0.0)


@register_policy_loss("cispo", zero_at_zero_advantage=True)
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax, arXiv:2506.13585): clip the importance weight, keep every token's gradient.

    ``L = -sg[clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)] * A * log_prob``: the clipped ratio is a
    constant weight, so clipped tokens still contribute a REINFORCE gradient. ``pg_clipfrac`` is the
    share of tokens whose ratio was clipped.
    """
    low, high = clip_bounds(config)
    log_ratio = _clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high).detach()
    pg_losses = -clipped_ratio * advantages * log_prob
    loss = aggregate_policy_loss(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(fraction(ratio != clipped_ratio, response_mask), ppo_kl(log_ratio, response_mask), 0.0)


@register_policy_loss("reinforce", "gpg", zero_at_zero_advantage=True)
def compute_policy_loss_reinforce(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE (Williams, 1992) with optional importance weights: ``L = -w * A * log_prob``.

    Registered as ``reinforce`` and as ``gpg`` (GPG's policy loss is the same plain policy gradient,
    Chu et al., arXiv:2504.02546). ``old_log_prob`` only feeds the ``ppo_kl`` metric; off-policy
    correction comes from ``rollout_is_weights``.
    """
    pg_losses = -advantages * log_prob
    loss = aggregate_policy_loss(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(0.0, ppo_kl(log_prob - old_log_prob, response_mask), 0.0)


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Reward Optimization's loss with a quadratic log-ratio penalty (verl's ``dro`` loss mode).

    ``L = -(A log_prob - beta/2 (log_prob - old_log_prob)^2)`` per token, ``beta = policy_loss.dro_beta > 0``:
    a REINFORCE term kept near the sampling policy by a squared log-ratio instead of a clip. Metrics:
    ``ppo_kl``; no clipping, so both clip fractions are 0.
    """
    beta = loss_option(config, "dro_beta")
    if beta is None or beta <= 0:
        raise PolicyLossConfigError(f"policy_loss.dro_beta={beta} must be > 0 for loss_mode=dro")
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    loss = aggregate_policy_loss(
        pg_losses, response_mask, loss_agg_mode, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(0.0, ppo_kl(log_ratio, response_mask), 0.0)
