"""The reward manager's keyword options, gathered from the config where verl users set them.

``reward_model.reward_kwargs`` goes to the manager as it is (verl's ``load_reward_manager(**reward_kwargs)``).
Options the config holds under other keys are filled in from there: ``reward_fn_key`` from
``data.reward_fn_key``; ``max_resp_len`` (DAPO's length limit) from ``data.max_response_length`` unless
``reward_kwargs`` sets it; DAPO's overlong penalty from ``reward_model.overlong_buffer`` (the layout of
verl's DAPO recipe). :func:`reward_manager_errors` checks them all before anything starts, with the checks the
manager's registry entry carries (``option_errors``: the remote judge's URL and limits).
"""

from __future__ import annotations

import difflib
from typing import Any

from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.rewards import REWARD_MANAGERS, manager_parameters, overlong_buffer_error


def _options_set_elsewhere(config: PPOTrainerConfig) -> dict[str, tuple[str, Any]]:
    """Manager option -> (the config key that sets it, its value), for options reward_kwargs must not repeat."""
    buffer = config.reward_model.overlong_buffer
    options = {"reward_fn_key": ("data.reward_fn_key", config.data.reward_fn_key)}
    if buffer.enable:
        options["overlong_buffer_len"] = ("reward_model.overlong_buffer.len", buffer.len)
        options["overlong_penalty_factor"] = ("reward_model.overlong_buffer.penalty_factor", buffer.penalty_factor)
    return options


def reward_manager_options(config: PPOTrainerConfig) -> dict[str, Any]:
    """Keyword options for ``build_reward_manager(config.reward_model.reward_manager, ...)``."""
    options = {}
    if "max_resp_len" in manager_parameters(config.reward_model.reward_manager):
        options["max_resp_len"] = config.data.max_response_length
    options.update(config.reward_model.reward_kwargs)
    options.update({name: value for name, (_, value) in _options_set_elsewhere(config).items()})
    return options


def reward_manager_errors(config: PPOTrainerConfig) -> list[str]:
    """Options the chosen manager does not have, lacks, or refuses, one line each naming the config key."""
    name = config.reward_model.reward_manager
    if name not in REWARD_MANAGERS:
        return []  # the registry check reports the name itself
    parameters, traits = manager_parameters(name), REWARD_MANAGERS.traits(name)
    errors = _reward_kwargs_errors(config, name, list(parameters))
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


def _function_errors(config: PPOTrainerConfig, name: str) -> list[str]:
    """A reward function file given to a manager that scores without one (the remote judge)."""
    path = config.custom_reward_function.path
    if not path or REWARD_MANAGERS.traits(name)["scores_with_function"]:
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
