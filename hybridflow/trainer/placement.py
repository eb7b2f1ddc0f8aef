"""Where each role's worker processes run (``trainer.placement``).

``colocated`` (the default, HybridFlow's hybrid engine, arXiv 2409.19256 section 5): one resource pool of
``nnodes x n_gpus_per_node`` processes, and every role (actor/rollout/ref, critic, reward model) fused into
one Ray actor per process, so they share the device and hand weights over without copies.
``split``: each role gets its own pool of the same shape, so roles run in separate processes (the critic's
calls overlap the actor's: ``phases.PhaseCalls``); it needs that many times the resources.
Under either, a ``rollout`` role (``actor_rollout_ref.hybrid_engine=false``) gets a pool of its own shape,
``ROLLOUT_POOL``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

# The package loads Ray on first use, so checking trainer.placement in a config does not start it.
from hybridflow import distributed

if TYPE_CHECKING:
    from hybridflow.distributed import LocalWorkerGroup, RayClassWithInitArgs, RayWorkerGroup, ResourcePool

PLACEMENTS = ("colocated", "split")
GLOBAL_POOL = "global_pool"
ROLLOUT_ROLE, ROLLOUT_POOL = "rollout", "rollout_pool"


@dataclass
class ResourcePlan:
    """Pools by name and the pool each role runs in."""

    pools: dict[str, ResourcePool]
    role_pool: dict[str, str]

    def roles_in(self, pool_name: str) -> list[str]:
        return [role for role, pool in self.role_pool.items() if pool == pool_name]

    def total_cpus(self) -> float:
        return sum(pool.world_size * pool.num_cpus_per_process for pool in self.pools.values())


def make_resource_plan(
    placement: str,
    roles: list[str],
    *,
    nnodes: int,
    processes_per_node: int,
    use_gpu: bool,
    cpus_per_process: float,
    rollout_pool_shape: tuple[int, int] = (1, 1),
) -> ResourcePlan:
    """Pools for ``roles`` under ``placement`` (one of :data:`PLACEMENTS`); a ``rollout`` role among them gets
    ``rollout_pool_shape`` (nodes, processes per node) to itself."""
    if placement not in PLACEMENTS:
        raise ValueError(f"trainer.placement={placement!r} is not one of {list(PLACEMENTS)}")

    def pool(name: str, shape: tuple[int, int] = (nnodes, processes_per_node)) -> ResourcePool:
        return distributed.ResourcePool(
            [shape[1]] * shape[0],
            use_gpu=use_gpu,
            num_cpus_per_process=cpus_per_process,
            num_gpus_per_process=1.0,
            name_prefix=name,
        )

    training_roles = [role for role in roles if role != ROLLOUT_ROLE]
    if placement == "colocated":
        pools, role_pool = {GLOBAL_POOL: pool(GLOBAL_POOL)}, {role: GLOBAL_POOL for role in training_roles}
    else:
        role_pool = {role: f"{role}_pool" for role in training_roles}
        pools = {name: pool(name) for name in role_pool.values()}
    if ROLLOUT_ROLE in roles:
        pools[ROLLOUT_POOL], role_pool[ROLLOUT_ROLE] = pool(ROLLOUT_POOL, rollout_pool_shape), ROLLOUT_POOL
    return ResourcePlan(pools, role_pool)


@dataclass
class WorkerGroups:
    """The started groups: ``roles[role]`` is what the driver calls (a group, or a view of a fused one)."""

    roles: dict[str, object]
    groups: list[RayWorkerGroup | LocalWorkerGroup]
    plan: ResourcePlan

    def shutdown(self) -> None:
        """End the worker processes and free their reservations."""
        for group in self.groups:
            group.kill()
        for pool in self.plan.pools.values():
            pool.release()


def _start_groups(
    plan: ResourcePlan, role_classes: dict[str, RayClassWithInitArgs], make_group: Callable[..., Any]
) -> WorkerGroups:
    """A group per pool, made by ``make_group(pool, class_with_init, name)``: a plain group for a pool with
    one role, a fused one with per-role views for a pool with several, so the driver calls
    ``roles["critic"].compute_values(batch)`` either way."""
    roles: dict[str, object] = {}
    groups: list[Any] = []
    try:
        for pool_name, pool in plan.pools.items():
            pool_roles = plan.roles_in(pool_name)
            if len(pool_roles) == 1:
                group = make_group(pool, role_classes[pool_roles[0]], pool_roles[0])
                roles[pool_roles[0]] = group
            else:
                fused = distributed.create_colocated_worker_cls({role: role_classes[role] for role in pool_roles})
                group = make_group(pool, fused, pool_name)
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
        plan, role_classes,
        lambda pool, cls_with_init, name: distributed.RayWorkerGroup(
            pool, cls_with_init, name, concurrent_calls=name in concurrent_roles
        ),
    )


def create_local_worker_groups(
    plan: ResourcePlan, role_classes: dict[str, RayClassWithInitArgs]
) -> WorkerGroups:
    """``trainer.local_mode``: every pool's roles built in this process (one rank each, no Ray), with the
    torch threads a pool gives each of its processes."""
    return _start_groups(
        plan, role_classes,
        lambda pool, cls_with_init, name: distributed.LocalWorkerGroup(
            cls_with_init, name, num_threads=int(pool.num_cpus_per_process)
        ),
    )
