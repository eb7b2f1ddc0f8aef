import math

import pytest
import torch

from hybridflow.algos.divergence_policy_losses import compute_policy_loss_dppo_kl, compute_policy_loss_dppo_tv
from hybridflow.algos.policy_losses import POLICY_LOSSES, PolicyLossConfig, get_policy_loss_fn

LN = math.log


def _tokens(old_probs, new_probs, advantages):
    """One row of masked-in tokens, plus a masked token holding garbage; ``log_prob`` requires grad."""
    old_log_prob = torch.tensor([[LN(p) for p in old_probs] + [5.0]])
    log_prob = torch.tensor([[LN(p) for p in new_probs] + [-40.0]], requires_grad=True)
    mask = torch.tensor([[1] * len(old_probs) + [0]])
    return old_log_prob, log_prob, torch.tensor([list(advantages) + [1e6]]), mask


def test_dppo_tv_hand_case():
    old_log_prob, log_prob, advantages, mask = _tokens([0.5, 0.5, 0.5, 0.1], [0.6, 0.8, 0.2, 0.4], [1, 1, -1, -1])
    config = PolicyLossConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0)
    loss, metrics = compute_policy_loss_dppo_tv(old_log_prob, log_prob, advantages, mask, config=config)
    # pi - pi_old: +0.1 (A>0, <= 0.2: kept), +0.3 (A>0, > 0.2: cut), -0.3 (A<0, < -0.2: cut), +0.3 (A<0: kept)
    # kept: token 0 with weight r = 1.2; token 3 with r = 4 truncated to 3
    assert loss.item() == pytest.approx((-1.2 * LN(0.6) + 3.0 * LN(0.4)) / 4, rel=1e-6)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(0.25)
    # ppo_kl = mean(log pi_old - log pi) = (ln(5/6) + ln(5/8) + ln(5/2) + ln(1/4)) / 4
    assert metrics["ppo_kl"] == pytest.approx((LN(5 / 6) + LN(5 / 8) + LN(5 / 2) + LN(1 / 4)) / 4, rel=1e-5)
    loss.backward()
    # the weight is a constant: d/dlog_prob = -A * w / 4 on kept tokens, 0 elsewhere
    assert log_prob.grad[0].tolist() == pytest.approx([-0.3, 0.0, 0.0, 0.75, 0.0], rel=1e-6)


def test_dppo_kl_hand_case():
    old_log_prob, log_prob, advantages, mask = _tokens([0.5, 0.5, 0.5, 0.5], [0.6, 0.8, 0.2, 0.2], [1, 1, 1, -1])
    config = PolicyLossConfig(clip_ratio_low=0.05, clip_ratio_high=0.05)
    loss, metrics = compute_policy_loss_dppo_kl(old_log_prob, log_prob, advantages, mask, config=config)
    # binary KL from 0.5 to p: 0.5 ln(0.5/p) + 0.5 ln(0.5/(1-p))
    #   p=0.6: 0.5 (ln(5/6) + ln(5/4)) = 0.0204 <= 0.05: kept
    #   p=0.8: 0.5 (ln(5/8) + ln(5/2)) = 0.2231 > 0.05, p rose with A>0: cut
    #   p=0.2 (A>0): 0.2231, but p fell against the advantage's push: kept
    #   p=0.2 (A<0): 0.2231 > 0.05 and p fell as A<0 pushes: cut
    assert loss.item() == pytest.approx((-1.2 * LN(0.6) - 0.4 * LN(0.2)) / 4, rel=1e-6)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)
    assert metrics["pg_clipfrac_lower"] == 0.0  # no kept ratio exceeds clip_ratio_c = 3
    loss.backward()
    assert log_prob.grad[0].tolist() == pytest.approx([-0.3, 0.0, -0.1, 0.0, 0.0], rel=1e-6)


def test_dppo_is_registered_under_verls_names_and_zero_at_zero_advantage():
    assert get_policy_loss_fn("dppo_tv") is compute_policy_loss_dppo_tv
    assert get_policy_loss_fn("dppo_kl") is compute_policy_loss_dppo_kl
    assert all(POLICY_LOSSES.traits(name)["zero_at_zero_advantage"] for name in ("dppo_tv", "dppo_kl"))
