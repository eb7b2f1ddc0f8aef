"""Where each role's worker processes run (``trainer.placement``): the pools and the pool of each role.

``colocated`` (the default, HybridFlow's hybrid engine, arXiv 2409.19256 section 5): one resource pool of
``nnodes x n_gpus_per_node`` processes, and every role (actor/rollout/ref, critic, reward model) fused into
one Ray actor per process, so they share the device and hand weights over without copies.
``split``: each role gets its own pool of the same shape, so roles run in separate processes (the critic's
calls overlap the actor's); it needs that many times the resources.
A layout spelled out (``actor+ref:2/critic:2``, ``config/layouts.py``) divides the run's devices among pools of
the sizes it names; ``auto`` is resolved to the best layout before the plan is made (``trainer/auto_placement.py``).
Under either, a ``rollout`` role (``actor_rollout_ref.hybrid_engine=false``) gets a pool of its own shape,
``ROLLOUT_POOL``, and so does a distillation ``teacher`` (``config/distillation_options.py``). Pools are
specifications until the trainer starts them (``trainer/worker_groups.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

# The package loads Ray on first use, so planning pools does not start it.
from hybridflow import distributed
from hybridflow.config.layouts import LAYOUT_NAMES, Layout

if TYPE_CHECKING:
    from hybridflow.distributed import ResourcePool

PLACEMENTS = ("colocated", "split", "auto")  # or a layout spelled out
GLOBAL_POOL = "global_pool"
ROLLOUT_ROLE, ROLLOUT_POOL = "rollout", "rollout_pool"


@dataclass
class ResourcePlan:
    """Pools by name and the pool each role runs in."""

    pools: dict[str, ResourcePool]
    role_pool: dict[str, str]
    # Per pool, how long its collectives wait for a stopped or stuck rank (the roles' nccl_timeout); absent: torch's.
    collective_timeouts: dict[str, float] = field(default_factory=dict)

    def roles_in(self, pool_name: str) -> list[str]:
        return [role for role, pool in self.role_pool.items() if pool == pool_name]

    def with_collective_timeouts(self, role_timeouts: dict[str, float]) -> "ResourcePlan":
        """This plan with each pool's collective timeout: the longest of its roles' ``role_timeouts``."""
        timeouts = {
            name: max(role_timeouts[role] for role in self.roles_in(name) if role in role_timeouts)
            for name in self.pools
            if any(role in role_timeouts for role in self.roles_in(name))
        }
        return ResourcePlan(self.pools, self.role_pool, timeouts)

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
    own_pools: dict[str, tuple[int, int]] | None = None,
) -> ResourcePlan:
    """Pools for ``roles`` under ``placement`` (one of :data:`PLACEMENTS`); a role of ``own_pools`` among them (the
    rollout's, a distillation teacher's) gets a pool of that shape (nodes, processes per node) to itself."""
    if placement not in ("colocated", "split"):
        raise ValueError(f"trainer.placement={placement!r} is not one of colocated, split")

    def pool(name: str, shape: tuple[int, int] = (nnodes, processes_per_node)) -> ResourcePool:
        return _pool(name, [shape[1]] * shape[0], use_gpu, cpus_per_process)

    own_pools = own_pools or {}
    training_roles = [role for role in roles if role not in own_pools]
    if placement == "colocated":
        pools, role_pool = {GLOBAL_POOL: pool(GLOBAL_POOL)}, {role: GLOBAL_POOL for role in training_roles}
    else:
        role_pool = {role: f"{role}_pool" for role in training_roles}
        pools = {name: pool(name) for name in role_pool.values()}
    return with_own_pools(ResourcePlan(pools, role_pool), roles, own_pools, use_gpu, cpus_per_process)


def with_own_pools(
    plan: ResourcePlan, roles: list[str], own_pools: dict[str, tuple[int, int]], use_gpu: bool, cpus_per_process: float
) -> ResourcePlan:
    """``plan`` with a pool ``<role>_pool`` of its shape for each role of ``own_pools`` among ``roles``."""
    pools, role_pool = dict(plan.pools), dict(plan.role_pool)
    for role, (nodes, per_node) in own_pools.items():
        if role in roles:
            name = f"{role}_pool"
            pools[name], role_pool[role] = _pool(name, [per_node] * nodes, use_gpu, cpus_per_process), name
    return ResourcePlan(pools, role_pool, plan.collective_timeouts)


def layout_resource_plan(
    layout: Layout, *, processes_per_node: int, use_gpu: bool, cpus_per_process: float
) -> ResourcePlan:
    """Pools of the sizes ``layout`` names, taking the devices in order node by node (a pool's processes on a
    node form one node entry of its :class:`~hybridflow.distributed.ResourcePool`)."""
    node_counts = layout.node_counts(processes_per_node)
    if len(layout.pools) == 1:
        names = [GLOBAL_POOL]
    else:
        names = ["_".join(LAYOUT_NAMES[role] for role in pool.roles) + "_pool" for pool in layout.pools]
    # Reserved largest node entry first: Ray picks each entry's node, and a small one taken first could split
    # the node a larger one needs
    by_size = sorted(zip(names, node_counts), key=lambda named: -max(named[1]))
    pools = {name: _pool(name, counts, use_gpu, cpus_per_process) for name, counts in by_size}
    role_pool = {role: name for name, pool in zip(names, layout.pools) for role in pool.roles}
    return ResourcePlan(pools, role_pool)


def _pool(name: str, process_on_nodes: list[int], use_gpu: bool, cpus_per_process: float) -> ResourcePool:
    return distributed.ResourcePool(
        process_on_nodes,
        use_gpu=use_gpu,
        num_cpus_per_process=cpus_per_process,
        num_gpus_per_process=1.0,
        name_prefix=name,
    )
