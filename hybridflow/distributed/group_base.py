"""What every worker group shares, wherever its ranks run: the roles it was built from, and one
driver-side method per ``@register``-ed worker method (``group.m``, or ``group.r_m`` and ``spawn()``'s
per-role views when several roles are fused); ``group.m.submit(...)`` starts a call without waiting and
returns its future (``get()``); a ``stream=True`` method returns its ``PartStream``. Subclasses say how a
dispatched call runs (``_run``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

from hybridflow.distributed.class_with_init import RayClassWithInitArgs
from hybridflow.distributed.colocate import ColocatedClassWithInitArgs, WorkerGroupView
from hybridflow.distributed.decorator import MethodSpec
from hybridflow.distributed.dispatch import DispatchedCall, dispatch

# Attributes of groups and views that a registered method may not shadow.
RESERVED_NAMES = frozenset(
    {"name", "role", "world_size", "resource_pool", "kill", "spawn", "worker_info", "make_group_method"}
)


def roles_of(
    cls_with_init: RayClassWithInitArgs | ColocatedClassWithInitArgs, group_kind: str
) -> dict[str, RayClassWithInitArgs]:
    """{role: class}; a single class is the one role "" and keeps plain method names."""
    if isinstance(cls_with_init, ColocatedClassWithInitArgs):
        return cls_with_init.role_classes
    if isinstance(cls_with_init, RayClassWithInitArgs):
        return {"": cls_with_init}
    raise TypeError(
        f"{group_kind} needs RayClassWithInitArgs(cls, *args, **kwargs) or create_colocated_worker_cls(...), "
        f"got {type(cls_with_init).__name__}"
    )


class WorkerGroupBase(ABC):
    """Binds the registered methods of ``self._roles`` onto the group; ``world_size`` and ``_run`` are the
    subclass's."""

    name: str
    _roles: dict[str, RayClassWithInitArgs]

    @property
    @abstractmethod
    def world_size(self) -> int: ...

    def _bind_methods(self) -> None:
        if "" in self._roles:
            self._bind(self, "", self._roles[""].registered_methods(), prefix="")
        else:
            for role, cls_with_init in self._roles.items():
                self._bind(self, role, cls_with_init.registered_methods(), prefix=f"{role}_")

    def _bind(self, target: Any, role: str, methods: dict[str, MethodSpec], prefix: str) -> None:
        for method, spec in methods.items():
            setattr(target, prefix + method, self.make_group_method(role, method, spec, public_name=prefix + method))

    def make_group_method(self, role: str, method: str, spec: MethodSpec, public_name: str) -> Callable[..., Any]:
        """The driver-side callable for ``role``'s registered ``method``."""
        if public_name in RESERVED_NAMES:
            raise ValueError(
                f"worker method {method!r} of group {self.name!r} would hide the group's own {public_name!r}; rename it"
            )

        def submit(*args: Any, **kwargs: Any) -> Any:
            return self._run(role, method, public_name, dispatch(spec, public_name, self.world_size, args, kwargs))

        def group_method(*args: Any, **kwargs: Any) -> Any:
            future = submit(*args, **kwargs)
            # a streamed method's stream is read by the caller, part by part
            return future.get() if spec.blocking and not spec.stream else future

        # group.m.submit(...) starts the call and returns its future whatever the method's ``blocking``: the driver
        # decides per call site whether to wait (calls on other pools overlap meanwhile).
        group_method.submit = submit
        group_method.__name__ = public_name
        group_method.__qualname__ = f"{type(self).__name__}.{public_name}"
        group_method.__doc__ = getattr(getattr(self._roles[role].cls, method), "__doc__", None)
        return group_method

    @abstractmethod
    def _run(self, role: str, method: str, public_name: str, plan: DispatchedCall) -> Any:
        """Start ``plan``'s calls of ``role.method``; returns an object whose ``get()`` collects them."""

    def spawn(self, prefix_set: set[str] | list[str] | None = None) -> dict[str, WorkerGroupView]:
        """{role: view} for a colocated group; each view's methods have the plain names."""
        if "" in self._roles:
            raise ValueError(
                f"group {self.name!r} has one class; spawn() splits groups built with create_colocated_worker_cls"
            )
        roles = list(prefix_set) if prefix_set is not None else list(self._roles)
        unknown = [role for role in roles if role not in self._roles]
        if unknown:
            raise ValueError(f"group {self.name!r} has no roles {unknown}; its roles are {list(self._roles)}")
        return {role: WorkerGroupView(self, role, self._roles[role].registered_methods()) for role in roles}
