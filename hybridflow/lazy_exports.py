"""Package ``__init__`` files that import a public name's module only when the name is first read (PEP 562).

``from hybridflow.workers import CriticWorker`` works as before, while ``import hybridflow.workers.config``
no longer loads every worker, rollout engine, Ray and transformers on the way, so checking a config on the
command line does not pay for them.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(
    package: str, exports: dict[str, list[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package``.

    ``exports`` maps each submodule (name relative to ``package``) to the public names it defines. A name is
    imported from its submodule the first time it is read and then kept on the package.
    """
    origin = {name: f"{package}.{module}" for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in origin:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(origin[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(origin))

    return __getattr__, __dir__, sorted(origin)
