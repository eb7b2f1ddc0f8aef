"""The local Ray cluster goes when its driver goes, even after ``kill -9``.

A local cluster's processes (GCS, raylet, dashboard and runtime-env agents, workers) outlive a driver killed
with SIGKILL, and some of its agents ignore SIGTERM after ``ray.shutdown()``. Before starting the cluster the
driver puts a marker in its environment, which every Ray process inherits; :func:`start_reaper` starts this
file as a small process of its own session that waits for the driver's pid to end, then SIGKILLs every process
carrying the marker. A cluster joined by address is never touched. Run as a script (only the standard library),
so it starts in milliseconds.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid

MARKER_ENV = "HYBRIDFLOW_RAY_SESSION"
POLL_S = 0.5


def start_reaper() -> str:
    """Mark this process's environment for the cluster about to start, and start its reaper; returns the marker."""
    marker = uuid.uuid4().hex
    # The reaper itself is not marked: it is not one of the cluster's processes.
    environment = {key: value for key, value in os.environ.items() if key != MARKER_ENV}
    subprocess.Popen(
        [sys.executable, str(pathlib.Path(__file__)), str(os.getpid()), marker],
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.environ[MARKER_ENV] = marker
    return marker


def marked_processes(marker: str) -> list[int]:
    """The pids (not this one's) whose environment carries ``marker``."""
    needle = f"{MARKER_ENV}={marker}".encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def reap(driver_pid: int, marker: str) -> None:
    while _alive(driver_pid):
        time.sleep(POLL_S)
    for _ in range(3):  # a worker may be starting while the first ones die
        for pid in marked_processes(marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(POLL_S)


if __name__ == "__main__":
    reap(int(sys.argv[1]), sys.argv[2])
