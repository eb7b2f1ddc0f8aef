"""Check the whole PPO config before any worker starts, and say every problem at once.

:func:`load_config` turns the Hydra/OmegaConf config into :class:`PPOTrainerConfig`: unknown keys (with a
close match), values of the wrong type, names no registry knows, batch sizes that do not divide, missing
model or data files, and combinations that cannot run (an estimator that needs a critic without one) are
collected and raised as one :class:`ConfigError`, one line per problem naming the key and the fix. No
value is ever rewritten. :func:`derived_sizes` gives the sizes the run will use, printed at start-up.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import pathlib
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS
from hybridflow.algos.kl import KL_ESTIMATORS
from hybridflow.algos.kl_controllers import KL_CONTROLLERS
from hybridflow.algos.masked_stats import LOSS_AGG_MODES
from hybridflow.algos.policy_losses import POLICY_LOSSES, PolicyLossConfigError, PolicyLossModeConfig
from hybridflow.data.truncation import TRUNCATION_MODES
from hybridflow.errors import HybridflowError
from hybridflow.rewards import REWARD_MANAGERS
from hybridflow.rollout.config import ENGINE_NAMES, RolloutConfigError
from hybridflow.rollout.tool_parser import TOOL_PARSERS
from hybridflow.trainer.batch_sizes import batch_size_errors, micro_batch_sizes, positive
from hybridflow.trainer.checkpoint_manager import RESUME_MODES
from hybridflow.trainer.config_schema import PPOTrainerConfig
from hybridflow.trainer.estimator_options import estimator_option_errors
from hybridflow.trainer.exact_skips import forced_skip_errors, skips_old_log_prob, skips_zero_signal_samples
from hybridflow.trainer.fully_async_options import (
    concurrent_samples, fully_async, fully_async_errors, max_required_samples, step_prompts, unread_async_options,
)
from hybridflow.trainer.lora_options import lora_errors
from hybridflow.trainer.local_mode import local_mode_errors
from hybridflow.trainer.placement import PLACEMENTS
from hybridflow.trainer.range_checks import range_errors
from hybridflow.trainer.reward_options import reward_manager_errors
from hybridflow.trainer.rollout_correction_options import rollout_correction_errors, uses_bypass
from hybridflow.trainer.rollout_pool_options import rollout_pool_errors, rollout_pool_processes, unread_pool_options
from hybridflow.trainer.tracking import LOGGER_BACKENDS
from hybridflow.trainer.verl_compat import split_compat, unread_engine_options
from hybridflow.trainer.environment import detected_device, environment_errors

DEVICES = ("cpu", "cuda")
ACTOR = "actor_rollout_ref.actor"
POLICY_LOSS_MODE_KEYS = frozenset(field.name for field in dataclasses.fields(PolicyLossModeConfig))


class ConfigError(HybridflowError, ValueError):
    """The config cannot run; ``errors`` holds one line per problem."""

    exit_code = 2

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        if len(self.errors) == 1:
            super().__init__(f"invalid config: {self.errors[0]}")
        else:
            lines = "\n".join(f"  - {error}" for error in self.errors)
            super().__init__(f"invalid config ({len(self.errors)} problems):\n{lines}")


def load_config(config: DictConfig | dict, check_environment: bool = True) -> PPOTrainerConfig:
    """``config`` checked against the schema and every cross-key rule, as a :class:`PPOTrainerConfig`."""
    return load_config_with_notes(config, check_environment)[0]


def load_config_with_notes(
    config: DictConfig | dict, check_environment: bool = True
) -> tuple[PPOTrainerConfig, list[str]]:
    """The checked config and the keys it sets that no component of this run reads ("key=value (why)").

    verl's keys for capabilities hybridflow lacks are refused first, alone (a Megatron script gets one line,
    not a hundred unknown Megatron keys). ``check_environment=False`` checks keys and values only: not the
    files, packages and devices of this machine (``HYBRIDFLOW_CONFIG_CHECK=surface``).
    """
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config)
    config, compat = split_compat(config)
    if compat.lacks:
        raise ConfigError(list(dict.fromkeys(compat.lacks)))
    config, form_errors = accepted_forms(config)
    errors = compat.errors + form_errors + unknown_key_errors(config, PPOTrainerConfig)
    typed, type_errors = _to_dataclass(config, keys_known=not errors)
    errors += type_errors
    if typed is not None:
        if check_environment:
            typed.trainer.device = typed.trainer.device or detected_device()
            errors += environment_errors(typed, uses_critic(typed)) + machine_resource_errors(typed)
        errors += semantic_errors(typed)
    if errors:
        raise ConfigError(errors)
    unread = unread_engine_options(typed) + unread_pool_options(typed) + unread_async_options(typed)
    return typed, compat.unread + unread


VERL_OVERLONG_KEYS = {"enable", "len", "penalty_factor", "log"}


def accepted_forms(config: DictConfig) -> tuple[DictConfig, list[str]]:
    """verl's other spellings of the same values, in hybridflow's form.

    ``trainer.logger=console`` is the list ``[console]``; DAPO's ``reward_kwargs.overlong_buffer_cfg``
    (enable, len, penalty_factor, log) is ``reward_model.overlong_buffer`` (its ``log`` is always on here: the
    DAPO manager reports ``overlong_reward`` and ``overlong`` every step).
    """
    logger = OmegaConf.select(config, "trainer.logger")
    if isinstance(logger, str):
        config.trainer.logger = [logger]
    kwargs = OmegaConf.select(config, "reward_model.reward_kwargs")
    if not kwargs or "overlong_buffer_cfg" not in kwargs:
        return config, []
    verl_buffer = OmegaConf.to_container(kwargs.pop("overlong_buffer_cfg"))
    key = "reward_model.reward_kwargs.overlong_buffer_cfg"
    unknown = sorted(set(verl_buffer) - VERL_OVERLONG_KEYS)
    if unknown:
        return config, [f"{key} has no key(s) {unknown}; its keys are {sorted(VERL_OVERLONG_KEYS)}"]
    if OmegaConf.select(config, "reward_model.overlong_buffer.enable"):
        return config, [f"{key} and reward_model.overlong_buffer both set DAPO's overlong penalty; keep one"]
    verl_buffer.pop("log", None)
    config.reward_model.overlong_buffer = OmegaConf.merge(config.reward_model.overlong_buffer, verl_buffer)
    return config, []


def unknown_key_errors(
    node: DictConfig | dict, schema: type, prefix: str = "", parent: tuple[str, list[str]] | None = None
) -> list[str]:
    """One line per key of ``node`` that the dataclass ``schema`` (recursively) does not have.

    ``parent`` is the enclosing section's ``(prefix, keys)``: a key set one level too deep is pointed there.
    """
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=False)
    errors = []
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in node.items():
        full_key = f"{prefix}{key}"
        if key not in fields:
            hint = _unknown_key_hint(str(key), list(fields), prefix, parent)
            errors.append(f"{full_key} is not a config key; {hint}")
            continue
        nested = _nested_schema(fields[key])
        if nested is not None and isinstance(value, dict):
            errors += unknown_key_errors(value, nested, prefix=f"{full_key}.", parent=(prefix, list(fields)))
    return errors


def _unknown_key_hint(key: str, keys: list[str], prefix: str, parent: tuple[str, list[str]] | None) -> str:
    if parent is not None and key in parent[1]:
        return f"did you mean {parent[0]}{key}?"
    close = difflib.get_close_matches(key, keys, n=1)
    return f"did you mean {prefix}{close[0]}?" if close else f"valid keys: {', '.join(keys)}"


def _nested_schema(field: dataclasses.Field) -> type | None:
    if field.default_factory is dataclasses.MISSING:
        return None
    default = field.default_factory()
    return type(default) if dataclasses.is_dataclass(default) else None


def _to_dataclass(config: DictConfig, keys_known: bool) -> tuple[PPOTrainerConfig | None, list[str]]:
    """Merge each section onto the schema separately so one bad section does not hide another's errors.

    Unknown keys are reported by :func:`unknown_key_errors`; here they are skipped, and no typed config is
    built while any remain.
    """
    schema = OmegaConf.structured(PPOTrainerConfig)
    errors = []
    for section in config.keys():
        if section not in schema:
            continue
        try:
            OmegaConf.merge(schema[section], config[section])
        except ConfigKeyError:
            continue
        except OmegaConfBaseException as error:
            errors.append(_one_line(error, section))
        except (ValueError, TypeError) as error:
            errors.append(f"{section}: {error}")
    if errors or not keys_known:
        return None, errors
    try:
        return OmegaConf.to_object(OmegaConf.merge(schema, config)), []
    except OmegaConfBaseException as error:
        return None, [_one_line(error, "")]
    except (ValueError, TypeError) as error:  # a section's __post_init__ refused a value
        return None, [" ".join(str(error).split())]


def _one_line(error: OmegaConfBaseException, section: str) -> str:
    key = getattr(error, "full_key", None) or ""
    full_key = f"{section}.{key}" if section and key and not key.startswith(section) else (key or section)
    message = str(error).splitlines()[0]
    return f"{full_key}: {message}; give a value of the type in the schema (hybridflow.trainer.config_schema)"


def semantic_errors(config: PPOTrainerConfig) -> list[str]:
    """Every cross-key rule the typed config breaks."""
    return (
        _registry_errors(config)
        + _section_errors(config)
        + batch_size_errors(config, num_processes(config), uses_critic(config))
        + _empty_path_errors(config)
        + _algorithm_errors(config)
        + _trainer_errors(config)
        + local_mode_errors(config)
        + rollout_pool_errors(config)
        + fully_async_errors(config)
        + _resource_errors(config)
        + reward_manager_errors(config)
        + estimator_option_errors(config)
        + forced_skip_errors(config)
        + rollout_correction_errors(config)
        + lora_errors(config, uses_critic(config))
        + range_errors(config)
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
        ("reward_model.reward_manager", config.reward_model.reward_manager, REWARD_MANAGERS),
        ("trainer.placement", config.trainer.placement, PLACEMENTS),
        ("data.truncation", config.data.truncation, TRUNCATION_MODES),
        ("actor_rollout_ref.rollout.name", config.actor_rollout_ref.rollout.name, ENGINE_NAMES),
        ("actor_rollout_ref.rollout.multi_turn.format", config.actor_rollout_ref.rollout.multi_turn.format,
         TOOL_PARSERS.names()),
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


def uses_critic(config: PPOTrainerConfig) -> bool:
    """A critic is built: ``critic.enable`` if set (verl), else when the estimator reads values (e.g. gae)."""
    if config.critic.enable is not None:
        return config.critic.enable
    estimator = config.algorithm.adv_estimator
    return estimator in ADV_ESTIMATORS and ADV_ESTIMATORS.traits(estimator)["needs_critic"]


def uses_reference(config: PPOTrainerConfig) -> bool:
    """A KL term (in the reward or as a loss) needs the reference policy's log-probs."""
    return config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss


