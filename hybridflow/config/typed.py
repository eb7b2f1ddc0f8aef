"""A Hydra/OmegaConf config as the typed schema: verl's other spellings of a value, keys the schema lacks, values
of the wrong type, each one line naming the key (the first job of the config check, ``config/load.py``)."""

from __future__ import annotations

import dataclasses
import difflib

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException

from hybridflow.config.schema import PPOTrainerConfig

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


def to_dataclass(config: DictConfig, keys_known: bool) -> tuple[PPOTrainerConfig | None, list[str]]:
    """The typed config; where it cannot be built, each section is merged onto the schema alone, so one bad
    section does not hide another's errors.

    Unknown keys are reported by :func:`unknown_key_errors`; here they are skipped, and no typed config is
    built while any remain.
    """
    schema = OmegaConf.structured(PPOTrainerConfig)
    whole_error = None
    if keys_known:  # the common case, a config that merges whole, merges once
        try:
            return OmegaConf.to_object(OmegaConf.merge(schema, config)), []
        except OmegaConfBaseException as error:
            whole_error = one_line(error, "")
        except (ValueError, TypeError) as error:  # a section's __post_init__ refused a value
            whole_error = " ".join(str(error).split())
    errors = []
    for section in config.keys():
        if section not in schema:
            continue
        try:
            OmegaConf.merge(schema[section], config[section])
        except ConfigKeyError:
            continue
        except OmegaConfBaseException as error:
            errors.append(one_line(error, section))
        except (ValueError, TypeError) as error:
            errors.append(f"{section}: {error}")
    return None, errors or ([whole_error] if whole_error else [])


def one_line(error: OmegaConfBaseException, section: str) -> str:
    key = getattr(error, "full_key", None) or ""
    full_key = f"{section}.{key}" if section and key and not key.startswith(section) else (key or section)
    message = str(error).splitlines()[0]
    return f"{full_key}: {message}; give a value of the type in the schema (hybridflow.config.schema)"
