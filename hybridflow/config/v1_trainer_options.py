"""``trainer.v1.trainer_mode``: verl's V1 trainer modes (``docs/advance/v1_async_trainer.md`` in verl).

``sync`` is hybridflow's synchronous PPO. ``separate_async`` (verl's ``PPOTrainerSeparateAsync``) generates on a
rollout pool of its own (``rollout.nnodes`` x ``rollout.n_gpus_per_node``) while the actor trains: each step is
``parameter_sync_step`` mini-batches, each taken from the pool's finished prompt groups and trained through phases
3 to 7 as soon as it is there, then one weight sync (partial rollout: it lands in the generation in flight); the
old log-probs of every mini-batch are the step's starting weights' (verl's decoupled PPO), and the pool runs at
most ``num_warmup_batches`` batches ahead; with ``hybrid_rollout.enable_switch`` the actor's processes get a
rollout engine and generate the groups a step lacks at its start (``trainer/step_switch.py``). ``colocate_async``
(verl's ``PPOTrainerColocateAsync``) keeps the actor's processes generating and training by turns, with partial
rollout: each step adds a batch of prompts (the first also ``num_warmup_batches`` more), generation stops once
``train_batch_size`` prompt groups have finished, the step trains on the oldest finished groups, and the
unfinished ones go on after the weight sync, from the tokens they drew. ``trainer.v1.sampler`` bounds how many
weight versions a group may span. What the mode cannot run with is refused here, before anything starts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hybridflow.config.estimator_options import greedy_baseline
from hybridflow.config.rollout_pool_options import one_step_off
from hybridflow.config.schema import HybridRolloutSwitchConfig, PPOTrainerConfig, TrainerV1Config

KEY = "trainer.v1.trainer_mode"
SYNC, COLOCATE_ASYNC, SEPARATE_ASYNC = "sync", "colocate_async", "separate_async"
STRATEGIES = ("drop", "wait")
SWITCH = "trainer.v1.separate_async.hybrid_rollout"


def colocate_async(config: PPOTrainerConfig) -> bool:
    return config.trainer.v1.trainer_mode == COLOCATE_ASYNC


def separate_async(config: PPOTrainerConfig) -> bool:
    return config.trainer.v1.trainer_mode == SEPARATE_ASYNC


def lends_trainer(config: PPOTrainerConfig) -> bool:
    """separate_async's step switching: the trainer's processes generate between steps."""
    return separate_async(config) and config.trainer.v1.separate_async.hybrid_rollout.enable_switch


def passes_per_step(config: PPOTrainerConfig) -> int:
    """Mini-batches a step trains one after another, each through phases 3 to 7 (1 but with separate_async)."""
    return config.trainer.v1.separate_async.parameter_sync_step if separate_async(config) else 1


def v1_errors(config: PPOTrainerConfig) -> list[str]:
    """Why ``config``'s V1 settings cannot run (none: they can)."""
    v1 = config.trainer.v1
    if v1.trainer_mode not in (SYNC, COLOCATE_ASYNC, SEPARATE_ASYNC):
        return [f"{KEY}={v1.trainer_mode!r} is not one of [sync, colocate_async, separate_async]"]
    errors = _setting_errors(v1)
    if colocate_async(config):
        errors += _colocate_errors(config)
    return errors + (_separate_errors(config) if separate_async(config) else [])


def _setting_errors(v1: TrainerV1Config) -> list[str]:
    errors = []
    if v1.colocate_async.num_warmup_batches < 0:
        errors.append(
            f"trainer.v1.colocate_async.num_warmup_batches={v1.colocate_async.num_warmup_batches} must be >= 0"
        )
    if v1.separate_async.num_warmup_batches < 0:
        errors.append(
            f"trainer.v1.separate_async.num_warmup_batches={v1.separate_async.num_warmup_batches} must be >= 0"
        )
    threshold = v1.sampler.max_off_policy_threshold
    if threshold is not None and threshold < 1:
        errors.append(f"trainer.v1.sampler.max_off_policy_threshold={threshold} must be >= 1 (or null: no limit)")
    if v1.sampler.max_off_policy_strategy not in STRATEGIES:
        errors.append(
            f"trainer.v1.sampler.max_off_policy_strategy={v1.sampler.max_off_policy_strategy!r} is not one of "
            f"[{', '.join(STRATEGIES)}]"
        )
    return errors


def _colocate_errors(config: PPOTrainerConfig) -> list[str]:
    """What ``colocate_async`` cannot run with: it continues the actor's own hf engine's samples one by one."""
    rollout = config.actor_rollout_ref.rollout
    conflicts = [
        (one_step_off(config), "actor_rollout_ref.hybrid_engine=false", "generates on the actor's processes"),
        (config.async_training.enable, "async_training.enable=true", "is an asynchronous mode of its own"),
        (rollout.name != "hf", f"actor_rollout_ref.rollout.name={rollout.name}", "continues samples on the hf engine"),
        (
            rollout.tensor_model_parallel_size > 1,
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={rollout.tensor_model_parallel_size}",
            "continues each rank's own samples (set it to 1)",
        ),
        (
            rollout.multi_turn.enable,
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "continues single-turn samples",
        ),
        (
            config.algorithm.filter_groups.enable,
            "algorithm.filter_groups.enable=true",
            "has no DAPO group eviction in hybridflow",
        ),
        (
            greedy_baseline(config),
            f"algorithm.adv_estimator={config.algorithm.adv_estimator}",
            "has no greedy baselines (ReMax)",
        ),
    ]
    return _refusals(COLOCATE_ASYNC, conflicts)


