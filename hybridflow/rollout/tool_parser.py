"""Tool calls parsed from a model's text, by format name (``actor_rollout_ref.rollout.multi_turn.format``).

"hermes" (Hermes / Qwen2.5 / Qwen3): each call is a JSON object inside its own tags,

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2+3"}}
    </tool_call>

``arguments`` may be an object or a JSON string holding one. A block that does not parse becomes an error
entry (the agent loop answers it with a tool message saying what was wrong) rather than being dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

from hybridflow.registry import Registry


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ParsedOutput:
    """The text outside tool-call blocks, the calls in order, and one message per malformed block."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def has_calls(self) -> bool:
        return bool(self.tool_calls or self.errors)


TOOL_PARSERS: Registry[Callable[[str], ParsedOutput]] = Registry(
    "tool-call format", "actor_rollout_ref.rollout.multi_turn.format"
)

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@TOOL_PARSERS.register("hermes")
def parse_hermes(text: str) -> ParsedOutput:
    """Parse every ``<tool_call>{json}</tool_call>`` block of ``text``."""
    parsed = ParsedOutput(content=_HERMES_BLOCK.sub("", text).strip())
    for number, match in enumerate(_HERMES_BLOCK.finditer(text), start=1):
        call, error = _parse_call(match.group(1).strip())
        if error is not None:
            parsed.errors.append(f"tool call {number} could not be parsed: {error}")
        else:
            parsed.tool_calls.append(call)
    return parsed


def _parse_call(body: str) -> tuple[ToolCall | None, str | None]:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as error:
        return None, f"invalid JSON ({error.msg} at character {error.pos})"
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None, 'expected {"name": <string>, "arguments": <object>}'
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            return None, f"arguments is a string but not valid JSON ({error.msg})"
    if not isinstance(arguments, dict):
        return None, f"arguments must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name=payload["name"], arguments=arguments), None
