import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.algos.kl import KL_ESTIMATORS, apply_kl_penalty, kl_penalty
from hybridflow.registry import UnknownNameError

LOG_PROB = torch.tensor([0.0])
REF = torch.tensor([math.log(0.5)])


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("kl", math.log(2)),
        ("k1", math.log(2)),
        ("abs", math.log(2)),
        ("mse", 0.5 * math.log(2) ** 2),
        ("k2", 0.5 * math.log(2) ** 2),
        ("low_var_kl", 0.5 + math.log(0.5) * -1 - 1),  # exp(ref - lp) - (ref - lp) - 1
        ("k3", 0.193147),
        ("k3+", 0.193147),
        ("low_var_kl+", 0.193147),
        ("kl+", math.log(2)),
        ("k1+", math.log(2)),
        ("abs+", math.log(2)),
        ("k2+", 0.5 * math.log(2) ** 2),
        ("mse+", 0.5 * math.log(2) ** 2),
    ],
)
def test_estimators_hand_values(kind, expected):
    assert kl_penalty(LOG_PROB, REF, kind).item() == pytest.approx(expected, abs=1e-6)


def test_low_var_kl_is_clamped_to_ten():
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([20.0]), "k3").item() == 10.0
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-30.0]), "k3").item() == 10.0
    assert kl_penalty(torch.tensor([0.0]), torch.tensor([-5.0]), "k3").item() == pytest.approx(math.exp(-5) + 4)


def test_unknown_kind_names_both_config_keys():
    with pytest.raises(UnknownNameError) as error:
        kl_penalty(LOG_PROB, REF, "k5")
    message = str(error.value)
    assert message.startswith("algorithm.kl_penalty='k5'") and "kl_loss_type" in message and "low_var_kl+" in message


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(["kl+", "k1+", "abs+", "k3+", "low_var_kl+", "k2+"]))
def test_straight_through_variants_have_k2_gradient_and_own_value(seed, kind):
    generator = torch.Generator().manual_seed(seed)
    log_prob = (-torch.rand(6, generator=generator) * 3).requires_grad_(True)
    ref = -torch.rand(6, generator=generator) * 3
    value = kl_penalty(log_prob, ref, kind)
    value.sum().backward()
    torch.testing.assert_close(log_prob.grad, (log_prob - ref).detach())
    torch.testing.assert_close(value.detach(), kl_penalty(log_prob.detach(), ref, kind.rstrip("+")))


def test_every_estimator_registered():
    assert {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"} <= set(KL_ESTIMATORS.names())


def test_apply_kl_penalty_hand_case():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    old_log_probs = torch.zeros(2, 3)
    ref_log_prob = torch.tensor([[-1.0, -1.0, -1.0], [0.0, -2.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    rewards, metrics = apply_kl_penalty(scores, old_log_probs, ref_log_prob, mask, kl_coef=0.1, kind="kl")
    # k1 = old - ref = [[1, 1, 1], [0, 2, masked]]
    torch.testing.assert_close(rewards, torch.tensor([[-0.1, -0.1, 0.9], [0.0, 1.8, 0.0]]))
    assert metrics == {"reward_kl_penalty": pytest.approx(1.0), "reward_kl_penalty_coeff": pytest.approx(0.1)}
