"""A trainer's command line before Hydra sees it: verl's habits accepted, and mistakes named.

Hydra refuses ``+key=value`` for a key that exists and ``key=value`` for one that does not, without naming
the key that was meant; verl's scripts write ``+`` for keys verl's own YAML lacks but hybridflow's has. So a
redundant ``+`` is dropped, a capability hybridflow lacks (``model_engine=megatron``, ``engine=megatron``) is
refused in one line, a verl config-group choice hybridflow's YAML already holds (``engine=fsdp``) is dropped,
and an unknown key gets a close match, all before Hydra composes anything. Each function takes the trainer's
:class:`~hybridflow.config.key_surface.Surface` and schema (the PPO trainer's unless given).
"""

from __future__ import annotations

import pathlib
from typing import Any, Callable, TypeVar

import yaml

from hybridflow.config.key_surface import Surface
from hybridflow.config.load import ConfigError
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.typed import unknown_key_errors
from hybridflow.config.verl_compat import PPO_SURFACE

HYDRA_OPTION_PREFIXES = ("-", "~", "hydra.", "hydra/")
CONFIG_FOLDER = pathlib.Path(__file__).parent / "yaml"
CONFIG_PATH_OPTIONS = ("--config-path", "-cp")
VERL_ONLY_CONFIGS = {"megatron": "the Megatron training engine", "veomni": "the VeOmni training engine"}
# "surface": check keys and values only, then exit; "full": also this machine's files, packages and devices,
# and read the data, tokenizer, reward function and tools as a run would before Ray, then exit; "plan": "full",
# then print the run plan (main_ppo's --plan). Unset: run.
CONFIG_CHECK_ENV = "HYBRIDFLOW_CONFIG_CHECK"
FULL_CHECK = "full"
T = TypeVar("T")


def without_redundant_plus(args: list[str], surface: Surface = PPO_SURFACE) -> list[str]:
    """``+key=value`` as ``key=value`` where ``key`` already exists in the config (verl scripts add it)."""
    known = set(surface.schema_defaults) | set(surface.compat_defaults)
    return [
        arg[1:] if arg.startswith("+") and not arg.startswith("++") and _key(arg[1:]) in known else arg for arg in args
    ]


def without_served_groups(args: list[str], surface: Surface) -> list[str]:
    """The arguments less the group choices hybridflow serves (``engine=fsdp``: its keys are in the YAML)."""
    return [arg for arg in args if _group_choice(arg, surface) is None]


def override_errors(args: list[str], surface: Surface = PPO_SURFACE, schema: type = PPOTrainerConfig) -> list[str]:
    """What is wrong with a command line before Hydra: the decisive errors alone if any, else the unknown keys."""
    flags, overrides = split_hydra_flags(args)
    return _config_name_lacks(flags) or (
        decisive_override_errors(overrides, surface) or unknown_override_errors(overrides, surface, schema)
    )


def decisive_override_errors(args: list[str], surface: Surface = PPO_SURFACE) -> list[str]:
    """Arguments Hydra cannot parse, or capabilities they ask for that hybridflow lacks: the rest is moot then.

    A verl config name or group choosing another engine (``engine=megatron``) comes alone."""
    if syntax := hydra_syntax_errors(args):
        return syntax
    return _group_lacks(args, surface) or surface.lacks_lines(_override_values(args))


def unknown_override_errors(
    args: list[str], surface: Surface = PPO_SURFACE, schema: type = PPOTrainerConfig
) -> list[str]:
    """One line per key the schema does not have (with a close match)."""
    tree: dict = {}
    for arg in _plain_overrides(args, surface):
        *parents, leaf = _key(arg).split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        if isinstance(node, dict):
            node[leaf] = None
    return unknown_key_errors(tree, schema)


def without_unknown_keys(args: list[str], surface: Surface = PPO_SURFACE, schema: type = PPOTrainerConfig) -> list[str]:
    """The arguments less those setting an unknown key, so Hydra composes the rest and every problem shows at once."""
    plain = set(_plain_overrides(args, surface))
    return [arg for arg in args if arg not in plain or not unknown_override_errors([arg], surface, schema)]


def _plain_overrides(args: list[str], surface: Surface) -> list[str]:
    """``key=value`` and ``+key=value`` arguments meant for the schema (not Hydra options, ``++``, groups or verl's
    keys): a ``+`` key the schema lacks is as wrong as a plain one, and is named with the rest."""
    return [
        arg
        for arg in args
        if "=" in arg
        and not arg.startswith(("++", *HYDRA_OPTION_PREFIXES))
        and not _group_choice(arg, surface)
        and surface.compat_key(_key(arg)) is None
    ]


