"""Copy the example files (and test functions) into the doc blocks that show them.

A block marked ``<!-- example: docs/examples/x.py -->`` shows that whole file; one marked
``<!-- example: tests/test_docs.py::test_name -->`` shows that function. tests/test_docs.py fails when a
block differs from its source.

    python docs/sync_examples.py    # rewrite the blocks of every docs/*.md
"""

from __future__ import annotations

import ast
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
EXAMPLE_BLOCK = re.compile(
    r"(?P<head><!-- example: (?P<path>[^\s:]+)(?:::(?P<function>\w+))? -->\n```\w*\n)(?P<code>.*?)(?P<tail>```)", re.S
)


def source_of(path: str, function: str | None = None) -> str:
    """The text of ``path`` (relative to the repository), or of its top-level function ``function``."""
    text = (REPO / path).read_text()
    if function is None:
        return text
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            return "".join(text.splitlines(keepends=True)[node.lineno - 1 : node.end_lineno])
    raise ValueError(f"{path} has no top-level function {function!r}")


def synced(doc_text: str) -> str:
    """``doc_text`` with every example block replaced by its source."""
    return EXAMPLE_BLOCK.sub(lambda m: m["head"] + source_of(m["path"], m["function"]) + m["tail"], doc_text)


def main() -> None:
    for doc in sorted(DOCS.glob("*.md")):
        text = doc.read_text()
        if synced(text) != text:
            doc.write_text(synced(text))
            print(f"updated {doc.relative_to(REPO)}")


if __name__ == "__main__":
    main()
