"""The ``main_ppo`` command line before Hydra sees it: verl's habits accepted, and mistakes named.

Hydra refuses ``+key=value`` for a key that exists and ``key=value`` for one that does not, without naming
the key that was meant; verl's scripts write ``+`` for keys verl's own YAML lacks but hybridflow's has. So a
redundant ``+`` is dropped, a capability hybridflow lacks (``model_engine=megatron``) is refused in one line,
and an unknown key gets a close match, all before Hydra composes anything.
"""

from __future__ import annotations

from typing import Any

import yaml

from hybridflow.trainer.config_schema import PPOTrainerConfig
from hybridflow.trainer.validate import unknown_key_errors
from hybridflow.trainer.verl_compat import compat_defaults, compat_key, lacks_lines, schema_yaml_defaults

HYDRA_OPTION_PREFIXES = ("-", "~", "hydra.")
VERL_ONLY_CONFIGS = {"megatron": "the Megatron training engine", "veomni": "the VeOmni training engine"}


def without_redundant_plus(args: list[str]) -> list[str]:
    """``+key=value`` as ``key=value`` where ``key`` already exists in the config (verl scripts add it)."""
    known = set(schema_yaml_defaults()) | set(compat_defaults())
    return [arg[1:] if arg.startswith("+") and not arg.startswith("++") and _key(arg[1:]) in known else arg
            for arg in args]


def override_errors(args: list[str]) -> list[str]:
    """Capabilities the overrides ask for that hybridflow lacks (alone, if any), else their unknown keys."""
    lacks = _config_name_lacks(args) or lacks_lines(_override_values(args))
    if lacks:
        return lacks
    tree: dict = {}
    for arg in args:
        if "=" not in arg or arg.startswith(("+", *HYDRA_OPTION_PREFIXES)) or compat_key(_key(arg)) is not None:
            continue
        *parents, leaf = _key(arg).split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        if isinstance(node, dict):
            node[leaf] = None
    return unknown_key_errors(tree, PPOTrainerConfig)


def _key(arg: str) -> str:
    return arg.split("=", 1)[0].lstrip("+")


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
