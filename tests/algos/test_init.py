import ast
import pathlib
import sys

import hybridflow.algos as algos

ALLOWED_THIRD_PARTY = {"torch", "numpy"}
# The bottom-layer helpers every layer shares: the name registry, help-carrying config fields and the base of the
# errors a user fixes from their message (hybridflow.errors imports nothing).
ALLOWED_PROJECT = ("hybridflow.algos", "hybridflow.registry", "hybridflow.help_fields", "hybridflow.errors")


def _imported_modules(source_file: pathlib.Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(source_file.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            modules.add(node.module)
    return modules


def test_algos_imports_only_torch_numpy_stdlib_and_the_shared_helpers():
    """The layer rule: algos is pure tensor math (no Ray, no models, no I/O, nothing from upper layers)."""
    package_dir = pathlib.Path(algos.__file__).parent
    offenders = {}
    for source_file in sorted(package_dir.glob("*.py")):
        for module in _imported_modules(source_file):
            top = module.split(".")[0]
            allowed = (
                top in sys.stdlib_module_names
                or top in ALLOWED_THIRD_PARTY
                or module == "__future__"
                or module.startswith(ALLOWED_PROJECT)
            )
            if not allowed:
                offenders.setdefault(source_file.name, []).append(module)
    assert offenders == {}


def test_public_names_are_exported():
    for name in algos.__all__:
        assert hasattr(algos, name), name
