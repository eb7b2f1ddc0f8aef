"""A shortened `make demo`: the same command, 12 GRPO steps, and the validation accuracy must rise."""

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_short_demo_learns_and_writes_its_plot(tmp_path):
    run_dir = tmp_path / "demo"
    completed = subprocess.run(
        [sys.executable, "-m", "hybridflow.demo", "--steps", "12", "--test_freq", "12", "--run_dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    accuracy = [row["val-core/sorting/acc/mean@1"] for row in rows if "val-core/sorting/acc/mean@1" in row]
    assert len(accuracy) == 2, accuracy  # before training and after step 12
    assert accuracy[1] >= accuracy[0] + 0.05, accuracy
    rewards = [row["critic/score/mean"] for row in rows if "critic/score/mean" in row]
    assert len(rewards) == 12 and sum(rewards[-4:]) > sum(rewards[:4]), rewards
    assert (run_dir / "demo.png").stat().st_size > 10_000
    assert "validation accuracy" in completed.stdout
