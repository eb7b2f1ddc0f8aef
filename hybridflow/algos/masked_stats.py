"""Statistics over the positions a mask selects: written once, used by every estimator and loss.

Masks are 0/1 (bool, int or float) tensors of the same shape as ``values``; a float mask also works
as weights. Positions outside the mask never change a result, even when they hold NaN or inf.
"""

from __future__ import annotations

import torch

WHITEN_EPSILON = 1e-8


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
