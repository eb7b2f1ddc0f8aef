"""Worker groups shared by the distributed tests: each costs seconds to start (every actor imports torch)."""

import pytest

from hybridflow.distributed import RayClassWithInitArgs, RayWorkerGroup, ResourcePool, create_colocated_worker_cls

from .sample_workers import ActorRole, CollectiveWorker, CriticRole, RefRole


def start_group(ray_cls_with_init, name: str, process_on_nodes=(2,), num_cpus_per_process=0.5):
    pool = ResourcePool(list(process_on_nodes), num_cpus_per_process=num_cpus_per_process, name_prefix=name)
    try:
        return RayWorkerGroup(pool, ray_cls_with_init, name_prefix=name)
    except BaseException:
        pool.release()
        raise


def stop_group(group: RayWorkerGroup) -> None:
    group.kill()
    group.resource_pool.release()


@pytest.fixture(scope="package")
def collective_group(ray_cluster):
    """Two ranks of CollectiveWorker, half a CPU each."""
    group = start_group(RayClassWithInitArgs(CollectiveWorker), "collective")
    yield group
    stop_group(group)


@pytest.fixture(scope="package")
def colocated_group(ray_cluster):
    """Two ranks, each one process holding an actor, a critic and a ref role."""
    fused = create_colocated_worker_cls(
        {
            "actor": RayClassWithInitArgs(ActorRole, scale=1.0),
            "critic": RayClassWithInitArgs(CriticRole, scale=10.0),
            "ref": RayClassWithInitArgs(RefRole, scale=100.0),
        }
    )
    group = start_group(fused, "fused")
    yield group
    stop_group(group)
