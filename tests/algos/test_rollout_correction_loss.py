"""Bypass mode's policy loss, by hand: the rollout's log-probs are the old ones; the correction is taken from the
current policy inside the loss. Two tokens with pi_theta / pi_rollout = 1.1 and 3, advantage 1; rejection
token_k2 at 0.3 drops the second ((ln 3)^2 / 2 = 0.60 > 0.3; (ln 1.1)^2 / 2 = 0.005 stays).

Float32 logs and products of numbers near 1: rel=abs=1e-6.
"""

import math

import pytest
import torch

from hybridflow.algos.policy_losses import PolicyLossConfig
from hybridflow.algos.rollout_correction import CorrectionSettings, RolloutCorrectionError
from hybridflow.algos.rollout_correction_loss import BypassCorrection, compute_bypass_policy_loss


def approx(value):
    return pytest.approx(value, rel=1e-6, abs=1e-6)


def _loss(bypass, global_token_count=None):
    log_prob = torch.tensor([[math.log(1.1), math.log(3.0)]], requires_grad=True)
    loss, metrics = compute_bypass_policy_loss(
        torch.zeros(1, 2),
        log_prob,
        torch.ones(1, 2),
        torch.ones(1, 2),
        bypass,
        config=PolicyLossConfig(),
        global_token_count=global_token_count,
    )
    loss.backward()
    return loss.item(), log_prob.grad, metrics


REJECT_K2 = dict(rollout_rs="token_k2", rollout_rs_threshold=0.3)


def test_ppo_clip_uses_the_rollout_as_old_policy_and_drops_rejected_tokens():
    settings = CorrectionSettings.from_keys("token", 2.0, False, **REJECT_K2)
    loss, grad, metrics = _loss(BypassCorrection(settings, "ppo_clip"))
    # kept token: -A * r = -1.1 (inside the clip [0.8, 1.2]); mean over the 1 kept token. Weights not applied.
    assert loss == approx(-1.1)
    torch.testing.assert_close(grad, torch.tensor([[-1.1, 0.0]]))
    assert metrics["pg_clipfrac"] == 0.0
    # correction metrics over both tokens: weights min(r, 2) = 1.1 and 2
    assert metrics["rollout_corr/rollout_is_mean"] == approx(1.55)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == approx(0.5)
    assert metrics["rollout_corr/kl"] == approx(-(math.log(1.1) + math.log(3.0)) / 2)
    assert "rollout_corr/rollout_is_max" not in metrics  # not a token mean: does not add up over micro-batches


def test_ppo_clip_normalises_by_the_counts_it_is_given():
    loss, _, _ = _loss(BypassCorrection(CorrectionSettings.from_keys(**REJECT_K2)), global_token_count=2)
    assert loss == approx(-1.1 / 2)


def test_reinforce_applies_the_truncated_weights_as_constants():
    settings = CorrectionSettings.from_keys("token", 2.0, False, **REJECT_K2)
    loss, grad, _ = _loss(BypassCorrection(settings, "reinforce"))
    # -w * A * log pi on the kept token: w = 1.1; the gradient is -w (w carries no gradient)
    assert loss == approx(-1.1 * math.log(1.1))
    torch.testing.assert_close(grad, torch.tensor([[-1.1, 0.0]]))


def test_unknown_loss_type_is_refused():
    with pytest.raises(RolloutCorrectionError, match="loss_type='ppo'"):
        BypassCorrection(CorrectionSettings(), "ppo")