def num_processes(config: PPOTrainerConfig) -> int:
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


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
    gen_batch_size = config.data.gen_batch_size
    # Fully async reads it too (fully_async_options)
    dynamic_sampling_only = not fully_async(config)
    if dynamic_sampling_only and gen_batch_size is not None and (gen_batch_size < 1 or not algorithm.filter_groups.enable):
        errors.append(
            f"data.gen_batch_size={gen_batch_size} sizes the generation batches of dynamic sampling: it needs "
            "algorithm.filter_groups.enable=true and a value >= 1 (each step trains on data.train_batch_size "
            "prompts); remove it otherwise"
        )
    if algorithm.filter_groups.enable:
        if rollout.n < 2:
            errors.append(
                "algorithm.filter_groups.enable=true drops groups whose samples all score the same, "
                "which needs actor_rollout_ref.rollout.n>=2"
            )
        if algorithm.filter_groups.max_num_gen_batches < 1:
            errors.append(
                f"algorithm.filter_groups.max_num_gen_batches={algorithm.filter_groups.max_num_gen_batches} "
                "must be >= 1 (dynamic sampling is bounded)"
            )
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


def _resource_errors(config: PPOTrainerConfig) -> list[str]:
    """A local cluster too small for the worker processes would leave them pending forever."""
    num_cpus = config.ray_kwargs.ray_init.num_cpus
    return [] if num_cpus is None else _cpu_shortfall(config, num_cpus, f"ray_kwargs.ray_init.num_cpus={num_cpus}")


