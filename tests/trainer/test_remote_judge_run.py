"""``main_ppo`` scored only by a remote judge: a judge server on the loopback address, started by the test."""

import json
import time

import pytest

from tests.rewards.judge_server import dead_url, judge_server

from .failure_harness import assert_refused, check_in_process, run_subprocess
from .helpers import tiny_run_overrides

SAMPLES_PER_STEP = 4 * 2  # tiny_run_overrides: 4 prompts x 2 samples


def length_score(sample: dict) -> dict:
    """A score that varies with the response, so the logged mean shows whose scores the run trained on."""
    return {"score": (len(sample["response"]) % 4) / 4}


def remote_run(tiny_model_dir, tiny_parquet, tmp_path, url: str) -> list[str]:
    return tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run") + [
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.local_mode=true",
        "reward_model.reward_manager=remote",
        f"+reward_model.reward_kwargs.url={url}",
        "+reward_model.reward_kwargs.max_concurrent=3",
        "+reward_model.reward_kwargs.retry_backoff_s=0.05",
    ]


def test_the_run_trains_on_the_judges_scores(tiny_model_dir, tiny_parquet, tmp_path):
    with judge_server(scorer=length_score) as server:
        outcome = run_subprocess("main_ppo", remote_run(tiny_model_dir, tiny_parquet, tmp_path, server.url), tmp_path)
    assert outcome.code == 0, outcome.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert len(server.requests) == 2 * SAMPLES_PER_STEP  # every sample scored, each once
    assert 1 <= server.max_in_flight <= 3
    for row, start in zip(rows, (0, SAMPLES_PER_STEP)):
        step_scores = server.scores[start : start + SAMPLES_PER_STEP]
        assert row["critic/score/mean"] == pytest.approx(sum(step_scores) / SAMPLES_PER_STEP)
        assert row["reward/score_errors"] == row["reward/score_timeouts"] == 0.0


def stopped_run(tiny_model_dir, tiny_parquet, tmp_path, url: str, *fragments: str) -> None:
    """The run stops in its first step's scoring with one line naming every fragment, well within a minute."""
    overrides = remote_run(tiny_model_dir, tiny_parquet, tmp_path, url) + ["+reward_model.reward_kwargs.timeout_s=0.5"]
    start = time.monotonic()
    outcome = run_subprocess("main_ppo", overrides, tmp_path)
    fragments = (f"the remote judge at {url} failed on {SAMPLES_PER_STEP} of {SAMPLES_PER_STEP} samples", *fragments)
    error = assert_refused(outcome, *fragments, code=1, workers_started=True)
    assert "\n" not in error and time.monotonic() - start < 60


def test_a_dead_judge_stops_the_first_step_in_one_line(tiny_model_dir, tiny_parquet, tmp_path):
    url = dead_url()
    stopped_run(tiny_model_dir, tiny_parquet, tmp_path, url, f"POST {url} failed on all 3 attempts", "Refused")


def test_a_slow_judge_stops_the_first_step_in_one_line(tiny_model_dir, tiny_parquet, tmp_path):
    with judge_server(delay_s=120) as server:
        stopped_run(
            tiny_model_dir,
            tiny_parquet,
            tmp_path,
            server.url,
            f"POST {server.url} got no answer within 0.5 s (reward_model.reward_kwargs.timeout_s)",
        )
        assert len(server.requests) == SAMPLES_PER_STEP  # each sent once, none answered


def test_options_that_cannot_work_are_refused_before_anything_starts(base, capsys, monkeypatch, tmp_path):
    overrides = [
        "reward_model.reward_manager=remote",
        "+reward_model.reward_kwargs.url=judge:8000",
        "+reward_model.reward_kwargs.max_concurrent=0",
        "custom_reward_function.path=/no/such/reward.py",
    ]
    outcome = check_in_process("main_ppo", base + overrides, capsys, monkeypatch, tmp_path)
    assert_refused(
        outcome,
        "reward_model.reward_kwargs.url='judge:8000' must be the judge server's http:// or https:// URL",
        "reward_model.reward_kwargs.max_concurrent=0 must be an integer >= 1",
        "reward_model.reward_manager='remote' scores without a reward function; unset custom_reward_function.path",
    )


def test_the_url_is_required(base, capsys, monkeypatch, tmp_path):
    outcome = check_in_process("main_ppo", base + ["reward_model.reward_manager=remote"], capsys, monkeypatch, tmp_path)
    assert_refused(outcome, "needs its option url; set +reward_model.reward_kwargs.url")
