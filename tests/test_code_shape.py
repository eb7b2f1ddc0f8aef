"""The shape the style guide asks of the package's code: no function over 45 lines (ruff checks the 120-character
lines and the rest of the style; it has no rule for a function's length)."""

import ast
from pathlib import Path

import pytest

from tests.source_tree import parse

PACKAGE = Path(__file__).resolve().parents[1] / "hybridflow"
MAX_FUNCTION_LINES = 45


def _long_functions(path: Path) -> list[str]:
    tree = parse(path)
    return [
        f"{node.name} ({node.end_lineno - node.lineno + 1} lines, from line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_over_45_lines(path):
    long = _long_functions(path)
    assert not long, f"{path.relative_to(PACKAGE.parent)}: split {', '.join(long)}"
