"""Advantage estimators that propagate rewards along the tokens: GAE, REINFORCE++ and ReMax.

Each keeps verl's contract (``verl/trainer/ppo/core_algos.py``): same argument names, shapes and formula.
One deliberate difference for all of them: positions where ``response_mask`` is 0 are 0 in both outputs
(verl leaves carried-over values there that no loss reads), so masked tokens never change any output.
The recursions run as chunked linear scans (:mod:`hybridflow.algos.scan`), not a loop over T tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.algos.advantage_registry import register_adv_est
from hybridflow.algos.masked_stats import masked_whiten
from hybridflow.algos.scan import reverse_linear_scan, shift_left


@register_adv_est("gae", requires=("values",))
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al., arXiv:1506.02438, eq. 16), whitened.

    ``delta_t = r_t + gamma * V_next - V_t`` and ``A_t = delta_t + gamma * lam * A_next``, where "next"
    is the next position with ``response_mask`` 1: masked positions (multi-turn tool tokens, padding)
    are skipped, so the recursion runs over the model's own tokens only. ``returns = A + V`` before the
    advantages are whitened over the masked positions.

    Differs from the paper: advantages are whitened over the batch (PPO practice), and masked positions
    are skipped (multi-turn responses interleave tool output the policy did not generate).

    Args:
        token_level_rewards: ``[B, T]`` rewards (a reward on a masked position is skipped, as in verl).
        values: ``[B, T]`` critic values.
        response_mask: ``[B, T]`` 1 on tokens the policy generated.
        gamma: discount (``algorithm.gamma``).
        lam: GAE lambda (``algorithm.lam``).

    Returns:
        ``(advantages [B, T], returns [B, T])``, 0 on masked positions.
    """
    mask = response_mask.bool()
    mask_f = mask.to(values.dtype)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    masked_values = torch.where(mask, values, zero)
    # Value of the next masked-in token: N_t = m_{t+1} V_{t+1} + (1 - m_{t+1}) N_{t+1}.
    next_values = reverse_linear_scan(shift_left(masked_values), 1 - shift_left(mask_f))
    deltas = torch.where(mask, token_level_rewards + gamma * next_values - values, zero)
    # A_t = delta_t + gamma lam A_{t+1} on masked-in tokens; masked ones carry A_{t+1} through unchanged.
    advantages = reverse_linear_scan(deltas, 1 + (gamma * lam - 1) * mask_f)
    returns = torch.where(mask, advantages + values, zero)
    advantages = torch.where(mask, masked_whiten(advantages, mask), zero)
    return advantages, returns


@register_adv_est("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu, arXiv:2501.03262): discounted reward-to-go, whitened over the batch.

    ``G_t = r_t + gamma * G_next`` where "next" is the next position with ``response_mask`` 1: masked
    spans (a multi-turn response's tool output) are skipped, neither resetting nor discounting the
    return, so the final reward reaches every earlier assistant turn (verl PR #7278). Advantages are
    ``G`` whitened over all masked positions of the batch (a global, not per-prompt, baseline).

    Differs from the paper: masked spans are skipped (the paper has single-turn responses only).

    Args:
        token_level_rewards: ``[B, T]`` (a reward on a masked position is skipped, as in verl).
        response_mask: ``[B, T]``.
        gamma: discount (``algorithm.gamma``).

    Returns:
        ``(advantages [B, T], returns [B, T])``, 0 on masked positions.
    """
    mask = response_mask.bool()
    mask_f = mask.to(token_level_rewards.dtype)
    rewards = torch.where(mask, token_level_rewards, torch.zeros_like(token_level_rewards))
    zero = torch.zeros((), dtype=rewards.dtype, device=rewards.device)
    # Running return x_t = r_t + gamma x_{t+1} on masked-in tokens; masked ones carry x_{t+1} unchanged.
    running = reverse_linear_scan(rewards, 1 + (gamma - 1) * mask_f)
    returns = torch.where(mask, running, zero)
    advantages = torch.where(mask, masked_whiten(returns, mask), zero)
    return advantages, returns


@register_adv_est("remax", requires=("reward_baselines",))
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al., arXiv:2310.10505): reward-to-go minus the greedy response's reward.

    ``returns_t = sum_{k >= t} r_k m_k`` and ``A_t = returns_t - b`` where ``b`` is the reward of the
    greedy (argmax-decoded) response to the same prompt.

    Args:
        token_level_rewards: ``[B, T]``.
        reward_baselines: ``[B]`` reward of each prompt's greedy response.
        response_mask: ``[B, T]``.

    Returns:
        ``(advantages [B, T], returns [B, T])``, 0 on masked positions.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    masked_rewards = torch.where(response_mask.bool(), token_level_rewards, torch.zeros_like(token_level_rewards))
    returns = masked_rewards.flip(-1).cumsum(-1).flip(-1) * mask
    advantages = returns - reward_baselines.reshape(-1, 1).to(returns.dtype) * mask
    return advantages, returns
