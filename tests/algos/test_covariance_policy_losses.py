import math

import pytest
import torch

from hybridflow.algos.covariance_policy_losses import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from hybridflow.algos.policy_losses import PolicyLossConfig

# covariance (A - mean A) * (log_prob - mean log_prob) with mean A = 0, mean log_prob = -2.5: [3, 0, 0, 1]
ADVANTAGES = torch.tensor([[2.0, 0.0, 0.0, -2.0]])
LOG_PROB = torch.tensor([[-1.0, -3.0, -3.0, -3.0]])
MASK = torch.ones(1, 4)


def test_clip_cov_cuts_the_gradient_of_the_token_inside_the_covariance_window():
    log_prob = LOG_PROB.clone().requires_grad_(True)
    loss, metrics = compute_policy_loss_clip_cov(LOG_PROB, log_prob, ADVANTAGES, MASK, config=PolicyLossConfig())
    # ratio 1 everywhere: token losses -A = [-2, 0, 0, 2]; token 0 (cov 3 in (1, 5)) is cut, token 3 (cov 1) is not
    assert loss.item() == pytest.approx(0.5)
    assert metrics["pg_clipfrac"] == 0.25
    loss.backward()
    assert log_prob.grad.tolist() == [pytest.approx([0.0, 0.0, 0.0, 0.5])]


def test_clip_cov_drops_nothing_outside_its_covariance_window():
    config = PolicyLossConfig(clip_cov_lb=5.0, clip_cov_ub=6.0)
    loss, metrics = compute_policy_loss_clip_cov(LOG_PROB, LOG_PROB, ADVANTAGES, MASK, config=config)
    assert loss.item() == pytest.approx(0.0) and metrics["pg_clipfrac"] == 0.0


def test_kl_cov_penalises_the_top_covariance_token():
    log_ratio = torch.tensor([[0.5, 0.0, 0.0, 0.2]])
    loss, metrics = compute_policy_loss_kl_cov(LOG_PROB - log_ratio, LOG_PROB, ADVANTAGES, MASK)
    # -A exp(log r) on every token, plus 0.1 * |log r| on token 0 (largest covariance, 1 of 4 tokens)
    expected = (-2 * math.exp(0.5) + 0.1 * 0.5 + 2 * math.exp(0.2)) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert metrics["ppo_kl"] == pytest.approx(0.7 / 4)


def test_kl_cov_with_no_masked_in_token_is_zero():
    loss, _ = compute_policy_loss_kl_cov(LOG_PROB, LOG_PROB, ADVANTAGES, torch.zeros(1, 4))
    assert loss.item() == 0.0
