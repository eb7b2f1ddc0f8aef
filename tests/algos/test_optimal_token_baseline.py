import math

import numpy as np
import pytest
import torch

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS, get_adv_estimator_fn
from hybridflow.algos.optimal_token_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)

LN = math.log


def _uids(*labels):
    return np.array(labels, dtype=object)


def _single_turn_case():
    """Group a: two responses of lengths 3 and 2 scoring 1 and 0; group c: one response scoring 2."""
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 2.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    # pi and sum pi^2 chosen so that 1 - 2 pi + sum pi^2 is 0.5, 0.5, 0.5 / 0.5, 0.75 / 0.5, 0.5, 0.5
    pi = torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.25, 0.9], [0.5, 0.5, 0.5]])
    sum_pi_squared = torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.25, 0.9], [0.5, 0.5, 0.5]])
    return rewards, mask, torch.log(pi), sum_pi_squared, _uids("a", "a", "c")


def test_optimal_token_baseline_hand_case():
    rewards, mask, old_log_probs, sum_pi_squared, uids = _single_turn_case()
    advantages, returns = compute_optimal_token_baseline_advantage(rewards, mask, uids, old_log_probs, sum_pi_squared)
    # Returns G: [1, 1, 1], [0, 0, -], [2, 2, 2]; path weights W (cumulative): [0.5, 1, 1.5], [0.5, 1.25, -].
    # Group a: B_0 = (1 * 0.5 + 0 * 0.5) / 1 = 0.5; B_1 = (1 * 1) / (1 + 1.25) = 4/9; B_2 = 1 * 1.5 / 1.5 = 1,
    # but row 0 is the group's unique longest (3 > 2): its baseline from position 2 on is 0 (zero tail).
    # Group c has one response: no baseline.
    expected = [[0.5, 5 / 9, 1.0], [-0.5, -4 / 9, 0.0], [2.0, 2.0, 2.0]]
    for row, want in zip(advantages.tolist(), expected):
        assert row == pytest.approx(want, rel=1e-6)
    assert returns.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0]]
    kept_tail, _ = compute_optimal_token_baseline_advantage(
        rewards, mask, uids, old_log_probs, sum_pi_squared, handle_zero_tail=False
    )
    assert kept_tail[0, 2].item() == pytest.approx(0.0, abs=1e-6)  # G_2 - B_2 = 1 - 1


def test_importance_weights_scale_the_path_weights_by_their_square():
    rewards, mask, old_log_probs, sum_pi_squared, uids = _single_turn_case()
    weights = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0], [1.0, 1.0, 1.0]])
    advantages, _ = compute_optimal_token_baseline_advantage(
        rewards, mask, uids, old_log_probs, sum_pi_squared, rollout_is_weights=weights
    )
    # Row 1's W is now 4 times larger: [2, 5]. B_0 = 0.5 / 2.5 = 0.2; B_1 = 1 / (1 + 5) = 1/6.
    assert advantages[0, :2].tolist() == pytest.approx([0.8, 5 / 6], rel=1e-6)
    assert advantages[1, :2].tolist() == pytest.approx([-0.2, -1 / 6], rel=1e-6)


def _multi_turn_case():
    """Two responses of one group: row 0 has a tool token (mask 0) at position 1, row 1 ends one early.
    Every token's 1 - 2 pi + sum pi^2 is 0.5."""
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 0]])
    old_log_probs = torch.full((2, 4), LN(0.5))
    return rewards, mask, old_log_probs, torch.full((2, 4), 0.5), _uids("a", "a")


def test_tir_baseline_lines_the_group_up_by_generated_token():
    rewards, mask, old_log_probs, sum_pi_squared, uids = _multi_turn_case()
    advantages, returns = compute_multi_turn_optimal_token_baseline_advantage(
        rewards, mask, uids, old_log_probs, sum_pi_squared
    )
    # Each row's own tokens: G = [1, 1, 1] and [0, 0, 0], W = [0.5, 1, 1.5] for both: B_k = 0.5 for k = 0, 1, 2.
    # Both have 3 tokens, so no zero tail. The advantages go back to each row's own positions.
    assert advantages.tolist() == [pytest.approx([0.5, 0.0, 0.5, 0.5]), pytest.approx([-0.5, -0.5, -0.5, 0.0])]
    assert returns.tolist() == [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]