def hydra_syntax_errors(args: list[str]) -> list[str]:
    """One line per argument Hydra's override grammar cannot parse (Hydra itself would answer with a traceback)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser, errors = OverridesParser.create(), []
    for arg in args:
        if arg.startswith("-"):
            continue
        try:
            parser.parse_overrides([arg])
        except OverrideParseException as error:
            reason = " ".join(str(error.message).split())
            errors.append(f"{arg!r} is not a valid key=value override ({reason}); quote values with spaces or brackets")
    return errors


def hydra_arguments(
    argv: list[str], surface: Surface = PPO_SURFACE, schema: type = PPOTrainerConfig
) -> tuple[list[str], list[str]]:
    """``(arguments for Hydra, one line per unknown key)``; raises :class:`ConfigError` for a decisive mistake.

    Hydra's own flags (``--cfg job``, ``-cn name``, ``-m``, ...) pass through as they are. Unknown keys are left out
    of Hydra's arguments (it would refuse them alone) and reported together with the composed config's own
    problems, so one run names every mistake."""
    flags, overrides = split_hydra_flags(argv)
    flags = with_own_config_folder(flags)
    args = without_redundant_plus(overrides, surface)
    if errors := _config_name_lacks(flags) + _shared_run_folder(flags, args) or decisive_override_errors(args, surface):
        raise ConfigError(errors)
    unknown = unknown_override_errors(args, surface, schema)
    return flags + without_served_groups(without_unknown_keys(args, surface, schema), surface), unknown


def with_own_config_folder(flags: list[str]) -> list[str]:
    """``flags`` with verl's ``--config-path=config`` (``-cp config``), its entry point's own config folder, naming
    hybridflow's, which holds the config files of verl's names."""
    named = []
    for flag in flags:
        option, _, value = flag.partition("=")
        if option in CONFIG_PATH_OPTIONS and value == "config":
            flag = f"{option}={CONFIG_FOLDER}"
        elif flag == "config" and named and named[-1] in CONFIG_PATH_OPTIONS:
            flag = str(CONFIG_FOLDER)
        named.append(flag)
    return named


def split_hydra_flags(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(Hydra's flags with their values, the overrides)``, read with Hydra's own argument parser's table: a flag
    that takes a value takes the next argument (``--cfg job``, ``-cn name``) unless written ``--flag=value``; one
    whose value is optional (``--info``) takes the next argument only when it is not an override or a flag."""
    from hydra._internal.utils import get_args_parser

    takes = {option: action.nargs for action in get_args_parser()._actions for option in action.option_strings}
    flags, overrides, position = [], [], 0
    while position < len(argv):
        arg = argv[position]
        option = arg.split("=", 1)[0]
        position += 1
        if option not in takes:
            overrides.append(arg)
            continue
        flags.append(arg)
        nargs, following = takes[option], argv[position] if position < len(argv) else None
        wants_value = nargs is None or (nargs == "?" and following is not None and "=" not in following)
        if "=" not in arg and wants_value and following is not None and not following.startswith("-"):
            flags.append(following)
            position += 1
    return flags, overrides


def checked_with(earlier_errors: list[str], load: Callable[[], T]) -> T:
    """``load()``'s checked config, its problems reported together with ``earlier_errors`` (unknown keys)."""
    try:
        loaded = load()
    except ConfigError as error:
        raise ConfigError(earlier_errors + error.errors) from None
    if earlier_errors:
        raise ConfigError(earlier_errors)
    return loaded


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


def _shared_run_folder(flags: list[str], args: list[str]) -> list[str]:
    """A sweep (``-m``) whose runs would share one run folder: each would resume from the one before."""
    if not {"-m", "--multirun"} & set(flags) or any(arg.startswith("trainer.default_local_dir=") for arg in args):
        return []
    return [
        "-m/--multirun runs the sweep one run after another, each in trainer.default_local_dir, so each would resume "
        "from the one before; give each run its own, e.g. trainer.default_local_dir='runs/${hydra:job.num}'"
    ]


def _config_name_lacks(flags: list[str]) -> list[str]:
    """A verl config name (``--config-name=ppo_megatron_trainer``, ``-cn ...``) for an engine hybridflow lacks."""
    for flag, following in zip(flags, flags[1:] + [""]):
        option, _, name = flag.partition("=")
        if option in ("--config-name", "-cn"):
            written = flag if name else f"{flag} {following}"
            for word, what in VERL_ONLY_CONFIGS.items():
                if word in (name or following):
                    return [f"{written} needs {what}, which hybridflow does not have"]
    return []
