"""The critic's clipped value loss and the actor's entropy bonus."""

from __future__ import annotations

import torch

from hybridflow.algos.masked_stats import Count, agg_loss, masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    loss_scale_factor: int | float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss (OpenAI baselines' ppo2; studied by Engstrom et al., arXiv:2005.12729).

    ``v_clip = clip(vpreds, values - cliprange_value, values + cliprange_value)`` and the per-token loss
    is ``0.5 * max((vpreds - returns)^2, (v_clip - returns)^2)``, aggregated by ``loss_agg_mode``.

    Args:
        vpreds: ``[B, T]`` values predicted now.
        returns: ``[B, T]`` targets (e.g. GAE returns).
        values: ``[B, T]`` values predicted when the batch was collected.
        response_mask: ``[B, T]``.
        cliprange_value: how far ``vpreds`` may move from ``values`` before the clip binds.
        loss_agg_mode, global_token_count, global_seq_count: as for :func:`~hybridflow.algos.agg_loss`.
        loss_scale_factor: the constant divisor of ``seq-mean-token-sum-norm`` (``critic.loss_scale_factor``,
            as the actor's); None means the padded response length.

    Returns:
        ``(vf_loss, vf_clipfrac)``: the scalar loss and the share of masked tokens where the clipped
        error was the larger one (a detached scalar tensor).
    """
    vpreds_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    squared_error = (vpreds - returns) ** 2
    squared_error_clipped = (vpreds_clipped - returns) ** 2
    per_token = torch.maximum(squared_error, squared_error_clipped)
    vf_loss = 0.5 * agg_loss(
        per_token,
        response_mask,
        loss_agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = masked_mean((squared_error_clipped > squared_error).float(), response_mask).detach()
    return vf_loss, vf_clipfrac


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` over the last axis: ``[..., V] -> [...]``."""
    log_probs = torch.log_softmax(logits, dim=-1)
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def compute_entropy_loss(
    logits: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> torch.Tensor:
    """Mean token entropy of ``logits [B, T, V]`` over ``response_mask [B, T]``, aggregated by ``loss_agg_mode``.

    The actor subtracts ``entropy_coeff`` times this from its loss (an entropy bonus). A worker that
    already has per-token entropy ``[B, T]`` (e.g. from chunked computation) calls ``agg_loss`` on it.
    """
    return agg_loss(
        entropy_from_logits(logits),
        response_mask,
        loss_agg_mode,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
    )
