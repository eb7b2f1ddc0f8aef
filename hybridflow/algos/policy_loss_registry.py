"""The policy-loss registry, keyed by ``actor_rollout_ref.actor.policy_loss.loss_mode``, and shared pieces.

Every registered loss has verl's signature::

    fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
       rollout_is_weights=None, global_token_count=None, global_seq_count=None) -> (loss, metrics)

with ``[B, T]`` tensors, ``config`` any object :func:`~hybridflow.algos.policy_loss_config.loss_option`
reads, ``rollout_is_weights [B, T]`` optional per-token importance-sampling weights (rollout-vs-trainer
mismatch correction) multiplying the per-token loss, and the global counts passed to
:func:`~hybridflow.algos.masked_stats.agg_loss` so micro-batch losses add up to the mini-batch loss. The
loss is a scalar tensor; ``metrics`` holds floats ``pg_clipfrac``, ``ppo_kl`` and ``pg_clipfrac_lower``
(verl's names without the ``actor/`` prefix, which the driver adds; 0 where a loss does not clip).

A loss registered with the trait ``zero_at_zero_advantage=True`` promises two things: a token whose advantage is 0
adds exactly 0 to the loss and to its gradient, and no row's loss depends on the other rows except
through the global counts. A row whose advantages are all 0 then changes the update only through those
counts, so the trainer may leave it out of the forward and backward passes and pass the whole batch's
counts instead (``POLICY_LOSSES.traits(name)["zero_at_zero_advantage"]``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from hybridflow.algos.masked_stats import Count, agg_loss, masked_mean
from hybridflow.algos.policy_loss_config import loss_option
from hybridflow.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry(
    "policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode", traits={"zero_at_zero_advantage": False}
)

LOG_RATIO_BOUND = 20.0
"""Log-ratios are clamped to +-20 before ``exp`` so one stale token cannot overflow the loss."""


def register_policy_loss(
    name: str, *aliases: str, zero_at_zero_advantage: bool = False
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under ``name`` (verl's ``register_policy_loss``).

    ``zero_at_zero_advantage``: the loss keeps the promise in the module docstring (zero loss and gradient
    on zero-advantage tokens, rows independent but for the global counts). Leave it False when unsure.
    """
    return POLICY_LOSSES.register(name, *aliases, zero_at_zero_advantage=zero_at_zero_advantage)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``; an unknown name raises listing every registered one."""
    return POLICY_LOSSES.get(name)


def aggregate_policy_loss(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    config: Any,
    rollout_is_weights: torch.Tensor | None,
    global_token_count: Count,
    global_seq_count: Count,
) -> torch.Tensor:
    """Apply the optional importance-sampling weights, then :func:`agg_loss` with the config's scale factor."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(
        pg_losses,
        response_mask,
        loss_agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        loss_scale_factor=loss_option(config, "loss_scale_factor"),
    )


def ppo_kl(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``log pi_old - log pi`` over the masked tokens (k1 estimate of KL(old || new))."""
    return masked_mean(-log_ratio.detach(), response_mask)


def fraction(condition: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Share of masked tokens where ``condition`` holds."""
    return masked_mean(condition.detach().float(), response_mask)


def loss_metrics(
    pg_clipfrac: torch.Tensor | float, ppo_kl_value: torch.Tensor | float, pg_clipfrac_lower: torch.Tensor | float
) -> dict[str, float]:
    """The metrics dict every policy loss returns, as Python floats."""
    return {
        "pg_clipfrac": float(pg_clipfrac),
        "ppo_kl": float(ppo_kl_value),
        "pg_clipfrac_lower": float(pg_clipfrac_lower),
    }
