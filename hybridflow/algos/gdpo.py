"""GDPO: Group reward-Decoupled normalisation Policy Optimization (arXiv:2601.05242).

GRPO sums a sample's reward components (format, accuracy, ...) before normalising within the group, so a
component with a large spread drowns the others. GDPO normalises each component within the group first,
then adds them with weights and whitens the sum over the batch (verl's ``compute_gdpo_outcome_advantage``).
The components are the scoring function's returned dict entries named in ``algorithm.gdpo_reward_keys``;
the reward manager keeps them as per-sample columns of the batch (``non_tensor_batch``).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from hybridflow.algos.advantage_registry import register_adv_est
from hybridflow.algos.group_stats import group_ids_from_index, group_mean_std
from hybridflow.algos.masked_stats import masked_whiten


class GDPOInputError(ValueError):
    """GDPO's reward components or their weights are missing or do not fit."""


def reward_components(
    token_level_rewards: torch.Tensor,
    gdpo_reward_keys: Sequence[str] | None,
    gdpo_reward_weights: Sequence[float] | None,
    non_tensor_batch: dict | None,
) -> tuple[list[torch.Tensor], list[float]]:
    """The per-sample reward components ``[B]`` named by ``gdpo_reward_keys`` and their weights.

    Called without a batch and without keys (a direct call, as verl allows), the one component is the
    summed ``token_level_rewards``.
    """
    keys = list(gdpo_reward_keys or [])
    if not keys:
        if non_tensor_batch is None:
            return [token_level_rewards.sum(dim=-1)], [1.0]
        raise GDPOInputError(
            "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the keys of the scoring function's "
            "returned dict to normalise one by one, e.g. [format_reward, accuracy_reward]"
        )
    columns = non_tensor_batch or {}
    missing = [key for key in keys if key not in columns]
    if missing:
        raise GDPOInputError(
            f"algorithm.gdpo_reward_keys {missing} are not columns of the batch (it has {sorted(columns)}); "
            "return them in the scoring function's dict"
        )
    weights = [1.0] * len(keys) if gdpo_reward_weights is None else [float(weight) for weight in gdpo_reward_weights]
    if len(weights) != len(keys):
        raise GDPOInputError(
            f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(keys)} gdpo_reward_keys; "
            "give one weight per key or leave it null (all 1)"
        )
    as_tensor = dict(dtype=token_level_rewards.dtype, device=token_level_rewards.device)
    return [torch.as_tensor(np.asarray(columns[key], dtype=np.float64), **as_tensor) for key in keys], weights


def _normalised_sum(
    components: list[torch.Tensor],
    weights: list[float],
    group_ids: torch.Tensor,
    num_groups: int,
    epsilon: float,
    divide_by_std: bool,
) -> torch.Tensor:
    """``sum_k w_k (r_k - mean_g(r_k)) / (std_g(r_k) + epsilon)`` per sample ``[B]`` (no division unless
    ``divide_by_std``)."""
    combined = torch.zeros_like(components[0])
    for component, weight in zip(components, weights):  # a handful of components, each vectorised
        mean, std, _ = group_mean_std(component, group_ids, num_groups)
        normalised = component - mean[group_ids]
        if divide_by_std:
            normalised = normalised / (std[group_ids] + epsilon)
        combined = combined + weight * normalised
    return combined


@register_adv_est("gdpo", requires=("index", "non_tensor_batch"))
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    gdpo_reward_keys: Sequence[str] | None = None,
    gdpo_reward_weights: Sequence[float] | None = None,
    non_tensor_batch: dict | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``A = whiten(sum_k w_k (r_k - mean_g(r_k)) / (std_g(r_k) + epsilon))`` (GDPO, arXiv:2601.05242).

    Each component ``r_k`` is normalised within the sample's group as GRPO normalises the score (a group
    of one: mean 0, std 1); the weighted sum is spread over the response tokens and whitened over every
    masked position of the batch.

    Differs from verl: ``algorithm.norm_adv_by_std_in_grpo`` applies (False skips the division by the
    std); verl's trainer does not pass it to gdpo, which then always divides.

    Args:
        token_level_rewards: ``[B, T]``; read only when there are no components (a direct call).
        response_mask: ``[B, T]``.
        index: ``[B]`` uid per sample.
        norm_adv_by_std_in_grpo: divide by each component's group std (``algorithm.norm_adv_by_std_in_grpo``).
        gdpo_reward_keys: the components, keys of the scoring function's dict (``algorithm.gdpo_reward_keys``).
        gdpo_reward_weights: one weight per key; None means 1 each (``algorithm.gdpo_reward_weights``).
        non_tensor_batch: the batch's per-sample columns, holding each ``gdpo_reward_keys`` entry.

    Returns:
        ``(advantages [B, T], returns [B, T])``, equal, 0 on masked positions.
    """
    components, weights = reward_components(
        token_level_rewards, gdpo_reward_keys, gdpo_reward_weights, non_tensor_batch
    )
    group_ids, num_groups = group_ids_from_index(index, token_level_rewards.device)
    if group_ids.numel() != token_level_rewards.shape[0]:
        raise GDPOInputError(
            f"index has {group_ids.numel()} uids but token_level_rewards has {token_level_rewards.shape[0]} rows; "
            "pass one uid per sample (the batch's non_tensor_batch['uid'])"
        )
    combined = _normalised_sum(components, weights, group_ids, num_groups, epsilon, norm_adv_by_std_in_grpo)
    mask = response_mask.to(combined.dtype)
    advantages = masked_whiten(combined.unsqueeze(-1) * mask, mask) * mask
    return advantages, advantages
