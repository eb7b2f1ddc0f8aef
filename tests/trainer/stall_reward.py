"""dense_reward.py's score, for kill tests: while ``$HYBRIDFLOW_TEST_STALL_AT`` names ``<metrics.jsonl>:<step>``
and that file holds the step, every call sleeps, so the run stands still in the next step's reward until killed."""

import json
import os
import pathlib
import time


def _stalled() -> bool:
    path, _, step = os.environ.get("HYBRIDFLOW_TEST_STALL_AT", "").rpartition(":")
    metrics = pathlib.Path(path)
    return (
        bool(path)
        and metrics.exists()
        and any(json.loads(line)["step"] == int(step) for line in metrics.read_text().splitlines() if line.strip())
    )


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    while _stalled():
        time.sleep(1)
    even = sum(ord(ch) % 2 == 0 for ch in solution_str)
    return {"score": even / max(len(solution_str), 1), "acc": float(solution_str.strip() == str(ground_truth))}
