"""Colocation: several roles (e.g. actor, critic, ref) fused into one process per rank.

The fused roles share the process, its memory, its device and its torch.distributed group, so a hybrid
engine can hand weights between them without copies across processes (HybridFlow, arXiv 2409.19256).
A fused group exposes role ``r``'s method ``m`` as ``group.r_m``; ``group.spawn()`` gives one view per
role whose methods have the plain names (``views["critic"].compute_values(batch)``).
"""

from __future__ import annotations

from typing import Any, Mapping

from hybridflow.distributed.class_with_init import RayClassWithInitArgs
from hybridflow.distributed.decorator import MethodSpec


class ColocatedClassWithInitArgs:
    """The roles to build in each rank's process, by role name, in construction order."""

    def __init__(self, role_classes: Mapping[str, RayClassWithInitArgs]):
        if not role_classes:
            raise ValueError("create_colocated_worker_cls needs at least one role, got none")
        for role, spec in role_classes.items():
            if not isinstance(role, str) or not role.isidentifier():
                raise ValueError(f"role names must be Python identifiers (they prefix method names), got {role!r}")
            if not isinstance(spec, RayClassWithInitArgs):
                raise TypeError(f"role {role!r} must be a RayClassWithInitArgs, got {type(spec).__name__}")
        self.role_classes = dict(role_classes)

    def __repr__(self) -> str:
        roles = ", ".join(f"{role}={spec.cls.__qualname__}" for role, spec in self.role_classes.items())
        return f"ColocatedClassWithInitArgs({roles})"


def create_colocated_worker_cls(class_dict: Mapping[str, RayClassWithInitArgs]) -> ColocatedClassWithInitArgs:
    """Fuse the roles of ``class_dict`` ({role: RayClassWithInitArgs}) into one worker per rank."""
    return ColocatedClassWithInitArgs(class_dict)


class WorkerGroupView:
    """One role of a fused worker group: its registered methods under their plain names."""

    def __init__(self, group: Any, role: str, methods: dict[str, MethodSpec]):
        self._group = group
        self.role = role
        for method, spec in methods.items():
            setattr(self, method, group.make_group_method(role, method, spec, public_name=method))

    @property
    def name(self) -> str:
        return f"{self._group.name}.{self.role}"

    @property
    def world_size(self) -> int:
        return self._group.world_size

    def worker_info(self) -> list[dict[str, Any]]:
        return self._group.worker_info()

    def __repr__(self) -> str:
        return f"WorkerGroupView({self.name!r}, world_size={self.world_size})"
