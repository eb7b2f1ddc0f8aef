import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.algos.advantages import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)
from hybridflow.algos.masked_stats import masked_whiten


def test_gae_gamma_lam_one_hand_case():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25, 0.0]])
    mask = torch.ones(1, 3)
    advantages, returns = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    # deltas -0.25, -0.25, 1 -> raw advantages 0.5, 0.75, 1.0; returns = advantages + values
    assert returns.tolist() == [[1.0, 1.0, 1.0]]
    # whitened: mean 0.75, unbiased std 0.25
    assert advantages.tolist() == [pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)]


def test_gae_discounted_hand_case():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25, 0.0]])
    advantages, returns = compute_gae_advantage_return(rewards, values, torch.ones(1, 3), gamma=0.5, lam=0.5)
    # delta_2 = 1, A_2 = 1; delta_1 = -0.25, A_1 = -0.25 + 0.25 * 1 = 0; delta_0 = 0.125 - 0.5, A_0 = -0.375
    assert returns.tolist() == [pytest.approx([0.125, 0.25, 1.0])]
    assert advantages.tolist() == [pytest.approx([-0.820695, -0.293105, 1.1138], abs=1e-5)]


def test_gae_skips_masked_tool_tokens():
    # Token 1 is a tool result (mask 0): its reward and value must not enter the recursion.
    rewards = torch.tensor([[0.0, 5.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 9.0, 0.25, 0.0]])
    mask = torch.tensor([[1, 0, 1, 1]])
    advantages, returns = compute_gae_advantage_return(rewards, values, mask, gamma=1.0, lam=1.0)
    assert returns.tolist() == [[1.0, 0.0, 1.0, 1.0]]
    assert advantages[0].tolist() == pytest.approx([-1.0, 0.0, 0.0, 1.0], abs=1e-6)


def test_reinforce_plus_plus_skips_masked_positions_hand_case():
    rewards = torch.tensor([[1.0, 0.0, 7.0, 2.0]])
    mask = torch.tensor([[1, 1, 0, 1]])
    advantages, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    # G_3 = 2; position 2 is masked: its 7 is skipped and G_3 carried; G_1 = 0 + 0.5 * 2 = 1; G_0 = 1 + 0.5 = 1.5
    assert returns.tolist() == [[1.5, 1.0, 0.0, 2.0]]
    # whitened over [1.5, 1, 2]: mean 1.5, unbiased std sqrt((0 + 0.25 + 0.25) / 2) = 0.5
    assert advantages[0].tolist() == pytest.approx([0.0, -1.0, 0.0, 1.0], abs=1e-6)


def test_reinforce_plus_plus_final_reward_reaches_every_assistant_turn():
    """Two assistant turns around a tool span (mask 0), then padding (verl PR #7278's cases)."""
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 5.0, 0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 0, 1, 0, 0]])
    _, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=1.0)
    assert returns.tolist() == [[1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0, 2.0, 0.0, 0.0]]
    _, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.5)
    # Discounted once per assistant token, never for the tool tokens: row 1 is 2, then 0.5 * 2, then 0.5 * 1.
    assert returns[1].tolist() == [0.5, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0]
    assert returns[0].tolist() == [0.125, 0.25, 0.0, 0.0, 0.5, 1.0, 0.0]


def test_remax_hand_case():
    rewards = torch.tensor([[0.0, 1.0, 2.0], [0.0, 0.0, 3.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    advantages, returns = compute_remax_outcome_advantage(rewards, torch.tensor([1.0, 2.0]), mask)
    assert returns.tolist() == [[3.0, 3.0, 2.0], [0.0, 0.0, 0.0]]
    assert advantages.tolist() == [[2.0, 2.0, 1.0], [-2.0, -2.0, 0.0]]


def _random_batch(seed: int, batch: int, length: int):
    generator = torch.Generator().manual_seed(seed)
    rewards = torch.randn(batch, length, generator=generator)
    values = torch.randn(batch, length, generator=generator)
    mask = torch.rand(batch, length, generator=generator) < 0.7
    mask[0, 0] = mask[0, -1] = True  # at least 2 masked-in tokens, so whitening is defined
    return generator, rewards, values, mask


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 6), length=st.integers(2, 8))
def test_gae_with_unit_gamma_lam_and_zero_values_returns_reward_to_go(seed, batch, length):
    _, rewards, _, mask = _random_batch(seed, batch, length)
    _, returns = compute_gae_advantage_return(rewards, torch.zeros_like(rewards), mask, gamma=1.0, lam=1.0)
    masked_rewards = rewards * mask
    reward_to_go = masked_rewards.flip(-1).cumsum(-1).flip(-1) * mask
    torch.testing.assert_close(returns, reward_to_go, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 6),
    length=st.integers(2, 8),
    name=st.sampled_from(["gae", "reinforce_plus_plus", "remax"]),
)
def test_masked_tokens_never_change_token_level_estimators(seed, batch, length, name):
    generator, rewards, values, mask = _random_batch(seed, batch, length)
    noise = torch.randn(batch, length, generator=generator) * 100 * ~mask
    estimators = {
        "gae": lambda r, v: compute_gae_advantage_return(r, v, mask, gamma=0.9, lam=0.8),
        "reinforce_plus_plus": lambda r, v: compute_reinforce_plus_plus_outcome_advantage(r, mask, gamma=0.9),
        "remax": lambda r, v: compute_remax_outcome_advantage(r, values[:, 0], mask),
    }
    clean = estimators[name](rewards, values)
    perturbed = estimators[name](rewards + noise, values + noise)
    for before, after in zip(clean, perturbed):
        torch.testing.assert_close(before, after)
        assert (after[~mask] == 0).all()


def _gae_loop(rewards, values, mask, gamma, lam):
    """GAE as the published per-token recursion, skipping masked positions (the verl contract)."""
    next_value = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    last = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    raw = torch.zeros_like(rewards)
    for t in range(rewards.shape[1] - 1, -1, -1):
        step = rewards[:, t] + gamma * next_value - values[:, t] + gamma * lam * last
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        last = torch.where(mask[:, t], step, last)
        raw[:, t] = last
    return raw, (raw + values) * mask


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 6),
    length=st.integers(2, 40),
    gamma=st.sampled_from([1.0, 0.99, 0.5]),
    lam=st.sampled_from([1.0, 0.95, 0.0]),
)
def test_gae_equals_the_per_token_recursion(seed, batch, length, gamma, lam):
    _, rewards, values, mask = _random_batch(seed, batch, length)
    rewards, values = rewards.double(), values.double()
    advantages, returns = compute_gae_advantage_return(rewards, values, mask, gamma=gamma, lam=lam)
    raw, expected_returns = _gae_loop(rewards, values, mask, gamma, lam)
    torch.testing.assert_close(returns, expected_returns)
    torch.testing.assert_close(advantages, masked_whiten(raw, mask) * mask)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), batch=st.integers(1, 6), length=st.integers(2, 40))
def test_reinforce_plus_plus_equals_the_per_token_recursion(seed, batch, length):
    """verl's loop: a masked position neither adds its reward nor resets or discounts the running return."""
    _, rewards, _, mask = _random_batch(seed, batch, length)
    rewards = rewards.double()
    running = torch.zeros(batch, dtype=rewards.dtype)
    expected = torch.zeros_like(rewards)
    for t in range(length - 1, -1, -1):
        running = torch.where(mask[:, t], rewards[:, t] + 0.9 * running, running)
        expected[:, t] = running
    _, returns = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=0.9)
    torch.testing.assert_close(returns, expected * mask)
