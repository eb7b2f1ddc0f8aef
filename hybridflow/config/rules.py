"""The cross-key rules of a typed PPO config: names no registry knows, what a section's own check refuses, empty
paths, algorithm and trainer settings that cannot run together, and every option module's rules; one line per
problem naming the key and the fix. No value is ever rewritten."""

from __future__ import annotations

import dataclasses
import difflib
import pathlib
from typing import Any

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS
from hybridflow.algos.kl import KL_ESTIMATORS
from hybridflow.algos.kl_controllers import KL_CONTROLLERS
from hybridflow.algos.masked_stats import LOSS_AGG_MODES
from hybridflow.algos.policy_losses import POLICY_LOSSES, PolicyLossConfigError, PolicyLossModeConfig
from hybridflow.checkpoints.manager import RESUME_MODES
from hybridflow.config.batch_sizes import batch_size_errors, positive
from hybridflow.config.distillation_options import distillation_errors
from hybridflow.config.estimator_options import estimator_option_errors
from hybridflow.config.exact_skips import forced_skip_errors
from hybridflow.config.fully_async_options import fully_async, fully_async_errors
from hybridflow.config.judge_options import judge_errors
from hybridflow.config.local_mode import local_mode_errors
from hybridflow.config.lora_options import lora_errors
from hybridflow.config.phases import uses_critic
from hybridflow.config.placement_options import placement_errors
from hybridflow.config.profiler_options import profiler_errors
from hybridflow.config.range_checks import range_errors
from hybridflow.config.resources import num_processes, resource_errors
from hybridflow.config.reward_options import manager_names, reward_manager_errors
from hybridflow.config.role_pools import spells_no_layout
from hybridflow.config.rollout_correction_options import rollout_correction_errors
from hybridflow.config.rollout_pool_options import rollout_pool_errors
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.sequence_parallel_options import sequence_parallel_errors
from hybridflow.config.tensor_parallel_options import tensor_parallel_errors, training_tensor_parallel_errors
from hybridflow.config.v1_trainer_options import separate_async, v1_errors
from hybridflow.config.worker_start_checks import worker_start_errors
from hybridflow.data.truncation import TRUNCATION_MODES
from hybridflow.rollout.config import ENGINE_NAMES, RolloutConfigError
from hybridflow.rollout.tool_parser import TOOL_PARSERS
from hybridflow.tracking.trackers import LOGGER_BACKENDS
from hybridflow.workers.config import WARMUP_STYLES

DEVICES = ("cpu", "cuda")
ACTOR = "actor_rollout_ref.actor"
POLICY_LOSS_MODE_KEYS = frozenset(field.name for field in dataclasses.fields(PolicyLossModeConfig))


def semantic_errors(config: PPOTrainerConfig) -> list[str]:
    """Every cross-key rule the typed config breaks."""
    return (
        _registry_errors(config)
        + _section_errors(config)
        + (batch_size_errors(config, num_processes(config), uses_critic(config)) if spells_no_layout(config) else [])
        + placement_errors(config)
        + judge_errors(config)
        + _empty_path_errors(config)
        + _algorithm_errors(config)
        + _trainer_errors(config)
        + local_mode_errors(config)
        + rollout_pool_errors(config)
        + fully_async_errors(config)
        + v1_errors(config)
        + resource_errors(config)
        + reward_manager_errors(config)
        + estimator_option_errors(config)
        + forced_skip_errors(config)
        + rollout_correction_errors(config)
        + lora_errors(config, uses_critic(config))
        + sequence_parallel_errors(config, uses_critic(config))
        + tensor_parallel_errors(config)
        + training_tensor_parallel_errors(config, uses_critic(config))
        + range_errors(config)
        + worker_start_errors(config, uses_critic(config))
        + profiler_errors(config)
        + distillation_errors(config)
    )


def _not_in(key: str, value: Any, allowed: Any) -> str:
    close = difflib.get_close_matches(str(value), [str(name) for name in allowed], n=1)
    fix = f"did you mean {close[0]!r}?" if close else "choose one of them"
    return f"{key}={value!r} is not one of [{', '.join(allowed)}]; {fix}"


