"""Run by test_two_node.py in its own process: a simulated two-node Ray cluster (ray.cluster_utils).

Prints one JSON line: where each rank of a group spread over both nodes ran, its all-reduce result, and
the error of a pool that fits neither node.
"""

import json
import time

import ray
from ray.cluster_utils import Cluster
from sample_workers import CollectiveWorker

from hybridflow.distributed import (
    InsufficientResourcesError,
    RayClassWithInitArgs,
    RayWorkerGroup,
    ResourcePool,
    init_local_ray,
)


def main() -> None:
    node_args = {"num_cpus": 2, "object_store_memory": 100 * 1024 * 1024, "include_dashboard": False}
    # The caller sets RAY_TMPDIR, so this cluster's files stay apart from the session cluster's.
    cluster = Cluster(initialize_head=True, head_node_args=node_args)
    cluster.add_node(**node_args)
    init_local_ray(address=cluster.address)
    # Each node entry needs both CPUs of a node, so the two ranks must land on different nodes.
    pool = ResourcePool([1, 1], num_cpus_per_process=2.0, name_prefix="spread")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(CollectiveWorker), name_prefix="spread")
    report = {
        "node_ids": [info["node_id"] for info in group.worker_info()],
        "all_reduce": group.all_reduce_sum(1.0),
        "environment": group.environment(),
    }
    try:
        ResourcePool([2], num_cpus_per_process=2.0, name_prefix="too_wide").placement_groups()
    except InsufficientResourcesError as error:
        report["too_wide_error"] = str(error)
    group.kill()
    pool.release()
    print(json.dumps(report), flush=True)
    start = time.monotonic()
    ray.shutdown()
    cluster.shutdown()
    print(json.dumps({"shutdown_s": time.monotonic() - start}), flush=True)


if __name__ == "__main__":
    main()
