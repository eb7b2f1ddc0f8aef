"""Statistics over the positions a mask selects, written once and used by every estimator and loss, and the
loss aggregation: a per-token loss matrix ``[B, T]`` to one scalar by ``loss_agg_mode``.

Masks are 0/1 (bool, int or float) tensors of the same shape as ``values``; a float mask also works
as weights. Positions outside the mask never change a result, even when they hold NaN or inf.

Aggregation is split-invariant: a mini-batch is cut into micro-batches (and data-parallel ranks), each
computing its loss separately. Pass ``global_token_count`` (masked tokens in the whole mini-batch, over all
ranks) and ``global_seq_count`` (its sequences that have at least one masked token) and every mode becomes
``sum over this micro-batch / global count``: summing the micro-batch losses of all micro-batches and
ranks gives exactly the whole mini-batch's loss. No ``dp_size`` enters the formula; a worker whose
gradient all-reduce averages over ranks (FSDP does) multiplies its loss by the data-parallel size.
Without global counts the local counts are used (verl's single-process behaviour).
"""

from __future__ import annotations

from typing import Callable

import torch

from hybridflow.registry import Registry

WHITEN_EPSILON = 1e-8

Count = int | float | torch.Tensor | None
Aggregation = Callable[..., torch.Tensor]
"""A registered aggregation: ``(loss_mat, loss_mask, global_token_count=, global_seq_count=,
loss_scale_factor=) -> scalar``."""

LOSS_AGG_MODES: Registry[Aggregation] = Registry("loss aggregation mode", "actor_rollout_ref.actor.loss_agg_mode")


class MaskedStatisticsError(ValueError):
    """A statistic was asked of too few selected positions (e.g. an unbiased variance of one value)."""


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero (weighted by ``mask``), over ``dim`` or everything."""
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    if mask.dtype == torch.bool:
        selected = torch.where(mask, values, zero)
    else:
        # torch.where first, so NaN/inf on masked positions cannot leak through 0 * inf.
        selected = torch.where(mask != 0, values, zero) * mask
    return selected.sum() if dim is None else selected.sum(dim=dim)


def _count(values: torch.Tensor, mask: torch.Tensor, dim: int | None) -> torch.Tensor:
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return count.to(values.dtype)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the masked positions; 0 where nothing is selected (never NaN)."""
    return masked_sum(values, mask, dim) / _count(values, mask, dim).clamp_min(1e-8)


def _centered_and_variance(
    values: torch.Tensor, mask: torch.Tensor, unbiased: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mean = masked_mean(values, mask)
    centered = values - mean
    variance = masked_mean(centered * centered, mask)
    if unbiased:
        count = _count(values, mask, None)
        if count < 2:
            raise MaskedStatisticsError(
                f"unbiased masked variance needs at least 2 selected positions, got {int(count.item())}; "
                "use a larger batch or unbiased=False"
            )
        variance = variance * count / (count - 1)
    return mean, centered, variance


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked positions (a scalar); ``unbiased`` applies Bessel's correction n/(n-1).

    Raises :class:`MaskedStatisticsError` when the unbiased variance is asked of fewer than 2 positions.
    """
    return _centered_and_variance(values, mask, unbiased)[2]


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` with mean and unbiased variance over the masked positions.

    With ``shift_mean=False`` the mean is added back (only the scale changes). Every position of the
    output is computed, masked ones included; callers that need zeros there multiply by the mask.
    """
    mean, centered, variance = _centered_and_variance(values, mask, unbiased=True)
    whitened = centered * torch.rsqrt(variance + WHITEN_EPSILON)
    return whitened if shift_mean else whitened + mean


def _denominator(local: torch.Tensor, global_count: Count, like: torch.Tensor) -> torch.Tensor:
    count = local if global_count is None else global_count
    # Only an empty batch reaches the floor: its sum is 0, so the loss is 0 instead of NaN.
    return torch.as_tensor(count, dtype=like.dtype, device=like.device).clamp_min(1e-8)


def _token_count(loss_mat: torch.Tensor, loss_mask: torch.Tensor, global_token_count: Count) -> torch.Tensor:
    # Summed in float64: a float32 running count stops being exact past 16.7M tokens.
    return _denominator(loss_mask.sum(dtype=torch.float64), global_token_count, loss_mat)


def _seq_count(loss_mat: torch.Tensor, loss_mask: torch.Tensor, global_seq_count: Count) -> torch.Tensor:
    return _denominator((loss_mask.sum(dim=-1) > 0).sum(dtype=torch.float64), global_seq_count, loss_mat)


@LOSS_AGG_MODES.register("token-mean")
def token_mean(loss_mat, loss_mask, global_token_count=None, global_seq_count=None, loss_scale_factor=None):
    """Mean over every masked token of the batch: long responses weigh more (DAPO, arXiv:2503.14476)."""
    return masked_sum(loss_mat, loss_mask) / _token_count(loss_mat, loss_mask, global_token_count)


@LOSS_AGG_MODES.register("token-sum")
def token_sum(loss_mat, loss_mask, global_token_count=None, global_seq_count=None, loss_scale_factor=None):
    """Sum over every masked token (no normalisation; already split-invariant)."""
    return masked_sum(loss_mat, loss_mask)


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def seq_mean_token_sum(loss_mat, loss_mask, global_token_count=None, global_seq_count=None, loss_scale_factor=None):
    """Sum over each sequence's tokens, then mean over sequences (empty sequences are not counted)."""
    return masked_sum(loss_mat, loss_mask) / _seq_count(loss_mat, loss_mask, global_seq_count)


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def seq_mean_token_mean(loss_mat, loss_mask, global_token_count=None, global_seq_count=None, loss_scale_factor=None):
    """Mean over each sequence's tokens, then mean over sequences: GRPO's original form (arXiv:2402.03300)."""
    tokens_per_seq = loss_mask.to(loss_mat.dtype).sum(dim=-1).clamp_min(1e-8)
    per_seq_mean = masked_sum(loss_mat, loss_mask, dim=-1) / tokens_per_seq
    return per_seq_mean.sum() / _seq_count(loss_mat, loss_mask, global_seq_count)


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(
    loss_mat, loss_mask, global_token_count=None, global_seq_count=None, loss_scale_factor=None
):
    """Dr.GRPO's constant normaliser (arXiv:2503.20783): ``sum / sequences / loss_scale_factor``.

    ``loss_scale_factor`` defaults to the padded length ``T``; set it to a constant (the maximum
    response length) so micro-batches padded to different lengths stay split-invariant.
    """
    scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    return masked_sum(loss_mat, loss_mask) / _seq_count(loss_mat, loss_mask, global_seq_count) / scale


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    global_token_count: Count = None,
    global_seq_count: Count = None,
    loss_scale_factor: int | float | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat [B, T]`` over ``loss_mask [B, T]`` into a scalar by ``loss_agg_mode``.

    Modes: ``token-mean``, ``token-sum``, ``seq-mean-token-sum``, ``seq-mean-token-mean``,
    ``seq-mean-token-sum-norm`` (see each function). ``global_token_count`` / ``global_seq_count`` are
    the mini-batch-wide counts that make the result additive over micro-batches (module docstring);
    ``loss_scale_factor`` is the constant of ``seq-mean-token-sum-norm``. Differs from verl: no
    ``dp_size`` argument (the caller scales for gradient averaging).
    """
    aggregate = LOSS_AGG_MODES.get(loss_agg_mode)
    return aggregate(
        loss_mat,
        loss_mask,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        loss_scale_factor=loss_scale_factor,
    )
