"""Rollout correction math, each case worked out by hand: importance weights (TIS, IcePop, sequence level,
batch normalisation), every rejection mode and threshold form, and the combined call.

Tolerances: every value is a handful of float32 operations on numbers of order 1 (a log, an exp, a mean of at
most six terms), so the rounding error is a few float32 ulps: rel=abs=1e-6 covers it.
"""

import math

import pytest
import torch

from hybridflow.algos.rollout_correction import (
    CorrectionSettings,
    RejectionBound,
    RolloutCorrectionError,
    WeightBounds,
    compute_importance_weights,
    compute_rejection_mask,
    compute_rollout_correction,
    parse_rejection_bounds,
    parse_weight_bounds,
)

LN = math.log


def approx(value):
    return pytest.approx(value, rel=1e-6, abs=1e-6)


def _ratios(rows):
    """log r [B, T] and the mask for rows of ratios (None = padding)."""
    width = max(len(row) for row in rows)
    log_ratio = torch.zeros(len(rows), width)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        for j, ratio in enumerate(row):
            if ratio is not None:
                log_ratio[i, j], mask[i, j] = LN(ratio), 1
    return log_ratio, mask


# Ratios pi_train / pi_rollout: row 0 has three tokens, row 1 two and a padding slot.
TOKENS = [[3.0, 0.5, 1.0], [1.5, 1.0, None]]


# ------------------------------------------------------------------------------------------ thresholds
def test_weight_threshold_forms():
    assert parse_weight_bounds(2.0) == WeightBounds(2.0)
    assert parse_weight_bounds("3") == WeightBounds(3.0)
    assert parse_weight_bounds("0.5_5.0") == WeightBounds(5.0, 0.5)


@pytest.mark.parametrize("spec", [0, -1.0, "abc", "", "2_1", "0_2", True, None, [2.0]])
def test_bad_weight_thresholds_name_the_key(spec):
    with pytest.raises(RolloutCorrectionError, match="rollout_is_threshold"):
        parse_weight_bounds(spec)


def test_rejection_threshold_forms_of_verls_multi_rs_script():
    assert parse_rejection_bounds("token_k1,seq_max_k2", "0.6_1.6,2.5") == (
        RejectionBound("token_k1", 1.6, 0.6),
        RejectionBound("seq_max_k2", 2.5),
    )
    # One entry serves every option; a bare k1 bound implies lower = 1 / upper; duplicates are dropped.
    assert parse_rejection_bounds(" seq_sum_k1 , token_k3,seq_sum_k1", 2.0) == (
        RejectionBound("seq_sum_k1", 2.0, 0.5),
        RejectionBound("token_k3", 2.0),
    )


@pytest.mark.parametrize(
    "options, spec, needle",
    [
        ("token_k4", 2.0, "rollout_rs="),
        ("", 2.0, "rollout_rs="),
        ("token_k1", None, "rollout_rs_threshold=None"),
        ("token_k1,token_k2,token_k3", "1.5,0.2", "2 entries for 3"),
        ("token_k2", "0.5_2", "takes one upper bound"),
        ("token_k1", "2_0.5", "lower bound must be <="),
        ("seq_mean_k3", "-1", "must be > 0"),
        ("seq_max_k3", "x", "is not a number"),
    ],
)
def test_bad_rejection_settings_name_the_key(options, spec, needle):
    with pytest.raises(RolloutCorrectionError, match=needle):
        parse_rejection_bounds(options, spec)


def test_settings_from_verls_keys():
    settings = CorrectionSettings.from_keys("sequence", "0.5_5", True, "seq_mean_k3", 0.01)
    assert settings == CorrectionSettings(
        "sequence", WeightBounds(5.0, 0.5), True, (RejectionBound("seq_mean_k3", 0.01),)
    )
    assert CorrectionSettings.from_keys(rollout_is_threshold=None) == CorrectionSettings()
    with pytest.raises(RolloutCorrectionError, match="rollout_is="):
        CorrectionSettings.from_keys("geometric")
    with pytest.raises(RolloutCorrectionError, match="rollout_is_threshold"):
        CorrectionSettings.from_keys("token", rollout_is_threshold=None)


