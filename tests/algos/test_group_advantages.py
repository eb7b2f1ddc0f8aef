import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS, get_adv_estimator_fn
from hybridflow.algos.group_advantages import (
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)


def _outcome_batch(scores: list[float], lengths: list[int], width: int | None = None):
    """Rewards with each score on the sample's last response token, right-padded masks."""
    width = width or max(lengths)
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for row, (score, length) in enumerate(zip(scores, lengths)):
        mask[row, :length] = 1
        rewards[row, length - 1] = score
    return rewards, mask


def _uids(*labels: str) -> np.ndarray:
    return np.array(labels, dtype=object)


def _per_sample(advantages: torch.Tensor) -> list[float]:
    return advantages[:, 0].tolist()


def test_grpo_hand_case_and_dr_grpo():
    rewards, mask = _outcome_batch([1, 0, 1, 2, 4, 7], [2, 3, 1, 3, 2, 3])
    index = _uids("a", "a", "a", "b", "b", "c")
    advantages, returns = compute_grpo_outcome_advantage(rewards, mask, index)
    # a: mean 2/3, std sqrt(1/3); b: mean 3, std sqrt(2); c alone: mean 0, std 1
    expected = [0.577350, -1.154700, 0.577350, -0.707107, 0.707107, 7.0]
    assert _per_sample(advantages) == pytest.approx(expected, abs=1e-5)
    assert torch.equal(advantages, returns)
    assert (advantages[mask == 0] == 0).all()
    assert advantages[1].tolist() == pytest.approx([-1.154700] * 3, abs=1e-5)
    dr_grpo, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert _per_sample(dr_grpo) == pytest.approx([1 / 3, -2 / 3, 1 / 3, -1.0, 1.0, 7.0], abs=1e-6)


def test_grpo_rejects_index_of_wrong_length():
    rewards, mask = _outcome_batch([1, 3], [1, 1])
    with pytest.raises(ValueError, match="index has 3 uids but token_level_rewards has 2 rows"):
        compute_grpo_outcome_advantage(rewards, mask, _uids("a", "a", "b"))


def test_grpo_passk_hand_case():
    rewards, mask = _outcome_batch([1, 4, 2, 5, 5], [1, 1, 1, 1, 1])
    index = _uids("a", "a", "a", "b", "b")
    advantages, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index)
    # a: best 4, runner-up 2, margin 2 over std sqrt(21/9); b: tie, margin 0
    assert _per_sample(advantages) == pytest.approx([0.0, 1.309307, 0.0, 0.0, 0.0], abs=1e-5)
    unnormalised, _ = compute_grpo_passk_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert _per_sample(unnormalised) == [0.0, 2.0, 0.0, 0.0, 0.0]


def test_grpo_passk_needs_two_samples_per_group():
    rewards, mask = _outcome_batch([1, 4, 2], [1, 1, 1])
    with pytest.raises(ValueError, match="uid 'lonely' has 1"):
        compute_grpo_passk_outcome_advantage(rewards, mask, _uids("a", "a", "lonely"))


def test_rloo_hand_case():
    rewards, mask = _outcome_batch([1, 0, 1, 2, 4, 7], [1] * 6)
    advantages, _ = compute_rloo_outcome_advantage(rewards, mask, _uids("a", "a", "a", "b", "b", "c"))
    # each minus the mean of the others; c alone keeps its score
    assert _per_sample(advantages) == pytest.approx([0.5, -1.0, 0.5, -2.0, 2.0, 7.0])


def test_rloo_vectorized_gives_a_group_of_one_zero_hand_case():
    rewards, mask = _outcome_batch([1, 0, 1, 2, 4, 7], [1] * 6)
    advantages, returns = compute_rloo_vectorized_outcome_advantage(rewards, mask, _uids("a", "a", "a", "b", "b", "c"))
    # as rloo (each minus the mean of the others), but c, alone, gets 0 as in verl's rloo_vectorized
    assert _per_sample(advantages) == pytest.approx([0.5, -1.0, 0.5, -2.0, 2.0, 0.0])
    assert torch.equal(advantages, returns)
    assert not ADV_ESTIMATORS.is_alias("rloo_vectorized")


