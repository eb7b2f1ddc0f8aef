"""The rollout-vs-trainer mismatch metrics, worked out by hand on ratios of powers of two.

Training log-probs: row 0 (ln 1/2, ln 1/4), row 1 (ln 1/2); rollout: row 0 (ln 1/4, ln 1/4), row 1 (ln 1). So
r = pi_train / pi_rollout is 2, 1 and 1/2. Float32 logs and exps of these are exact to a few ulps:
rel=abs=1e-6.
"""

import math

import pytest
import torch

from hybridflow.algos.rollout_correction_metrics import mismatch_metrics

LN2 = math.log(2.0)


def approx(value):
    return pytest.approx(value, rel=1e-6, abs=1e-6)


@pytest.fixture()
def metrics():
    training = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.5), 7.0]])
    rollout = torch.tensor([[math.log(0.25), math.log(0.25)], [0.0, -7.0]])
    mask = torch.tensor([[1, 1], [1, 0]])  # the second row's last slot is padding holding garbage
    return mismatch_metrics(training, rollout, mask)


def test_kl_estimators(metrics):
    # k1: mean of log pi_rollout - log pi_train = (-ln2 + 0 + ln2) / 3
    assert metrics["kl"] == approx(0.0)
    # k3: mean of r - 1 - ln r = ((1 - ln2) + 0 + (ln2 - 1/2)) / 3
    assert metrics["k3_kl"] == approx(0.5 / 3)


def test_perplexities_and_their_ratio(metrics):
    # mean token log-probs: train -1.5 ln2 and -ln2, rollout -2 ln2 and 0
    assert metrics["training_ppl"] == approx((2**1.5 + 2) / 2)
    assert metrics["training_log_ppl"] == approx(1.25 * LN2)
    assert metrics["rollout_ppl"] == approx((4 + 1) / 2)
    assert metrics["rollout_log_ppl"] == approx(LN2)
    # per sequence, rollout mean - train mean: -0.5 ln2 and ln2
    assert metrics["log_ppl_diff"] == approx(0.25 * LN2)
    assert metrics["log_ppl_abs_diff"] == approx(0.75 * LN2)
    assert metrics["log_ppl_diff_max"] == approx(LN2)
    assert metrics["log_ppl_diff_min"] == approx(-0.5 * LN2)
    assert metrics["ppl_ratio"] == approx((2**-0.5 + 2) / 2)


def test_chi_square_divergences(metrics):
    assert metrics["chi2_token"] == approx((4 + 1 + 0.25) / 3 - 1)  # E[r^2] - 1
    assert metrics["chi2_seq"] == approx((2**2 + 0.5**2) / 2 - 1)  # products 2 and 1/2


def test_equal_log_probs_measure_no_mismatch():
    log_probs = torch.log(torch.tensor([[0.3, 0.9], [0.5, 0.2]]))
    metrics = mismatch_metrics(log_probs, log_probs.clone(), torch.ones(2, 2))
    for name in ("kl", "k3_kl", "log_ppl_diff", "log_ppl_abs_diff", "chi2_token", "chi2_seq"):
        assert metrics[name] == 0.0, name
    assert metrics["ppl_ratio"] == 1.0 and metrics["training_ppl"] == metrics["rollout_ppl"]
