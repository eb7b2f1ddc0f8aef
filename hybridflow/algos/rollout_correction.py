"""Rollout correction: the gap between the rollout engine's token probabilities and the trainer's.

With ``log r = log pi_train - log pi_rollout`` per response token ([B, T]; ``pi_train`` is the old policy in
decoupled mode, the current one in bypass mode), two separate tools, as in verl's ``rollout_corr_helper``
(verl PRs #3984, #3980, #4544, #5722; Liu, Li et al., "When Speed Kills Stability", 2025; Li et al.,
"Trust Region Masking for Long-Horizon LLM RL", arXiv 2512.23075):

- **Importance weights** ``rollout_is_weights`` (``rollout_is``: ``token`` or ``sequence``), multiplying the
  per-token policy loss. Token: ``w_t = r_t``; sequence: ``w = prod_t r_t`` on every token of the row. Each
  is ``exp`` of a log clamped to +-20, then truncated at ``rollout_is_threshold`` (TIS), or, given
  ``"lower_upper"``, zeroed outside ``[lower, upper]`` (IcePop); optionally divided by the batch mean
  (``rollout_is_batch_normalize``). Weights are constants (no gradient).
- **Rejection** (``rollout_rs``): tokens or whole sequences whose divergence is out of bounds leave
  ``response_mask``. Per-token ``k1 = -log r``, ``k2 = (log r)^2 / 2``, ``k3 = r - 1 - log r`` (log r clamped
  to +-20), taken per token (``token_k*``) or per sequence as a sum, mean or max (``seq_sum_k*``,
  ``seq_mean_k*``, ``seq_max_k2|3``). k1 options keep ``log(lower) <= k1 <= log(upper)``; the others keep
  ``k <= upper``. Several comma-separated options must all pass.

Metrics: :mod:`hybridflow.algos.rollout_correction_metrics`, under verl's names (``rollout_corr/...``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from hybridflow.algos.masked_stats import masked_mean, masked_sum
from hybridflow.algos.rollout_correction_metrics import (
    METRIC_PREFIX,
    importance_weight_metrics,
    mismatch_metrics,
    rejection_option_metrics,
)

SAFETY_BOUND = 20.0
"""Log-ratios are clamped to +-20 before ``exp`` (weights within [2e-9, 4.9e8])."""

IS_LEVELS = ("token", "sequence")
RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


class RolloutCorrectionError(ValueError):
    """A rollout-correction setting cannot be used; the message names the key."""


@dataclass(frozen=True)
class WeightBounds:
    """``upper`` truncates (TIS); with ``lower`` too, weights outside [lower, upper] become 0 (IcePop)."""

    upper: float
    lower: float | None = None


@dataclass(frozen=True)
class RejectionBound:
    """One ``rollout_rs`` option and its bounds: ``lower``/``upper`` are ratio bounds for k1 options (compared
    in log space), and ``upper`` alone a divergence bound for k2/k3 options (``lower`` None)."""

    option: str
    upper: float
    lower: float | None = None


@dataclass(frozen=True)
class CorrectionSettings:
    """``algorithm.rollout_correction``'s math settings, parsed and checked (:meth:`from_keys`)."""

    rollout_is: str | None = None
    weight_bounds: WeightBounds = WeightBounds(2.0)
    batch_normalize: bool = False
    rejections: tuple[RejectionBound, ...] = ()

    @classmethod
    def from_keys(
        cls,
        rollout_is: str | None = None,
        rollout_is_threshold: Any = 2.0,
        rollout_is_batch_normalize: bool = False,
        rollout_rs: str | None = None,
        rollout_rs_threshold: Any = None,
    ) -> "CorrectionSettings":
        """Parse verl's keys; raises :class:`RolloutCorrectionError` naming the key at fault."""
        if rollout_is is not None and rollout_is not in IS_LEVELS:
            raise RolloutCorrectionError(f"rollout_is={rollout_is!r} must be one of {list(IS_LEVELS)} or null")
        rejections = () if rollout_rs is None else parse_rejection_bounds(rollout_rs, rollout_rs_threshold)
        # A null threshold is an error only where weights are computed (it bounds nothing otherwise).
        unused = rollout_is is None and rollout_is_threshold is None
        bounds = WeightBounds(2.0) if unused else parse_weight_bounds(rollout_is_threshold)
        return cls(rollout_is, bounds, bool(rollout_is_batch_normalize), rejections)


