"""``actor_rollout_ref.hybrid_engine=false``: the rollout on a pool of its own, one step ahead of training.

verl's one-step-off policy (``verl.experimental.one_step_off_policy``; AReaL, arXiv 2505.24298, for the
asynchronous idea): while the actor trains on step k's samples, the rollout pool generates step k+1's with the
weights from before step k's update, so every sample is exactly one update stale (step 1's are on-policy).
The top-level ``rollout.nnodes`` x ``rollout.n_gpus_per_node`` sizes that pool, which fully async training and
verl's V1 ``separate_async`` use too. What the driver cannot do one
step ahead is refused here, before anything starts.
"""

from __future__ import annotations

from hybridflow.algos import ADV_ESTIMATORS
from hybridflow.config.schema import PPOTrainerConfig

KEY = "actor_rollout_ref.hybrid_engine=false"
SEPARATE_ASYNC_KEY = "trainer.v1.trainer_mode=separate_async"


def one_step_off(config: PPOTrainerConfig) -> bool:
    """The rollout runs on its own pool: one step ahead of training, fully async (``fully_async_options``), or
    verl's V1 ``separate_async`` (``v1_trainer_options``)."""
    return not config.actor_rollout_ref.hybrid_engine or config.trainer.v1.trainer_mode == "separate_async"


def pool_key(config: PPOTrainerConfig) -> str:
    """The setting that gave this run a rollout pool of its own, as errors name it."""
    return SEPARATE_ASYNC_KEY if config.trainer.v1.trainer_mode == "separate_async" else KEY


def rollout_pool_processes(config: PPOTrainerConfig) -> int:
    """Processes of the rollout's own pool (0 with the hybrid engine)."""
    return config.rollout.nnodes * config.rollout.n_gpus_per_node if one_step_off(config) else 0


def rollout_pool_errors(config: PPOTrainerConfig) -> list[str]:
    """Why ``config`` cannot run its rollout on a pool of its own (none: it can, or the hybrid engine runs)."""
    if not one_step_off(config):
        return []
    key_name = pool_key(config)
    hybrid = "hybrid_engine=true" if key_name == KEY else "trainer.v1.trainer_mode=sync"
    errors = [
        f"rollout.{key}={getattr(config.rollout, key)} must be >= 1 (the rollout pool of {key_name})"
        for key in ("nnodes", "n_gpus_per_node")
        if getattr(config.rollout, key) < 1
    ]
    if config.trainer.local_mode:
        errors.append(
            f"{key_name} runs the rollout in processes of its own, which trainer.local_mode=true does not "
            f"start; set trainer.local_mode=false or {hybrid}"
        )
    if config.algorithm.filter_groups.enable:
        errors.append(
            f"{key_name} generates ahead of training, but dynamic sampling (algorithm.filter_groups.enable=true) "
            "decides how many batches a step needs after scoring them; turn one of them off"
        )
    estimator = config.algorithm.adv_estimator
    if estimator in ADV_ESTIMATORS and "reward_baselines" in ADV_ESTIMATORS.traits(estimator)["requires"]:
        errors.append(
            f"{key_name} generates ahead of training, but algorithm.adv_estimator={estimator} needs a greedy "
            f"response from the current policy each step; use {hybrid} with it"
        )
    return errors


def unread_pool_options(config: PPOTrainerConfig) -> list[str]:
    """The rollout pool's keys set to a non-default value in a run with the hybrid engine, which reads none."""
    if one_step_off(config):
        return []
    defaults = PPOTrainerConfig()
    values = {
        "rollout.nnodes": (config.rollout.nnodes, defaults.rollout.nnodes),
        "rollout.n_gpus_per_node": (config.rollout.n_gpus_per_node, defaults.rollout.n_gpus_per_node),
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes": (
            config.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes,
            defaults.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes,
        ),
    }
    return [
        f"{key}={value} (read only with {KEY}; the hybrid engine copies the weights in place, tensor by tensor)"
        for key, (value, default) in values.items()
        if value != default
    ]
