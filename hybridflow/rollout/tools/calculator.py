"""A calculator tool: evaluates an arithmetic expression by walking its syntax tree (never ``eval``).

Allowed: numbers, ``+ - * / // % **``, parentheses, and the functions in ``FUNCTIONS``. Exponents and
intermediate results are bounded so an expression like ``9**9**9`` is refused instead of running forever.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from hybridflow.rollout.tools.base import BaseTool, ToolResult
from hybridflow.rollout.tools.registry import TOOLS

BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt, "log": math.log, "exp": math.exp}
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 10**100


class CalculatorError(ValueError):
    """The expression uses something the calculator does not allow, or its value is out of range."""


def evaluate(expression: str) -> int | float:
    """The value of ``expression``; raises ``CalculatorError`` (or ZeroDivisionError) on bad input."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise CalculatorError(f"not an arithmetic expression: {expression!r}") from error
    return _value(tree.body)


def _value(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in UNARY:
        return UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is larger than {MAX_EXPONENT}")
        return _bounded(BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
        if node.keywords:
            raise CalculatorError("functions take positional arguments only")
        return _bounded(FUNCTIONS[node.func.id](*(_value(arg) for arg in node.args)))
    allowed = ", ".join(sorted(FUNCTIONS))
    raise CalculatorError(f"unsupported syntax {ast.unparse(node)!r}: use numbers, + - * / // % **, ( ) and {allowed}")


def _bounded(value: Any) -> int | float:
    if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
        raise CalculatorError(f"result {value!r} is out of range")
    return value


@TOOLS.register("calculator")
class CalculatorTool(BaseTool):
    name = "calculator"
    description = "Evaluate an arithmetic expression, e.g. '(2+3)*4' or 'sqrt(2)'."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "The expression to evaluate."}},
        "required": ["expression"],
    }

    async def execute(self, instance_id: str, arguments: dict[str, Any]) -> ToolResult:
        expression = arguments.get("expression")
        if not isinstance(expression, str):
            return ToolResult("Error: the calculator needs a string argument 'expression'")
        try:
            value = evaluate(expression)
        except (CalculatorError, ZeroDivisionError, OverflowError, ValueError, TypeError) as error:
            return ToolResult(f"Error: {error}")
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return ToolResult(str(value))
