"""Metrics of the rollout correction, under verl's names (``verl/trainer/ppo/rollout_corr_helper.py``).

All are floats over the response tokens of one batch; the caller adds :data:`METRIC_PREFIX`. Three groups:
the importance weights' (``rollout_is_*``), each rejection option's (``rollout_rs_<option>_*``) and the
rollout-vs-trainer mismatch (``kl``, ``k3_kl``, perplexities, chi-square), which verl logs whenever both
log-probs are there.
"""

from __future__ import annotations

import math

import torch

from hybridflow.algos.masked_stats import masked_mean, masked_sum

METRIC_PREFIX = "rollout_corr/"
_LOG_BOUND = 20.0  # the same clamp as rollout_correction.SAFETY_BOUND


def _clamped_std(values: torch.Tensor, response_mask: torch.Tensor, low: float, high: float) -> float:
    """Population std over the masked tokens of ``values`` clamped to [low, high]; 0 for one token or none."""
    if response_mask.sum() <= 1:
        return 0.0
    clamped = values.clamp(min=low, max=high)
    variance = masked_mean(clamped.square(), response_mask) - masked_mean(clamped, response_mask).square()
    return variance.clamp_min(0.0).sqrt().item()


def _masked_extremes(values: torch.Tensor, response_mask: torch.Tensor) -> tuple[float, float]:
    valid = response_mask.bool()
    return values.masked_fill(~valid, float("-inf")).max().item(), values.masked_fill(~valid, float("inf")).min().item()


def importance_weight_metrics(
    weights: torch.Tensor,
    raw_weights: torch.Tensor,
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    upper: float,
    lower: float | None,
) -> dict[str, float]:
    """``rollout_is_*``: mean, max, min, std, effective sample size and the shares beyond the bounds.

    ``weights`` are the applied (truncated or IcePop) weights, ``raw_weights`` those before the bounds (both
    [B, T], 0 on padding), ``log_ratio`` the unclamped log-weights ([B, T] token, [B, 1] sequence). Without an
    IcePop ``lower``, the low share counts weights below ``1 / upper``. Sequence level: max/min and the
    shares come from the per-sequence log-weights (every row). ESS is ``1 / E[(w / E[w])^2]`` over tokens.
    Differs from verl: all-zero weights give ESS 0 (verl raises ZeroDivisionError).
    """
    lower_bound = 1.0 / upper if lower is None else lower
    metrics = {"rollout_is_mean": masked_mean(weights, response_mask).item()}
    if level == "sequence":
        metrics["rollout_is_max"] = torch.exp(log_ratio.max().clamp(max=_LOG_BOUND)).item()
        metrics["rollout_is_min"] = torch.exp(log_ratio.min()).item()
        metrics["rollout_is_ratio_fraction_high"] = (log_ratio > math.log(upper)).float().mean().item()
        metrics["rollout_is_ratio_fraction_low"] = (log_ratio < math.log(lower_bound)).float().mean().item()
    else:
        metrics["rollout_is_max"], metrics["rollout_is_min"] = _masked_extremes(weights, response_mask)
        metrics["rollout_is_ratio_fraction_high"] = masked_mean((raw_weights > upper).float(), response_mask).item()
        metrics["rollout_is_ratio_fraction_low"] = masked_mean(
            (raw_weights < lower_bound).float(), response_mask
        ).item()
    metrics["rollout_is_std"] = _clamped_std(weights, response_mask, 0.0, upper)
    bounded = weights.clamp(min=0.0, max=upper)
    normalised = bounded / (masked_mean(bounded, response_mask) + 1e-8)
    second_moment = masked_mean(normalised.square(), response_mask).item()
    # Every weight zeroed (IcePop rejected all): no effective sample (verl divides by zero here).
    metrics["rollout_is_eff_sample_size"] = 1.0 / second_moment if second_moment > 0 else 0.0
    metrics.update(_per_sequence_metrics(weights, raw_weights, response_mask, upper, lower_bound))
    if lower is not None:
        outside = (raw_weights < lower) | (raw_weights > upper)
        metrics["rollout_is_oob_ratio"] = masked_mean(outside.float(), response_mask).item()
    return metrics


def _per_sequence_metrics(
    weights: torch.Tensor, raw_weights: torch.Tensor, response_mask: torch.Tensor, upper: float, lower_bound: float
) -> dict[str, float]:
    """``rollout_is_seq_*``: the statistics of each sequence's mean weight, and the shares beyond the bounds."""
    per_sequence = masked_mean(weights, response_mask, dim=-1)
    raw_per_sequence = masked_mean(raw_weights, response_mask, dim=-1)
    return {
        "rollout_is_seq_mean": per_sequence.mean().item(),
        "rollout_is_seq_std": per_sequence.std().item() if per_sequence.numel() > 1 else 0.0,
        "rollout_is_seq_max": per_sequence.max().item(),
        "rollout_is_seq_min": per_sequence.min().item(),
        "rollout_is_seq_max_deviation": (per_sequence - 1.0).abs().max().item(),
        "rollout_is_seq_fraction_high": (raw_per_sequence > upper).float().mean().item(),
        "rollout_is_seq_fraction_low": (raw_per_sequence < lower_bound).float().mean().item(),
    }