# ----------------------------------------------------------------------------------- importance weights
def test_token_level_truncated_weights_and_metrics():
    log_ratio, mask = _ratios(TOKENS)
    weights, metrics = compute_importance_weights(log_ratio, mask, "token", WeightBounds(2.0))
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 1.0], [1.5, 1.0, 0.0]]))
    # mean (2 + .5 + 1 + 1.5 + 1) / 5 = 1.2; E[w^2] = (4 + .25 + 1 + 2.25 + 1) / 5 = 1.7
    assert metrics["rollout_is_mean"] == approx(1.2)
    assert (metrics["rollout_is_max"], metrics["rollout_is_min"]) == (approx(2.0), approx(0.5))
    assert metrics["rollout_is_ratio_fraction_high"] == approx(1 / 5)  # raw 3 > 2
    assert metrics["rollout_is_ratio_fraction_low"] == 0.0  # nothing below 1/2
    assert metrics["rollout_is_std"] == approx(math.sqrt(1.7 - 1.44))
    assert metrics["rollout_is_eff_sample_size"] == approx(1.44 / 1.7)
    # per-sequence means 3.5/3 and 2.5/2
    assert metrics["rollout_is_seq_mean"] == approx((3.5 / 3 + 1.25) / 2)
    assert metrics["rollout_is_seq_max"] == approx(1.25)
    assert metrics["rollout_is_seq_min"] == approx(3.5 / 3)
    assert metrics["rollout_is_seq_max_deviation"] == approx(0.25)
    assert metrics["rollout_is_seq_fraction_high"] == 0.0  # raw per-sequence means 1.5 and 1.25
    assert "rollout_is_batch_norm_factor" not in metrics and "rollout_is_oob_ratio" not in metrics
    assert not weights.requires_grad


def test_icepop_zeroes_weights_outside_the_band():
    log_ratio, mask = _ratios(TOKENS)
    weights, metrics = compute_importance_weights(log_ratio, mask, "token", parse_weight_bounds("0.6_2.5"))
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.0, 1.0], [1.5, 1.0, 0.0]]))
    assert metrics["rollout_is_oob_ratio"] == approx(2 / 5)  # 3 > 2.5 and 0.5 < 0.6
    assert metrics["rollout_is_ratio_fraction_low"] == approx(1 / 5)
    assert metrics["rollout_is_mean"] == approx(3.5 / 5)


def test_icepop_rejecting_every_token_reports_no_effective_sample():
    log_ratio, mask = _ratios([[3.0, 4.0]])
    weights, metrics = compute_importance_weights(log_ratio, mask, "token", WeightBounds(2.0, 0.5))
    assert torch.equal(weights, torch.zeros(1, 2)) and metrics["rollout_is_eff_sample_size"] == 0.0


def test_sequence_level_weight_is_the_truncated_product_with_batch_normalisation():
    log_ratio, mask = _ratios([[3.0, 2.0, 1.0], [0.25, 1.0, None]])
    weights, metrics = compute_importance_weights(log_ratio, mask, "sequence", WeightBounds(2.0))
    # products 6 (truncated to 2) and 0.25, on every token of the row
    torch.testing.assert_close(weights, torch.tensor([[2.0, 2.0, 2.0], [0.25, 0.25, 0.0]]))
    assert (metrics["rollout_is_max"], metrics["rollout_is_min"]) == (approx(6.0), approx(0.25))
    assert metrics["rollout_is_ratio_fraction_high"] == approx(0.5)  # 6 > 2
    assert metrics["rollout_is_ratio_fraction_low"] == approx(0.5)  # 0.25 < 1/2
    assert metrics["rollout_is_mean"] == approx((6 + 0.5) / 5)
    normalised, metrics = compute_importance_weights(log_ratio, mask, "sequence", WeightBounds(2.0), True)
    # mean over sequences (2 + 0.25) / 2 = 1.125
    assert metrics["rollout_is_batch_norm_factor"] == approx(1.125)
    torch.testing.assert_close(normalised, weights / 1.125)


def test_token_level_batch_normalisation_divides_by_the_token_mean():
    log_ratio, mask = _ratios(TOKENS)
    weights, metrics = compute_importance_weights(log_ratio, mask, "token", WeightBounds(2.0), batch_normalize=True)
    assert metrics["rollout_is_batch_norm_factor"] == approx(1.2)
    assert metrics["rollout_is_mean"] == approx(1.2)  # metrics describe the weights before normalisation
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 1.0], [1.5, 1.0, 0.0]]) / 1.2)


