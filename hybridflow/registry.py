"""One registry class for everything a user picks by name in config.

Advantage estimators, policy losses, KL estimators, reward functions, rollout engines and tools each keep
one ``Registry``. A name registered twice raises naming both functions; an unknown name raises listing
every valid one, with the config key the user should change. An alias (verl's ``grpo_vectorized`` for
``grpo``) is a second name for a registered object, and the registry remembers which name it stands for.
An entry carries its traits (what a trainer must know about it without calling it, such as the batch inputs
an estimator reads), registered with it and shared by its aliases.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Callable, Generic, Iterator, Mapping, TypeVar

from hybridflow.errors import HybridflowError

T = TypeVar("T")


class DuplicateNameError(ValueError):
    """A name was registered twice in the same registry."""


class UnknownNameError(HybridflowError, ValueError):
    """A name was looked up that nobody registered."""


def _describe(obj: object) -> str:
    module = getattr(obj, "__module__", "?")
    qualname = getattr(obj, "__qualname__", repr(obj))
    return f"{module}.{qualname}"


class Registry(Generic[T]):
    """Maps names to objects (functions or classes) of one kind.

    ``kind`` names the registry in errors ("advantage estimator"); ``config_key`` is the config key that
    selects from it ("algorithm.adv_estimator"), so an error can say which key to change. ``traits`` are the
    traits an entry may carry and their defaults (an entry registered without one has the default).
    """

    def __init__(self, kind: str, config_key: str | None = None, traits: Mapping[str, Any] | None = None):
        self.kind = kind
        self.config_key = config_key
        self._default_traits = dict(traits or {})
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}  # alias -> the name it stands for
        self._traits: dict[str, Mapping[str, Any]] = {}  # name (not alias) -> its traits

    def register(self, name: str, *aliases: str, **traits: Any) -> Callable[[T], T]:
        """Decorator: ``@REGISTRY.register("grpo", "grpo_vectorized", requires=...)``: the name, its aliases,
        then the entry's traits."""

        def decorator(obj: T) -> T:
            self.add(name, obj, **traits)
            for alias in aliases:
                self.add_alias(alias, name)
            return obj

        return decorator

    def add(self, name: str, obj: T, **traits: Any) -> None:
        """Register ``obj`` as ``name`` with ``traits``; the same object again under the same name is harmless
        (re-import). A trait the registry does not define raises listing those it does."""
        unknown = sorted(set(traits) - set(self._default_traits))
        if unknown:
            known = sorted(self._default_traits)
            raise ValueError(f"{self.kind} {name!r} has unknown traits {unknown}; {self.kind} traits are {known}")
        self._check_free(name, obj, alias_of=None)
        self._entries[name] = obj
        self._traits[name] = MappingProxyType({**self._default_traits, **traits})

    def add_alias(self, alias: str, name: str) -> None:
        """Make ``alias`` a second name for what ``name`` (a registered name or alias) stands for."""
        target = self.canonical(name)
        self._check_free(alias, self._entries[target], alias_of=target)
        self._entries[alias] = self._entries[target]
        self._aliases[alias] = target

    def _check_free(self, name: str, obj: T, alias_of: str | None) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
        if name not in self._entries:
            return
        if self._entries[name] is not obj or self._aliases.get(name) != alias_of:
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered twice: {self._role(self._aliases.get(name), self._entries[name])} "
                f"and {self._role(alias_of, obj)}; rename one of them"
            )

    @staticmethod
    def _role(alias_of: str | None, obj: object) -> str:
        return f"by {_describe(obj)}" if alias_of is None else f"as an alias of {alias_of!r}"

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            where = f"{self.config_key}={name!r}" if self.config_key else repr(name)
            raise UnknownNameError(
                f"{where} is not a registered {self.kind}; choose one of [{', '.join(self.names())}]"
            ) from None

    def traits(self, name: str) -> Mapping[str, Any]:
        """The traits of the entry ``name`` (or the name an alias stands for), defaults filled in; an unknown
        name raises listing the valid ones."""
        return self._traits[self.canonical(name)]

    def names(self) -> list[str]:
        """Every registered name, aliases included, sorted."""
        return sorted(self._entries)

    def primary_names(self) -> list[str]:
        """The registered names that are not aliases, sorted."""
        return sorted(name for name in self._entries if name not in self._aliases)

    def is_alias(self, name: str) -> bool:
        """True when ``name`` was registered as an alias; an unknown name raises listing the valid ones."""
        self.get(name)
        return name in self._aliases

    def canonical(self, name: str) -> str:
        """The name an alias stands for (a name that is no alias stands for itself)."""
        self.get(name)
        return self._aliases.get(name, name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={self.names()})"
