"""ResourcePool: fail fast when the cluster cannot hold a pool; split pools work at the same time."""

import time

import pytest

from hybridflow.distributed import InsufficientResourcesError, ResourcePool


def test_pool_larger_than_the_cluster_fails_at_once_naming_what_is_missing(ray_cluster):
    start = time.monotonic()
    with pytest.raises(InsufficientResourcesError, match=r"needs 8 CPU, but the cluster has 4 CPU in total"):
        ResourcePool([2, 2, 2, 2], num_cpus_per_process=1.0, name_prefix="huge").placement_groups()
    with pytest.raises(
        InsufficientResourcesError, match=r"needs 5 CPU on one node, but the largest .* has 4 CPU in total"
    ):
        ResourcePool([5], num_cpus_per_process=1.0, name_prefix="wide").placement_groups()
    with pytest.raises(InsufficientResourcesError, match=r"needs 1 GPU on one node, but the largest .* has 0 GPU"):
        ResourcePool([1], use_gpu=True, name_prefix="gpu").placement_groups()
    # At once: without the up-front check the first pool alone would wait its default ready timeout, 30 s.
    assert time.monotonic() - start < 30


def test_pool_that_fits_the_cluster_but_not_what_is_free_fails_after_its_timeout(collective_group):
    # collective_group holds 1 of the 4 CPUs (other groups may hold more), so 4 cannot be reserved now.
    pool = ResourcePool([4], num_cpus_per_process=1.0, name_prefix="busy", ready_timeout_s=0.5)
    start = time.monotonic()
    expected = r"needs 4 CPU on one node, but .* has [0-3] CPU free now \(waited 0.5 s\); other pools or actors hold"
    with pytest.raises(InsufficientResourcesError, match=expected):
        pool.placement_groups()
    # It waited its own 0.5 s, not the default 30 s (load delays the start of the wait, not its length).
    assert 0.5 <= time.monotonic() - start < 30


def test_pool_arguments_are_checked():
    with pytest.raises(ValueError, match="positive ints, got \\[2, 0\\]"):
        ResourcePool([2, 0])
    with pytest.raises(ValueError, match="num_cpus_per_process must be > 0"):
        ResourcePool([1], num_cpus_per_process=0)


def test_pool_reports_its_shape():
    pool = ResourcePool([2, 3], num_cpus_per_process=0.5)
    assert (pool.world_size, pool.store, pool.bundle_resources()) == (5, [2, 3], {"CPU": 0.5})


def test_groups_on_split_pools_run_concurrently(collective_group, colocated_group):
    pools = [group.resource_pool.placement_groups() for group in (collective_group, colocated_group)]
    assert pools[0][0].id != pools[1][0].id
    futures = [collective_group.sleep_span(1.5), colocated_group.critic_sleep_span(1.5)]
    spans = [span for future in futures for span in future.get(timeout=60)]
    # Every call began before any ended: they overlapped, however long the machine took to dispatch them.
    latest_start, earliest_end = max(start for start, _ in spans), min(end for _, end in spans)
    assert latest_start < earliest_end, f"the calls on split pools ran one after the other: {spans}"
    pids = [info["pid"] for group in (collective_group, colocated_group) for info in group.worker_info()]
    assert len(set(pids)) == 4
