"""Imports point down only: trainer -> workers -> {models, rollout, rewards, data} -> {algos, protocol, distributed}."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hybridflow"

LAYER = {
    "registry": 0,
    "errors": 0,
    "protocol": 0,
    "distributed": 0,
    "algos": 0,
    "models": 1,
    "rollout": 1,
    "rewards": 1,
    "data": 1,
    "workers": 2,
    "trainer": 3,
    "demo": 4,
    "model_merger": 4,
}
# algos is pure tensor math: beyond the standard library it may import only these.
ALGOS_ALLOWED = {"torch", "numpy", "hybridflow"}


def _layer_of(module_parts: list[str]) -> int | None:
    if len(module_parts) < 2 or module_parts[0] != "hybridflow":
        return None
    return LAYER.get(module_parts[1])


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    relative_base = path.relative_to(PACKAGE.parent).with_suffix("").parts
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(relative_base[: len(relative_base) - node.level])
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = _layer_of(list(path.relative_to(PACKAGE.parent).with_suffix("").parts))
    if own is None:
        return
    for lineno, name in _imports(path):
        target = _layer_of(name.split("."))
        assert target is None or target <= own, (
            f"{path.relative_to(PACKAGE.parent)}:{lineno} imports {name}, a higher layer"
        )


@pytest.mark.parametrize("path", sorted((PACKAGE / "algos").rglob("*.py")), ids=lambda p: p.name)
def test_algos_is_pure_math(path):
    import sys

    for lineno, name in _imports(path):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in ALGOS_ALLOWED:
            continue
        pytest.fail(f"hybridflow/algos/{path.name}:{lineno} imports {name}; algos may use torch and numpy only")
