"""A worker's failure reaches the driver within seconds as a WorkerError naming group, rank and method."""

import time

import pytest

from hybridflow.distributed import (
    RayClassWithInitArgs,
    RayWorkerGroup,
    StalledRanksError,
    WorkerError,
    WorkerTimeoutError,
)
from hybridflow.distributed.resource_pool import ResourcePool
from hybridflow.distributed.worker import DEFAULT_PROCESS_GROUP_TIMEOUT_S

from .conftest import start_group, stop_group
from .sample_workers import CollectiveWorker, FailingInitWorker, StuckPeerWorker


@pytest.fixture(scope="module")
def doomed_group(ray_cluster):
    """A group the tests may leave broken (a peer stuck in a collective); killed afterwards."""
    group = start_group(RayClassWithInitArgs(CollectiveWorker), "doomed")
    yield group
    stop_group(group)


def test_exception_names_group_rank_method_and_carries_the_traceback(collective_group):
    with pytest.raises(WorkerError) as caught:
        collective_group.raise_on_rank(1)
    error = caught.value
    assert (error.group, error.rank, error.method, error.cause_type) == ("collective", 1, "raise_on_rank", "ValueError")
    message = str(error)
    assert message.startswith("group 'collective' rank 1 method 'raise_on_rank' failed:")
    assert "deliberate failure on rank 1" in message
    assert "sample_workers.py" in message and "in raise_on_rank" in message
    # the group stays usable after a method raised
    assert collective_group.all_reduce_sum(1.0) == [3.0, 3.0]


# Without prompt failure reports the driver would wait for a peer blocked in a collective (or a rendezvous)
# until the process group's timeout: 30 minutes. Start-up takes seconds, a minute on a machine loaded 10x;
# a tenth of the timeout separates the two on any machine.
HANG_BOUND_S = DEFAULT_PROCESS_GROUP_TIMEOUT_S / 10


def test_exception_while_peers_block_in_a_collective_arrives_within_seconds(doomed_group):
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"group 'doomed' rank 0 method 'raise_on_rank_while_peers_all_reduce'"):
        doomed_group.raise_on_rank_while_peers_all_reduce(0)
    assert time.monotonic() - start < HANG_BOUND_S
    # The error did not wait for rank 1: it is still blocked in the all-reduce, so a call queued behind it
    # cannot finish (whatever the load, until the process group's timeout).
    with pytest.raises(WorkerTimeoutError, match=r"ranks \[(0, )?1\] did not finish"):
        doomed_group.sleep(0.0).get(timeout=1.0)


def test_dead_worker_is_reported_instead_of_hanging(doomed_group):
    # rank 1 is still blocked in the previous test's all-reduce; its peer now dies outright.
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        doomed_group.die_on_rank_while_peers_all_reduce(0)
    assert time.monotonic() - start < HANG_BOUND_S
    assert (caught.value.rank, caught.value.method) == (0, "die_on_rank_while_peers_all_reduce")
    assert "died" in str(caught.value)


def test_constructor_failure_on_one_rank_fails_the_group_and_frees_its_actors(ray_cluster):
    start = time.monotonic()
    expected = r"group 'bad_init' rank 1 method 'FailingInitWorker.__init__' failed"
    with pytest.raises(WorkerError, match=expected) as caught:
        start_group(RayClassWithInitArgs(FailingInitWorker), "bad_init")
    assert "could not load its model" in str(caught.value)
    # Bounded by the actors' start-up (torch imports), not by rank 0's rendezvous timeout.
    assert time.monotonic() - start < HANG_BOUND_S


def test_a_rank_stuck_while_its_peers_wait_in_a_collective_is_named_within_the_timeout(ray_cluster):
    """The group's collective timeout (a role's nccl_timeout) bounds the wait: the waiting rank fails, and the
    rank that never joined (still running after the grace for the other waiters) is named."""
    pool = ResourcePool([2], num_cpus_per_process=0.5, name_prefix="stuck")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(StuckPeerWorker), name_prefix="stuck", process_group_timeout_s=3)
    try:
        start = time.monotonic()
        with pytest.raises(StalledRanksError) as caught:
            group.stuck_on_rank_while_peers_all_reduce(1, DEFAULT_PROCESS_GROUP_TIMEOUT_S)
        assert time.monotonic() - start < HANG_BOUND_S
        assert str(caught.value).startswith(
            "worker group 'stuck': rank(s) [1] never joined a collective of 'stuck_on_rank_while_peers_all_reduce' "
            "(stuck, or stopped mid-call); rank 0 waited for them until the process group's timeout ("
        )
        assert "Timed out waiting 3000ms" in str(caught.value)
    finally:
        group.kill()
        pool.release()
