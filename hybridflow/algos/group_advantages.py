"""Outcome advantage estimators with a per-prompt (group) baseline: GRPO and its relatives.

Each response's score is the sum of its ``token_level_rewards`` row (verl's contract: the whole row
counts, so a score placed on a trailing tool token is not lost). Samples sharing a uid in ``index``
form a group; group statistics come from :mod:`hybridflow.algos.group_stats` (scatter ops, no loop over
groups). Every estimator returns the per-sample advantage on every masked-in token and 0 elsewhere,
with ``returns`` equal to ``advantages`` (there is no critic to regress).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hybridflow.algos.advantage_registry import register_adv_est
from hybridflow.algos.group_stats import group_ids_from_index, group_max, group_mean_std, group_sums
from hybridflow.algos.masked_stats import masked_whiten


def _scores_and_groups(token_level_rewards: torch.Tensor, index: Any) -> tuple[torch.Tensor, torch.Tensor, int]:
    scores = token_level_rewards.sum(dim=-1)
    group_ids, num_groups = group_ids_from_index(index, scores.device)
    if group_ids.numel() != scores.numel():
        raise ValueError(
            f"index has {group_ids.numel()} uids but token_level_rewards has {scores.numel()} rows; "
            "pass one uid per sample (the batch's non_tensor_batch['uid'])"
        )
    return scores, group_ids, num_groups


def _per_token(per_sample: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_sample.unsqueeze(-1) * response_mask.to(per_sample.dtype)


@register_adv_est("grpo", "grpo_vectorized", requires=("index",))
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al., arXiv:2402.03300, sec. 4.1.2): ``A_i = (s_i - mean_g) / (std_g + epsilon)``.

    ``std_g`` is the unbiased standard deviation of the group's scores; a group of one sample has mean 0
    and std 1. With ``norm_adv_by_std_in_grpo=False`` the division is skipped: Dr.GRPO
    (Liu et al., arXiv:2503.20783).

    Differs from the paper: ``epsilon`` in the denominator, and the group-of-one rule (the paper samples
    several outputs per prompt and does not define it).

    Also registered as ``grpo_vectorized``: verl keeps a loop and a vectorised copy of the same formula
    under two names; this one is vectorised, so both names run it.

    Args:
        token_level_rewards: ``[B, T]``; a sample's score is its row sum.
        response_mask: ``[B, T]``.
        index: ``[B]`` uid per sample (numpy object array); equal uids form a group.
        epsilon: added to the std.
        norm_adv_by_std_in_grpo: divide by the group's std (``algorithm.norm_adv_by_std_in_grpo``).

    Returns:
        ``(advantages [B, T], returns [B, T])``, equal, 0 on masked positions.
    """
    scores, group_ids, num_groups = _scores_and_groups(token_level_rewards, index)
    mean, std, _ = group_mean_std(scores, group_ids, num_groups)
    advantages = scores - mean[group_ids]
    if norm_adv_by_std_in_grpo:
        advantages = advantages / (std[group_ids] + epsilon)
    advantages = _per_token(advantages, response_mask)
    return advantages, advantages


@register_adv_est("grpo_passk", requires=("index",))
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (Chen et al., arXiv:2503.19595): only the group's best response gets an advantage.

    ``A_best = (s_max - s_second_max) / (std_g + epsilon)`` (no division when
    ``norm_adv_by_std_in_grpo`` is False); every other sample gets 0. On a tie for the best score the
    earliest sample is "best", and its advantage is 0 anyway. Every group needs at least 2 samples.

    Returns:
        ``(advantages [B, T], returns [B, T])``, equal, 0 on masked positions.
    """
    scores, group_ids, num_groups = _scores_and_groups(token_level_rewards, index)
    _, std, counts = group_mean_std(scores, group_ids, num_groups)
    if bool((counts < 2).any()):
        small_group = int(torch.nonzero(counts < 2)[0].item())
        uid = np.asarray(index, dtype=object).reshape(-1)[(group_ids == small_group).nonzero()[0].item()]
        raise ValueError(
            f"grpo_passk needs at least 2 samples per group, uid {uid!r} has 1; set actor_rollout_ref.rollout.n >= 2"
        )
    best_score = group_max(scores, group_ids, num_groups)
    positions = torch.arange(scores.numel(), device=scores.device)
    candidates = torch.where(scores == best_score[group_ids], positions, scores.numel())
    first_best = torch.full((num_groups,), scores.numel(), dtype=torch.long, device=scores.device)
    first_best = first_best.scatter_reduce(0, group_ids, candidates, reduce="amin")
    is_best = positions == first_best[group_ids]
    runner_up = group_max(scores.masked_fill(is_best, float("-inf")), group_ids, num_groups)
    margin = best_score - runner_up
    if norm_adv_by_std_in_grpo:
        margin = margin / (std + epsilon)
    advantages = torch.where(is_best, margin[group_ids], torch.zeros_like(scores))
    advantages = _per_token(advantages, response_mask)
    return advantages, advantages


def _leave_one_out(scores: torch.Tensor, group_ids: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``s_i - (sum_g - s_i) / (n - 1)`` per sample (0 for a group of one) and the group sizes ``n``."""
    n = torch.bincount(group_ids, minlength=num_groups)[group_ids].to(scores.dtype)
    others_mean = (group_sums(scores, group_ids, num_groups)[group_ids] - scores) / (n - 1).clamp_min(1)
    return torch.where(n > 1, scores - others_mean, torch.zeros_like(scores)), n


