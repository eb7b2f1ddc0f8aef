"""``RayWorkerGroup``: one Ray actor per rank of a ``ResourcePool``, driven as one object.

Every ``@register``-ed method of the worker class becomes a method of the group: calling it dispatches
the arguments over the ranks, runs them (all ranks, or rank 0) and collects the results, as declared by
the method's ``Dispatch``/``Execute`` modes. ``blocking=False`` methods return a ``GroupFuture``, ``stream=True``
methods a ``RayPartStream``.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hybridflow.distributed.class_with_init import RayClassWithInitArgs
from hybridflow.distributed.colocate import ColocatedClassWithInitArgs
from hybridflow.distributed.dispatch import DispatchedCall
from hybridflow.distributed.futures import GroupFuture, wait_for_ranks
from hybridflow.distributed.group_base import WorkerGroupBase, roles_of
from hybridflow.distributed.ray_init import WORKER_ENV_VARS
from hybridflow.distributed.resource_pool import ResourcePool
from hybridflow.distributed.streams import RayPartStream
from hybridflow.distributed.worker import PROCESS_GROUP_TIMEOUT_ENV
from hybridflow.distributed.worker_host import CONCURRENT_GROUP, ConcurrentWorkerHost, WorkerHost

_RemoteWorkerHost = ray.remote(WorkerHost)
_RemoteConcurrentWorkerHost = ray.remote(concurrency_groups={CONCURRENT_GROUP: 1})(ConcurrentWorkerHost)


def _local_ranks(node_ids: list[str]) -> list[tuple[int, int]]:
    """(LOCAL_RANK, LOCAL_WORLD_SIZE) of each rank, from the node each one actually landed on."""
    seen: dict[str, int] = {}
    local = []
    for node in node_ids:
        local.append(seen.get(node, 0))
        seen[node] = local[-1] + 1
    return [(index, seen[node]) for index, node in zip(local, node_ids)]


class RayWorkerGroup(WorkerGroupBase):
    """Starts ``ray_cls_with_init`` on every rank of ``resource_pool`` and exposes its registered methods.

    The constructor returns once every rank's worker is built (and has joined the group's process group);
    a rank that fails or dies meanwhile raises ``WorkerError`` and the group's actors are killed. A rank's
    failure in a later call raises ``WorkerError`` naming the group, rank and method, with its traceback.
    ``name_prefix`` names the group in errors and logs (default: the class name, or the fused role names);
    ``init_timeout_s`` bounds each start-up phase (actors starting, workers constructing);
    ``concurrent_calls``: ``register(concurrent=True)`` methods run beside a call in progress;
    ``process_group_timeout_s``: how long a collective waits for a rank that stopped or is stuck before the
    ranks waiting in it fail (None: torch's 30 minutes).
    """

    def __init__(
        self,
        resource_pool: ResourcePool,
        ray_cls_with_init: RayClassWithInitArgs | ColocatedClassWithInitArgs,
        name_prefix: str | None = None,
        init_timeout_s: float | None = 600.0,
        concurrent_calls: bool = False,
        process_group_timeout_s: float | None = None,
    ):
        self._roles = roles_of(ray_cls_with_init, type(self).__name__)
        self._concurrent_calls = concurrent_calls
        self._process_group_timeout_s = process_group_timeout_s
        self.name = name_prefix or "_".join(self._roles) or self._roles[""].cls.__name__
        self.resource_pool = resource_pool
        self.nodes: list[dict[str, str]] = []  # per rank: the Ray node_id and IP of its process
        self._hosts: list[Any] = self._start_hosts()
        try:
            self._construct(init_timeout_s)
        except BaseException:
            self.kill()
            raise
        self._bind_methods()

    @property
    def world_size(self) -> int:
        return len(self._hosts)

    def _start_hosts(self) -> list[Any]:
        pool = self.resource_pool
        threads = max(1, int(pool.num_cpus_per_process))
        env_vars = {**WORKER_ENV_VARS, "OMP_NUM_THREADS": str(threads)}
        host_class = _RemoteConcurrentWorkerHost if self._concurrent_calls else _RemoteWorkerHost
        return [
            host_class.options(
                num_cpus=pool.num_cpus_per_process,
                num_gpus=pool.num_gpus_per_process,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=bundle.placement_group, placement_group_bundle_index=bundle.bundle_index
                ),
                runtime_env={"env_vars": env_vars},
                max_restarts=0,
            ).remote(self.name, rank)
            for rank, bundle in enumerate(pool.bundles())
        ]

    def _construct(self, timeout: float | None) -> None:
        """Find rank 0's address and a port there, then build every rank's roles with its environment."""
        address_refs = {rank: host.node_address.remote() for rank, host in enumerate(self._hosts)}
        addresses = wait_for_ranks(self.name, "node_address", address_refs, timeout)
        master = addresses[0]
        self.nodes = [{"node_id": addresses[r]["node_id"], "ip": addresses[r]["ip"]} for r in range(self.world_size)]
        local = _local_ranks([node["node_id"] for node in self.nodes])
        roles = ray.put({role: (spec.cls, spec.args, spec.kwargs) for role, spec in self._roles.items()})
        refs = {}
        for rank, host in enumerate(self._hosts):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(local[rank][0]),
                "LOCAL_WORLD_SIZE": str(local[rank][1]),
                "MASTER_ADDR": master["ip"],
                "MASTER_PORT": str(master["free_port"]),
            }
            if self._process_group_timeout_s is not None:
                env[PROCESS_GROUP_TIMEOUT_ENV] = str(self._process_group_timeout_s)
            refs[rank] = host.construct.remote(roles, env)
        wait_for_ranks(self.name, "__init__", refs, timeout, self.nodes)

    def _run(self, role: str, method: str, public_name: str, plan: DispatchedCall) -> GroupFuture:
        if not self._hosts:
            raise RuntimeError(f"group {self.name!r} was killed; create a new RayWorkerGroup to call {public_name!r}")
        call_ids = [id(call) for call in plan.calls]
        shared: dict[int, Any] = {}
        refs = {}
        for rank, call in zip(plan.ranks, plan.calls):
            if call_ids.count(id(call)) > 1:
                # The same arguments for several ranks go to the object store once, not once per rank.
                if id(call) not in shared:
                    shared[id(call)] = (ray.put(call[0]), ray.put(call[1]))
                call = shared[id(call)]
            if plan.stream:
                refs[rank] = (
                    self._hosts[rank]
                    .execute_stream.options(num_returns="streaming")
                    .remote(role, method, call[0], call[1])
                )
            elif plan.concurrent and self._concurrent_calls:
                refs[rank] = self._hosts[rank].execute_concurrently.remote(role, method, call[0], call[1])
            else:
                refs[rank] = self._hosts[rank].execute.remote(role, method, call[0], call[1])
        if plan.stream:
            return RayPartStream(self.name, public_name, refs, plan.collect, self.nodes)
        return GroupFuture(self.name, public_name, refs, plan.collect, self.nodes)

    def worker_info(self) -> list[dict[str, Any]]:
        """Per rank: ``rank``, ``pid`` and Ray ``node_id`` of its process."""
        refs = {rank: host.describe.remote() for rank, host in enumerate(self._hosts)}
        info = wait_for_ranks(self.name, "describe", refs, None)
        return [info[rank] for rank in range(self.world_size)]

    def kill(self) -> None:
        """End every rank's process now (e.g. after a failure left peers blocked in a collective)."""
        for host in self._hosts:
            ray.kill(host, no_restart=True)
        self._hosts = []

    def __repr__(self) -> str:
        return f"RayWorkerGroup({self.name!r}, world_size={self.world_size})"
