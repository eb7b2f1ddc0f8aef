"""Hosts the Ray cluster a test process's trainer runs join (``cli.SharedRayCluster``): started here with
``num_cpus`` CPUs in ``temp_dir``, it prints its address and lives until its stdin closes; the reaper ends its
processes should this one be killed."""

import sys

import ray

from hybridflow.distributed import init_local_ray

if __name__ == "__main__":
    num_cpus, temp_dir = int(sys.argv[1]), sys.argv[2]
    init_local_ray(num_cpus=num_cpus, temp_dir=temp_dir)
    print(ray.get_runtime_context().gcs_address, flush=True)
    sys.stdin.read()
    ray.shutdown()
