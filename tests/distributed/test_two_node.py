"""A group spread over a simulated two-node cluster; run in a subprocess, apart from the session cluster."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.trainer.cli import HANG_GUARD_S, RayTempDir

SCRIPT = Path(__file__).with_name("two_node_cluster.py")


def test_group_spreads_over_two_nodes_and_all_reduces_across_them():
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    with RayTempDir() as ray_temp_dir:  # short: Ray's socket paths must fit 107 bytes
        env["RAY_TMPDIR"] = ray_temp_dir
        done = subprocess.run(
            [sys.executable, str(SCRIPT)],
            cwd=SCRIPT.parent,
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    report = lines[0]
    assert len(set(report["node_ids"])) == 2
    assert report["all_reduce"] == [3.0, 3.0]
    assert [e["rank"] for e in report["environment"]] == [0, 1]
    assert [e["local_rank"] for e in report["environment"]] == [0, 0]  # one rank on each node
    assert {e["torch_threads"] for e in report["environment"]} == {2}  # 2 CPUs per process
    assert "needs 4 CPU on one node, but the largest of the 2 node(s) has 2 CPU in total" in report["too_wide_error"]
