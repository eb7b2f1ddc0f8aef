"""Config rules of the estimators that read more than the token rewards, checked before anything starts.

GDPO (``algorithm.adv_estimator=gdpo``) reads the reward components named in ``algorithm.gdpo_reward_keys``
instead of the token rewards; the optimal token baseline estimators read ``sum_pi_squared``, which the actor
computes only with ``actor_rollout_ref.actor.calculate_sum_pi_squared=true``. Each problem is one line
naming the key and the fix (verl fails on them mid-step, with an assert).
"""

from __future__ import annotations

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS
from hybridflow.config.schema import PPOTrainerConfig

GDPO = "gdpo"


def _gdpo_errors(config: PPOTrainerConfig, is_gdpo: bool) -> list[str]:
    algorithm = config.algorithm
    keys, weights = algorithm.gdpo_reward_keys, algorithm.gdpo_reward_weights
    if not is_gdpo:
        set_keys = [name for name, value in (("gdpo_reward_keys", keys), ("gdpo_reward_weights", weights)) if value]
        return [
            f"algorithm.{name} is read only by adv_estimator=gdpo, not {algorithm.adv_estimator!r}; "
            "remove it or set algorithm.adv_estimator=gdpo"
            for name in set_keys
        ]
    errors = []
    if not keys:
        errors.append(
            "algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the keys of the scoring function's "
            "returned dict to normalise one by one, e.g. algorithm.gdpo_reward_keys=[format_reward,accuracy_reward]"
        )
    elif weights is not None and len(weights) != len(keys):
        errors.append(
            f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(keys)} gdpo_reward_keys; "
            "give one weight per key or set it to null (all 1)"
        )
    if algorithm.use_kl_in_reward:
        errors.append(
            "algorithm.use_kl_in_reward=true has no effect with adv_estimator=gdpo (its advantages come from the "
            "reward components, not the token rewards); set it to false, or use actor_rollout_ref.actor.use_kl_loss"
        )
    return errors


def estimator_option_errors(config: PPOTrainerConfig) -> list[str]:
    """One line per estimator option that is missing, inconsistent or set for an estimator that ignores it."""
    estimator = config.algorithm.adv_estimator
    if estimator not in ADV_ESTIMATORS:
        return []  # reported with the other unknown names
    errors = _gdpo_errors(config, ADV_ESTIMATORS.canonical(estimator) == GDPO)
    requires = ADV_ESTIMATORS.traits(estimator)["requires"]
    if "sum_pi_squared" in requires and not config.actor_rollout_ref.actor.calculate_sum_pi_squared:
        errors.append(
            f"algorithm.adv_estimator={estimator} reads sum_pi_squared from the actor's log-prob pass; "
            "set actor_rollout_ref.actor.calculate_sum_pi_squared=true"
        )
    return errors


def greedy_baseline(config: PPOTrainerConfig) -> bool:
    """ReMax (arXiv 2310.10505): the estimator reads the reward of a greedy response per prompt."""
    estimator = config.algorithm.adv_estimator
    return estimator in ADV_ESTIMATORS and "reward_baselines" in ADV_ESTIMATORS.traits(estimator)["requires"]