def test_log_ratio_is_clamped_before_exp():
    log_ratio = torch.tensor([[100.0, -100.0]])
    weights, _ = compute_importance_weights(log_ratio, torch.ones(1, 2), "token", WeightBounds(1e9))
    torch.testing.assert_close(weights, torch.tensor([[math.exp(20.0), math.exp(-20.0)]]))


# ----------------------------------------------------------------------------------------- rejection
def _reject(rows, options, spec):
    log_ratio, mask = _ratios(rows)
    return compute_rejection_mask(log_ratio, mask, parse_rejection_bounds(options, spec))


def test_token_k1_keeps_rollout_over_train_ratios_inside_the_bounds():
    # k1 = -log r in [log .6, log 1.6]  <=>  r in [1/1.6, 1/.6] = [0.625, 1.67]: 3 and 0.5 leave
    kept, metrics = _reject(TOKENS, "token_k1", "0.6_1.6")
    assert torch.equal(kept, torch.tensor([[0, 0, 1], [1, 1, 0]]))
    assert kept.dtype == torch.long
    assert metrics["rollout_rs_token_k1_masked_fraction"] == approx(2 / 5)
    assert metrics["rollout_rs_token_k1_seq_masked_fraction"] == approx(1 / 2)
    assert metrics["rollout_rs_masked_fraction"] == approx(2 / 5)
    assert metrics["rollout_rs_seq_masked_fraction"] == approx(1 / 2)
    # k1 values -ln3, ln2, 0, -ln1.5, 0 against [ln .6, ln 1.6] = [-0.511, 0.470]
    assert metrics["rollout_rs_token_k1_mean"] == approx((-LN(3) + LN(2) - LN(1.5)) / 5)
    assert metrics["rollout_rs_token_k1_fraction_high"] == approx(1 / 5)
    assert metrics["rollout_rs_token_k1_fraction_low"] == approx(1 / 5)


def test_token_k2_and_k3_bound_the_divergence_from_above():
    # k2 = (ln r)^2 / 2: r=3 -> 0.603, r=0.5 -> 0.240, r=1.5 -> 0.082
    kept, metrics = _reject(TOKENS, "token_k2", 0.3)
    assert torch.equal(kept, torch.tensor([[0, 1, 1], [1, 1, 0]]))
    assert metrics["rollout_rs_token_k2_mean"] == approx((LN(3) ** 2 + LN(2) ** 2 + LN(1.5) ** 2) / 2 / 5)
    assert metrics["rollout_rs_token_k2_max"] == approx(LN(3) ** 2 / 2)
    assert metrics["rollout_rs_token_k2_min"] == 0.0
    assert metrics["rollout_rs_token_k2_fraction_high"] == approx(1 / 5)
    # k3 = r - 1 - ln r: r=3 -> 0.901, r=0.5 -> 0.193, r=1.5 -> 0.095
    kept, _ = _reject(TOKENS, "token_k3", "0.15")
    assert torch.equal(kept, torch.tensor([[0, 0, 1], [1, 1, 0]]))


# Row 0: ratios 2, 0.5, 1 (geometric mean 1); row 1: 1.5, 1.5.
SEQUENCES = [[2.0, 0.5, 1.0], [1.5, 1.5, None]]


@pytest.mark.parametrize(
    "option, spec, kept_rows",
    [
        ("seq_sum_k1", "0.5_2", [1, 0]),  # sums of -ln r: 0 and -2 ln 1.5 = -0.81 < ln 0.5
        ("seq_mean_k1", "0.5_2", [1, 1]),  # means 0 and -0.41, inside [-0.69, 0.69]
        ("seq_mean_k1", "0.9_1.1", [1, 0]),  # -0.41 < ln 0.9
        ("seq_sum_k2", 0.4, [0, 1]),  # sums of (ln r)^2/2: (ln 2)^2 = 0.48 and (ln 1.5)^2 = 0.16
        ("seq_mean_k2", 0.1, [0, 1]),  # means 0.160 and 0.082
        ("seq_max_k2", 0.2, [0, 1]),  # maxima 0.240 and 0.082
        ("seq_sum_k3", 0.3, [0, 1]),  # sums of r - 1 - ln r: 0.5 and 2 (0.5 - ln 1.5) = 0.19
        ("seq_mean_k3", 0.1, [0, 1]),  # means 0.167 and 0.095
        ("seq_max_k3", 0.25, [0, 1]),  # maxima 1 - ln 2 = 0.307 and 0.095
    ],
)
def test_sequence_modes_reject_whole_rows(option, spec, kept_rows):
    kept, metrics = _reject(SEQUENCES, option, spec)
    _, mask = _ratios(SEQUENCES)
    assert torch.equal(kept, mask * torch.tensor(kept_rows)[:, None])
    assert metrics[f"rollout_rs_{option}_seq_masked_fraction"] == approx(kept_rows.count(0) / 2)


