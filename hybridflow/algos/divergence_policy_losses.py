"""DPPO (Qi et al., "Rethinking the Trust Region in LLM Reinforcement Learning", arXiv:2602.04879).

PPO's ratio clip over-penalises low-probability tokens and under-penalises high-probability ones. DPPO
keeps a token's gradient only while a divergence between the old and the new policy at that token stays
under a threshold, in the direction the advantage pushes: ``dppo_tv`` uses the total variation of the
binary (token vs. the rest) distributions, ``dppo_kl`` their KL divergence. A kept token contributes
``-A * sg[min(r, clip_ratio_c)] * log pi`` (truncated importance sampling, section 5.4).

verl's keys, reused with a new meaning (as in verl's ``dppo_tv``/``dppo_kl``): ``clip_ratio_low`` /
``clip_ratio_high`` (falling back to ``clip_ratio``) are the divergence thresholds for negative / positive
advantages, ``clip_ratio_c`` the importance-weight truncation (verl's example uses 10000 for no
truncation). Metrics: ``pg_clipfrac`` is the share of tokens outside the trust region,
``pg_clipfrac_lower`` the share inside it whose ratio was truncated. Both losses are
``zero_at_zero_advantage``: a token with ``A = 0`` adds 0, and each token's mask is its own.
"""

from __future__ import annotations

import torch

from hybridflow.algos.masked_stats import Count
from hybridflow.algos.policy_losses import (
    DEFAULT_CONFIG,
    PolicyLossConfig,
    aggregate_policy_loss,
    clamped_log_ratio,
    fraction,
    loss_metrics,
    ppo_kl,
    register_policy_loss,
)

BINARY_KL_EPSILON = 1e-8
"""Keeps ``log((1 - p_old) / (1 - p))`` finite when a probability is 1 (verl's constant)."""


def _truncated_is_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    trusted: torch.Tensor,
    config: PolicyLossConfig,
    rollout_is_weights: torch.Tensor | None,
    global_token_count: Count,
    global_seq_count: Count,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``-A * sg[min(r, clip_ratio_c)] * log_prob`` on the ``trusted`` tokens, aggregated, and the metrics."""
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clip_ratio_c = config.clip_ratio_c
    trusted = trusted.detach().to(log_prob.dtype)
    pg_losses = -advantages * ratio.clamp(max=clip_ratio_c).detach() * log_prob * trusted
    loss = aggregate_policy_loss(
        pg_losses, response_mask, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(
        fraction(trusted == 0, response_mask),
        ppo_kl(log_ratio, response_mask),
        fraction((ratio > clip_ratio_c) & (trusted != 0), response_mask),
    )


@register_policy_loss("dppo_tv", zero_at_zero_advantage=True)
def compute_policy_loss_dppo_tv(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-TV: a token is kept while ``pi - pi_old <= clip_ratio_high`` (``A > 0``) or
    ``pi - pi_old >= -clip_ratio_low`` (``A <= 0``): the total variation of the token's binary
    distribution, signed by the direction the advantage pushes."""
    low, high = config.clip_ratio_low, config.clip_ratio_high
    change = torch.exp(log_prob) - torch.exp(old_log_prob)
    trusted = torch.where(advantages > 0, change <= high, change >= -low)
    return _truncated_is_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        trusted,
        config,
        rollout_is_weights,
        global_token_count,
        global_seq_count,
    )


@register_policy_loss("dppo_kl", zero_at_zero_advantage=True)
def compute_policy_loss_dppo_kl(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPPO-Binary-KL: ``D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))`` over the
    token's binary distribution. A token is kept while ``D <= clip_ratio_high`` or ``p <= p_old``
    (``A > 0``), or while ``D <= clip_ratio_low`` or ``p >= p_old`` (``A <= 0``): moving against the
    advantage is never cut."""
    low, high = config.clip_ratio_low, config.clip_ratio_high
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    rest = torch.log((1.0 - old_prob + BINARY_KL_EPSILON) / (1.0 - prob + BINARY_KL_EPSILON))
    binary_kl = old_prob * (old_log_prob - log_prob) + (1.0 - old_prob) * rest
    trusted = torch.where(
        advantages > 0, (binary_kl <= high) | (prob <= old_prob), (binary_kl <= low) | (prob >= old_prob)
    )
    return _truncated_is_loss(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        trusted,
        config,
        rollout_is_weights,
        global_token_count,
        global_seq_count,
    )
