"""Accept another framework's config keys that a schema lacks: each aliased, refused, or listed as unread.

A :class:`Surface` is a YAML of keys the schema has no field for (with the other framework's defaults, merged
under the trainer's config by Hydra) and :class:`Rule` s saying what each means here (first matching pattern
wins):

- ``alias``: another name of a schema key; a value set there is moved to the schema key, and setting both
  differently is an error.
- ``lacks``: a capability hybridflow does not have; a value other than the default (or one in ``allowed``)
  is refused, naming the capability.
- ``unread``: a knob of a component hybridflow does not run; accepted, and a value other than the default is
  listed once at start-up as not read by this run.

A :class:`Group` is one of the other framework's Hydra config groups (``engine=fsdp``): hybridflow's YAML holds
the keys of the choices it serves inline, so choosing one of those changes nothing, and any other is refused.

:meth:`Surface.split` takes these keys out of a composed config before the schema sees it. The PPO trainer's
surface is :mod:`hybridflow.config.verl_compat`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import pathlib
from dataclasses import dataclass, field
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

ALIAS, LACKS, UNREAD = "alias", "lacks", "unread"


@dataclass(frozen=True)
class Rule:
    """What the keys matching ``pattern`` (an fnmatch glob over the dotted key) mean in hybridflow."""

    pattern: str
    kind: str
    what: str  # lacks: the missing capability; unread: why nothing reads it; alias: the schema key ('*' = suffix)
    allowed: tuple = ()  # lacks: values besides the default that hybridflow serves itself
    decisive: bool = False  # lacks: a choice of engine or device; refused alone, the rest of the config is moot
    same_as: str = ""  # lacks: a value equal to this key's asks for nothing more (a copy of a key this one follows)
    served_with: tuple[str, Any] = ()  # lacks: any value is served while this (key, value) is set

    def target(self, key: str) -> str:
        """The schema key an alias points at: ``what`` with ``*`` replaced by the part ``*`` matched."""
        if "*" not in self.what:
            return self.what
        prefix = self.pattern.split("*", 1)[0]
        return self.what.replace("*", key[len(prefix) :])


def lacks(
    pattern: str, what: str, *allowed: Any, decisive: bool = False, same_as: str = "", served_with: tuple[str, Any] = ()
) -> Rule:
    return Rule(pattern, LACKS, what, tuple(allowed), decisive, same_as, served_with)


def unread(pattern: str, why: str) -> Rule:
    return Rule(pattern, UNREAD, why)


def moot(pattern: str, switch: str) -> Rule:
    """``unread`` keys read only when ``switch`` is on, which a ``lacks`` rule refuses: they change nothing."""
    return Rule(pattern, UNREAD, f"read only with {switch}, which hybridflow refuses")


def alias(pattern: str, target: str) -> Rule:
    return Rule(pattern, ALIAS, target)


@dataclass(frozen=True)
class Group:
    """A config group ``name``: choosing one of ``served`` changes nothing here, any other choice needs ``lacks``."""

    name: str
    served: tuple[str, ...]
    lacks: str

    def refusal(self, choice: str) -> str | None:
        """The one-line refusal of ``name=choice``, or None for a served choice."""
        return None if choice in self.served else _lacks_line(self.name, choice, self.lacks)


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as {dotted key: leaf}; an empty mapping is a leaf (an open dict such as engine_kwargs)."""
    flat = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


@dataclass
class CompatReport:
    """What the surface's keys in one config amount to."""

    lacks: list[str] = field(default_factory=list)  # one line per missing capability the config asks for
    errors: list[str] = field(default_factory=list)  # an alias and its schema key set to different values
    unread: list[str] = field(default_factory=list)  # "key=value (why)", for the start-up banner


