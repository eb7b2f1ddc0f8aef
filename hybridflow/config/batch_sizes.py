"""Batch-size rules of the PPO config: prompts per step, mini-batches and micro-batches per rank.

``data.train_batch_size`` and ``*.ppo_mini_batch_size`` count prompts (x ``rollout.n`` samples); a rank's
micro-batch size is verl's ``*_per_gpu`` key or its deprecated global form divided by the number of ranks
(:func:`hybridflow.workers.config.micro_batch_size_per_rank`). :mod:`hybridflow.config.load` collects
these errors with the others.
"""

from __future__ import annotations

from typing import Any

from hybridflow.config.fully_async_options import fully_async, step_prompts
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.sequence_parallel_options import data_parallel_ranks
from hybridflow.workers.config import ActorRolloutRefConfig, CriticConfig, WorkerConfigError, micro_batch_size_per_rank

ACTOR = "actor_rollout_ref.actor"


def positive(key: str, value: Any) -> list[str]:
    """An error unless ``value`` is None or at least 1."""
    return [] if value is None or value >= 1 else [f"{key}={value} must be a positive integer (or null)"]


def minibatch_errors(
    role: str, train_batch: int, mini: int, micro: int | None, dynamic: bool, n: int, world: int
) -> list[str]:
    """``train_batch`` prompts split into mini-batches of ``mini`` prompts, each sample-split over ``world``
    data-parallel ranks (each Ulysses group one) and then into micro-batches of ``micro`` samples."""
    if mini < 1:
        return [f"{role}.ppo_mini_batch_size={mini} must be >= 1"]
    errors = []
    if train_batch % mini:
        errors.append(
            f"data.train_batch_size={train_batch} is not a multiple of {role}.ppo_mini_batch_size={mini}; "
            f"choose a mini-batch size that divides it (e.g. {_largest_divisor(train_batch, mini)})"
        )
    samples = mini * n
    if samples % world:
        errors.append(
            f"{role}.ppo_mini_batch_size={mini} x rollout.n={n} = {samples} samples do not split over "
            f"{world} worker processes (trainer.nnodes x trainer.n_gpus_per_node); make it a multiple of {world}"
        )
    elif micro is not None and not dynamic and (samples // world) % micro:
        errors.append(
            f"{role}.ppo_micro_batch_size_per_gpu={micro} does not divide the {samples // world} samples "
            f"per rank of a mini-batch; choose a divisor of {samples // world} or set {role}.use_dynamic_bsz=true"
        )
    return errors


def _largest_divisor(number: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, min(number, at_most)) + 1) if number % d == 0)


def micro_batch_sizes(
    arr: ActorRolloutRefConfig, critic: CriticConfig, world: int
) -> tuple[dict[str, int | None], list[str]]:
    """Each micro-batch key's size per rank (verl's ``*_per_gpu`` or its deprecated global form), by key; a
    global form divides over the data-parallel ranks (``world`` over each role's Ulysses size)."""
    actor_ranks = data_parallel_ranks(
        world, arr.actor.ulysses_sequence_parallel_size, arr.actor.fsdp_config.tensor_parallel_size
    )
    ranks = {
        f"{ACTOR}.ppo_micro_batch_size": actor_ranks,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size": actor_ranks,
        "actor_rollout_ref.ref.log_prob_micro_batch_size": data_parallel_ranks(
            world, arr.ref.ulysses_sequence_parallel_size, arr.ref.fsdp_config.tensor_parallel_size
        ),
        "critic.ppo_micro_batch_size": data_parallel_ranks(
            world, critic.ulysses_sequence_parallel_size, critic.model.fsdp_config.tensor_parallel_size
        ),
        "critic.forward_micro_batch_size": data_parallel_ranks(
            world, critic.ulysses_sequence_parallel_size, critic.model.fsdp_config.tensor_parallel_size
        ),
    }
    pairs = {
        f"{ACTOR}.ppo_micro_batch_size": (arr.actor.ppo_micro_batch_size_per_gpu, arr.actor.ppo_micro_batch_size),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size": (
            arr.rollout.log_prob_micro_batch_size_per_gpu,
            arr.rollout.log_prob_micro_batch_size,
        ),
        "actor_rollout_ref.ref.log_prob_micro_batch_size": (
            arr.ref.log_prob_micro_batch_size_per_gpu,
            arr.ref.log_prob_micro_batch_size,
        ),
        "critic.ppo_micro_batch_size": (critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size),
        "critic.forward_micro_batch_size": (critic.forward_micro_batch_size_per_gpu, critic.forward_micro_batch_size),
    }
    sizes, errors = {}, []
    for key, (per_gpu, global_size) in pairs.items():
        bad = positive(f"{key}_per_gpu", per_gpu) + positive(key, global_size)
        if not bad:
            try:
                sizes[key] = micro_batch_size_per_rank(per_gpu, global_size, ranks[key], key)
            except WorkerConfigError as error:
                bad.append(str(error))
        errors += bad
    return sizes, errors


def batch_size_errors(config: PPOTrainerConfig, world: int, with_critic: bool) -> list[str]:
    """Every batch-size rule the config breaks on ``world`` worker processes (the critic's only ``with_critic``)."""
    data, actor = config.data, config.actor_rollout_ref.actor
    n = config.actor_rollout_ref.rollout.n
    positives = {
        # Fully async trains on require_batches mini-batches a step instead (verl's scripts set it to 0)
        **({} if fully_async(config) else {"data.train_batch_size": data.train_batch_size}),
        "data.val_batch_size": data.val_batch_size,
        "actor_rollout_ref.rollout.n": n,
        "trainer.n_gpus_per_node": config.trainer.n_gpus_per_node,
        "trainer.nnodes": config.trainer.nnodes,
    }
    errors = [error for key, value in positives.items() for error in positive(key, value)]
    if errors:
        return errors
    micro, errors = micro_batch_sizes(config.actor_rollout_ref, config.critic, world)
    errors += minibatch_errors(
        "actor_rollout_ref.actor",
        step_prompts(config),
        actor.ppo_mini_batch_size,
        micro.get(f"{ACTOR}.ppo_micro_batch_size"),
        actor.use_dynamic_bsz,
        n,
        data_parallel_ranks(world, actor.ulysses_sequence_parallel_size, actor.fsdp_config.tensor_parallel_size),
    )
    if with_critic:
        critic = config.critic
        errors += minibatch_errors(
            "critic",
            step_prompts(config),
            critic.ppo_mini_batch_size,
            micro.get("critic.ppo_micro_batch_size"),
            critic.use_dynamic_bsz,
            critic.rollout_n,
            data_parallel_ranks(
                world, critic.ulysses_sequence_parallel_size, critic.model.fsdp_config.tensor_parallel_size
            ),
        )
        if critic.rollout_n != n:
            errors.append(
                f"critic.rollout_n={critic.rollout_n} differs from actor_rollout_ref.rollout.n={n}; "
                "remove the critic.rollout_n override (it follows rollout.n)"
            )
    return errors + _reward_model_errors(config)


def _reward_model_errors(config: PPOTrainerConfig) -> list[str]:
    if not config.reward_model.enable:
        return []
    return positive("reward_model.micro_batch_size_per_gpu", config.reward_model.micro_batch_size_per_gpu)
