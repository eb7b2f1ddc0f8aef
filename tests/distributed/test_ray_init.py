"""init_local_ray: explicit resources, and idempotent under the session cluster."""

import base64
import json

import psutil

from hybridflow.distributed import init_local_ray
from hybridflow.distributed.ray_init import DEFAULT_OBJECT_STORE_BYTES, TASK_EVENTS_KEPT, TASK_EVENTS_KEY


def test_session_cluster_has_the_requested_cpus_and_a_small_object_store(ray_cluster):
    resources = ray_cluster.cluster_resources()
    assert resources["CPU"] == 4
    assert resources["object_store_memory"] == DEFAULT_OBJECT_STORE_BYTES


def test_second_call_joins_the_running_cluster_instead_of_starting_another(ray_cluster):
    before = ray_cluster.get_runtime_context().get_node_id()
    assert init_local_ray(num_cpus=1)["CPU"] == 4
    assert ray_cluster.get_runtime_context().get_node_id() == before


def test_the_local_clusters_gcs_keeps_a_bounded_number_of_task_events(ray_cluster):
    # Direct children only: a shared cluster that other tests start has its own GCS a level further down.
    gcs = [p for p in psutil.Process().children() if p.name() == "gcs_server"]
    assert len(gcs) == 1
    assert gcs[0].environ()[TASK_EVENTS_KEY] == TASK_EVENTS_KEPT


def test_the_local_cluster_starts_no_worker_processes_for_jobs_without_a_runtime_env(ray_cluster):
    # Ray's default starts one idle worker process per CPU for the first driver; hybridflow's jobs carry a
    # runtime_env, which those workers lack, so none of them would ever take a worker group's rank.
    gcs = next(p for p in psutil.Process().children() if p.name() == "gcs_server")
    encoded = next(arg for arg in gcs.cmdline() if arg.startswith("--config_list="))
    assert json.loads(base64.b64decode(encoded.split("=", 1)[1]))["prestart_worker_first_driver"] is False