def _registry_errors(config: PPOTrainerConfig) -> list[str]:
    actor = config.actor_rollout_ref.actor
    checks = [
        ("algorithm.adv_estimator", config.algorithm.adv_estimator, ADV_ESTIMATORS),
        ("algorithm.kl_penalty", config.algorithm.kl_penalty, KL_ESTIMATORS),
        ("algorithm.kl_ctrl.type", config.algorithm.kl_ctrl.type, KL_CONTROLLERS),
        ("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type, KL_ESTIMATORS),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", actor.policy_loss.loss_mode, POLICY_LOSSES),
        ("critic.loss_agg_mode", config.critic.loss_agg_mode, LOSS_AGG_MODES),
        # A class loaded from a file (reward_manager_source=importlib) is checked by its loader instead.
        ("reward_model.reward_manager", config.reward_model.reward_manager, manager_names(config)),
        ("data.truncation", config.data.truncation, TRUNCATION_MODES),
        ("actor_rollout_ref.rollout.name", config.actor_rollout_ref.rollout.name, ENGINE_NAMES),
        ("actor_rollout_ref.actor.optim.warmup_style", actor.optim.warmup_style, WARMUP_STYLES),
        ("critic.optim.warmup_style", config.critic.optim.warmup_style, WARMUP_STYLES),
        (
            "actor_rollout_ref.rollout.multi_turn.format",
            config.actor_rollout_ref.rollout.multi_turn.format,
            TOOL_PARSERS.names(),
        ),
    ]
    errors = [_not_in(key, value, list(allowed)) for key, value, allowed in checks if value not in allowed]
    if config.trainer.device is not None and config.trainer.device not in DEVICES:
        errors.append(_not_in("trainer.device", config.trainer.device, DEVICES) + " (or null: this machine's)")
    errors += [
        _not_in("trainer.logger entry", backend, LOGGER_BACKENDS.names())
        for backend in config.trainer.logger
        if backend not in LOGGER_BACKENDS
    ]
    return errors


def _section_errors(config: PPOTrainerConfig) -> list[str]:
    """Problems the lower layers' own checks find in their sections."""
    errors = []
    try:
        config.actor_rollout_ref.actor.policy_loss_config()
    except PolicyLossConfigError as error:
        errors += [_policy_loss_error(line) for line in error.errors]
    try:
        config.actor_rollout_ref.rollout.validate()
    except RolloutConfigError as error:
        errors += [line.strip() for line in str(error).splitlines()[1:] if line.strip()]
    return errors


def _policy_loss_error(error: str) -> str:
    """``tau_neg=0.0 must be > 0`` with its full key: the mode's options sit under ``actor.policy_loss``."""
    name = error.split("=", 1)[0]
    section = f"{ACTOR}.policy_loss" if name in POLICY_LOSS_MODE_KEYS else ACTOR
    return f"{section}.{error}"


def _empty_path_errors(config: PPOTrainerConfig) -> list[str]:
    """Paths the run cannot do without (whether they exist is :func:`environment_errors`' question)."""
    errors = []
    if not config.actor_rollout_ref.model.path:
        errors.append("actor_rollout_ref.model.path is empty; set it to a Hugging Face model folder or hub id")
    if uses_critic(config) and not config.critic.model.path:
        errors.append(
            f"critic.model.path is empty, but algorithm.adv_estimator={config.algorithm.adv_estimator!r} needs a "
            "critic: set critic.model.path (e.g. to the actor's model) or choose an estimator without one: "
            f"{', '.join(name for name in ADV_ESTIMATORS.names() if not ADV_ESTIMATORS.traits(name)['needs_critic'])}"
        )
    if config.reward_model.enable and not config.reward_model.model.path:
        errors.append("reward_model.model.path is empty; set it or reward_model.enable=false")
    if not config.data.train_files:
        errors.append("data.train_files is empty; set it to a parquet file (or a list of them)")
    return errors


