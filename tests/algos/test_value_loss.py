import math

import pytest
import torch

from hybridflow.algos.value_loss import compute_entropy_loss, compute_value_loss, entropy_from_logits


def test_clipped_value_loss_hand_case():
    vpreds = torch.tensor([[1.0, 0.0, 2.0, 50.0]])
    values = torch.tensor([[0.5, 0.5, 0.5, 0.5]])
    returns = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    # token 0: max(0, (0.7 - 1)^2) = 0.09 (clipped larger); token 1: max(1, 0.49) = 1; token 2: max(4, 0.49) = 4
    assert vf_loss.item() == pytest.approx(0.5 * (0.09 + 1.0 + 4.0) / 3)
    assert vf_clipfrac.item() == pytest.approx(1 / 3)


def test_value_loss_scale_factor_divides_seq_mean_token_sum_norm():
    vpreds = torch.tensor([[1.0, 0.0, 2.0, 50.0], [0.5, 0.5, 0.5, 0.5]])
    values = torch.full((2, 4), 0.5)
    returns = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.5, 0.5, 0.5, 0.5]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    mode = "seq-mean-token-sum-norm"
    # row 0 sums 0.09 + 1 + 4 = 5.09 (as above); row 1: (0.5 - 1.5)^2 = 1 -> 6.09 over 2 sequences
    scaled, _ = compute_value_loss(vpreds, returns, values, mask, 0.2, loss_agg_mode=mode, loss_scale_factor=2)
    assert scaled.item() == pytest.approx(0.5 * 6.09 / 2 / 2)
    padded_length, _ = compute_value_loss(vpreds, returns, values, mask, 0.2, loss_agg_mode=mode)
    assert padded_length.item() == pytest.approx(0.5 * 6.09 / 2 / 4)
    # The other modes have no constant to scale.
    token_mean, _ = compute_value_loss(vpreds, returns, values, mask, 0.2, loss_scale_factor=2)
    assert token_mean.item() == pytest.approx(0.5 * 6.09 / 4)


def test_value_loss_gradient_flows_to_vpreds_only_through_the_larger_error():
    vpreds = torch.tensor([[0.0]], requires_grad=True)
    vf_loss, _ = compute_value_loss(vpreds, torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.ones(1, 1), 0.2)
    vf_loss.backward()
    assert vpreds.grad.item() == pytest.approx(-1.0)  # d/dv 0.5 (v - 1)^2 at v = 0


def test_entropy_of_uniform_and_peaked_logits():
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [100.0, 0.0, 0.0, 0.0]]])
    assert entropy_from_logits(logits).tolist() == [[pytest.approx(math.log(4)), pytest.approx(0.0, abs=1e-6)]]
    loss = compute_entropy_loss(logits, torch.tensor([[1, 1]]))
    assert loss.item() == pytest.approx(math.log(4) / 2)
    assert compute_entropy_loss(logits, torch.tensor([[1, 0]])).item() == pytest.approx(math.log(4))