@register_adv_est("rloo", requires=("index",))
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, epsilon: float = 1e-6, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al., arXiv:2402.14740): score minus the mean of the group's other scores.

    ``A_i = s_i - (sum_g - s_i) / (n - 1) = n / (n - 1) * (s_i - mean_g)``.

    Differs from the paper: a group of one keeps its raw score (there is no other sample to compare with).

    Returns:
        ``(advantages [B, T], returns [B, T])``, equal, 0 on masked positions.
    """
    scores, group_ids, num_groups = _scores_and_groups(token_level_rewards, index)
    leave_one_out, n = _leave_one_out(scores, group_ids, num_groups)
    advantages = _per_token(torch.where(n > 1, leave_one_out, scores), response_mask)
    return advantages, advantages


@register_adv_est("rloo_vectorized", requires=("index",))
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, epsilon: float = 1e-6, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO as verl's ``rloo_vectorized`` computes it: :func:`compute_rloo_outcome_advantage`'s
    leave-one-out advantage, except that a group of one gets 0 instead of its raw score.

    verl's two RLOO estimators disagree only there; both conventions are kept under verl's names.

    Returns:
        ``(advantages [B, T], returns [B, T])``, equal, 0 on masked positions.
    """
    scores, group_ids, num_groups = _scores_and_groups(token_level_rewards, index)
    advantages = _per_token(_leave_one_out(scores, group_ids, num_groups)[0], response_mask)
    return advantages, advantages


@register_adv_est("reinforce_plus_plus_baseline", requires=("index",))
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, epsilon: float = 1e-6, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu, arXiv:2501.03262): group-mean baseline, then batch whitening.

    ``A_i = s_i - mean_g`` (a group of one keeps its raw score), spread over the tokens and whitened
    over every masked position of the batch.

    Returns:
        ``(advantages [B, T], returns [B, T])``, equal, 0 on masked positions.
    """
    scores, group_ids, num_groups = _scores_and_groups(token_level_rewards, index)
    mean, _, _ = group_mean_std(scores, group_ids, num_groups)
    mask = response_mask.to(scores.dtype)
    advantages = _per_token(scores - mean[group_ids], response_mask)
    advantages = masked_whiten(advantages, mask) * mask
    return advantages, advantages


@register_adv_est("opo", requires=("index",))
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any, epsilon: float = 1e-6, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al., arXiv:2505.23585): baseline is the length-weighted mean of group scores.

    ``b_g = sum_j |y_j| s_j / sum_j |y_j|`` with ``|y_j|`` the response's masked length; a group of one
    has baseline 0.

    Returns:
        ``(advantages [B, T], returns [B, T])``, equal, 0 on masked positions.
    """
    scores, group_ids, num_groups = _scores_and_groups(token_level_rewards, index)
    lengths = response_mask.to(scores.dtype).sum(dim=-1)
    weighted = group_sums(lengths * scores, group_ids, num_groups)
    total_length = group_sums(lengths, group_ids, num_groups)
    counts = torch.bincount(group_ids, minlength=num_groups)
    baseline = torch.where(counts > 1, weighted / total_length.clamp_min(1), torch.zeros_like(weighted))
    advantages = _per_token(scores - baseline[group_ids], response_mask)
    return advantages, advantages


@register_adv_est("gpg", requires=("index",))
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Any,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG (Chu et al., arXiv:2504.02546): ``A_i = alpha * (s_i - mean_g) / f_norm``.

    ``alpha = B / max(1, number of samples with a non-zero score)`` rescales the batch so groups whose
    answers all scored 0 do not dilute the gradient; a group of one has mean 0.

    Returns:
        ``(advantages [B, T], returns [B, T])``, equal, 0 on masked positions.
    """
    scores, group_ids, num_groups = _scores_and_groups(token_level_rewards, index)
    mean, _, _ = group_mean_std(scores, group_ids, num_groups)
    alpha = scores.numel() / torch.count_nonzero(scores).clamp_min(1).to(scores.dtype)
    advantages = _per_token(alpha * (scores - mean[group_ids]) / f_norm, response_mask)
    return advantages, advantages