def test_sequence_statistics_metrics_of_seq_sum_k3():
    _, metrics = _reject(SEQUENCES, "seq_sum_k3", 0.3)
    row0, row1 = 0.5, 2 * (0.5 - LN(1.5))
    prefix = "rollout_rs_seq_sum_k3"
    assert metrics[f"{prefix}_mean"] == approx((3 * row0 + 2 * row1) / 5)  # each token carries its row's value
    assert (metrics[f"{prefix}_max"], metrics[f"{prefix}_min"]) == (approx(row0), approx(row1))
    assert metrics[f"{prefix}_seq_mean"] == approx((row0 + row1) / 2)
    assert metrics[f"{prefix}_fraction_high"] == approx(0.5)
    assert f"{prefix}_seq_fraction_low" not in metrics


def test_several_options_must_all_pass_as_in_verls_multi_rs_script():
    # token_k1 0.6_1.6 drops the ratios 3 and 0.5 of TOKENS; seq_max_k2 2.5 keeps both rows (max 0.60).
    kept, metrics = _reject(TOKENS, "token_k1,seq_max_k2", "0.6_1.6,2.5")
    assert torch.equal(kept, torch.tensor([[0, 0, 1], [1, 1, 0]]))
    assert metrics["rollout_rs_seq_max_k2_masked_fraction"] == 0.0
    # with seq_max_k2 at 0.5 row 0 (max 0.60) goes whole
    kept, metrics = _reject(TOKENS, "token_k1,seq_max_k2", "0.6_1.6,0.5")
    assert torch.equal(kept, torch.tensor([[0, 0, 0], [1, 1, 0]]))
    assert metrics["rollout_rs_masked_fraction"] == approx(3 / 5)


def test_an_all_padding_mask_is_refused():
    with pytest.raises(RolloutCorrectionError, match="response_mask is all 0"):
        compute_rejection_mask(torch.zeros(1, 2), torch.zeros(1, 2), parse_rejection_bounds("token_k2", 1.0))


# ------------------------------------------------------------------------------------------ combined
def test_combined_correction_uses_train_minus_rollout_and_prefixes_every_metric():
    log_ratio, mask = _ratios(TOKENS)
    rollout_log_probs = torch.full_like(log_ratio, -1.0)
    settings = CorrectionSettings.from_keys("token", 2.0, False, "token_k2", 0.3)
    weights, kept, metrics = compute_rollout_correction(
        rollout_log_probs + log_ratio, rollout_log_probs, mask, settings
    )
    torch.testing.assert_close(weights, torch.tensor([[2.0, 0.5, 1.0], [1.5, 1.0, 0.0]]))
    assert torch.equal(kept, torch.tensor([[0, 1, 1], [1, 1, 0]]))
    assert all(name.startswith("rollout_corr/") for name in metrics)
    assert metrics["rollout_corr/rollout_is_mean"] == approx(1.2)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == approx(1 / 5)
    assert "rollout_corr/kl" in metrics


def test_without_is_or_rs_only_the_mismatch_is_measured():
    log_ratio, mask = _ratios(TOKENS)
    weights, kept, metrics = compute_rollout_correction(
        log_ratio, torch.zeros_like(log_ratio), mask, CorrectionSettings()
    )
    assert weights is None and torch.equal(kept, mask)
    assert not any("rollout_is" in name or "rollout_rs" in name for name in metrics)
    assert metrics["rollout_corr/kl"] == approx(-(LN(3) + LN(0.5) + LN(1.5)) / 5)


def test_shapes_must_agree():
    with pytest.raises(RolloutCorrectionError, match="one shape"):
        compute_rollout_correction(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3), CorrectionSettings())