def machine_resource_errors(config: PPOTrainerConfig) -> list[str]:
    """What a local cluster on this machine lacks: a second node, or CPUs when ``ray_init.num_cpus`` is unset."""
    if config.ray_kwargs.ray_init.address or os.environ.get("RAY_ADDRESS"):
        return []
    if rollout_pool_processes(config) and config.rollout.nnodes > 1:
        return [
            f"rollout.nnodes={config.rollout.nnodes} but no cluster is given, and a local Ray cluster has one node; "
            "start Ray on each node and set ray_kwargs.ray_init.address (or RAY_ADDRESS), or set rollout.nnodes=1"
        ]
    if config.trainer.nnodes > 1:
        return [
            f"trainer.nnodes={config.trainer.nnodes} but no cluster is given, and a local Ray cluster has one node; "
            "start Ray on each node and set ray_kwargs.ray_init.address (or RAY_ADDRESS), or set trainer.nnodes=1"
        ]
    if config.ray_kwargs.ray_init.num_cpus is not None:
        return []
    cpus = os.cpu_count() or 1
    return _cpu_shortfall(config, cpus, f"this machine has {cpus} (ray_kwargs.ray_init.num_cpus is unset)")


def _cpu_shortfall(config: PPOTrainerConfig, available: float, source: str) -> list[str]:
    trainer, ray_config = config.trainer, config.ray_kwargs.ray_init
    if ray_config.address or trainer.placement not in PLACEMENTS:
        return []
    pools = 1 if trainer.placement == "colocated" else 1 + uses_critic(config) + config.reward_model.enable
    rollout_pool = rollout_pool_processes(config)
    needed = (pools * num_processes(config) + rollout_pool) * trainer.cpus_per_worker
    if needed <= available:
        return []
    rollout_part = f" + {rollout_pool} rollout-pool process(es)" if rollout_pool else ""
    return [
        f"trainer.placement={trainer.placement} needs {needed:g} CPUs ({pools} pool(s) x {num_processes(config)} "
        f"process(es){rollout_part} x trainer.cpus_per_worker={trainer.cpus_per_worker:g}) but {source}; lower "
        "trainer.n_gpus_per_node or trainer.cpus_per_worker, or raise ray_kwargs.ray_init.num_cpus"
    ]


