"""Generate docs/config_reference.md from hybridflow/config/yaml/ppo_trainer.yaml.

Every key of the YAML becomes a table row: its dotted name, its default exactly as the YAML writes it
(``${...}`` interpolations included) and its help, which is the key's inline YAML comment. A section's
help is the comment line directly above it. Where the YAML has no comment, the help comes from the
schema (``field.metadata["help"]`` in hybridflow/config/schema.py); schema keys missing from the
YAML are listed too, so the reference covers every key the trainer accepts.

    python docs/gen_config_reference.py           # rewrite docs/config_reference.md
    python docs/gen_config_reference.py --check   # exit 1 if the committed file is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from dataclasses import dataclass, field

import yaml

REPO = pathlib.Path(__file__).resolve().parent.parent
YAML_PATH = REPO / "hybridflow" / "config" / "yaml" / "ppo_trainer.yaml"
OUTPUT_PATH = REPO / "docs" / "config_reference.md"
COMMAND = "python docs/gen_config_reference.py"


class MissingHelpError(ValueError):
    """A config key has neither a YAML comment nor schema help."""


@dataclass
class Section:
    """One mapping of the config: its dotted name, help, leaf rows (key, default, help) and subsections."""

    name: str
    help: str
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    children: list[Section] = field(default_factory=list)


def _comment(text: str) -> str | None:
    text = text.strip()
    return text.lstrip("#").strip() if text.startswith("#") else None


def schema_entries(cls: type, prefix: str = "") -> dict[str, tuple[str, str | None]]:
    """{dotted key: (default as text, or "section", help)} for every field of the dataclass ``cls``."""
    entries = {}
    for item in dataclasses.fields(cls):
        key = f"{prefix}{item.name}"
        default = item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
        if dataclasses.is_dataclass(default):
            entries[key] = ("section", item.metadata.get("help"))
            entries.update(schema_entries(type(default), f"{key}."))
        else:
            entries[key] = (json.dumps(default), item.metadata.get("help"))
    return entries


class ReferenceBuilder:
    """Walks the YAML's node tree (so key order, raw defaults and comment lines are kept)."""

    def __init__(self, text: str, schema: dict[str, tuple[str, str | None]]):
        self.text = text
        self.lines = text.splitlines()
        self.schema = schema
        self.seen: set[str] = set()

    def _help(self, key: str, comment: str | None) -> str:
        help_text = comment or self.schema.get(key, ("", None))[1]
        if not help_text:
            raise MissingHelpError(
                f"config key {key} has no help: add an inline comment in {YAML_PATH.name} or help= in its schema field"
            )
        return help_text

    def section(self, node: yaml.MappingNode, name: str, help_text: str) -> Section:
        section = Section(name, help_text)
        prefix = f"{name}." if name else ""
        for key_node, value_node in node.value:
            if not name and key_node.value == "defaults":  # Hydra's defaults list, not a key
                continue
            key = f"{prefix}{key_node.value}"
            self.seen.add(key)
            if isinstance(value_node, yaml.MappingNode) and value_node.value:
                above = self.lines[key_node.start_mark.line - 1] if key_node.start_mark.line else ""
                section.children.append(self.section(value_node, key, self._help(key, _comment(above))))
            else:
                default = self.text[value_node.start_mark.index : value_node.end_mark.index]
                rest = self.lines[value_node.end_mark.line][value_node.end_mark.column :]
                section.rows.append((key, default, self._help(key, _comment(rest))))
        self._add_schema_only(section, prefix)
        return section

    def _add_schema_only(self, section: Section, prefix: str) -> None:
        """Keys the schema accepts under ``section`` that the YAML does not write out."""
        for key, (default, _) in self.schema.items():
            direct = key.startswith(prefix) and "." not in key[len(prefix) :]
            if direct and key not in self.seen and default != "section":
                section.rows.append((key, default, f"{self._help(key, None)} (not in {YAML_PATH.name})"))
                self.seen.add(key)

    def header(self, root: yaml.MappingNode) -> list[str]:
        """The YAML's leading comment lines, without the one that is the first section's help."""
        first_line = root.value[0][0].start_mark.line
        leading = []
        for line in self.lines[:first_line]:
            comment = _comment(line)
            if comment is None:
                break
            leading.append(comment)
        return leading[:-1] if len(leading) == first_line else leading


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _render_section(section: Section, level: int) -> list[str]:
    lines = [f"{'#' * level} `{section.name}`", "", section.help, ""]
    if section.rows:
        lines += ["| Key | Default | Help |", "|---|---|---|"]
        lines += [f"| `{key}` | `{_cell(default)}` | {_cell(help_text)} |" for key, default, help_text in section.rows]
        lines.append("")
    for child in section.children:
        lines += _render_section(child, 3)
    return lines


