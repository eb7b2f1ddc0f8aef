"""The Optimal Token Baseline (OTB): a per-token baseline from the group's returns, weighted by path variance.

A group-mean baseline gives every token of a response the same baseline. OTB (verl's
``compute_optimal_token_baseline_advantage``, after Yingru Li's note "The Optimal Token Baseline",
https://yingru.notion.site/The-Optimal-Token-Baseline-399211a558b782cfa936014c0d42dfb8) gives token
``t`` of a prompt group the baseline that minimises the policy gradient's variance under a
logit-gradient-norm proxy:

    B_t = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + epsilon),  W_{i,t} = sum_{j <= t} (1 - 2 pi_j + sum_v pi_v^2)

where ``G`` is the reward-to-go, ``pi_j`` the probability of the sampled token under the policy that
sampled it (``old_log_probs``) and ``sum_v pi_v^2`` the sum of squared probabilities over the vocabulary
(``sum_pi_squared``, from the actor's log-prob pass with ``actor.calculate_sum_pi_squared=true``). With
importance weights ``rho`` the terms are scaled by ``rho^2``. A group of one gets no baseline. With
``handle_zero_tail`` the part of a group's unique longest response past the second longest gets baseline
0 (no other response estimates it). ``optimal_token_baseline`` lines the group up by position;
``tir_optimal_token_baseline`` (tool-integrated reasoning) by the index of the model's own tokens, so a
multi-turn response's k-th generated token meets the others' k-th, whatever tool output came before.

The sums run as scatter-adds over the groups (no Python loop over groups or rows). Differs from verl:
``returns`` are 0 where ``response_mask`` is 0, as for every hybridflow estimator.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algos.advantage_registry import register_adv_est
from hybridflow.algos.group_stats import group_ids_from_index, group_max, group_sums

OTB_INPUTS = ("index", "old_log_probs", "sum_pi_squared", "rollout_is_weights")


def _path_variance(
    old_log_probs: torch.Tensor, sum_pi_squared: torch.Tensor, rollout_is_weights: torch.Tensor | None
) -> torch.Tensor:
    """``||s_t||^2 = 1 - 2 pi_t + sum pi^2`` per token ``[B, T]``, times ``rho^2`` when weights are given."""
    per_token = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
    return per_token if rollout_is_weights is None else per_token * rollout_is_weights**2


def _groups(index: Any, counted: torch.Tensor) -> tuple[torch.Tensor, int, torch.Tensor]:
    """Group ids ``[B]``, the number of groups, and each row's group size counting only ``counted`` rows."""
    group_ids, num_groups = group_ids_from_index(index, counted.device)
    if group_ids.numel() != counted.numel():
        raise ValueError(
            f"index has {group_ids.numel()} uids but token_level_rewards has {counted.numel()} rows; "
            "pass one uid per sample (the batch's non_tensor_batch['uid'])"
        )
    sizes = group_sums(counted.to(torch.long), group_ids, num_groups)
    return group_ids, num_groups, sizes[group_ids]


def _zero_tail_start(
    lengths: torch.Tensor, group_ids: torch.Tensor, num_groups: int, counted: torch.Tensor, width: int
) -> torch.Tensor:
    """Per row ``[B]``: the position from which ``handle_zero_tail`` zeroes its baseline (``width``: none).
    Only a group's unique longest row, longer than the second longest, is cut, at the second's length."""
    length = torch.where(counted, lengths, -1).to(torch.float64)
    longest = group_max(length, group_ids, num_groups)[group_ids]
    is_longest = counted & (length == longest)
    unique = group_sums(is_longest.to(torch.long), group_ids, num_groups)[group_ids] == 1
    second = group_max(length.masked_fill(is_longest, -1), group_ids, num_groups)[group_ids]
    cut = is_longest & unique & (second < longest)
    return torch.where(cut, second, float(width)).to(torch.long)


def _baselines(
    returns: torch.Tensor,
    weights: torch.Tensor,
    lengths: torch.Tensor,
    index: Any,
    counted: torch.Tensor,
    handle_zero_tail: bool,
    epsilon: float,
) -> torch.Tensor:
    """``B_t`` per row and position ``[B, T]`` from ``returns`` and path weights ``W`` already zero where a
    row does not count; 0 for groups of one and, with ``handle_zero_tail``, past the cut."""
    group_ids, num_groups, sizes = _groups(index, counted)
    numerator = group_sums(returns * weights, group_ids, num_groups)
    denominator = group_sums(weights, group_ids, num_groups) + epsilon
    baselines = (numerator / denominator)[group_ids]
    keep = (sizes >= 2).unsqueeze(-1).expand_as(baselines)
    if handle_zero_tail:
        width = returns.shape[-1]
        start = _zero_tail_start(lengths, group_ids, num_groups, counted, width)
        positions = torch.arange(width, device=returns.device)
        keep = keep & (positions < start.unsqueeze(-1))
    return torch.where(keep, baselines, torch.zeros_like(baselines))


def _reward_to_go(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    masked = torch.where(response_mask.bool(), token_level_rewards, torch.zeros_like(token_level_rewards))
    return masked.flip(-1).cumsum(-1).flip(-1)


@register_adv_est("optimal_token_baseline", requires=OTB_INPUTS)
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB with the group lined up by position (module docstring); every input ``[B, T]``, ``index [B]``.

    Returns:
        ``(advantages, returns)`` ``[B, T]``: ``A_t = G_t - B_t`` and the reward-to-go ``G``, 0 where
        ``response_mask`` is 0.
    """
    mask = response_mask.bool()
    mask_f = mask.to(token_level_rewards.dtype)
    returns = _reward_to_go(token_level_rewards, mask)
    variance = torch.where(mask, _path_variance(old_log_probs, sum_pi_squared, rollout_is_weights), 0.0)
    weights = variance.cumsum(-1) * mask_f
    counted = torch.ones_like(mask[:, 0])
    lengths = mask.sum(-1)
    baselines = _baselines(returns, weights, lengths, index, counted, handle_zero_tail, epsilon)
    return (returns - baselines) * mask_f, returns * mask_f


def _compact(values: torch.Tensor, rank: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's masked-in values moved left in order (``[B, T]``, zero-padded on the right)."""
    width = values.shape[-1]
    target = torch.where(mask, rank, width)  # masked-out values land in a spare column, then dropped
    spread = torch.zeros(values.shape[0], width + 1, dtype=values.dtype, device=values.device)
    return spread.scatter(1, target, torch.where(mask, values, torch.zeros_like(values)))[:, :width]


@register_adv_est("tir_optimal_token_baseline", requires=OTB_INPUTS)
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OTB for multi-turn, tool-integrated responses: the group is lined up by the index of each row's
    own (``response_mask`` 1) tokens, so tool spans of different lengths do not shift the comparison.
    Rows without a masked-in token take no part. Inputs and outputs as
    :func:`compute_optimal_token_baseline_advantage`."""
    mask = response_mask.bool()
    mask_f = mask.to(token_level_rewards.dtype)
    returns = _reward_to_go(token_level_rewards, mask)
    variance = torch.where(mask, _path_variance(old_log_probs, sum_pi_squared, rollout_is_weights), 0.0)
    rank = mask.long().cumsum(-1) - 1
    compact_returns = _compact(returns, rank, mask)
    compact_weights = _compact(variance.cumsum(-1), rank, mask)
    lengths = mask.sum(-1)
    baselines = _baselines(compact_returns, compact_weights, lengths, index, lengths > 0, handle_zero_tail, epsilon)
    advantages = (compact_returns - baselines).gather(1, rank.clamp_min(0))
    return advantages * mask_f, returns * mask_f
