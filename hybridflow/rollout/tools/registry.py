"""The tool registry and the YAML that configures tools (``actor_rollout_ref.rollout.multi_turn.tool_config_path``).

    tools:
      - name: calculator                 # a registered tool ...
        config: {timeout: 5}
      - class_name: my_pkg.tools.Search  # ... or any BaseTool subclass by import path
        config: {timeout: 10}
        tool_schema:                     # optional: replaces the class's own schema
          type: function
          function: {name: search, description: ..., parameters: {...}}

Built-in names: ``calculator``, ``python`` (alias ``code_interpreter``).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import yaml

from hybridflow.errors import HybridflowError
from hybridflow.registry import Registry
from hybridflow.rollout.tools.base import BaseTool

TOOLS: Registry[type[BaseTool]] = Registry("tool", "actor_rollout_ref.rollout.multi_turn.tool_config_path")


class ToolConfigError(HybridflowError, ValueError):
    """The tool YAML is malformed; the message names the file, the entry and the fix."""


def load_tools(tool_config_path: str | os.PathLike | None) -> dict[str, BaseTool]:
    """Instantiate every tool listed in the YAML file, by the name the model calls it with."""
    if tool_config_path is None:
        return {}
    key = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
    try:
        with open(tool_config_path) as handle:
            document = yaml.safe_load(handle) or {}
    except OSError as error:
        raise ToolConfigError(
            f"{key}={str(tool_config_path)!r} cannot be read ({error.strerror}); fix the path"
        ) from None
    except yaml.YAMLError as error:
        reason = " ".join(str(error).split())
        raise ToolConfigError(f"{key}: {tool_config_path} is not valid YAML ({reason}); fix the file") from None
    entries = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ToolConfigError(f"{tool_config_path}: expected a top-level 'tools:' list of tool entries")
    return build_tools(entries, where=str(tool_config_path))


def build_tools(entries: list[dict[str, Any]], where: str = "tool config") -> dict[str, BaseTool]:
    tools: dict[str, BaseTool] = {}
    for index, entry in enumerate(entries):
        tool = _build_tool(entry, f"{where}: tools[{index}]")
        if tool.name in tools:
            raise ToolConfigError(f"{where}: two tools are named {tool.name!r}; give one a different tool_schema name")
        tools[tool.name] = tool
    return tools


def _build_tool(entry: Any, where: str) -> BaseTool:
    if not isinstance(entry, dict) or ("name" in entry) == ("class_name" in entry):
        raise ToolConfigError(f"{where}: give exactly one of 'name' (one of {TOOLS.names()}) or 'class_name'")
    cls = TOOLS.get(entry["name"]) if "name" in entry else _import_class(entry["class_name"], where)
    if not (isinstance(cls, type) and issubclass(cls, BaseTool)):
        raise ToolConfigError(f"{where}: {cls!r} is not a subclass of hybridflow.rollout.tools.BaseTool")
    return cls(config=entry.get("config") or {}, tool_schema=entry.get("tool_schema"))


def _import_class(dotted: str, where: str) -> Any:
    module_name, _, class_name = str(dotted).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as error:
        raise ToolConfigError(f"{where}: class_name {dotted!r} could not be imported ({error})") from error
