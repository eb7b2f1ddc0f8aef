"""RayWorkerGroup on the session's local Ray cluster: the process group and every dispatch mode."""

import os

import numpy as np
import pytest
import torch

from hybridflow.distributed import (
    GroupFuture,
    PartStream,
    RayClassWithInitArgs,
    RayWorkerGroup,
    ResourcePool,
    WorkerError,
    WorkerTimeoutError,
)
from hybridflow.protocol import DataProto

from .sample_workers import FlagWorker


def make_batch(rows: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(rows, dtype=torch.float32)},
        non_tensors={"uid": np.array([f"row{i}" for i in range(rows)], dtype=object)},
    )


def test_two_ranks_all_reduce_through_gloo(collective_group):
    # rank r contributes 3 * (r + 1): 3 + 6
    assert collective_group.all_reduce_sum(3.0) == [9.0, 9.0]


def test_ranks_know_their_place_and_share_one_master(collective_group):
    env = collective_group.environment()
    assert [e["rank"] for e in env] == [0, 1]
    assert {e["world_size"] for e in env} == {2}
    assert [e["local_rank"] for e in env] == [0, 1]
    assert len({e["master"] for e in env}) == 1
    assert {e["backend"] for e in env} == {"gloo"}
    assert len({e["pid"] for e in env}) == 2
    assert [info["pid"] for info in collective_group.worker_info()] == [e["pid"] for e in env]


def test_workers_wait_passively_with_one_thread_per_half_cpu(collective_group):
    env = collective_group.environment()
    assert {e["omp_wait_policy"] for e in env} == {"PASSIVE"}
    assert {e["torch_threads"] for e in env} == {1}
    # oneDNN's and ideep's caches bounded (hybridflow's 64 and 16 unless the driver's environment sets them).
    assert {e["onednn_cache"] for e in env} == {os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "64")}
    assert {e["ideep_cache"] for e in env} == {os.environ.get("LRU_CACHE_CAPACITY", "16")}


@pytest.mark.parametrize("rows", [5, 1, 4])
def test_dp_compute_proto_returns_exact_rows_in_order(collective_group, rows):
    batch = make_batch(rows)
    out = collective_group.double(batch, factor=3)
    assert len(out) == rows
    torch.testing.assert_close(out.batch["doubled"], batch.batch["x"] * 3)
    assert list(out.non_tensor_batch["uid"]) == list(batch.non_tensor_batch["uid"])
    per_rank = -(-rows // 2)
    assert out.batch["rank"].tolist() == [i // per_rank for i in range(rows)]


def test_dp_compute_proto_pads_to_the_world_size_and_lists_non_proto_results(collective_group):
    assert collective_group.count_rows(make_batch(5)) == [3, 3]
    assert collective_group.count_rows(data=make_batch(4)) == [2, 2]


def test_dp_compute_proto_refuses_data_protos_of_different_lengths(collective_group):
    with pytest.raises(ValueError, match=r"one batch size; got sizes \[3, 4\]"):
        collective_group.double(make_batch(3), factor=make_batch(4))


def test_all_to_all_gives_each_rank_its_item(collective_group):
    assert collective_group.add_rank([1, 2], offset=[10, 20]) == [11, 122]
    with pytest.raises(ValueError, match=r"one item per rank \(length 2\); got a list of length 3"):
        collective_group.add_rank([1, 2, 3])


def test_rank_zero_modes_run_only_rank_zero(collective_group):
    assert collective_group.rank_zero_echo("hello") == (0, "hello")
    assert collective_group.rank_zero_world_size() == (0, 2)


def test_submit_starts_any_method_without_waiting_and_calls_on_other_groups_overlap(collective_group, colocated_group):
    future = collective_group.add_rank.submit([1, 2], offset=[10, 20])
    assert isinstance(future, GroupFuture)
    assert future.get(timeout=30) == collective_group.add_rank([1, 2], offset=[10, 20]) == [11, 122]
    # What the driver does on split placement: start one group's call, call another group, then wait.
    started = collective_group.sleep_span.submit(1.0)
    waited = colocated_group.actor_sleep_span(1.0).get(timeout=30)
    spans = started.get(timeout=30) + waited
    assert max(start for start, _ in spans) < min(end for _, end in spans)  # all four ranks slept at once


def test_non_blocking_call_returns_a_future_the_driver_waits_on_later(collective_group):
    future = collective_group.sleep(0.5)
    assert isinstance(future, GroupFuture)
    with pytest.raises(WorkerTimeoutError, match=r"group 'collective' method 'sleep': ranks \[0, 1\] did not finish"):
        future.get(timeout=0.05)
    assert future.get(timeout=30) == [0, 1]
    assert future.done()


@pytest.mark.parametrize("rows", [6, 5])
def test_a_streamed_method_hands_over_each_part_while_the_ranks_still_run(collective_group, tmp_path, rows):
    go_on = tmp_path / "go_on"
    batch = make_batch(rows)
    stream = collective_group.double_in_parts(batch, go_on_file=str(go_on))
    assert isinstance(stream, PartStream)
    parts = []
    for part in stream:
        parts.append(part)
        go_on.touch()  # each rank's second part waits for this file
    assert [part.data.meta_info.get("saw_go_on") for part in parts].count(True) == 2
    # Rows placed in the padded whole (3 rows per rank), each part's values those of its rows
    assert sorted(np.concatenate([part.rows for part in parts]).tolist()) == list(range(6))
    padded = make_batch(6)
    padded.batch["x"][rows:] = 0.0  # dispatch pads with copies of the first rows
    for part in parts:
        torch.testing.assert_close(part.data.batch["doubled"], padded.batch["x"][part.rows] * 2)
    whole = stream.get()
    expected = collective_group.double(batch)
    assert len(whole) == rows
    torch.testing.assert_close(whole.batch["doubled"], expected.batch["doubled"])
    assert list(whole.non_tensor_batch["uid"]) == list(batch.non_tensor_batch["uid"])
    assert whole.meta_info["metrics"] == {"parts_rank": [0, 1]}


def test_a_rank_failing_mid_stream_stops_the_stream_with_its_error(collective_group):
    stream = collective_group.double_in_parts(make_batch(4), fail_after_first=True)
    with pytest.raises(WorkerError, match=r"(?s)rank [01].*double_in_parts.*deliberate failure"):
        stream.get()


@pytest.mark.parametrize("concurrent_calls", [True, False])
def test_a_concurrent_method_runs_beside_a_call_in_progress_on_a_group_started_for_it(ray_cluster, concurrent_calls):
    """``register(concurrent=True)`` (the rollout pool's weight loads under partial rollout): on a group with
    ``concurrent_calls`` it runs while the call in progress waits for it; elsewhere after that call, in order."""
    pool = ResourcePool([2], num_cpus_per_process=0.5, name_prefix="flags")
    group = RayWorkerGroup(
        pool, RayClassWithInitArgs(FlagWorker), name_prefix="flags", concurrent_calls=concurrent_calls
    )
    try:
        waiting = group.wait_for_flag.submit(30.0 if concurrent_calls else 0.5)
        group.raise_flag()
        assert waiting.get() == [concurrent_calls] * 2
        assert group.wait_for_flag(0.0) == [True, True]
    finally:
        group.kill()
        pool.release()