def _separate_errors(config: PPOTrainerConfig) -> list[str]:
    """What ``separate_async`` cannot run with (its pool's own limits are ``rollout_pool_options``')."""
    settings, actor = config.trainer.v1.separate_async, config.actor_rollout_ref.actor
    rollout = config.actor_rollout_ref.rollout
    if settings.parameter_sync_step < 1:
        return [f"trainer.v1.separate_async.parameter_sync_step={settings.parameter_sync_step} must be >= 1"]
    errors = []
    if config.data.train_batch_size != settings.parameter_sync_step * actor.ppo_mini_batch_size:
        errors.append(
            f"data.train_batch_size={config.data.train_batch_size} must equal trainer.v1.separate_async."
            f"parameter_sync_step={settings.parameter_sync_step} x actor_rollout_ref.actor.ppo_mini_batch_size="
            f"{actor.ppo_mini_batch_size} (each step trains its batch one mini-batch at a time, as verl asserts)"
        )
    conflicts = [
        (config.async_training.enable, "async_training.enable=true", "is an asynchronous mode of its own"),
        (
            rollout.name != "hf",
            f"actor_rollout_ref.rollout.name={rollout.name}",
            "loads weight syncs into the generation in flight, which the hf engine does",
        ),
        (
            rollout.multi_turn.enable,
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "continues single-turn samples across weight syncs",
        ),
        (
            config.data.gen_batch_size not in (None, 1),
            f"data.gen_batch_size={config.data.gen_batch_size}",
            "takes prompts one at a time (verl's scripts set 1)",
        ),
    ]
    return errors + _refusals(SEPARATE_ASYNC, conflicts) + _switch_errors(config)


def _switch_errors(config: PPOTrainerConfig) -> list[str]:
    """What step switching (``hybrid_rollout.enable_switch``) cannot run with: it generates on the trainer's
    processes, with the hybrid engine's rollout in them."""
    switch = config.trainer.v1.separate_async.hybrid_rollout
    if not switch.enable_switch:
        return []
    errors = []
    if not 0 < switch.switch_threshold_ratio <= 1:
        errors.append(f"{SWITCH}.switch_threshold_ratio={switch.switch_threshold_ratio} must be in (0, 1]")
    for key in ("switch_threshold_step_up", "switch_threshold_step_down"):
        if getattr(switch, key) < 0:
            errors.append(f"{SWITCH}.{key}={getattr(switch, key)} must be >= 0")
    for key in ("switch_threshold_release_steps", "switch_cost_window_size"):
        if getattr(switch, key) < 1:
            errors.append(f"{SWITCH}.{key}={getattr(switch, key)} must be >= 1")
    if not config.actor_rollout_ref.hybrid_engine:
        errors.append(
            f"{SWITCH}.enable_switch=true with actor_rollout_ref.hybrid_engine=false: the trainer's processes "
            "generate with the hybrid engine's rollout; set hybrid_engine=true or enable_switch=false"
        )
    return errors


def _refusals(mode: str, conflicts: list[tuple[bool, str, str]]) -> list[str]:
    """One line per (conflict, setting, why) that holds: ``mode`` cannot run with ``setting``."""
    return [
        f"{KEY}={mode} with {setting}: {mode} {why}; use {KEY}=sync or change {setting}"
        for conflict, setting, why in conflicts
        if conflict
    ]


def unread_v1_options(config: PPOTrainerConfig) -> list[str]:
    """V1 keys set to a non-default value that this run does not read ("key=value (why)")."""
    v1, default = config.trainer.v1, TrainerV1Config()
    readers = {"colocate_async": (COLOCATE_ASYNC,), "separate_async": (SEPARATE_ASYNC,)}
    readers["sampler"] = (COLOCATE_ASYNC, SEPARATE_ASYNC)
    unread = [
        f"trainer.v1.{section}.{key}={value} (read only with {KEY}={' or '.join(modes)})"
        for section, modes in readers.items()
        if v1.trainer_mode not in modes
        for key, value in _changed(getattr(v1, section), getattr(default, section))
    ]
    switch = v1.separate_async.hybrid_rollout
    if separate_async(config) and not switch.enable_switch:
        unread += [
            f"{SWITCH}.{key}={value} (read only with {SWITCH}.enable_switch=true)"
            for key, value in _changed(switch, HybridRolloutSwitchConfig())
        ]
    return unread


def _changed(settings: Any, default: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of each setting of a section, nested sections walked, that differs from ``default``."""
    changed = []
    for key, value in vars(settings).items():
        if dataclasses.is_dataclass(value):
            changed += _changed(value, getattr(default, key), f"{prefix}{key}.")
        elif value != getattr(default, key):
            changed.append((f"{prefix}{key}", value))
    return changed
