"""Tools for multi-turn rollouts: the interface, the registry/YAML loader, and the built-in tools."""

from hybridflow.rollout.tools import calculator, python_executor  # noqa: F401 - register the built-in tools
from hybridflow.rollout.tools.base import BaseTool, ToolResult
from hybridflow.rollout.tools.registry import TOOLS, ToolConfigError, build_tools, load_tools

__all__ = ["TOOLS", "BaseTool", "ToolConfigError", "ToolResult", "build_tools", "load_tools"]