def test_position_baseline_on_the_same_multi_turn_case():
    rewards, mask, old_log_probs, sum_pi_squared, uids = _multi_turn_case()
    advantages, _ = compute_optimal_token_baseline_advantage(rewards, mask, uids, old_log_probs, sum_pi_squared)
    # By position: t=0 both (B = 0.5); t=1 only row 1 (B = 0); t=2 W = 1 and 1.5: B = 1 / 2.5 = 0.4;
    # t=3 only row 0 (B = 1). Both have 3 tokens: no zero tail.
    assert advantages.tolist() == [pytest.approx([0.5, 0.0, 0.6, 0.0]), pytest.approx([-0.5, 0.0, -0.4, 0.0])]


def test_tir_rows_without_tokens_take_no_part():
    rewards, mask, old_log_probs, sum_pi_squared, _ = _multi_turn_case()
    rewards = torch.cat([rewards, torch.zeros(1, 4)])
    mask = torch.cat([mask, torch.zeros(1, 4, dtype=mask.dtype)])
    old_log_probs = torch.cat([old_log_probs, torch.zeros(1, 4)])
    sum_pi_squared = torch.cat([sum_pi_squared, torch.zeros(1, 4)])
    # A third row of group a without a single token: it neither enters the sums nor counts as a member.
    advantages, _ = compute_multi_turn_optimal_token_baseline_advantage(
        rewards, mask, _uids("a", "a", "a"), old_log_probs, sum_pi_squared
    )
    assert advantages[:2].tolist() == [pytest.approx([0.5, 0.0, 0.5, 0.5]), pytest.approx([-0.5, -0.5, -0.5, 0.0])]
    assert advantages[2].tolist() == [0.0] * 4


def test_otb_estimators_ask_for_the_log_prob_pass_outputs_and_the_rollout_weights():
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        inputs = {"index", "old_log_probs", "sum_pi_squared", "rollout_is_weights"}
        traits = ADV_ESTIMATORS.traits(name)
        assert traits["requires"] == inputs and not traits["needs_critic"]
    assert get_adv_estimator_fn("tir_optimal_token_baseline") is compute_multi_turn_optimal_token_baseline_advantage


def _reference(rewards, mask, uids, old_log_probs, sum_pi_squared, by_generated_token):
    """The formula row by row and position by position, with the group's members found by a Python loop."""
    mask = mask.bool()
    returns = (rewards * mask).flip(-1).cumsum(-1).flip(-1)
    weights = ((1 - 2 * old_log_probs.exp() + sum_pi_squared) * mask).cumsum(-1)
    rows = range(len(uids))
    if by_generated_token:  # each row's own tokens, in order
        seq = {i: (returns[i][mask[i]], weights[i][mask[i]]) for i in rows}
    else:
        seq = {i: (returns[i], weights[i] * mask[i]) for i in rows}
    lengths = {i: int(mask[i].sum()) for i in rows}
    advantages = torch.zeros_like(rewards)
    for i in rows:
        members = [j for j in rows if uids[j] == uids[i] and (lengths[j] > 0 or not by_generated_token)]
        g, w = seq[i]
        baseline = torch.zeros_like(g)
        if len(members) > 1:
            for k in range(len(g)):
                at_k = [(seq[j][0][k], seq[j][1][k]) for j in members if k < len(seq[j][0])]
                baseline[k] = sum(gj * wj for gj, wj in at_k) / (sum(wj for _, wj in at_k) + 1e-8)
            others = sorted(lengths[j] for j in members if j != i)
            if lengths[i] > others[-1]:
                baseline[others[-1] :] = 0.0
        if by_generated_token:
            advantages[i][mask[i]] = g - baseline
        else:
            advantages[i] = (g - baseline) * mask[i]
    return advantages


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("by_generated_token", [False, True])
def test_vectorised_baselines_equal_the_per_group_loop(seed, by_generated_token):
    generator = torch.Generator().manual_seed(seed)
    rows, width = 9, 7
    mask = torch.rand(rows, width, generator=generator) < 0.7
    mask[4] = False  # a row without tokens
    rewards = torch.randn(rows, width, generator=generator, dtype=torch.float64)
    logits = torch.randn(rows, width, 5, generator=generator, dtype=torch.float64)
    probs = logits.softmax(-1)
    old_log_probs, sum_pi_squared = probs[..., 0].log(), (probs**2).sum(-1)
    uids = _uids(*"aaabbbbcd")
    estimate = (
        compute_multi_turn_optimal_token_baseline_advantage
        if by_generated_token
        else compute_optimal_token_baseline_advantage
    )
    advantages, _ = estimate(rewards, mask, uids, old_log_probs, sum_pi_squared)
    expected = _reference(rewards, mask, uids, old_log_probs, sum_pi_squared, by_generated_token)
    torch.testing.assert_close(advantages, expected)
