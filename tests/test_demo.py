"""A shortened `make demo`: the same command, 12 GRPO steps, and the validation accuracy must rise; the memory
estimate its start-up banner prints bounds the peak its process reached."""

import json
import os
import re
import subprocess
import sys

import pytest

ESTIMATE = re.compile(r"memory per process of the driver \(trainer\.local_mode=true\) \(1\): ~([\d.]+) GiB")


@pytest.mark.slow
def test_short_demo_learns_and_writes_its_plot(tmp_path):
    run_dir, log_path = tmp_path / "demo", tmp_path / "demo.log"
    command = [sys.executable, "-m", "hybridflow.demo", "--steps", "12", "--test_freq", "12", "--run_dir", str(run_dir)]
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        # wait4: the launcher's rusage, whose peak is that of main_ppo, the one process of a local-mode run
        _, status, usage = os.wait4(process.pid, 0)
    output = log_path.read_text()
    assert status == 0, output[-6000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accuracy = [row["val-core/sorting/acc/mean@1"] for row in rows if "val-core/sorting/acc/mean@1" in row]
    assert len(accuracy) == 2, accuracy  # before training and after step 12
    assert accuracy[1] >= accuracy[0] + 0.05, accuracy
    rewards = [row["critic/score/mean"] for row in rows if "critic/score/mean" in row]
    assert len(rewards) == 12 and sum(rewards[-4:]) > sum(rewards[:4]), rewards
    assert (run_dir / "demo.png").stat().st_size > 10_000
    assert "validation accuracy" in output
    # The estimate is printed to 0.01 GiB; it assumes every sample at the longest lengths, so it bounds the peak.
    estimate = float(ESTIMATE.search(output).group(1))
    peak = usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024  # bytes there, KiB on Linux
    assert peak / 2**30 <= estimate + 0.005, (peak, estimate)
