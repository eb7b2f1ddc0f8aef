import asyncio

import pytest

from hybridflow.rollout.tools.calculator import CalculatorError, CalculatorTool, evaluate


@pytest.mark.parametrize(
    "expression, value",
    [
        ("2+3", 5),
        ("(2+3)*4 - 1", 19),
        ("7 // 2 + 7 % 2", 4),
        ("2**10", 1024),
        ("-3 + sqrt(16)", 1.0),
        ("max(1, 5, 3)", 5),
    ],
)
def test_arithmetic(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os').system('ls')", "9**9**9", "a + 1", "open('x')", "1 +"])
def test_anything_else_is_refused(expression):
    with pytest.raises(CalculatorError):
        evaluate(expression)


def test_tool_answers_errors_as_text():
    tool = CalculatorTool()
    assert asyncio.run(tool.execute("i", {"expression": "6*7"})).text == "42"
    assert asyncio.run(tool.execute("i", {"expression": "1/0"})).text.startswith("Error: division by zero")
    assert "expression" in asyncio.run(tool.execute("i", {})).text
    assert tool.schema["function"]["name"] == "calculator"
