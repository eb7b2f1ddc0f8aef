"""Evaluating a model-written arithmetic expression safely: parsed with ``ast``, never ``eval``.

Only integer literals, ``+ - * /``, unary minus and parentheses are allowed; powers, names, calls and
attribute access are rejected, and the text length is capped, so a response cannot run code or build
astronomically large numbers. Division is exact (``Fraction``).
"""

from __future__ import annotations

import ast
from fractions import Fraction

MAX_EXPRESSION_CHARS = 100

_BINARY_OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class ExpressionError(ValueError):
    """The text is not an allowed arithmetic expression (or divides by zero)."""


def evaluate_expression(text: str) -> tuple[Fraction, list[int]]:
    """Return ``(value, integer literals used, in order)`` for an expression like ``"(3+5)*7"``."""
    cleaned = text.replace("×", "*").replace("÷", "/").strip()
    if not cleaned:
        raise ExpressionError("empty expression")
    if len(cleaned) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(cleaned, mode="eval")
    except SyntaxError as error:
        raise ExpressionError(f"not an arithmetic expression: {cleaned!r}") from error
    literals: list[int] = []
    return _evaluate(tree.body, literals), literals


def _evaluate(node: ast.AST, literals: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand, literals)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPERATORS:
        left = _evaluate(node.left, literals)
        right = _evaluate(node.right, literals)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ExpressionError("division by zero")
        return _BINARY_OPERATORS[type(node.op)](left, right)
    raise ExpressionError(f"{type(node).__name__} is not allowed; use integers, + - * / and parentheses")