def rejection_option_metrics(
    option: str, upper_bound: float, lower_bound: float | None, statistic: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """``rollout_rs_<option>_*`` of one option: ``statistic`` is [B, T] (token options) or [B] (sequence).

    The option's bounds (a ``rollout_correction.RejectionBound``'s) are compared as the option uses them: k1
    in log space with a lower bound, k2/k3 (``lower_bound`` None) above 0.
    ``_mean`` and ``_std`` are over tokens (a sequence statistic counts once per token); max, min and the
    shares beyond the bounds are over tokens for token options and over sequences with tokens otherwise;
    ``_seq_*`` describe the per-sequence values (a token option's mean per sequence).
    """
    prefix = f"rollout_rs_{option}"
    k1 = lower_bound is not None
    upper = math.log(upper_bound) if k1 else upper_bound
    lower = math.log(lower_bound) if k1 else 0.0
    has_tokens = response_mask.sum(-1) > 0
    per_token = statistic if statistic.dim() == 2 else statistic.unsqueeze(-1).expand_as(response_mask)
    per_sequence = statistic if statistic.dim() == 1 else masked_mean(statistic, response_mask, dim=-1)
    per_sequence = per_sequence[has_tokens]
    metrics = {f"{prefix}_mean": masked_mean(per_token, response_mask).item()}
    if statistic.dim() == 1:
        metrics[f"{prefix}_max"], metrics[f"{prefix}_min"] = per_sequence.max().item(), per_sequence.min().item()
        metrics[f"{prefix}_fraction_high"] = (per_sequence > upper).float().mean().item()
        metrics[f"{prefix}_fraction_low"] = (per_sequence < lower).float().mean().item() if k1 else 0.0
    else:
        metrics[f"{prefix}_max"], metrics[f"{prefix}_min"] = _masked_extremes(statistic, response_mask)
        metrics[f"{prefix}_fraction_high"] = masked_mean((statistic > upper).float(), response_mask).item()
        metrics[f"{prefix}_fraction_low"] = (
            masked_mean((statistic < lower).float(), response_mask).item() if k1 else 0.0
        )
    metrics[f"{prefix}_std"] = _clamped_std(per_token, response_mask, lower, upper)
    metrics.update(
        {
            f"{prefix}_seq_mean": per_sequence.mean().item(),
            f"{prefix}_seq_std": per_sequence.std().item() if per_sequence.numel() > 1 else 0.0,
            f"{prefix}_seq_max": per_sequence.max().item(),
            f"{prefix}_seq_min": per_sequence.min().item(),
            f"{prefix}_seq_max_deviation": per_sequence.abs().max().item(),
            f"{prefix}_seq_fraction_high": (per_sequence > upper).float().mean().item(),
        }
    )
    if k1:
        metrics[f"{prefix}_seq_fraction_low"] = (per_sequence < lower).float().mean().item()
    return metrics


def mismatch_metrics(
    training_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the rollout's token log-probs are from the trainer's, over the response tokens ([B, T] each).

    ``kl`` = mean of ``log pi_rollout - log pi_train`` (k1 of KL(rollout || train)); ``k3_kl`` = mean of
    ``r - 1 - log r``; ``training_ppl``/``rollout_ppl`` = mean over sequences of ``exp(-mean token log-prob)``,
    ``*_log_ppl`` the mean of its log; ``log_ppl_diff`` = per-sequence ``log ppl_train - log ppl_rollout``
    (mean, mean |.|, max, min) and ``ppl_ratio`` = mean of its exp; ``chi2_token`` = ``E_token[r^2] - 1`` and
    ``chi2_seq`` = ``E_seq[(prod r)^2] - 1`` (log r clamped to +-20). Every row counts in the sequence means.
    """
    log_ratio = training_log_probs - rollout_log_probs
    train_mean = masked_mean(training_log_probs, response_mask, dim=-1)
    rollout_mean = masked_mean(rollout_log_probs, response_mask, dim=-1)
    log_ppl_diff = rollout_mean - train_mean
    ratio = torch.exp(log_ratio.clamp(-_LOG_BOUND, _LOG_BOUND))
    sequence_log_ratio = masked_sum(log_ratio, response_mask, dim=-1).clamp(-_LOG_BOUND, _LOG_BOUND)
    return {
        "training_ppl": torch.exp(-train_mean).mean().item(),
        "training_log_ppl": (-train_mean).mean().item(),
        "kl": masked_mean(-log_ratio, response_mask).item(),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask).item(),
        "rollout_ppl": torch.exp(-rollout_mean).mean().item(),
        "rollout_log_ppl": (-rollout_mean).mean().item(),
        "log_ppl_diff": log_ppl_diff.mean().item(),
        "log_ppl_abs_diff": log_ppl_diff.abs().mean().item(),
        "log_ppl_diff_max": log_ppl_diff.max().item(),
        "log_ppl_diff_min": log_ppl_diff.min().item(),
        "ppl_ratio": torch.exp(log_ppl_diff).mean().item(),
        "chi2_token": (masked_mean(ratio.square(), response_mask) - 1.0).item(),
        "chi2_seq": (torch.exp(2.0 * sequence_log_ratio).mean() - 1.0).item(),
    }
