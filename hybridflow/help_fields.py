"""Config dataclass fields that carry a help string, for every config schema in hybridflow.

``option(0.2, "PPO clip epsilon.")`` is a field with a default; ``section(OptimConfig, "Optimizer.")`` is a
nested config section. The help lands in ``field.metadata["help"]``, where the YAML comments, the docs and
the tests read it.
"""

from __future__ import annotations

import copy
from dataclasses import field
from typing import Any


def option(default: Any, help_text: str, read_by: tuple[str, ...] = ()) -> Any:
    """A config field with ``default`` and ``help_text``; a list or dict default is copied per instance.

    ``read_by`` names the rollout engines that read the field (an engine knob such as vLLM's
    ``enforce_eager``); a run on another engine lists the field at start-up as set but not read.
    """
    metadata = {"help": help_text, "read_by": tuple(read_by)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


def section(cls: type, help_text: str) -> Any:
    """A nested config section: a fresh ``cls()`` per instance, with ``help_text``."""
    return field(default_factory=cls, metadata={"help": help_text})
