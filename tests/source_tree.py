"""A source file's AST for the tests that read the package's code (its shape, its layers)."""

import ast
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """``ast.parse`` of ``path``, once more if CPython 3.11 raises "AST constructor recursion depth mismatch": its
    AST checker reads the interpreter-wide recursion limit at the start and at the end, so another thread setting
    it in between (a test's leftover thread; seen once in `make test`) fails a valid file."""
    source = path.read_text()
    try:
        return ast.parse(source, filename=str(path))
    except SystemError:
        return ast.parse(source, filename=str(path))
