"""``ResourcePool``: the processes of one worker group, how many on each node, and what each one gets.

Realised as one Ray placement group per node entry (STRICT_PACK: that entry's processes share a node),
so a group's actors never wait in Ray's queue: either the resources are reserved up front or the pool
raises ``InsufficientResourcesError`` saying what is missing. Ray is imported when a pool is realised, not before:
a plan names its pools in local mode too, which runs without Ray.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from hybridflow.distributed.errors import InsufficientResourcesError

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup


@dataclass(frozen=True)
class Bundle:
    """Where one rank lives: a bundle of a placement group."""

    placement_group: PlacementGroup
    bundle_index: int


def _fmt(amount: float) -> str:
    return f"{amount:g}"


class ResourcePool:
    """``process_on_nodes[i]`` processes on node entry ``i``, each with ``num_cpus_per_process`` CPUs
    (fractions allowed) and, if ``use_gpu``, ``num_gpus_per_process`` GPUs.

    Ranks are numbered in order: node entry 0's processes first. The placement groups are created on first
    use (``placement_groups()``), which checks the request against the cluster first and fails at once if
    it can never fit; if it fits the cluster but not what is free now, it waits ``ready_timeout_s`` for
    other pools to release resources, then fails. ``release()`` frees the reservation.
    """

    def __init__(
        self,
        process_on_nodes: Sequence[int],
        use_gpu: bool = False,
        num_cpus_per_process: float = 1.0,
        num_gpus_per_process: float = 1.0,
        name_prefix: str = "pool",
        ready_timeout_s: float = 30.0,
    ):
        process_on_nodes = list(process_on_nodes)
        if not process_on_nodes or any(not isinstance(n, int) or n < 1 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must be a non-empty list of positive ints, got {process_on_nodes!r}")
        if num_cpus_per_process <= 0:
            raise ValueError(f"num_cpus_per_process must be > 0, got {num_cpus_per_process!r}")
        if use_gpu and num_gpus_per_process <= 0:
            raise ValueError(f"num_gpus_per_process must be > 0 when use_gpu=True, got {num_gpus_per_process!r}")
        self.process_on_nodes = process_on_nodes
        self.use_gpu = use_gpu
        self.num_cpus_per_process = float(num_cpus_per_process)
        self.num_gpus_per_process = float(num_gpus_per_process) if use_gpu else 0.0
        self.name_prefix = name_prefix
        self.ready_timeout_s = ready_timeout_s
        self._placement_groups: list[PlacementGroup] | None = None

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    @property
    def store(self) -> list[int]:
        """verl's name for ``process_on_nodes``."""
        return self.process_on_nodes

    def bundle_resources(self) -> dict[str, float]:
        """What each process gets, in Ray resource names."""
        resources = {"CPU": self.num_cpus_per_process}
        if self.use_gpu:
            resources["GPU"] = self.num_gpus_per_process
        return resources

    def placement_groups(self) -> list[PlacementGroup]:
        """The pool's placement groups (one per node entry), created and waited for on first call."""
        import ray

        if self._placement_groups is None:
            if not ray.is_initialized():
                raise RuntimeError(
                    f"ResourcePool {self.name_prefix!r} needs a running Ray cluster; "
                    "call hybridflow.distributed.init_local_ray() first"
                )
            self._check_fits(_node_resources(available=False), "in total")
            self._placement_groups = self._create_and_wait()
        return self._placement_groups

    def bundles(self) -> list[Bundle]:
        """One bundle per rank, in rank order."""
        return [
            Bundle(pg, index)
            for pg, count in zip(self.placement_groups(), self.process_on_nodes)
            for index in range(count)
        ]

    def release(self) -> None:
        """Remove the placement groups (kill the pool's worker groups first); a pool never realised has none."""
        if self._placement_groups:
            from ray.util.placement_group import remove_placement_group

            for pg in self._placement_groups:
                remove_placement_group(pg)
        self._placement_groups = None

    def _describe(self) -> str:
        return (
            f"ResourcePool {self.name_prefix!r} (process_on_nodes={self.process_on_nodes}, "
            f"{', '.join(f'{_fmt(v)} {k}' for k, v in self.bundle_resources().items())} per process)"
        )

    def _shortfall(self, nodes: list[dict[str, float]], which: str) -> str | None:
        """What is missing, if a node entry does not fit the largest node or the pool the whole cluster."""
        for resource, per_process in self.bundle_resources().items():
            largest = max((node.get(resource, 0.0) for node in nodes), default=0.0)
            cluster = sum(node.get(resource, 0.0) for node in nodes)
            biggest_entry = max(self.process_on_nodes) * per_process
            if biggest_entry > largest:
                return (
                    f"needs {_fmt(biggest_entry)} {resource} on one node, but the largest of the {len(nodes)} "
                    f"node(s) has {_fmt(largest)} {resource} {which}"
                )
            if self.world_size * per_process > cluster:
                needed = _fmt(self.world_size * per_process)
                return f"needs {needed} {resource}, but the cluster has {_fmt(cluster)} {resource} {which}"
        return None

    def _check_fits(self, nodes: list[dict[str, float]], which: str) -> None:
        shortfall = self._shortfall(nodes, which)
        if shortfall:
            raise InsufficientResourcesError(
                f"{self._describe()} {shortfall}; use fewer processes or less per process, or start Ray with more"
            )

    def _create_and_wait(self) -> list[PlacementGroup]:
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        tag = uuid.uuid4().hex[:8]
        groups = [
            placement_group(
                [self.bundle_resources()] * count, strategy="STRICT_PACK", name=f"{self.name_prefix}_{tag}_{i}"
            )
            for i, count in enumerate(self.process_on_nodes)
        ]
        ready, _ = ray.wait([pg.ready() for pg in groups], num_returns=len(groups), timeout=self.ready_timeout_s)
        if len(ready) == len(groups):
            return groups
        for pg in groups:
            remove_placement_group(pg)
        free = _node_resources(available=True)
        shortfall = self._shortfall(free, "free now") or "does not fit: the free resources are split across nodes"
        raise InsufficientResourcesError(
            f"{self._describe()} {shortfall} (waited {self.ready_timeout_s:g} s); other pools or actors hold the "
            f"rest: kill their groups and release() their pools first, or raise ready_timeout_s. Free per node: "
            f"{[{k: v for k, v in node.items() if k in ('CPU', 'GPU')} for node in free]}"
        )


def _node_resources(available: bool) -> list[dict[str, float]]:
    """CPU/GPU of every live node, in total or free now."""
    import ray

    if available:
        # Ray has no public per-node view of free resources.
        from ray._private.state import available_resources_per_node

        return [dict(r) for r in available_resources_per_node().values()]
    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]


RayResourcePool = ResourcePool
