"""The reward manager's keyword options, gathered from the config where verl users set them.

``reward_model.reward_kwargs`` goes to the manager as it is (verl's ``load_reward_manager(**reward_kwargs)``).
Options the config holds under other keys are filled in from there: ``reward_fn_key`` from
``data.reward_fn_key``; ``max_resp_len`` (DAPO's length limit) from ``data.max_response_length`` unless
``reward_kwargs`` sets it; DAPO's overlong penalty from ``reward_model.overlong_buffer`` (the layout of
verl's DAPO recipe). :func:`reward_manager_errors` checks them all before anything starts, with the checks the
manager's registry entry carries (``option_errors``: the remote judge's URL and limits).

The manager is a registered name, or with ``reward_model.reward_manager_source=importlib`` (verl's
``reward.reward_manager.source``) a class in the user's file (:mod:`hybridflow.rewards.manager_file`), checked
and built the same way; the environment check reports a file that cannot serve.
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.rewards import (
    REWARD_MANAGERS,
    CustomRewardError,
    load_reward_manager_class,
    manager_class_traits,
    manager_parameters,
    overlong_buffer_error,
)

SOURCES = ("register", "importlib")  # verl's RewardManagerConfig.source values


def manager_from_file(config: PPOTrainerConfig) -> bool:
    return config.reward_model.reward_manager_source == "importlib"


def manager_names(config: PPOTrainerConfig) -> list[str]:
    """The names reward_model.reward_manager may take: the registry's, or any class name with a file source (or an
    unknown source, which its own line reports)."""
    registered = config.reward_model.reward_manager_source == "register"
    return REWARD_MANAGERS.names() if registered else [config.reward_model.reward_manager]


def reward_manager_class(config: PPOTrainerConfig) -> type:
    """The manager's class: registered as ``reward_model.reward_manager``, or with ``reward_manager_source=
    importlib`` the class of that name in ``reward_manager_module_path`` (raises CustomRewardError)."""
    reward_model = config.reward_model
    if manager_from_file(config):
        return load_reward_manager_class(reward_model.reward_manager_module_path, reward_model.reward_manager)
    return REWARD_MANAGERS.get(reward_model.reward_manager)


def reward_manager_traits(config: PPOTrainerConfig) -> Mapping[str, Any]:
    """The registry traits of the chosen manager (a loaded class: those of the registered class it derives from)."""
    if manager_from_file(config):
        return manager_class_traits(reward_manager_class(config))
    return REWARD_MANAGERS.traits(config.reward_model.reward_manager)


def manager_source_errors(config: PPOTrainerConfig) -> list[str]:
    """An unknown source, or a file source without a file; whether the file serves is the environment's check."""
    reward_model = config.reward_model
    if reward_model.reward_manager_source not in SOURCES:
        return [
            f"reward.reward_manager.source={reward_model.reward_manager_source!r} is not one of "
            f"[{', '.join(SOURCES)}]; set register (a registered manager) or importlib (a class in a file)"
        ]
    if manager_from_file(config) and not reward_model.reward_manager_module_path:
        return [
            "reward.reward_manager.source=importlib needs reward.reward_manager.module.path, the .py file that "
            f"defines class {reward_model.reward_manager}; set it"
        ]
    return []


def loadable_manager(config: PPOTrainerConfig) -> bool:
    """The manager's class can be had: a registered name, or a file class that loads (else another check says why)."""
    if manager_source_errors(config):
        return False
    if not manager_from_file(config):
        return config.reward_model.reward_manager in REWARD_MANAGERS
    try:
        reward_manager_class(config)
    except CustomRewardError:
        return False
    return True


def _options_set_elsewhere(config: PPOTrainerConfig) -> dict[str, tuple[str, Any]]:
    """Manager option -> (the config key that sets it, its value), for options reward_kwargs must not repeat."""
    buffer = config.reward_model.overlong_buffer
    options = {"reward_fn_key": ("data.reward_fn_key", config.data.reward_fn_key)}
    if config.reward_model.num_workers > 0:
        options["num_workers"] = ("reward_model.num_workers", config.reward_model.num_workers)
    if buffer.enable:
        options["overlong_buffer_len"] = ("reward_model.overlong_buffer.len", buffer.len)
        options["overlong_penalty_factor"] = ("reward_model.overlong_buffer.penalty_factor", buffer.penalty_factor)
    return options


