"""The tool interface the agent loop calls: create per sample, execute per call, reward hook, release.

One tool object serves every sample; per-sample state lives under the ``instance_id`` the agent loop passes.
``create`` receives the sample's ``tools_kwargs[<tool name>]["create_kwargs"]`` (from the dataset's
``extra_info.tools_kwargs``), e.g. a ground truth a reward hook compares against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolResult:
    """What one call returns: the text shown to the model, an optional step reward, and metrics."""

    text: str
    reward: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)


class BaseTool(ABC):
    """Subclasses set ``name``, ``description`` and ``parameters`` (a JSON schema) and implement ``execute``.

    ``config`` comes from the tool YAML; the key ``timeout`` (seconds, default 30) bounds each call, enforced by
    the agent loop. ``tool_schema`` from the YAML, when given, replaces the default OpenAI-style schema.
    """

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        self.config = dict(config or {})
        self.timeout = float(self.config.get("timeout", 30.0))
        self._schema = tool_schema
        if tool_schema is not None:
            self.name = tool_schema.get("function", tool_schema).get("name", self.name)
        self._instances: dict[str, dict[str, Any]] = {}

    @property
    def schema(self) -> dict[str, Any]:
        """The function schema given to the chat template (``tools=[...]``)."""
        if self._schema is not None:
            return self._schema
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}

    async def create(self, instance_id: str, **create_kwargs: Any) -> None:
        """Start per-sample state (default: remember the kwargs and the step rewards)."""
        self._instances[instance_id] = {"kwargs": create_kwargs, "rewards": []}

    @abstractmethod
    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        """Run one call. Raising is allowed: the agent loop turns the error into a tool message."""

    async def calc_reward(self, instance_id: str) -> float:
        """Per-tool reward hook, called once when the sample ends (default: the sum of step rewards)."""
        return float(sum(self._instances.get(instance_id, {}).get("rewards", [])))

    async def release(self, instance_id: str) -> None:
        self._instances.pop(instance_id, None)

    def record_reward(self, instance_id: str, reward: float) -> None:
        self._instances.setdefault(instance_id, {"kwargs": {}, "rewards": []})["rewards"].append(reward)

    def create_kwargs(self, instance_id: str) -> dict[str, Any]:
        return self._instances.get(instance_id, {}).get("kwargs", {})