def _positive_float(text: Any, key: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise RolloutCorrectionError(f"{key}={text!r} is not a number") from None
    if not value > 0:
        raise RolloutCorrectionError(f"{key}={text!r} must be > 0")
    return value


def parse_weight_bounds(spec: Any) -> WeightBounds:
    """``rollout_is_threshold``: a number (or numeric string) truncates; ``"lower_upper"`` is IcePop's band."""
    key = "rollout_is_threshold"
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise RolloutCorrectionError(f"{key}={spec!r} must be a number or a 'lower_upper' string such as '0.5_5.0'")
    text = str(spec).strip()
    if "_" not in text:
        return WeightBounds(_positive_float(text, key))
    lower_text, upper_text = text.split("_", 1)
    lower, upper = _positive_float(lower_text, key), _positive_float(upper_text, key)
    if lower > upper:
        raise RolloutCorrectionError(f"{key}={spec!r}: the lower bound must be <= the upper bound")
    return WeightBounds(upper, lower)


def parse_rejection_bounds(rollout_rs: str, spec: Any) -> tuple[RejectionBound, ...]:
    """``rollout_rs`` (comma-separated options, duplicates dropped) with ``rollout_rs_threshold``: one entry
    for all options or one per option, comma-separated. A k1 entry is ``"lower_upper"`` or a bare upper
    bound (lower = 1/upper); a k2/k3 entry is one upper bound."""
    options = list(dict.fromkeys(part.strip() for part in str(rollout_rs).split(",") if part.strip()))
    unknown = [option for option in options if option not in RS_OPTIONS]
    if not options or unknown:
        raise RolloutCorrectionError(
            f"rollout_rs={rollout_rs!r} has unknown option(s) {unknown}; "
            f"use comma-separated options of {list(RS_OPTIONS)}"
        )
    if spec is None or isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise RolloutCorrectionError(
            f"rollout_rs_threshold={spec!r} must be set for rollout_rs={rollout_rs!r}: a number or a string "
            "with one entry per option (e.g. '0.6_1.6,2.5')"
        )
    entries = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(entries) not in (1, len(options)):
        raise RolloutCorrectionError(
            f"rollout_rs_threshold={spec!r} has {len(entries)} entries for {len(options)} rollout_rs options; "
            "give one for all or one per option"
        )
    entries = entries * len(options) if len(entries) == 1 else entries
    return tuple(_rejection_bound(option, entry) for option, entry in zip(options, entries))


def _rejection_bound(option: str, entry: str) -> RejectionBound:
    key = f"rollout_rs_threshold (for {option})"
    if not option.endswith("k1"):
        if "_" in entry:
            raise RolloutCorrectionError(f"{key}={entry!r}: {option} takes one upper bound, not 'lower_upper'")
        return RejectionBound(option, _positive_float(entry, key))
    if "_" in entry:
        lower_text, upper_text = entry.split("_", 1)
        lower, upper = _positive_float(lower_text, key), _positive_float(upper_text, key)
    else:
        upper = _positive_float(entry, key)
        lower = 1.0 / upper
    if lower > upper:
        raise RolloutCorrectionError(f"{key}={entry!r}: the lower bound must be <= the upper bound")
    return RejectionBound(option, upper, lower)


def _check_mask(response_mask: torch.Tensor) -> None:
    if not response_mask.any():
        raise RolloutCorrectionError("rollout correction needs at least one response token (response_mask is all 0)")


def compute_importance_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    bounds: WeightBounds,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """``rollout_is_weights`` [B, T] (0 on padding) and their metrics (un-prefixed, before normalisation).

    ``log_ratio`` = ``log pi_train - log pi_rollout`` [B, T]. Batch normalisation divides by the mean weight
    over tokens (``token``) or over sequences (``sequence``) when that mean exceeds 1e-8, and reports it as
    ``rollout_is_batch_norm_factor``.
    """
    _check_mask(response_mask)
    if level not in IS_LEVELS:
        raise RolloutCorrectionError(f"rollout_is={level!r} must be one of {list(IS_LEVELS)}")
    mask = response_mask.to(log_ratio.dtype)
    if level == "token":
        log_for_metrics = log_ratio
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        log_for_metrics = masked_sum(log_ratio, response_mask, dim=-1).unsqueeze(-1)
        raw = torch.exp(log_for_metrics.clamp(-SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    if bounds.lower is None:
        weights = raw.clamp(max=bounds.upper)
    else:
        weights = torch.where((raw >= bounds.lower) & (raw <= bounds.upper), raw, torch.zeros_like(raw))
    metrics = importance_weight_metrics(weights, raw, log_for_metrics, response_mask, level, bounds.upper, bounds.lower)
    weights = weights.detach()
    if batch_normalize:
        weights, metrics["rollout_is_batch_norm_factor"] = _batch_normalize(weights, response_mask, level)
    return weights, metrics


def _batch_normalize(weights: torch.Tensor, response_mask: torch.Tensor, level: str) -> tuple[torch.Tensor, float]:
    if level == "token":
        mean = masked_mean(weights, response_mask)
    else:
        per_sequence = masked_mean(weights, response_mask, dim=-1)
        has_tokens = (response_mask.sum(-1) > 0).to(weights.dtype)
        mean = (per_sequence * has_tokens).sum() / has_tokens.sum().clamp_min(1e-8)
    if mean <= 1e-8:
        return weights, 1.0
    return weights / mean, mean.item()


def _token_divergences(log_ratio: torch.Tensor) -> dict[str, torch.Tensor]:
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {"k1": -safe, "k2": 0.5 * safe.square(), "k3": torch.exp(safe) - 1.0 - safe}


def _sequence_max(values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Row maximum over the masked tokens; 0 for a row without tokens."""
    masked = values.masked_fill(~response_mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(masked), torch.zeros_like(masked), masked)


def _option_statistic(option: str, divergences: dict, response_mask: torch.Tensor) -> torch.Tensor:
    """The option's statistic: [B, T] for token options, [B] for sequence options."""
    level, estimator = option.rsplit("_", 1)
    values = divergences[estimator]
    if level == "token":
        return values
    reduce = {"seq_sum": masked_sum, "seq_mean": masked_mean}.get(level)
    return reduce(values, response_mask, dim=-1) if reduce else _sequence_max(values, response_mask)


def compute_rejection_mask(
    log_ratio: torch.Tensor, response_mask: torch.Tensor, rejections: tuple[RejectionBound, ...]
) -> tuple[torch.Tensor, dict[str, float]]:
    """``response_mask`` with the rejected tokens set to 0 (same dtype), and the rejection metrics.

    Per option: ``rollout_rs_<option>_*`` statistics, ``_masked_fraction`` (share of response tokens it
    rejects) and ``_seq_masked_fraction`` (share of sequences with tokens where it rejects any); overall
    ``rollout_rs_masked_fraction`` and ``rollout_rs_seq_masked_fraction`` (over all rows).
    """
    _check_mask(response_mask)
    divergences = _token_divergences(log_ratio)
    valid = response_mask.bool()
    has_tokens = valid.any(dim=-1)
    keep_all = torch.ones_like(valid)
    metrics: dict[str, float] = {}
    for bound in rejections:
        statistic = _option_statistic(bound.option, divergences, response_mask)
        if bound.lower is None:
            keep = statistic <= bound.upper
        else:
            keep = (statistic >= math.log(bound.lower)) & (statistic <= math.log(bound.upper))
        keep = keep if keep.dim() == 2 else keep.unsqueeze(-1).expand_as(valid)
        keep_all &= keep
        metrics.update(rejection_option_metrics(bound.option, bound.upper, bound.lower, statistic, response_mask))
        rejected_rows = (~keep & valid).any(dim=-1)
        prefix = f"rollout_rs_{bound.option}"
        metrics[f"{prefix}_masked_fraction"] = masked_mean((~keep).float(), response_mask).item()
        metrics[f"{prefix}_seq_masked_fraction"] = (rejected_rows & has_tokens).sum().item() / max(
            has_tokens.sum().item(), 1
        )
    metrics["rollout_rs_masked_fraction"] = masked_mean((~keep_all).float(), response_mask).item()
    metrics["rollout_rs_seq_masked_fraction"] = (~keep_all & valid).any(dim=-1).float().mean().item()
    return (response_mask * keep_all).to(response_mask.dtype), metrics


def compute_rollout_correction(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    settings: CorrectionSettings,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """``(rollout_is_weights or None, response_mask after rejection, metrics)`` for one batch, [B, T] each.

    ``old_log_probs`` are the trainer's. Metrics carry verl's ``rollout_corr/`` prefix: the weights' (when
    ``rollout_is`` is set), the rejection's (when ``rollout_rs`` is) and the mismatch diagnostics always.
    """
    if old_log_probs.shape != rollout_log_probs.shape or old_log_probs.shape != response_mask.shape:
        raise RolloutCorrectionError(
            f"old_log_probs {tuple(old_log_probs.shape)}, rollout_log_probs {tuple(rollout_log_probs.shape)} and "
            f"response_mask {tuple(response_mask.shape)} must have one shape"
        )
    _check_mask(response_mask)
    log_ratio = old_log_probs - rollout_log_probs
    weights, metrics = None, {}
    if settings.rollout_is is not None:
        weights, metrics = compute_importance_weights(
            log_ratio, response_mask, settings.rollout_is, settings.weight_bounds, settings.batch_normalize
        )
    corrected_mask = response_mask.clone()
    if settings.rejections:
        corrected_mask, rejection_metrics = compute_rejection_mask(log_ratio, response_mask, settings.rejections)
        metrics.update(rejection_metrics)
    metrics.update(mismatch_metrics(old_log_probs, rollout_log_probs, response_mask))
    return weights, corrected_mask, {f"{METRIC_PREFIX}{name}": value for name, value in metrics.items()}
