from enum import Enum

import numpy as np
import pytest
import torch

import hybridflow.algos  # noqa: F401  (registers the built-in estimators)
from hybridflow.algos.advantage_registry import ADV_ESTIMATORS, get_adv_estimator_fn, register_adv_est
from hybridflow.registry import UnknownNameError

BUILT_IN = [
    "gae",
    "gpg",
    "grpo",
    "grpo_passk",
    "opo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
    "rloo_vectorized",
    "grpo_vectorized",
    "gdpo",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
]


def test_every_built_in_estimator_is_reachable_by_its_config_string():
    assert set(BUILT_IN) <= set(ADV_ESTIMATORS.names())
    for name in BUILT_IN:
        assert callable(get_adv_estimator_fn(name))


def test_unknown_estimator_lists_known_names_and_config_key():
    with pytest.raises(UnknownNameError) as error:
        get_adv_estimator_fn("gpro")
    message = str(error.value)
    assert message.startswith("algorithm.adv_estimator='gpro' is not a registered advantage estimator")
    assert all(name in message for name in BUILT_IN)


def test_required_inputs_per_estimator_are_traits_of_the_entry():
    traits = ADV_ESTIMATORS.traits
    assert traits("gae")["needs_critic"] and traits("gae")["requires"] == {"values"}
    assert traits("remax")["requires"] == {"reward_baselines"}
    assert traits("reinforce_plus_plus")["requires"] == frozenset()
    for name in (
        "grpo",
        "grpo_vectorized",
        "grpo_passk",
        "rloo",
        "rloo_vectorized",
        "opo",
        "gpg",
        "reinforce_plus_plus_baseline",
    ):
        assert traits(name)["requires"] == {"index"} and not traits(name)["needs_critic"]
    with pytest.raises(UnknownNameError):
        traits("nope")


def test_enum_names_are_accepted_like_verl():
    class Estimator(str, Enum):
        GRPO = "grpo"

    assert get_adv_estimator_fn(Estimator.GRPO) is get_adv_estimator_fn("grpo")


def test_register_rejects_unknown_inputs():
    with pytest.raises(ValueError, match="unknown inputs \\['critic_values'\\]"):
        register_adv_est("bad_estimator", requires=("critic_values",))


def test_every_estimator_accepts_the_generic_keyword_call():
    """The trainer calls each with the same keywords plus what it declared; extra options are ignored."""
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    mask = torch.ones(4, 2)
    batch_inputs = {
        "values": torch.full((4, 2), 0.5),
        "index": np.array(["a", "a", "b", "b"], dtype=object),
        "reward_baselines": torch.tensor([0.5, 0.5, 0.5, 0.5]),
        "old_log_probs": torch.full((4, 2), -0.5),
        "sum_pi_squared": torch.full((4, 2), 0.5),
        "rollout_is_weights": torch.full((4, 2), 1.5),
        "non_tensor_batch": {"score": np.array([1.0, 0.0, 1.0, 2.0], dtype=object)},
    }
    options = {
        "gamma": 1.0,
        "lam": 0.95,
        "norm_adv_by_std_in_grpo": True,
        "gdpo_reward_keys": ["score"],
        "gdpo_reward_weights": None,
    }
    for name in BUILT_IN:
        inputs = {key: batch_inputs[key] for key in ADV_ESTIMATORS.traits(name)["requires"]}
        advantages, returns = get_adv_estimator_fn(name)(
            token_level_rewards=rewards, response_mask=mask, **options, **inputs
        )
        assert advantages.shape == returns.shape == (4, 2), name
        assert torch.isfinite(advantages).all() and torch.isfinite(returns).all(), name
