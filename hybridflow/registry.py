"""One registry class for everything a user picks by name in config.

Advantage estimators, policy losses, KL estimators, reward functions, rollout engines and tools each keep
one ``Registry``. A name registered twice raises naming both functions; an unknown name raises listing
every valid one, with the config key the user should change.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class DuplicateNameError(ValueError):
    """A name was registered twice in the same registry."""


class UnknownNameError(ValueError):
    """A name was looked up that nobody registered."""


def _describe(obj: object) -> str:
    module = getattr(obj, "__module__", "?")
    qualname = getattr(obj, "__qualname__", repr(obj))
    return f"{module}.{qualname}"


class Registry(Generic[T]):
    """Maps names to objects (functions or classes) of one kind.

    ``kind`` names the registry in errors ("advantage estimator"); ``config_key`` is the config key that
    selects from it ("algorithm.adv_estimator"), so an error can say which key to change.
    """

    def __init__(self, kind: str, config_key: str | None = None):
        self.kind = kind
        self.config_key = config_key
        self._entries: dict[str, T] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("grpo")`` (aliases map to the same object)."""

        def decorator(obj: T) -> T:
            for key in (name, *aliases):
                self.add(key, obj)
            return obj

        return decorator

    def add(self, name: str, obj: T) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name in self._entries and self._entries[name] is not obj:
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered twice: by {_describe(self._entries[name])} "
                f"and by {_describe(obj)}; rename one of them"
            )
        self._entries[name] = obj

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            where = f"{self.config_key}={name!r}" if self.config_key else repr(name)
            raise UnknownNameError(
                f"{where} is not a registered {self.kind}; choose one of [{', '.join(self.names())}]"
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