def test_grpo_vectorized_is_an_alias_of_grpo():
    assert ADV_ESTIMATORS.is_alias("grpo_vectorized") and ADV_ESTIMATORS.canonical("grpo_vectorized") == "grpo"
    rewards, mask = _outcome_batch([1, 0, 2, 4, 7], [2, 1, 1, 3, 2])
    uids = _uids("a", "a", "b", "b", "c")
    alias = get_adv_estimator_fn("grpo_vectorized")(
        token_level_rewards=rewards, response_mask=mask, index=uids, norm_adv_by_std_in_grpo=True
    )
    original = compute_grpo_outcome_advantage(rewards, mask, uids)
    # a: mean 0.5, std sqrt(0.5); b: mean 3, std sqrt(2); c alone: mean 0, std 1
    half, root2 = 0.5 / (0.5**0.5 + 1e-6), 1 / (2**0.5 + 1e-6)
    assert _per_sample(original[0]) == pytest.approx([half, -half, -root2, root2, 7 / (1 + 1e-6)], rel=1e-6)
    for alias_tensor, original_tensor in zip(alias, original):
        assert torch.equal(alias_tensor, original_tensor)


def test_reinforce_plus_plus_baseline_hand_case():
    rewards, mask = _outcome_batch([1, 3, 0, 4], [1] * 4, width=2)
    advantages, _ = compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, _uids("a", "a", "b", "b"))
    # centred [-1, 1, -2, 2], whitened by the unbiased std sqrt(10/3); padding stays 0
    assert _per_sample(advantages) == pytest.approx([-0.547723, 0.547723, -1.095445, 1.095445], abs=1e-5)
    assert advantages[:, 1].tolist() == [0.0] * 4


def test_opo_length_weighted_baseline_hand_case():
    rewards, mask = _outcome_batch([1, 0, 1, 5], [2, 1, 3, 4])
    advantages, _ = compute_opo_outcome_advantage(rewards, mask, _uids("a", "a", "a", "b"))
    # a: baseline (2*1 + 1*0 + 3*1) / 6 = 5/6; b alone: baseline 0
    assert _per_sample(advantages) == pytest.approx([1 / 6, -5 / 6, 1 / 6, 5.0])


def test_gpg_hand_case():
    rewards, mask = _outcome_batch([1, 0, 0, 0], [1] * 4)
    advantages, _ = compute_gpg_outcome_advantage(rewards, mask, _uids("a", "a", "b", "b"), f_norm=2.0)
    # alpha = 4 samples / 1 non-zero score = 4; a mean 0.5, b mean 0; divided by f_norm 2
    assert _per_sample(advantages) == [1.0, -1.0, 0.0, 0.0]


def _reference_outcome_advantages(name: str, scores: list[float], lengths: list[int], uids: list[str]) -> list[float]:
    """Per-sample loops over each paper's definition, to compare the vectorised estimators with."""
    out = []
    for i, uid in enumerate(uids):
        group = [j for j in range(len(uids)) if uids[j] == uid]
        others = [scores[j] for j in group if j != i]
        group_scores = torch.tensor([scores[j] for j in group])
        mean = float(group_scores.mean()) if len(group) > 1 else 0.0
        std = float(group_scores.std()) if len(group) > 1 else 1.0
        if name == "grpo":
            out.append((scores[i] - mean) / (std + 1e-6))
        elif name == "rloo":
            out.append(scores[i] - sum(others) / len(others) if others else scores[i])
        elif name == "rloo_vectorized":
            out.append(scores[i] - sum(others) / len(others) if others else 0.0)
        elif name == "opo":
            weighted = sum(lengths[j] * scores[j] for j in group) / sum(lengths[j] for j in group)
            out.append(scores[i] - (weighted if len(group) > 1 else 0.0))
        elif name == "gpg":
            alpha = len(scores) / max(1, sum(s != 0 for s in scores))
            out.append(alpha * (scores[i] - mean))
    return out