def derived_sizes(config: PPOTrainerConfig, steps: int | None = None) -> list[str]:
    """The sizes the run will use, one line each, for the start-up banner."""
    data, actor = config.data, config.actor_rollout_ref.actor
    n, world = config.actor_rollout_ref.rollout.n, num_processes(config)
    samples_per_mini = actor.ppo_mini_batch_size * n
    per_rank = samples_per_mini // world
    prompts = step_prompts(config)
    lines = [
        f"samples per step: {prompts} prompts x {n} = {prompts * n}",
        f"actor mini-batches per epoch: {prompts // actor.ppo_mini_batch_size} "
        f"({samples_per_mini} samples, {per_rank} per rank on {world} process(es)), ppo_epochs={actor.ppo_epochs}",
    ]
    micro = micro_batch_sizes(config, world)[0]
    actor_micro = micro.get(f"{ACTOR}.ppo_micro_batch_size")
    if actor.use_dynamic_bsz:
        lines.append(f"actor micro-batches: by token budget {actor.ppo_max_token_len_per_gpu} per rank")
    elif actor_micro:
        lines.append(f"actor micro-batches per mini-batch per rank: {per_rank // actor_micro} of {actor_micro} samples")
    rollout, ref = config.actor_rollout_ref.rollout, config.actor_rollout_ref.ref
    if uses_bypass(config):
        lines.append("old log-probs: the rollout engine's (algorithm.rollout_correction.bypass_mode), no pass")
    elif not skips_old_log_prob(config):
        lines.append(_forward_batching(
            "old-log-prob", rollout.log_prob_use_dynamic_bsz, rollout.log_prob_max_token_len_per_gpu,
            micro.get("actor_rollout_ref.rollout.log_prob_micro_batch_size"),
        ))
    if uses_reference(config):
        lines.append(_forward_batching(
            "reference", ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu,
            micro.get("actor_rollout_ref.ref.log_prob_micro_batch_size"),
        ))
    lines.append(f"tokens per sample: <= {data.max_prompt_length} prompt + {data.max_response_length} response")
    estimator = config.algorithm.adv_estimator
    if n < 2 and estimator in ADV_ESTIMATORS and "index" in ADV_ESTIMATORS.traits(estimator)["requires"]:
        # verl runs this too: a group of one sample has mean 0 and std 1, so its advantage is its score.
        lines.append(
            f"note: algorithm.adv_estimator={estimator!r} compares the samples of each prompt, but rollout.n=1: "
            "each group is one sample and its advantage is its raw score (set rollout.n>=2 for group baselines)"
        )
    if steps is not None:
        lines.append(f"training steps: {steps}")
    if fully_async(config):
        settings = config.async_training
        lines.append(
            f"rollout: a pool of its own, {rollout_pool_processes(config)} process(es), generating fully async: "
            f"weights synced every {settings.trigger_parameter_sync_step} steps, at most "
            f"{max_required_samples(config)} prompts started per weight version, {concurrent_samples(config)} at once"
        )
    elif rollout_pool_processes(config):
        lines.append(
            f"rollout: a pool of its own, {rollout_pool_processes(config)} process(es), generating one step ahead "
            "(each step trains on samples from the weights before its previous update)"
        )
    yes_no = {True: "yes", False: "no"}
    lines.append(f"critic: {yes_no[uses_critic(config)]}; reference: {yes_no[uses_reference(config)]}")
    lines.append(
        f"old-log-prob pass skipped (on-policy update): {yes_no[skips_old_log_prob(config)]}; "
        f"zero-signal samples skipped: {yes_no[skips_zero_signal_samples(config)]}"
    )
    return lines


def _forward_batching(name: str, dynamic: bool, max_token_len: int, micro: int | None) -> str:
    if dynamic:
        return f"{name} micro-batches: by token budget {max_token_len} per rank"
    if micro:
        return f"{name} micro-batches: {micro} samples per rank"
    return f"{name} micro-batches: each rank's whole batch in one forward"
