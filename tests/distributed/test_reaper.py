"""A local Ray cluster leaves no process behind: after ``ray.shutdown()``, nor when its driver is killed with
SIGKILL."""

import os
import signal
import subprocess
import sys
import time

from hybridflow.distributed.reaper import marked_processes

DRIVER = """
import os, time, ray
from hybridflow.distributed.ray_init import init_local_ray
from hybridflow.distributed.reaper import marked_processes
init_local_ray(num_cpus=1, temp_dir={temp_dir!r})
first = os.environ["HYBRIDFLOW_RAY_SESSION"]
ray.shutdown()
deadline = time.monotonic() + 10
while marked_processes(first) and time.monotonic() < deadline:
    time.sleep(0.2)
print(len(marked_processes(first)), flush=True)
init_local_ray(num_cpus=1, temp_dir={temp_dir!r})
print(os.environ["HYBRIDFLOW_RAY_SESSION"], flush=True)
time.sleep(600)
"""


def test_a_shut_down_or_killed_driver_leaves_no_ray_process(tmp_path):
    temp_dir = f"/tmp/hfreap{os.getpid()}"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER.format(temp_dir=temp_dir)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert driver.stdout.readline().strip() == "0", "ray.shutdown() left processes of its cluster running"
        marker = driver.stdout.readline().strip()
        assert marker, "the driver did not start its cluster"
        assert len(marked_processes(marker)) >= 3  # the driver, the GCS server and the raylet at least
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 20
        while marked_processes(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marked_processes(marker) == []
    finally:
        driver.kill()
        subprocess.run(["rm", "-rf", temp_dir])
