"""Start (or join) the Ray cluster that hosts the worker groups.

Ray's defaults suit a dedicated cluster, not a laptop or a test run: its object store takes ~30% of RAM,
the dashboard starts, every run shares one temp folder, its GCS keeps 100,000 tasks' events (~300 MiB), a worker
process per CPU starts for the first driver (hybridflow's workers carry a runtime_env, so these never serve it),
and torch's spin-waiting OpenMP threads make a busy 2-core machine 5-10x slower. ``init_local_ray`` sets each of
those explicitly.
"""

from __future__ import annotations

import logging
import os
import tempfile

import ray

from hybridflow.distributed.reaper import start_reaper

logger = logging.getLogger(__name__)

DEFAULT_OBJECT_STORE_BYTES = 1 << 30

# Set in the driver before Ray starts (so the raylet and its workers inherit them) and in the job's
# runtime_env (so workers on a joined cluster get them too).
WORKER_ENV_VARS = {"OMP_WAIT_POLICY": "PASSIVE", "RAY_AUTH_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false"}
# Ray's GCS keeps the events of the last 100,000 tasks, ~3 KiB each: the demo's runs grew it 10-17 MiB per 1,000
# steps (bench/bench_soak.py) for thousands of steps. 1,000 tasks (~3 MiB, the last ~100 steps) bound it early;
# a run that asks for Ray's timeline (built from these events) keeps Ray's default.
TASK_EVENTS_KEY, TASK_EVENTS_KEPT = "RAY_task_events_max_num_task_in_gcs", "1000"


def init_local_ray(
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    object_store_memory: int = DEFAULT_OBJECT_STORE_BYTES,
    temp_dir: str | None = None,
    address: str | None = None,
    env_vars: dict[str, str] | None = None,
    namespace: str | None = None,
    runtime_env: dict | None = None,
    keep_task_events: bool = False,
) -> dict[str, float]:
    """Join ``address`` (or ``$RAY_ADDRESS``) if given, else start a local cluster; returns its resources.

    A local cluster gets exactly ``num_cpus`` (default: every core) and ``num_gpus`` (default: Ray's
    detection), an object store of ``object_store_memory`` bytes, no dashboard, and its own temp folder
    (``temp_dir`` or a fresh one under the system temp dir). Calling it again while Ray is up is a no-op.
    ``env_vars`` are added to every worker's environment; ``runtime_env`` is the job's Ray runtime_env (its own
    ``env_vars`` override hybridflow's). A local cluster's processes are killed when this process ends
    (``hybridflow.distributed.reaper``), ``kill -9`` included; its GCS keeps the events of the last 1,000 tasks
    unless ``keep_task_events`` (for ``ray.timeline``).
    """
    if ray.is_initialized():
        return ray.cluster_resources()
    for key, value in WORKER_ENV_VARS.items():
        os.environ.setdefault(key, value)
    runtime_env = dict(runtime_env or {})
    runtime_env["env_vars"] = {**WORKER_ENV_VARS, **(env_vars or {}), **runtime_env.get("env_vars", {})}
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        logger.info("joining the Ray cluster at %s; num_cpus, num_gpus, temp_dir apply only to a new one", address)
        ray.init(address=address, runtime_env=runtime_env, namespace=namespace, log_to_driver=True)
    else:
        start_reaper()  # the cluster's processes go with this driver, however it ends
        if not keep_task_events:
            os.environ.setdefault(TASK_EVENTS_KEY, TASK_EVENTS_KEPT)
        cpus = num_cpus if num_cpus is not None else os.cpu_count()
        _start_local_cluster(cpus, num_gpus, object_store_memory, temp_dir, runtime_env, namespace)
    return ray.cluster_resources()


def _start_local_cluster(
    num_cpus: int,
    num_gpus: int | None,
    object_store_memory: int,
    temp_dir: str | None,
    runtime_env: dict,
    namespace: str | None,
) -> None:
    ray.init(
        address="local",
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        object_store_memory=object_store_memory,
        include_dashboard=False,
        _temp_dir=temp_dir or tempfile.mkdtemp(prefix="hybridflow-ray-"),
        runtime_env=runtime_env,
        namespace=namespace,
        log_to_driver=True,
        _system_config={"prestart_worker_first_driver": False},
    )
