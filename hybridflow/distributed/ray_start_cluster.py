"""A two-node Ray cluster started as ``docs/multi_node.md`` tells users: ``ray start --head``, then ``ray start
--address=...`` for the other node; here both on this machine, each node with its own CPUs and its own temp folder
(the multi-node tests and ``bench/bench_placement.py`` run on it). It is stopped by killing exactly its own
processes, never with ``ray stop`` (which stops every Ray cluster on the machine, another test's or the user's
included).
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

from hybridflow.distributed.worker import find_free_port

RAY = pathlib.Path(sys.executable).with_name("ray")


def _cluster_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_ADDRESS")}
    return {**env, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def _processes_under(folder: str) -> list[int]:
    """Processes whose command line names ``folder`` (a node's GCS, raylet, agents and workers all do)."""
    pids = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if folder in command:
                pids.append(int(entry.name))
    return pids


def _kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class RayStartCluster:
    """A head node and one worker node of ``cpus_per_node`` CPUs each; ``address`` is what ``ray_init.address``
    takes."""

    def __init__(self, cpus_per_node: int = 1):
        self.cpus_per_node = cpus_per_node
        self.port = find_free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Short folders: Ray's socket paths must stay under ~100 characters.
        self.head_dir = tempfile.mkdtemp(prefix="hfh", dir="/tmp")
        self.worker_dir = tempfile.mkdtemp(prefix="hfw", dir="/tmp")

    def _ray_start(self, *args: str) -> None:
        command = [str(RAY), "start", f"--num-cpus={self.cpus_per_node}", "--disable-usage-stats", *args]
        subprocess.run(command, env=_cluster_env(), check=True, capture_output=True, text=True, timeout=120)

    def start_head(self) -> None:
        self._ray_start(
            "--head",
            f"--port={self.port}",
            f"--temp-dir={self.head_dir}",
            "--include-dashboard=false",
            f"--dashboard-port={find_free_port()}",
            f"--ray-client-server-port={find_free_port()}",
        )

    def start_worker_node(self) -> None:
        self._ray_start(f"--address={self.address}", f"--temp-dir={self.worker_dir}")
        deadline = time.monotonic() + 60
        while self.alive_nodes() < 2:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the worker node did not join {self.address} within 60 s")
            time.sleep(0.5)

    def alive_nodes(self) -> int:
        command = [sys.executable, "-c", _COUNT_NODES, self.address]
        completed = subprocess.run(command, env=_cluster_env(), capture_output=True, text=True, timeout=60)
        # Ray's driver also prints the cluster's error events (a node marked dead) on stdout
        counts = [line for line in completed.stdout.splitlines() if line.startswith("alive_nodes=")]
        return int(counts[-1].removeprefix("alive_nodes=")) if counts else 0

    def kill_worker_raylet(self) -> None:
        """The worker node's raylet, SIGKILLed: the node and every process on it are lost, as when a machine dies."""
        _kill([pid for pid in _processes_under(self.worker_dir) if "raylet" in _command(pid)])

    def restart_worker_node(self) -> None:
        """What a user does after a node was lost: ``ray start --address=...`` on it again (a fresh temp folder;
        the lost node's leftover agents are ended first)."""
        _kill(_processes_under(self.worker_dir))
        subprocess.run(["rm", "-rf", self.worker_dir], check=False)
        self.worker_dir = tempfile.mkdtemp(prefix="hfw", dir="/tmp")
        self.start_worker_node()

    def processes(self) -> list[int]:
        """Every process of the cluster: both nodes' Ray services and workers."""
        return _processes_under(self.head_dir) + _processes_under(self.worker_dir)

    def stop(self) -> None:
        for folder in (self.worker_dir, self.head_dir):
            _kill(_processes_under(folder))
            subprocess.run(["rm", "-rf", folder], check=False)


def _command(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


_COUNT_NODES = """
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(f"alive_nodes={sum(node['Alive'] for node in ray.nodes())}")
"""
