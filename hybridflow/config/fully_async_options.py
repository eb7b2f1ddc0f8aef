"""``async_training.enable=true``: fully async training, the rollout pool generating while the actor trains.

verl's fully async policy (``verl.experimental.fully_async_policy``, after AReaL, arXiv 2505.24298): each
training step takes ``required`` = ``async_training.require_batches`` x ``actor.ppo_mini_batch_size`` finished
prompt groups from a queue the rollout pool fills; every ``trigger_parameter_sync_step`` steps the actor's weights
are synced into the pool. Between two syncs the pool starts at most ``max_required`` = int(required x (1 +
``staleness_threshold``) x ``trigger_parameter_sync_step``) prompts, counting those queued or in flight at the
sync (verl's ``staleness_samples``), so no sample is more than a bounded number of versions old. The run
generates ``rollout.total_rollout_steps`` prompts (capped by the data's epochs) and trains on them in steps of
``required``; ``trainer.save_freq`` and ``trainer.test_freq`` count weight versions, as in verl. With
``partial_rollout`` a sync lands in the generation in flight (single-turn; the hf engine keeps the keys and values
drawn so far, vLLM computes them again under the new weights). What this mode cannot do is refused here, before
anything starts.
"""

from __future__ import annotations

from typing import Any

from hybridflow.config.rollout_pool_options import one_step_off, rollout_pool_processes
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.v1_trainer_options import separate_async

KEY = "async_training.enable=true"


def fully_async(config: PPOTrainerConfig) -> bool:
    """Fully async training (its rollout pool is the one of ``actor_rollout_ref.hybrid_engine=false``)."""
    return config.async_training.enable


def partial_rollout(config: PPOTrainerConfig) -> bool:
    """Weight syncs land between the decode steps of the generation in flight, which goes on with the new weights
    (verl: only with ``staleness_threshold > 0``; at 0 nothing is in flight at a sync)."""
    settings = config.async_training
    return fully_async(config) and settings.partial_rollout and settings.staleness_threshold > 0


def required_samples(config: PPOTrainerConfig) -> int:
    """Prompt groups per training step: ``require_batches`` mini-batches."""
    return config.async_training.require_batches * config.actor_rollout_ref.actor.ppo_mini_batch_size


def step_prompts(config: PPOTrainerConfig) -> int:
    """Prompts each pass of phases 3 to 7 trains on (x ``rollout.n`` samples): a step's, or with
    ``separate_async`` one mini-batch's."""
    if separate_async(config):
        return config.actor_rollout_ref.actor.ppo_mini_batch_size
    return required_samples(config) if fully_async(config) else config.data.train_batch_size


def max_required_samples(config: PPOTrainerConfig) -> int:
    """Prompts the pool may start per weight version, those queued or in flight at the sync included."""
    settings = config.async_training
    return int(required_samples(config) * (1 + settings.staleness_threshold) * settings.trigger_parameter_sync_step)


def concurrent_samples(config: PPOTrainerConfig) -> int:
    """Prompts in flight at once: ``concurrent_samples_per_replica`` on each rollout replica, an engine split over
    ``tensor_model_parallel_size`` of the pool's processes (verl's ``fully_async_rollouter.py``: active servers x
    the per-replica count)."""
    replicas = rollout_pool_processes(config) // config.actor_rollout_ref.rollout.tensor_model_parallel_size
    return config.async_training.concurrent_samples_per_replica * replicas


def steps_per_version(config: PPOTrainerConfig) -> int:
    """Training steps between two weight syncs (1 unless fully async)."""
    return config.async_training.trigger_parameter_sync_step if fully_async(config) else 1


def training_steps(config: PPOTrainerConfig, prompts_per_epoch: int) -> int:
    """The run's training steps: its prompts (``rollout.total_rollout_steps``, at most every epoch's) in steps
    of ``required_samples``, at most ``trainer.total_training_steps`` when that is set."""
    prompts = prompts_per_epoch * config.trainer.total_epochs
    if config.rollout.total_rollout_steps is not None:
        prompts = min(prompts, config.rollout.total_rollout_steps)
    steps = prompts // required_samples(config)
    return min(steps, config.trainer.total_training_steps) if config.trainer.total_training_steps else steps