def _algorithm_errors(config: PPOTrainerConfig) -> list[str]:
    algorithm, rollout = config.algorithm, config.actor_rollout_ref.rollout
    errors = []
    estimator = algorithm.adv_estimator
    needs_critic = estimator in ADV_ESTIMATORS and ADV_ESTIMATORS.traits(estimator)["needs_critic"]
    if config.critic.enable is False and needs_critic:
        errors.append(
            f"critic.enable=false but algorithm.adv_estimator={estimator!r} reads critic values; "
            "remove critic.enable or choose an estimator without a critic"
        )
    errors += _dynamic_sampling_errors(config)
    if algorithm.kl_ctrl.type == "adaptive" and (algorithm.kl_ctrl.horizon <= 0 or algorithm.kl_ctrl.target_kl <= 0):
        errors.append("algorithm.kl_ctrl.type=adaptive needs kl_ctrl.horizon > 0 and kl_ctrl.target_kl > 0")
    lengths = {"response_length": config.data.max_response_length, "prompt_length": config.data.max_prompt_length}
    for key, configured in lengths.items():
        value = getattr(rollout, key)
        if value != configured:
            data_key = f"data.max_{key}"
            errors.append(
                f"actor_rollout_ref.rollout.{key}={value} differs from {data_key}={configured}; "
                f"set {data_key} instead (the rollout follows it)"
            )
    return errors


def _dynamic_sampling_errors(config: PPOTrainerConfig) -> list[str]:
    """DAPO's dynamic sampling: its generation batch size, several samples per prompt, a bounded budget."""
    filter_groups, gen_batch_size, errors = config.algorithm.filter_groups, config.data.gen_batch_size, []
    # Fully async and separate_async read data.gen_batch_size too (fully_async_options, v1_trainer_options)
    reads_it = fully_async(config) or separate_async(config)
    if not reads_it and gen_batch_size is not None and (gen_batch_size < 1 or not filter_groups.enable):
        errors.append(
            f"data.gen_batch_size={gen_batch_size} sizes the generation batches of dynamic sampling: it needs "
            "algorithm.filter_groups.enable=true and a value >= 1 (each step trains on data.train_batch_size "
            "prompts); remove it otherwise"
        )
    if not filter_groups.enable:
        return errors
    if config.actor_rollout_ref.rollout.n < 2:
        errors.append(
            "algorithm.filter_groups.enable=true drops groups whose samples all score the same, "
            "which needs actor_rollout_ref.rollout.n>=2"
        )
    if filter_groups.max_num_gen_batches < 1:
        errors.append(
            f"algorithm.filter_groups.max_num_gen_batches={filter_groups.max_num_gen_batches} "
            "must be >= 1 (dynamic sampling is bounded)"
        )
    return errors


def _trainer_errors(config: PPOTrainerConfig) -> list[str]:
    trainer = config.trainer
    errors = []
    for key in ("save_freq", "test_freq"):
        value = getattr(trainer, key)
        if value == 0 or value < -1:
            errors.append(f"trainer.{key}={value} must be -1 (never) or a positive number of steps")
    errors += positive("trainer.total_epochs", trainer.total_epochs)
    errors += positive("trainer.total_training_steps", trainer.total_training_steps)
    errors += positive("trainer.rollout_dump_freq", trainer.rollout_dump_freq)
    if trainer.max_nonfinite_steps < 0:
        errors.append(f"trainer.max_nonfinite_steps={trainer.max_nonfinite_steps} must be >= 0 (0: stop at the first)")
    for key in ("critic_warmup", "log_val_generations"):
        if getattr(trainer, key) < 0:
            errors.append(f"trainer.{key}={getattr(trainer, key)} must be >= 0 (0 turns it off)")
    if trainer.critic_warmup > 0 and not uses_critic(config):
        errors.append(
            f"trainer.critic_warmup={trainer.critic_warmup} warms up a critic, but algorithm.adv_estimator="
            f"{config.algorithm.adv_estimator} has none (the actor would just not train); set it to 0"
        )
    if trainer.resume_mode == "resume_path":
        if not trainer.resume_from_path:
            errors.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=<global_step_N folder>")
        elif not pathlib.Path(trainer.resume_from_path).is_dir():
            errors.append(
                f"trainer.resume_from_path={trainer.resume_from_path!r} does not exist; "
                "point it at a global_step_N folder"
            )
    elif trainer.resume_mode not in RESUME_MODES and not pathlib.Path(trainer.resume_mode).is_dir():
        errors.append(
            f"trainer.resume_mode={trainer.resume_mode!r} is neither one of [{', '.join(RESUME_MODES)}] "
            "nor an existing checkpoint folder; fix the path or use auto"
        )
    if trainer.cpus_per_worker <= 0:
        errors.append(f"trainer.cpus_per_worker={trainer.cpus_per_worker} must be > 0")
    return errors
