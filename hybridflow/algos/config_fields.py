"""Read one option from a config that may be a dataclass, a dict or an OmegaConf DictConfig.

The algorithms never import the trainer's config classes: the caller hands over whatever config object it
has (verl's ``ActorConfig``, a Hydra ``DictConfig``, a plain dict, :class:`PolicyLossConfig`) and each
function reads the few fields it needs through :func:`read_field`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_ABSENT = object()


def read_field(config: Any, name: str, default: Any = None) -> Any:
    """``config[name]`` for mappings (dict, DictConfig), ``config.name`` for objects; ``default`` if absent.

    A field present with value ``None`` counts as absent, so verl's "``None`` means fall back" convention
    (e.g. ``clip_ratio_low: null``) works unchanged.
    """
    if config is None:
        return default
    if isinstance(config, Mapping):
        value = config.get(name, _ABSENT)
    else:
        value = getattr(config, name, _ABSENT)
    return default if value is _ABSENT or value is None else value


def pick_option(name: str, explicit: Any, config: Any, default: Any) -> Any:
    """An explicitly passed argument wins, then the config's field, then the default."""
    if explicit is not None:
        return explicit
    return read_field(config, name, default)