@dataclass(frozen=True)
class Surface:
    """The keys of ``compat_yaml`` (the schema's are in ``schema_yaml``), what ``rules`` say they mean,
    ``choices``: {(schema key, value): missing capability} for values of schema keys hybridflow cannot serve
    (decisive, like an engine choice), and the other framework's config ``groups``."""

    compat_yaml: pathlib.Path
    schema_yaml: pathlib.Path
    rules: tuple[Rule, ...]
    choices: tuple[tuple[tuple[str, Any], str], ...] = ()
    groups: tuple[Group, ...] = ()

    def group(self, name: str) -> Group | None:
        return next((group for group in self.groups if group.name == name), None)

    def rule_for(self, key: str) -> Rule | None:
        """The first rule whose pattern matches ``key``, or None."""
        if key not in self._rules_found:  # every config check asks for most keys: each is matched once
            self._rules_found[key] = next((rule for rule in self.rules if fnmatch.fnmatchcase(key, rule.pattern)), None)
        return self._rules_found[key]

    @functools.cached_property
    def _rules_found(self) -> dict[str, Rule | None]:
        return {}

    @functools.cached_property
    def compat_defaults(self) -> dict[str, Any]:
        """{dotted key: default} of every key in ``compat_yaml`` (empty mappings are leaves)."""
        return flatten(yaml.safe_load(self.compat_yaml.read_text()) or {})

    @functools.cached_property
    def schema_defaults(self) -> dict[str, Any]:
        """{dotted key: default} of the schema's own YAML (interpolations unresolved, no defaults list)."""
        tree = yaml.safe_load(self.schema_yaml.read_text())
        tree.pop("defaults", None)
        return flatten(tree)

    def split(self, config: DictConfig) -> tuple[DictConfig, CompatReport]:
        """``config`` without the surface's keys (aliases moved to their schema keys), and what they meant."""
        raw = OmegaConf.to_container(config, resolve=False)
        values = flatten(raw)
        report = CompatReport(lacks=self.lacks_lines(values))
        under: dict[str, dict[str, Any]] = {}  # the leaves at each surface key or below it (an open dict's too)
        for dotted, value in values.items():
            key = self.compat_key(dotted)
            if key is not None:
                under.setdefault(key, {})[dotted] = value
        for key, default in self.compat_defaults.items():
            rule = self.rule_for(key)
            for dotted, value in under.get(key, {}).items():
                if value == default or rule is None:
                    continue
                if rule.kind == ALIAS:
                    self._move_alias(raw, values, dotted, rule.target(dotted), value, report)
                elif rule.kind == UNREAD:
                    report.unread.append(f"{dotted}={_show(value)} ({rule.what})")
            _drop(raw, key)
        return OmegaConf.create(raw), report

    def lacks_lines(self, values: dict[str, Any]) -> list[str]:
        """One line per capability that the dotted ``values`` ask for and hybridflow lacks (each named once);
        only the first if one of them is a decisive choice (an engine or device: the rest is moot then)."""
        decisive = [_lacks_line(key, choice, what) for (key, choice), what in self.choices if values.get(key) == choice]
        lines = {}
        for dotted, value in values.items():
            key = self.compat_key(dotted)
            rule = self.rule_for(key) if key is not None else None
            default = self.compat_defaults.get(key)
            if rule is not None and rule.kind == LACKS and not _served(rule, value, default, values):
                line = _lacks_line(dotted, value, rule.what)
                if rule.decisive:
                    decisive.append(line)
                lines.setdefault(rule.what, line)
        return decisive[:1] or list(lines.values())

    def compat_key(self, dotted: str) -> str | None:
        """The surface key that ``dotted`` is, or lies under (an open dict such as engine_kwargs.vllm); else None."""
        parts = dotted.split(".")
        keys = (".".join(parts[:i]) for i in range(len(parts), 0, -1))
        return next((key for key in keys if key in self.compat_defaults), None)

    def _move_alias(self, raw: dict, values: dict, alias: str, target: str, value: Any, report: CompatReport) -> None:
        current = values.get(target)
        if current != value and current != self.schema_defaults.get(target):
            report.errors.append(f"{alias}={_show(value)} and {target}={_show(current)} set the same thing; keep one")
            return
        *parents, leaf = target.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value


def _served(rule: Rule, value: Any, default: Any, values: dict[str, Any]) -> bool:
    """A ``lacks`` key at its default, at a value in ``allowed``, equal to the key it follows (``same_as``), or
    set beside the setting that serves it (``served_with``)."""
    if rule.served_with and values.get(rule.served_with[0]) == rule.served_with[1]:
        return True
    return value == default or value in rule.allowed or (bool(rule.same_as) and values.get(rule.same_as) == value)


def _drop(raw: dict, key: str) -> None:
    """Remove ``key`` and then every section the removal left empty (verl-only sections vanish whole)."""
    *parents, leaf = key.split(".")
    chain, node = [], raw
    for part in parents:
        if not isinstance(node.get(part), dict):
            return
        chain.append((node, part))
        node = node[part]
    node.pop(leaf, None)
    for parent, part in reversed(chain):
        if parent[part] == {}:
            del parent[part]


def unread_engine_options(config: Any) -> list[str]:
    """Engine knobs (fields with ``read_by``) set to a non-default value that this run's engine does not read."""
    engine = config.actor_rollout_ref.rollout.name
    return [
        f"{key}={_show(value)} (read only by the {' and '.join(readers)} rollout engine; this run uses {engine})"
        for key, value, default, readers in _engine_fields(config, "")
        if engine not in readers and value != default
    ]


def unread_sync_check(config: Any) -> list[str]:
    """The weight sync check where the engine cannot read its weights back (``vllm_engine.weights_checksum``)."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "vllm" or rollout.weight_sync_check_freq == 0:
        return []
    return [
        f"actor_rollout_ref.rollout.weight_sync_check_freq={rollout.weight_sync_check_freq} (vLLM fuses and repacks "
        "the weights it is sent, so no checksum of what it holds can match the actor's; every sync is still checked "
        "to have loaded each of its weights)"
    ]


def _engine_fields(node: Any, prefix: str):
    for item in dataclasses.fields(node):
        value = getattr(node, item.name)
        if dataclasses.is_dataclass(value):
            yield from _engine_fields(value, f"{prefix}{item.name}.")
        elif item.metadata.get("read_by"):
            default = item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
            yield f"{prefix}{item.name}", value, default, item.metadata["read_by"]


def _lacks_line(key: str, value: Any, what: str) -> str:
    return f"{key}={_show(value)} needs {what}, which hybridflow does not have"


def _show(value: Any) -> str:
    return "null" if value is None else str(value)