def fully_async_errors(config: PPOTrainerConfig) -> list[str]:
    """Why ``config`` cannot train fully async (none: it can, or it does not ask to)."""
    if not fully_async(config):
        return []
    settings = config.async_training
    errors = []
    if not one_step_off(config):
        errors.append(
            f"{KEY} generates on a rollout pool of its own; set actor_rollout_ref.hybrid_engine=false "
            "(and size the pool with rollout.nnodes / rollout.n_gpus_per_node)"
        )
    if settings.staleness_threshold < 0:
        errors.append(
            f"async_training.staleness_threshold={settings.staleness_threshold} must be >= 0 "
            "(0: every sample from the newest weights)"
        )
    for key in ("trigger_parameter_sync_step", "require_batches", "concurrent_samples_per_replica"):
        if getattr(settings, key) < 1:
            errors.append(f"async_training.{key}={getattr(settings, key)} must be >= 1")
    return errors + _lacking_errors(config) + _batch_errors(config)


def _batch_errors(config: PPOTrainerConfig) -> list[str]:
    """The loader's batch and the run's prompts, as fully async reads them."""
    errors = []
    if config.data.gen_batch_size not in (None, 1):
        errors.append(
            f"data.gen_batch_size={config.data.gen_batch_size}: {KEY} feeds the rollout one prompt at a "
            "time (verl supports only 1); set data.gen_batch_size=1"
        )
    total = config.rollout.total_rollout_steps
    if total is not None and total < required_samples(config):
        errors.append(
            f"rollout.total_rollout_steps={total} prompts make no training step of "
            f"async_training.require_batches x actor_rollout_ref.actor.ppo_mini_batch_size = "
            f"{required_samples(config)} prompts; raise it or lower those"
        )
    return errors


def _lacking_errors(config: PPOTrainerConfig) -> list[str]:
    """What of verl's fully async policy this config asks for and hybridflow does not have."""
    settings, rollout, errors = config.async_training, config.actor_rollout_ref.rollout, []
    if partial_rollout(config) and rollout.multi_turn.enable:
        errors.append(
            "async_training.partial_rollout=true tags each token with the weights that drew it in "
            "single-turn rollouts only; set actor_rollout_ref.rollout.multi_turn.enable=false or "
            "async_training.partial_rollout=false"
        )
    if settings.use_trainer_do_validate:
        errors.append(
            "async_training.use_trainer_do_validate=true needs validation on the training pool, which "
            "hybridflow does not have; set it to false (the rollout pool validates with synced weights)"
        )
    if settings.use_dynamic_resource_scheduling:
        errors.append(
            "async_training.use_dynamic_resource_scheduling=true needs training GPUs lent to the rollout, "
            "which hybridflow does not have; set it to false"
        )
    return errors


def unread_async_options(config: PPOTrainerConfig) -> list[str]:
    """Keys set to a non-default value that this run does not read ("key=value (why)")."""
    defaults = PPOTrainerConfig()
    settings, default_settings = config.async_training, defaults.async_training
    # verl's fully async config sets it, and verl's workers read it nowhere
    unread = (
        [
            "actor_rollout_ref.actor.use_rollout_log_probs=True (algorithm.rollout_correction.bypass_mode decides "
            "whether the rollout's log-probs are the old ones)"
        ]
        if config.actor_rollout_ref.actor.use_rollout_log_probs
        else []
    )
    if not fully_async(config):
        changed = {
            f"async_training.{key}": value
            for key, value in vars(settings).items()
            if value != getattr(default_settings, key)
        }
        if config.rollout.total_rollout_steps is not None:
            changed["rollout.total_rollout_steps"] = config.rollout.total_rollout_steps
        return unread + [f"{key}={value} (read only with {KEY})" for key, value in changed.items()]
    if settings.partial_rollout and not partial_rollout(config):
        unread.append(
            "async_training.partial_rollout=True (takes effect only with staleness_threshold > 0: at 0 "
            "nothing is in flight at a sync)"
        )
    unread += _unread_scheduling(settings, default_settings)
    if config.data.train_batch_size not in (0, defaults.data.train_batch_size):
        unread.append(
            f"data.train_batch_size={config.data.train_batch_size} ({KEY} trains on async_training."
            f"require_batches x actor_rollout_ref.actor.ppo_mini_batch_size = {required_samples(config)} "
            "prompts a step)"
        )
    return unread


def _unread_scheduling(settings: Any, default_settings: Any) -> list[str]:
    """Dynamic scheduling's knobs set without dynamic scheduling (refused in ``_lacking_errors``)."""
    if settings.use_dynamic_resource_scheduling:
        return []
    keys = ("dynamic_schedule_policy", "dynamic_schedule_deactivate_ratio", "dynamic_schedule_enable_rebalance")
    return [
        f"async_training.{key}={getattr(settings, key)} (read only with "
        "async_training.use_dynamic_resource_scheduling=true)"
        for key in keys
        if getattr(settings, key) != getattr(default_settings, key)
    ]
