"""Check the whole PPO config before any worker starts, and say every problem at once.

:func:`load_config` turns the Hydra/OmegaConf config into :class:`PPOTrainerConfig` in four jobs, each a module:
verl's capabilities hybridflow lacks are refused alone (``verl_compat``); keys and types (``typed``); what this
machine lacks, its files, packages, devices and CPUs (``environment``, ``resources``); and the cross-key rules
(``rules``). Every problem is collected and raised as one :class:`ConfigError`, one line per problem naming the
key and the fix. No value is ever rewritten. The checked config then becomes the run plan (``config/plan.py``).
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from hybridflow.config.environment import detected_device, environment_errors
from hybridflow.config.fully_async_options import unread_async_options
from hybridflow.config.key_surface import unread_sync_check
from hybridflow.config.phases import uses_critic
from hybridflow.config.profiler_options import unread_profiler_options
from hybridflow.config.resources import machine_resource_errors
from hybridflow.config.rollout_pool_options import unread_pool_options
from hybridflow.config.rules import semantic_errors
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.typed import accepted_forms, to_dataclass, unknown_key_errors
from hybridflow.config.v1_trainer_options import unread_v1_options
from hybridflow.config.verl_compat import split_compat, unread_engine_options
from hybridflow.errors import HybridflowError


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
    typed, type_errors = to_dataclass(config, keys_known=not errors)
    errors += type_errors
    if typed is not None:
        if check_environment:
            typed.trainer.device = typed.trainer.device or detected_device()
            errors += environment_errors(typed, uses_critic(typed)) + machine_resource_errors(typed)
        errors += semantic_errors(typed)
    if errors:
        raise ConfigError(errors)
    unread = unread_engine_options(typed) + unread_sync_check(typed) + unread_pool_options(typed)
    unread += unread_async_options(typed) + unread_v1_options(typed) + unread_profiler_options(typed)
    return typed, compat.unread + unread