def generate(yaml_path: pathlib.Path = YAML_PATH) -> str:
    """The full text of docs/config_reference.md."""
    from hybridflow.config.schema import PPOTrainerConfig

    text = yaml_path.read_text()
    root = yaml.compose(text)
    builder = ReferenceBuilder(text, schema_entries(PPOTrainerConfig))
    top = builder.section(root, "", "")
    relative = yaml_path.resolve().relative_to(REPO) if yaml_path.resolve().is_relative_to(REPO) else yaml_path
    lines = [
        "# Config reference: `ppo_trainer.yaml`",
        "",
        f"<!-- Generated by `{COMMAND}` from {relative}; edit the YAML comments, not this file. -->",
        "",
        "Every key `python -m hybridflow.trainer.main_ppo` accepts, its default and what it does. Set a key on",
        "the command line as `section.key=value` (Hydra overrides); an unknown key is refused before anything",
        "starts. A default `${other.key}` follows that key. Defaults and help are read from",
        f"[`{relative}`](../{relative}), so this page cannot drift from it.",
        "",
        *(f"> {line}" for line in builder.header(root)),
        "",
        "Sections: " + " · ".join(f"[`{child.name}`](#{child.name})" for child in top.children),
        "",
    ]
    for child in top.children:
        lines += _render_section(child, 2)
    lines += _verl_only_keys()
    return "\n".join(lines).rstrip() + "\n"


def _verl_only_keys() -> list[str]:
    """One row per alias or refusal of hybridflow/config/verl_compat.py, then the keys accepted but not read."""
    from hybridflow.config.verl_compat import COMPAT_YAML, PPO_SURFACE
    from hybridflow.config.verl_sft_compat import SFT_SURFACE

    meaning = {"alias": "another name of `{what}`", "lacks": "refused unless at verl's default: needs {what}"}
    lines = [
        "## verl's other keys",
        "",
        f"Keys of verl's config that hybridflow has no field for live in `{COMPAT_YAML.name}` with verl's",
        "defaults (merged under the trainer config), and the first matching rule of",
        "`hybridflow/config/verl_compat.py` says what each means here. A refused value stops the run before",
        "anything starts, in one line naming the missing capability.",
        "",
        "| Keys | Means | verl keys |",
        "|---|---|---|",
    ]
    counts = _rule_counts(PPO_SURFACE)
    for rule in PPO_SURFACE.rules:
        if counts.get(rule) and rule.kind in meaning:
            text = meaning[rule.kind].format(what=rule.what)
            if rule.served_with:
                text = text.replace(
                    "unless at verl's default", "unless at verl's default or with `{}={}`".format(*rule.served_with)
                )
            lines.append(f"| `{_cell(rule.pattern)}` | {_cell(text)} | {counts[rule]} |")
    lines += [
        "",
        "### Accepted, but not read",
        "",
        "These keys change nothing in hybridflow, each for the reason given: a knob of speed or memory whose",
        "results are the same, a key read only with a capability refused above, or one that follows a schema key.",
        "Set to anything but verl's default, each is listed once in the start-up banner with its reason. (An",
        "engine knob of the schema, such as `rollout.enforce_eager`, is listed the same way on the engine that",
        "does not read it.)",
        "",
    ]
    for title, surface in (("`main_ppo`", PPO_SURFACE), ("`main_sft`", SFT_SURFACE)):
        counts = _rule_counts(surface)
        lines += [f"{title}:", "", "| Keys | Why it changes nothing | verl keys |", "|---|---|---|"]
        for rule in surface.rules:
            if counts.get(rule) and rule.kind == "unread":
                lines.append(f"| `{_cell(rule.pattern)}` | {_cell(rule.what)} | {counts[rule]} |")
        lines.append("")
    return lines


def _rule_counts(surface) -> dict:
    """How many of the surface's keys each rule decides."""
    counts: dict = {}
    for key in surface.compat_defaults:
        counts[surface.rule_for(key)] = counts.get(surface.rule_for(key), 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only compare with the committed file")
    args = parser.parse_args(argv)
    fresh = generate()
    if args.check:
        if not OUTPUT_PATH.exists() or OUTPUT_PATH.read_text() != fresh:
            print(f"{OUTPUT_PATH.relative_to(REPO)} is stale; run: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    OUTPUT_PATH.write_text(fresh)
    print(f"wrote {OUTPUT_PATH.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
