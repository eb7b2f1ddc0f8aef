"""Imports point down only:

    trainer -> config -> workers -> {models, rollout, rewards, data, tracking, checkpoints} -> distributed
    -> {algos, protocol} -> the foundation (registry, errors, help_fields, lazy_exports)

``algos`` and ``protocol`` do not import each other: ``algos`` is pure tensor math (torch, numpy and the
foundation); ``protocol`` (the batches) imports neither ``algos`` nor ``distributed``, which ships its batches.
The foundation imports nothing of the package but itself. The entry points above the trainer (the demo, the model
merger, verl's experimental entry points) may import anything.
"""

import ast
import sys
from pathlib import Path

import pytest

from tests.source_tree import parse

PACKAGE = Path(__file__).resolve().parents[1] / "hybridflow"

FOUNDATION = {"registry", "errors", "help_fields", "lazy_exports"}
LAYER = {
    **{name: 0 for name in FOUNDATION},
    "protocol": 1,
    "algos": 1,
    "distributed": 2,
    "models": 3,
    "rollout": 3,
    "rewards": 3,
    "data": 3,
    "tracking": 3,
    "checkpoints": 3,
    "workers": 4,
    "config": 5,
    "trainer": 6,
    "demo": 7,
    "model_merger": 7,
    "experimental": 7,
}
# The layer whose packages must not import each other.
SAME_LAYER_APART = {1}
# algos is pure tensor math: beyond the standard library it may import only these.
ALGOS_ALLOWED = {"torch", "numpy", "hybridflow"}


def _package_of(module_parts: list[str] | tuple[str, ...]) -> str | None:
    if len(module_parts) < 2 or module_parts[0] != "hybridflow":
        return None
    return module_parts[1]


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = parse(path)
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


def test_every_package_has_a_layer():
    packages = {path.relative_to(PACKAGE).with_suffix("").parts[0] for path in SOURCES} - {"__init__"}
    assert packages <= set(LAYER), f"give {sorted(packages - set(LAYER))} a layer in tests/test_layers.py"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = _package_of(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if own is None or own == "__init__":
        return
    for lineno, name in _imports(path):
        target = _package_of(name.split("."))
        if target is None or target == own or target == "__init__":
            continue
        where = f"{path.relative_to(PACKAGE.parent)}:{lineno} imports {name}"
        assert LAYER[target] <= LAYER[own], f"{where}, a higher layer"
        assert not (LAYER[target] == LAYER[own] and LAYER[own] in SAME_LAYER_APART), f"{where}, a package beside it"


@pytest.mark.parametrize("path", sorted((PACKAGE / "algos").rglob("*.py")), ids=lambda p: p.name)
def test_algos_is_pure_math(path):
    for lineno, name in _imports(path):
        top = name.split(".")[0]
        if top in sys.stdlib_module_names or top in ALGOS_ALLOWED:
            continue
        pytest.fail(f"hybridflow/algos/{path.name}:{lineno} imports {name}; algos may use torch and numpy only")


def test_the_rules_catch_what_they_forbid(tmp_path, monkeypatch):
    """protocol importing distributed, algos importing protocol, and config importing the trainer are refused."""
    bad_imports = {
        "protocol": ("from hybridflow.distributed import RayWorkerGroup\n", "a higher layer"),
        "algos": ("from hybridflow.protocol import DataProto\n", "a package beside it"),
        "config": ("from hybridflow.trainer.ppo_trainer import RayPPOTrainer\n", "a higher layer"),
    }
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "hybridflow")
    for package, (line, message) in bad_imports.items():
        folder = tmp_path / "hybridflow" / package
        folder.mkdir(parents=True)
        (folder / "bad.py").write_text(line)
        with pytest.raises(AssertionError, match=message):
            test_imports_point_down(folder / "bad.py")
