import pytest

from hybridflow.registry import UnknownNameError
from hybridflow.rollout.tool_parser import TOOL_PARSERS, ToolCall, parse_hermes


def test_hermes_calls_are_parsed_in_order_with_object_or_string_arguments():
    text = (
        'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
    )
    parsed = parse_hermes(text)
    assert parsed.tool_calls == [
        ToolCall("calculator", {"expression": "2+3"}),
        ToolCall("python", {"code": "print(1)"}),
    ]
    assert parsed.content == "Let me compute." and parsed.errors == [] and parsed.has_calls


def test_text_without_calls_has_none():
    parsed = parse_hermes("The answer is 5.")
    assert not parsed.has_calls and parsed.content == "The answer is 5."


@pytest.mark.parametrize(
    "body, message",
    [
        ('{"name": "calculator", "arguments": {', "invalid JSON"),
        ('["calculator"]', '"name"'),
        ('{"name": "calculator", "arguments": 3}', "arguments must be a JSON object"),
    ],
)
def test_malformed_calls_become_errors(body, message):
    parsed = parse_hermes(f"<tool_call>{body}</tool_call>")
    assert parsed.tool_calls == [] and len(parsed.errors) == 1 and message in parsed.errors[0]
    assert parsed.has_calls


def test_formats_are_picked_by_name():
    assert TOOL_PARSERS.get("hermes") is parse_hermes
    with pytest.raises(UnknownNameError, match=r"multi_turn\.format='qwen9'.*hermes"):
        TOOL_PARSERS.get("qwen9")
