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


@pytest.mark.slow
def test_demo_with_the_judge_trains_on_its_scores_and_validates_by_the_rule(tmp_path):
    """`--reward judge`: the tiny judge's raw scores are the only training reward (the rule's are 0 or 1, the
    judge's are negative for a wrong answer, and most first answers are wrong), and validation is scored by the
    sorting rule (a share of the 200 prompts)."""
    run_dir = tmp_path / "demo"
    command = [sys.executable, "-m", "hybridflow.demo", "--reward", "judge", "--steps", "3", "--test_freq", "3"]
    command += ["--run_dir", str(run_dir), "actor_rollout_ref.actor.optim.lr_warmup_steps=1"]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["critic/score/min"] < 0 for row in rows if "critic/score/min" in row] == [True] * 3
    accuracy = [row["val-core/sorting/acc/mean@1"] for row in rows if "val-core/sorting/acc/mean@1" in row]
    assert len(accuracy) == 2 and all(abs(200 * value - round(200 * value)) < 1e-6 for value in accuracy), accuracy
