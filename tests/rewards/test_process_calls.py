"""Scoring in killable processes (the ``prime`` manager): a stuck scorer is killed at its limit, with what it
started; the others are scored, and the pool goes on."""

import os
import subprocess
import time

import pytest

from hybridflow.rewards.managers import SCORE_TIMEOUTS_METRIC, PrimeRewardManager, RewardFunctionError
from hybridflow.rewards.process_calls import ProcessCallRunner

from .conftest import rollout_batch


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_a_stuck_scorer_is_killed_at_its_limit_with_what_it_started(tokenizer, tmp_path):
    def stuck_or_length(data_source, solution_str, ground_truth, extra_info=None):
        if solution_str == "hang":
            with open(extra_info["pid_file"], "w") as out:  # a grandchild in the scorer's session, to be killed too
                out.write(str(subprocess.Popen(["sleep", "300"]).pid))
            while True:
                pass
        return float(len(solution_str))

    pid_file = tmp_path / "sleep.pid"
    manager = PrimeRewardManager(tokenizer, stuck_or_length, timeout_s=1.5, max_workers=2, max_failed_share=0.9)
    try:
        pids = None
        batch = rollout_batch(
            tokenizer, ["ab", "hang", "abcd"], ["d"] * 3, ["x"] * 3, extra_infos=[{"pid_file": str(pid_file)}] * 3
        )
        start = time.monotonic()
        _, extra, metrics = manager(batch)
        assert time.monotonic() - start < 30  # the 1.5 s limit, not the scorer's endless loop
        assert extra["score"] == [2.0, 0.0, 4.0] and metrics[SCORE_TIMEOUTS_METRIC] == 1.0
        assert manager.runner.num_killed == 1
        deadline = time.monotonic() + 5
        while _alive(int(pid_file.read_text())) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(int(pid_file.read_text()))  # the scorer's own child went with it
        pids = manager.runner.pids()
        _, extra, _ = manager(rollout_batch(tokenizer, ["abc"], ["d"], ["x"]))  # the pool goes on
        assert extra["score"] == [3.0]
        assert set(manager.runner.pids()) == set(pids)  # warm: no new process for a call that ended
    finally:
        manager.close()
    assert not any(_alive(pid) for pid in pids)


def test_prime_stops_the_run_when_every_call_fails_and_names_the_first(tokenizer):
    def raises(data_source, solution_str, ground_truth, extra_info=None):
        raise ValueError(f"cannot parse {solution_str!r}")

    manager = PrimeRewardManager(tokenizer, raises, max_workers=1)
    try:
        with pytest.raises(RewardFunctionError, match=r"2 of 2 samples.*ValueError: cannot parse 'a'"):
            manager(rollout_batch(tokenizer, ["a", "b"], ["d"] * 2, ["x"] * 2))
    finally:
        manager.close()


def test_a_result_printed_by_the_scorer_does_not_break_the_protocol():
    def noisy():
        print("debug output from a scorer")
        return {"score": 1.0}

    runner = ProcessCallRunner(max_workers=1, timeout_s=10)
    try:
        (outcome,) = runner.run([noisy])
        assert (outcome.status, outcome.value) == ("ok", {"score": 1.0})
    finally:
        runner.close()
