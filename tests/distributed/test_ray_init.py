"""init_local_ray: explicit resources, and idempotent under the session cluster."""

from hybridflow.distributed import init_local_ray
from hybridflow.distributed.ray_init import DEFAULT_OBJECT_STORE_BYTES


def test_session_cluster_has_the_requested_cpus_and_a_small_object_store(ray_cluster):
    resources = ray_cluster.cluster_resources()
    assert resources["CPU"] == 4
    assert resources["object_store_memory"] == DEFAULT_OBJECT_STORE_BYTES


def test_second_call_joins_the_running_cluster_instead_of_starting_another(ray_cluster):
    before = ray_cluster.get_runtime_context().get_node_id()
    assert init_local_ray(num_cpus=1)["CPU"] == 4
    assert ray_cluster.get_runtime_context().get_node_id() == before
