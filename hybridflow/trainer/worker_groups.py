"""The worker groups of a run: the run plan's pools started as Ray actors (or, in local mode, in this process),
one group per pool; a pool with several roles runs them fused in one actor per process (``config/placement.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from hybridflow import distributed
from hybridflow.config.placement import ResourcePlan

if TYPE_CHECKING:
    from hybridflow.distributed import LocalWorkerGroup, RayClassWithInitArgs, RayWorkerGroup


@dataclass
class WorkerGroups:
    """The started groups: ``roles[role]`` is what the driver calls (a group, or a view of a fused one)."""

    roles: dict[str, object]
    groups: list[RayWorkerGroup | LocalWorkerGroup]
    plan: ResourcePlan

    def placement_lines(self) -> list[str]:
        """Per Ray group, the nodes its ranks landed on (local groups run in this process: none)."""
        lines = []
        for group in self.groups:
            by_node: dict[tuple[str, str], list[int]] = {}
            for rank, node in enumerate(getattr(group, "nodes", [])):
                by_node.setdefault((node["ip"], node["node_id"][:8]), []).append(rank)
            where = ", ".join(f"rank(s) {ranks} on node {ip} ({node_id})" for (ip, node_id), ranks in by_node.items())
            if where:
                lines.append(f"group {group.name!r}: {where}")
        return lines

    def shutdown(self) -> None:
        """End the worker processes and free their reservations."""
        for group in self.groups:
            group.kill()
        for pool in self.plan.pools.values():
            pool.release()


def _start_groups(
    plan: ResourcePlan, role_classes: dict[str, RayClassWithInitArgs], make_group: Callable[..., Any]
) -> WorkerGroups:
    """A group per pool, made by ``make_group(pool, class_with_init, name, collective_timeout_s)``: a plain group
    for a pool with one role, a fused one with per-role views for a pool with several, so the driver calls
    ``roles["critic"].compute_values(batch)`` either way."""
    roles: dict[str, object] = {}
    groups: list[Any] = []
    try:
        for pool_name, pool in plan.pools.items():
            pool_roles = plan.roles_in(pool_name)
            timeout = plan.collective_timeouts.get(pool_name)
            if len(pool_roles) == 1:
                group = make_group(pool, role_classes[pool_roles[0]], pool_roles[0], timeout)
                roles[pool_roles[0]] = group
            else:
                fused = distributed.create_colocated_worker_cls({role: role_classes[role] for role in pool_roles})
                group = make_group(pool, fused, pool_name, timeout)
                roles.update(group.spawn())
            groups.append(group)
    except BaseException:
        WorkerGroups(roles, groups, plan).shutdown()
        raise
    return WorkerGroups(roles, groups, plan)


def create_worker_groups(
    plan: ResourcePlan, role_classes: dict[str, RayClassWithInitArgs], concurrent_roles: frozenset[str] = frozenset()
) -> WorkerGroups:
    """Start every pool's workers as Ray actors, one per rank; the groups of ``concurrent_roles`` take
    ``register(concurrent=True)`` calls beside a call in progress."""
    return _start_groups(
        plan,
        role_classes,
        lambda pool, cls_with_init, name, timeout: distributed.RayWorkerGroup(
            pool, cls_with_init, name, concurrent_calls=name in concurrent_roles, process_group_timeout_s=timeout
        ),
    )


def create_local_worker_groups(plan: ResourcePlan, role_classes: dict[str, RayClassWithInitArgs]) -> WorkerGroups:
    """``trainer.local_mode``: every pool's roles built in this process (one rank each, no Ray), with the
    torch threads a pool gives each of its processes."""
    return _start_groups(
        plan,
        role_classes,
        # One rank per pool here: no collective waits for another process.
        lambda pool, cls_with_init, name, timeout: distributed.LocalWorkerGroup(
            cls_with_init, name, num_threads=int(pool.num_cpus_per_process)
        ),
    )
