"""``RayClassWithInitArgs``: a worker class and the arguments to construct it with on every rank."""

from __future__ import annotations

from typing import Any

from hybridflow.distributed.decorator import MethodSpec, registered_methods


def plain_class(cls: Any) -> type:
    """The Python class behind ``cls``, which may also be a ``ray.remote``-decorated class (verl style)."""
    metadata = getattr(cls, "__ray_metadata__", None)
    if metadata is not None:
        # Ray subclasses the user's class once to add its own hooks; the user's class is its base.
        cls = metadata.modified_class.__bases__[0]
    if not isinstance(cls, type):
        raise TypeError(f"expected a worker class, got {cls!r}")
    return cls


class RayClassWithInitArgs:
    """``cls(*args, **kwargs)`` is what each rank of a ``RayWorkerGroup`` runs."""

    def __init__(self, cls: Any, *args: Any, **kwargs: Any):
        self.cls = plain_class(cls)
        self.args = args
        self.kwargs = kwargs

    def registered_methods(self) -> dict[str, MethodSpec]:
        return registered_methods(self.cls)

    def __repr__(self) -> str:
        return f"RayClassWithInitArgs({self.cls.__qualname__})"
