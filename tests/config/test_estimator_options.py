"""The options of GDPO and the optimal token baseline are checked before anything starts, one line each."""

import pytest

from hybridflow.config.load import load_config
from tests.trainer.helpers import compose_config, config_errors

GDPO = "algorithm.adv_estimator=gdpo"
KEYS = "algorithm.gdpo_reward_keys=[score,acc]"
SUM_PI_SQUARED = "actor_rollout_ref.actor.calculate_sum_pi_squared=true"


def test_gdpo_without_reward_keys_is_one_error(base):
    (error,) = config_errors(base + [GDPO])
    assert error.startswith("algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys")
    config = load_config(compose_config(base + [GDPO, KEYS, "algorithm.gdpo_reward_weights=[1.0,0.5]"]))
    assert config.algorithm.gdpo_reward_keys == ["score", "acc"] and config.algorithm.gdpo_reward_weights == [1.0, 0.5]


def test_gdpo_weights_must_match_the_keys(base):
    (error,) = config_errors(base + [GDPO, KEYS, "algorithm.gdpo_reward_weights=[1.0]"])
    assert error == (
        "algorithm.gdpo_reward_weights has 1 entries for 2 gdpo_reward_keys; give one weight per key or set it to "
        "null (all 1)"
    )


def test_gdpo_keys_set_for_another_estimator_are_refused(base):
    errors = config_errors(base + [KEYS, "algorithm.gdpo_reward_weights=[1.0,1.0]"])
    assert errors == [
        f"algorithm.{key} is read only by adv_estimator=gdpo, not 'grpo'; remove it or set algorithm.adv_estimator=gdpo"
        for key in ("gdpo_reward_keys", "gdpo_reward_weights")
    ]


def test_gdpo_with_kl_in_reward_is_refused(base):
    (error,) = config_errors(base + [GDPO, KEYS, "algorithm.use_kl_in_reward=true"])
    assert error.startswith("algorithm.use_kl_in_reward=true has no effect with adv_estimator=gdpo")


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_optimal_token_baseline_needs_sum_pi_squared(base, estimator):
    (error,) = config_errors(base + [f"algorithm.adv_estimator={estimator}"])
    assert error == (
        f"algorithm.adv_estimator={estimator} reads sum_pi_squared from the actor's log-prob pass; "
        "set actor_rollout_ref.actor.calculate_sum_pi_squared=true"
    )
    load_config(compose_config(base + [f"algorithm.adv_estimator={estimator}", SUM_PI_SQUARED]))
