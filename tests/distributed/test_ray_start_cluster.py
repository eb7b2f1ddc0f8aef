"""The demo's task on a two-node cluster started with ``ray start`` (issue 30): colocated with one rank per node,
split with the actor on one node and the critic on the other, and a node lost mid-run: the run stops within 60 s
naming the node and the ranks, and after ``ray start`` on that node again the same command resumes."""

import json
import pathlib
import re
import subprocess
import sys
import time

import pytest

from hybridflow.distributed.ray_start_cluster import RayStartCluster
from tests.trainer.cli import HANG_GUARD_S

pytestmark = pytest.mark.slow
# One CPU per node and one per worker, so that a pool of one rank per node must span both nodes.
ACROSS_NODES = ["trainer.local_mode=false", "trainer.cpus_per_worker=1", "trainer.n_gpus_per_node=1"]
SHORT = ["actor_rollout_ref.actor.optim.lr_warmup_steps=1", "critic.optim.lr_warmup_steps=1"]
PLACEMENT_LINE = re.compile(r"\[hybridflow\] group '(\w+)': (.*)")
NODE = re.compile(r"on node (\S+) \((\w+)\)")


@pytest.fixture(scope="module")
def cluster():
    cluster = RayStartCluster(cpus_per_node=1)
    try:
        cluster.start_head()
        cluster.start_worker_node()
        yield cluster
    finally:
        cluster.stop()


def demo_command(run_dir: pathlib.Path, cluster: RayStartCluster, *args: str) -> list[str]:
    return [sys.executable, "-m", "hybridflow.demo", "--run_dir", str(run_dir), *args,
            f"ray_init.address={cluster.address}", *ACROSS_NODES, *SHORT]  # fmt: skip


def nodes_of_groups(output: str) -> dict[str, set[str]]:
    """{group: the node ids its ranks ran on}, from the start-up lines."""
    return {match[1]: {node_id for _, node_id in NODE.findall(match[2])} for match in PLACEMENT_LINE.finditer(output)}


def logged_steps(run_dir: pathlib.Path) -> list[int]:
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return []
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines() if line.strip()]


def test_colocated_run_places_one_rank_on_each_node(cluster, tmp_path):
    command = demo_command(tmp_path, cluster, "--steps", "3", "--test_freq", "3", "trainer.nnodes=2")
    completed = subprocess.run(command, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    (nodes,) = nodes_of_groups(completed.stdout).values()
    assert len(nodes) == 2
    assert logged_steps(tmp_path)[-1] == 3


def test_split_run_puts_the_actor_and_the_critic_on_different_nodes(cluster, tmp_path):
    command = demo_command(
        tmp_path, cluster, "--algo", "ppo", "--steps", "3", "--test_freq", "3", "trainer.placement=split"
    )
    completed = subprocess.run(command, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    nodes = nodes_of_groups(completed.stdout)
    assert set(nodes) == {"actor_rollout_ref", "critic"}
    assert len(nodes["actor_rollout_ref"]) == len(nodes["critic"]) == 1
    assert nodes["actor_rollout_ref"] != nodes["critic"]


def test_a_lost_node_stops_the_run_naming_it_and_the_same_command_resumes(cluster, tmp_path):
    command = demo_command(tmp_path, cluster, "--algo", "ppo", "--steps", "8", "--test_freq", "2",
                           "trainer.placement=split")  # fmt: skip
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + HANG_GUARD_S
    while max(logged_steps(tmp_path), default=0) < 3 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert run.poll() is None, "the run ended before the node was lost"
    cluster.kill_worker_raylet()
    lost_at = time.monotonic()
    output, _ = run.communicate(timeout=120)
    stopped_after = time.monotonic() - lost_at
    assert run.returncode != 0
    assert stopped_after < 60, f"the run took {stopped_after:.0f} s to stop"
    error = next(line for line in output.splitlines() if line.startswith("hybridflow: error: worker group"))
    named = re.search(
        r"worker group '(\w+)' rank 0 .* died or was killed on node \S+ \((\w+).*\) with rank\(s\) \[0\]", error
    )
    assert named, error
    # The group named is the one whose rank ran on the lost node.
    assert nodes_of_groups(output)[named[1]] == {named[2]}

    cluster.restart_worker_node()
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    resumed_from = re.search(r"resumed from \S+global_step_(\d+) at step (\d+)", resumed.stdout)
    assert resumed_from and resumed_from[1] == resumed_from[2] and int(resumed_from[1]) >= 2, resumed.stdout[-3000:]
    assert logged_steps(tmp_path)[-1] == 8
