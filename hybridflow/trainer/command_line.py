"""A trainer's command line before Hydra sees it: verl's habits accepted, and mistakes named.

Hydra refuses ``+key=value`` for a key that exists and ``key=value`` for one that does not, without naming
the key that was meant; verl's scripts write ``+`` for keys verl's own YAML lacks but hybridflow's has. So a
redundant ``+`` is dropped, a capability hybridflow lacks (``model_engine=megatron``, ``engine=megatron``) is
refused in one line, a verl config-group choice hybridflow's YAML already holds (``engine=fsdp``) is dropped,
and an unknown key gets a close match, all before Hydra composes anything. Each function takes the trainer's
:class:`~hybridflow.trainer.key_surface.Surface` and schema (the PPO trainer's unless given).
"""

from __future__ import annotations

from typing import Any

import yaml

from hybridflow.trainer.config_schema import PPOTrainerConfig
from hybridflow.trainer.key_surface import Surface
from hybridflow.trainer.validate import unknown_key_errors
from hybridflow.trainer.verl_compat import PPO_SURFACE

HYDRA_OPTION_PREFIXES = ("-", "~", "hydra.")
VERL_ONLY_CONFIGS = {"megatron": "the Megatron training engine", "veomni": "the VeOmni training engine"}
# "surface": check keys and values only, then exit; "full": also this machine's files, packages and
# devices, then exit. Unset: check everything and run.
CONFIG_CHECK_ENV = "HYBRIDFLOW_CONFIG_CHECK"


def without_redundant_plus(args: list[str], surface: Surface = PPO_SURFACE) -> list[str]:
    """``+key=value`` as ``key=value`` where ``key`` already exists in the config (verl scripts add it)."""
    known = set(surface.schema_defaults) | set(surface.compat_defaults)
    return [arg[1:] if arg.startswith("+") and not arg.startswith("++") and _key(arg[1:]) in known else arg
            for arg in args]


def without_served_groups(args: list[str], surface: Surface) -> list[str]:
    """The arguments less the group choices hybridflow serves (``engine=fsdp``: its keys are in the YAML)."""
    return [arg for arg in args if _group_choice(arg, surface) is None]


def override_errors(
    args: list[str], surface: Surface = PPO_SURFACE, schema: type = PPOTrainerConfig
) -> list[str]:
    """Capabilities the overrides ask for that hybridflow lacks (alone, if any), else their unknown keys.

    A verl config name or group choosing another engine (``engine=megatron``) is decisive: its line comes alone."""
    lacks = _config_name_lacks(args) or _group_lacks(args, surface) or surface.lacks_lines(_override_values(args))
    if lacks:
        return lacks
    tree: dict = {}
    for arg in args:
        if "=" not in arg or arg.startswith(("+", *HYDRA_OPTION_PREFIXES)) or _group_choice(arg, surface):
            continue
        if surface.compat_key(_key(arg)) is not None:
            continue
        *parents, leaf = _key(arg).split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        if isinstance(node, dict):
            node[leaf] = None
    return unknown_key_errors(tree, schema)


def print_check_outcome(unread: list[str], check: str | None) -> None:
    """The start-up lines: keys accepted but not read by this run, and, under ``CONFIG_CHECK_ENV``, the verdict."""
    if unread:
        print(f"[hybridflow] accepted, but not read by this run ({len(unread)}):")
        for line in unread:
            print(f"[hybridflow]   {line}")
    if check:
        print(f"[hybridflow] config check passed ({check}); {CONFIG_CHECK_ENV} is set, so nothing runs")


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+")


def _group_choice(arg: str, surface: Surface) -> tuple[str, str] | None:
    """``(group, choice)`` when ``arg`` picks a served choice of one of the surface's config groups."""
    if "=" not in arg or arg.startswith(("+", *HYDRA_OPTION_PREFIXES)):
        return None
    name, choice = arg.split("=", 1)
    group = surface.group(name)
    return (name, choice) if group is not None and group.refusal(choice) is None else None


def _group_lacks(args: list[str], surface: Surface) -> list[str]:
    """The first group choice hybridflow lacks (another engine: the rest of the command line is moot then)."""
    for arg in args:
        name, _, choice = arg.partition("=")
        group = surface.group(name) if choice and not arg.startswith(HYDRA_OPTION_PREFIXES) else None
        if group is not None and group.refusal(choice) is not None:
            return [group.refusal(choice)]
    return []


def _override_values(args: list[str]) -> dict[str, Any]:
    values = {}
    for arg in args:
        if "=" in arg and not arg.startswith(HYDRA_OPTION_PREFIXES):
            text = arg.split("=", 1)[1]
            try:
                values[_key(arg)] = yaml.safe_load(text)
            except yaml.YAMLError:
                values[_key(arg)] = text
    return values


def _config_name_lacks(args: list[str]) -> list[str]:
    for arg in args:
        if arg.startswith("--config-name"):
            name = arg.split("=", 1)[-1]
            for word, what in VERL_ONLY_CONFIGS.items():
                if word in name:
                    return [f"{arg} needs {what}, which hybridflow does not have"]
    return []
