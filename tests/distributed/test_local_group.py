"""``LocalWorkerGroup``: the same workers and dispatch modes as a Ray group of one rank, in this process."""

import os

import pytest
import torch

from hybridflow.distributed import LocalWorkerGroup, RayClassWithInitArgs, create_colocated_worker_cls
from hybridflow.protocol import DataProto
from tests.trainer.cli import HANG_GUARD_S

from .sample_workers import CollectiveWorker


@pytest.fixture
def local_group(monkeypatch):
    # The group sets these for the worker it builds here; monkeypatch puts them back afterwards.
    for key in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "OMP_NUM_THREADS",
    ):
        monkeypatch.setenv(key, os.environ.get(key, "0"))
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.delenv("LRU_CACHE_CAPACITY", raising=False)
    threads = torch.get_num_threads()
    group = LocalWorkerGroup(RayClassWithInitArgs(CollectiveWorker), num_threads=1)
    yield group
    torch.set_num_threads(threads)


def test_the_one_rank_runs_in_this_process_with_the_threads_asked_for(local_group):
    (environment,) = local_group.environment()
    assert (environment["rank"], environment["world_size"], environment["pid"]) == (0, 1, os.getpid())
    assert environment["torch_threads"] == 1
    # oneDNN's and ideep's caches bounded before any model is built (the driver's process, in local mode).
    assert (environment["onednn_cache"], environment["ideep_cache"]) == ("64", "16")
    assert local_group.world_size == 1
    assert local_group.all_reduce_sum(2.0) == [2.0]


def test_a_primitive_cache_size_the_user_set_is_kept(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    group = LocalWorkerGroup(RayClassWithInitArgs(CollectiveWorker))
    assert group.environment()[0]["onednn_cache"] == "512"


def test_every_dispatch_mode_collects_as_a_ray_group_of_one_rank(local_group):
    data = DataProto.from_dict(tensors={"x": torch.arange(5.0)}, non_tensors={"uid": list("abcde")})
    doubled = local_group.double(data, factor=3)
    assert torch.equal(doubled.batch["doubled"], torch.arange(5.0) * 3)
    assert list(doubled.non_tensor_batch["uid"]) == list("abcde")
    assert local_group.count_rows(data) == [5]
    assert local_group.add_rank([7], offset=[1]) == [8]
    assert local_group.rank_zero_echo("hi") == (0, "hi")
    # Submitted, a call has run by the time it returns (there is nothing to overlap with in one process).
    assert local_group.add_rank.submit([7], offset=[1]).get() == [8]
    assert local_group.rank_zero_world_size() == (0, 1)
    future = local_group.sleep(0.0)
    assert future.done() and future.get() == [0]


def test_a_streamed_method_runs_as_its_parts_are_read(local_group):
    data = DataProto.from_dict(tensors={"x": torch.arange(5.0)}, non_tensors={"uid": list("abcde")})
    stream = local_group.double_in_parts(data)
    first = next(iter(stream))
    assert first.rows.tolist() == [1, 3] and first.total == 5
    torch.testing.assert_close(first.data.batch["doubled"], torch.tensor([2.0, 6.0]))
    whole = stream.get()
    assert torch.equal(whole.batch["doubled"], torch.arange(5.0) * 2)
    assert list(whole.non_tensor_batch["uid"]) == list("abcde")


def test_a_worker_exception_reaches_the_caller_as_raised(local_group):
    # No WorkerError wrapping: a debugger stops where the worker raised.
    with pytest.raises(ValueError, match="deliberate failure on rank 0"):
        local_group.raise_on_rank(0)


def test_a_killed_group_says_so(local_group):
    local_group.kill()
    with pytest.raises(RuntimeError, match="was killed"):
        local_group.all_reduce_sum(1.0)


def test_fused_roles_share_the_process_and_views_use_plain_names(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, os.environ.get(key, "0"))
    fused = create_colocated_worker_cls(
        {"actor": RayClassWithInitArgs(CollectiveWorker), "critic": RayClassWithInitArgs(CollectiveWorker)}
    )
    group = LocalWorkerGroup(fused, "pool")
    views = group.spawn()
    assert group.actor_rank_zero_echo(1) == (0, 1)
    assert views["critic"].rank_zero_echo(2) == (0, 2)
    assert views["actor"].environment()[0]["pid"] == views["critic"].environment()[0]["pid"] == os.getpid()


def test_local_mode_does_not_load_ray():
    """Local mode plans its pools and builds its groups without Ray: it runs where Ray is not installed."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from hybridflow.config.placement import make_resource_plan\n"
        "from hybridflow.distributed import LocalWorkerGroup, RayClassWithInitArgs\n"
        "import hybridflow.distributed.streams, hybridflow.trainer.main_ppo, hybridflow.trainer.worker_groups\n"
        "plan = make_resource_plan('colocated', ['actor_rollout'], nnodes=1, processes_per_node=1, use_gpu=False,"
        " cpus_per_process=1)\n"
        "plan.pools['global_pool'].release()\n"
        "assert 'ray' not in sys.modules, sorted(name for name in sys.modules if name.startswith('ray'))\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert completed.returncode == 0, completed.stderr[-3000:]
