import numpy as np
import pytest
import torch

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS, get_adv_estimator_fn
from hybridflow.algos.gdpo import GDPOInputError, compute_gdpo_outcome_advantage
from hybridflow.algos.group_advantages import compute_grpo_outcome_advantage
from hybridflow.algos.masked_stats import masked_whiten

UIDS = np.array(["a", "a", "b", "b"], dtype=object)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
COLUMNS = {
    "format_reward": np.array([1.0, 0.0, 1.0, 1.0], dtype=object),
    "accuracy_reward": np.array([1.0, 0.0, 0.0, 1.0], dtype=object),
    "uid": UIDS,
}


def test_gdpo_normalises_each_component_in_its_group_then_whitens_the_weighted_sum():
    options = {"gdpo_reward_keys": ["format_reward", "accuracy_reward"], "gdpo_reward_weights": [1.0, 2.0]}
    rewards = torch.zeros(4, 3)  # not read: the components come from the batch's columns
    advantages, returns = compute_gdpo_outcome_advantage(rewards, MASK, UIDS, **options, non_tensor_batch=COLUMNS)
    # Each 2-sample group with scores {0, 1} normalises to -h, +h with h = 0.5 / (sqrt(0.5) + 1e-6);
    # a group with equal scores to 0. format: a -> [h, -h], b -> [0, 0]; accuracy: a -> [h, -h], b -> [-h, h].
    # 1 * format + 2 * accuracy = [3h, -3h, -2h, 2h], on 2 + 1 + 3 + 2 = 8 tokens:
    # mean (2 * 3h - 3h - 3 * 2h + 2 * 2h) / 8 = h / 8; then divided by the tokens' unbiased std.
    h = 0.5 / (0.5**0.5 + 1e-6)
    per_token = torch.tensor([3 * h] * 2 + [-3 * h] + [-2 * h] * 3 + [2 * h] * 2, dtype=torch.float64)
    mean = per_token.mean()
    std = ((per_token - mean) ** 2).sum().div(7).add(1e-8).sqrt()
    expected = ((torch.tensor([3 * h, -3 * h, -2 * h, 2 * h], dtype=torch.float64) - mean) / std).tolist()
    # float32 arithmetic, about ten roundings of 6e-8 each between the inputs and the result
    assert advantages[:, 0].tolist() == pytest.approx(expected, rel=1e-5)
    assert (advantages[MASK == 0] == 0).all() and torch.equal(advantages, returns)


def test_one_component_is_grpo_whitened():
    columns = {"score": np.array([0.2, 0.9, 0.4, 0.4], dtype=object)}
    rewards = torch.zeros(4, 3)
    rewards[:, 0] = torch.tensor([0.2, 0.9, 0.4, 0.4])
    gdpo, _ = compute_gdpo_outcome_advantage(rewards, MASK, UIDS, gdpo_reward_keys=["score"], non_tensor_batch=columns)
    grpo, _ = compute_grpo_outcome_advantage(rewards, MASK, UIDS)
    torch.testing.assert_close(gdpo, masked_whiten(grpo, MASK) * MASK)
    # Called without a batch or keys (as verl allows), the summed token rewards are the one component.
    direct, _ = compute_gdpo_outcome_advantage(rewards, MASK, UIDS)
    torch.testing.assert_close(direct, gdpo)


def test_norm_adv_by_std_in_grpo_false_only_centres_each_component():
    advantages, _ = compute_gdpo_outcome_advantage(
        torch.zeros(4, 3),
        MASK,
        UIDS,
        norm_adv_by_std_in_grpo=False,
        gdpo_reward_keys=["format_reward", "accuracy_reward"],
        non_tensor_batch=COLUMNS,
    )
    # format centred: [0.5, -0.5, 0, 0]; accuracy: [0.5, -0.5, -0.5, 0.5]; sum [1, -1, -0.5, 0.5]: the same
    # ratios as [2, -2, -1, 1], so whitening gives what the unnormalised sum [2, -2, -1, 1] would.
    unnormalised = torch.tensor([2.0, -2.0, -1.0, 1.0]).unsqueeze(-1) * MASK
    torch.testing.assert_close(advantages, masked_whiten(unnormalised, MASK) * MASK)


def test_missing_keys_columns_or_weights_are_one_line_errors():
    rewards = torch.zeros(4, 3)
    with pytest.raises(GDPOInputError, match="needs algorithm.gdpo_reward_keys"):
        compute_gdpo_outcome_advantage(rewards, MASK, UIDS, non_tensor_batch=COLUMNS)
    with pytest.raises(GDPOInputError, match=r"\['length_reward'\] are not columns of the batch"):
        compute_gdpo_outcome_advantage(
            rewards, MASK, UIDS, gdpo_reward_keys=["length_reward"], non_tensor_batch=COLUMNS
        )
    with pytest.raises(GDPOInputError, match="has 1 entries for 2 gdpo_reward_keys"):
        options = {"gdpo_reward_keys": ["format_reward", "accuracy_reward"], "gdpo_reward_weights": [1.0]}
        compute_gdpo_outcome_advantage(rewards, MASK, UIDS, **options, non_tensor_batch=COLUMNS)


def test_gdpo_asks_for_the_batch_columns():
    assert ADV_ESTIMATORS.traits("gdpo")["requires"] == {"index", "non_tensor_batch"}
    assert get_adv_estimator_fn("gdpo") is compute_gdpo_outcome_advantage