def reward_manager_options(config: PPOTrainerConfig) -> dict[str, Any]:
    """Keyword options for ``build_reward_manager(config.reward_model.reward_manager, ...)``."""
    options = {}
    if "max_resp_len" in manager_parameters(reward_manager_class(config)):
        options["max_resp_len"] = config.data.max_response_length
    options.update(config.reward_model.reward_kwargs)
    options.update({name: value for name, (_, value) in _options_set_elsewhere(config).items()})
    return options


def reward_manager_errors(config: PPOTrainerConfig) -> list[str]:
    """Options the chosen manager does not have, lacks, or refuses, one line each naming the config key."""
    name = config.reward_model.reward_manager
    if not loadable_manager(config):
        return manager_source_errors(config)  # the registry check, or the environment's file check, says the rest
    parameters, traits = manager_parameters(reward_manager_class(config)), reward_manager_traits(config)
    errors = _reward_kwargs_errors(config, name, list(parameters))
    errors += _num_workers_errors(config, name, parameters)
    if config.reward_model.overlong_buffer.enable and "overlong_buffer_len" not in parameters:
        errors.append(
            f"reward_model.overlong_buffer.enable=true but reward manager {name!r} has no overlong penalty; "
            "set reward_model.reward_manager=dapo or reward_model.overlong_buffer.enable=false"
        )
    if errors:
        return errors + _function_errors(config, name)
    options = reward_manager_options(config)
    for option, parameter in parameters.items():
        if parameter.default is parameter.empty and option not in options:
            errors.append(
                f"reward_model.reward_manager={name!r} needs its option {option}; "
                f"set +reward_model.reward_kwargs.{option}"
            )
    if not errors and traits["option_errors"]:  # the manager's own checks, once it has every option it needs
        errors += traits["option_errors"](options)
    if "overlong_buffer_len" in options and "max_resp_len" in options:
        error = overlong_buffer_error(options["max_resp_len"], options["overlong_buffer_len"])
        errors += [f"reward_model.overlong_buffer.len: {error}"] if error else []
    return errors + _function_errors(config, name)


def _num_workers_errors(config: PPOTrainerConfig, name: str, parameters: Mapping[str, Any]) -> list[str]:
    """Scoring processes asked of a manager that does not run its calls in them, or with nothing to run there."""
    workers = config.reward_model.num_workers
    if workers < 0:
        return [f"reward_model.num_workers={workers} must be 0 (the driver's threads) or a number of processes"]
    if workers == 0:
        return []
    if "num_workers" not in parameters and not config.reward_model.enable:
        return [
            f"reward_model.num_workers={workers}: reward manager {name!r} does not run its calls in scoring "
            "processes; set reward_model.num_workers=0"
        ]
    return []


def num_workers_notes(config: PPOTrainerConfig) -> list[str]:
    """Scoring processes that nothing would use: the reward model scores every sample (verl's reward loop workers
    would send its requests; here its own worker group computes them)."""
    workers = config.reward_model.num_workers
    if workers > 0 and config.reward_model.enable:
        return [f"reward_model.num_workers={workers} starts no process: the reward model scores in its own workers"]
    return []


def _function_errors(config: PPOTrainerConfig, name: str) -> list[str]:
    """A reward function file given to a manager that scores without one (the remote judge)."""
    path = config.custom_reward_function.path
    if not path or reward_manager_traits(config)["scores_with_function"]:
        return []
    return [
        f"custom_reward_function.path={path!r} is set, but reward_model.reward_manager={name!r} scores without a "
        "reward function; unset custom_reward_function.path or choose another reward manager"
    ]


def _reward_kwargs_errors(config: PPOTrainerConfig, name: str, accepted: list[str]) -> list[str]:
    errors = []
    set_elsewhere = _options_set_elsewhere(config)
    for key in config.reward_model.reward_kwargs:
        full_key = f"reward_model.reward_kwargs.{key}"
        if key in set_elsewhere:
            errors.append(f"{full_key} repeats {set_elsewhere[key][0]}; set only {set_elsewhere[key][0]}")
        elif key not in accepted:
            close = difflib.get_close_matches(str(key), accepted, n=1)
            hint = f"did you mean {close[0]}?" if close else f"its options are [{', '.join(accepted)}]"
            errors.append(f"{full_key} is not an option of reward manager {name!r}; {hint}")
    return errors