_ESTIMATORS = {
    "grpo": compute_grpo_outcome_advantage,
    "rloo": compute_rloo_outcome_advantage,
    "rloo_vectorized": compute_rloo_vectorized_outcome_advantage,
    "opo": compute_opo_outcome_advantage,
    "gpg": compute_gpg_outcome_advantage,
}


@st.composite
def _grouped_outcomes(draw):
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=6))
    uids = [f"p{g}" for g, size in enumerate(sizes) for _ in range(size)]
    order = draw(st.permutations(range(len(uids))))
    uids = [uids[i] for i in order]
    scores = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0]), min_size=len(uids), max_size=len(uids)))
    lengths = draw(st.lists(st.integers(1, 5), min_size=len(uids), max_size=len(uids)))
    return uids, scores, lengths


@settings(max_examples=60, deadline=None)
@given(data=_grouped_outcomes(), name=st.sampled_from(sorted(_ESTIMATORS)))
def test_vectorised_estimators_equal_per_sample_definition(data, name):
    uids, scores, lengths = data
    rewards, mask = _outcome_batch(scores, lengths, width=5)
    advantages, _ = _ESTIMATORS[name](rewards, mask, np.array(uids, dtype=object))
    expected = _reference_outcome_advantages(name, scores, lengths, uids)
    assert _per_sample(advantages) == pytest.approx(expected, abs=1e-4)
    assert (advantages[mask == 0] == 0).all()
    for row in range(len(uids)):
        assert torch.allclose(advantages[row, : lengths[row]], advantages[row, 0])


@settings(max_examples=60, deadline=None)
@given(data=_grouped_outcomes(), normalise=st.booleans())
def test_grpo_advantages_have_zero_mean_per_group(data, normalise):
    uids, scores, lengths = data
    rewards, mask = _outcome_batch(scores, lengths, width=5)
    advantages, _ = compute_grpo_outcome_advantage(
        rewards, mask, np.array(uids, dtype=object), norm_adv_by_std_in_grpo=normalise
    )
    for uid in set(uids):
        members = [i for i, u in enumerate(uids) if u == uid]
        if len(members) > 1:
            assert sum(advantages[i, 0].item() for i in members) == pytest.approx(0.0, abs=1e-4)


@settings(max_examples=60, deadline=None)
@given(data=_grouped_outcomes())
def test_rloo_equals_leave_one_out_definition(data):
    uids, scores, lengths = data
    rewards, mask = _outcome_batch(scores, lengths, width=5)
    advantages, _ = compute_rloo_outcome_advantage(rewards, mask, np.array(uids, dtype=object))
    for i, uid in enumerate(uids):
        others = [scores[j] for j, u in enumerate(uids) if u == uid and j != i]
        expected = scores[i] - sum(others) / len(others) if others else scores[i]
        assert advantages[i, 0].item() == pytest.approx(expected, abs=1e-5)


@settings(max_examples=60, deadline=None)
@given(data=_grouped_outcomes())
def test_grpo_passk_equals_per_group_definition(data):
    uids, scores, lengths = data
    if any(uids.count(u) < 2 for u in uids):
        uids = uids + uids  # every group gets at least 2 samples
        scores, lengths = scores + [s + 0.25 for s in scores], lengths + lengths
    rewards, mask = _outcome_batch(scores, lengths, width=5)
    advantages, _ = compute_grpo_passk_outcome_advantage(rewards, mask, np.array(uids, dtype=object))
    for uid in set(uids):
        members = [i for i, u in enumerate(uids) if u == uid]
        ranked = sorted(members, key=lambda i: (-scores[i], i))
        best, runner_up = ranked[0], ranked[1]
        std = float(torch.tensor([scores[i] for i in members]).std())
        for i in members:
            expected = (scores[best] - scores[runner_up]) / (std + 1e-6) if i == best else 0.0
            assert advantages[i, 0].item() == pytest.approx(expected, abs=1e-4)
