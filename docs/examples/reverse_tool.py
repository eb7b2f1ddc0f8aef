"""A tool for multi-turn rollouts: reverses a string. Listed in tools.yaml by its import path."""

from typing import Any

from hybridflow.rollout.tools import BaseTool, ToolResult


class ReverseTool(BaseTool):
    name = "reverse"
    description = "Reverse the characters of a text."
    parameters = {
        "type": "object",
        "properties": {"text": {"type": "string", "description": "The text to reverse."}},
        "required": ["text"],
    }

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        text = arguments.get("text")
        if not isinstance(text, str):
            return ToolResult("Error: 'text' must be a string")
        reversed_text = text[::-1]
        # create_kwargs come from the row's extra_info.tools_kwargs.reverse.create_kwargs.
        solved = reversed_text == self.create_kwargs(instance_id).get("ground_truth")
        return ToolResult(reversed_text, reward=1.0 if solved else 0.0)
