"""``main_ppo`` with verl's ``reward.num_workers``: the reward function's calls run in that many scoring processes,
not on the driver's threads; what cannot use them is refused, or noted where nothing would run in them."""

import json

from hybridflow.config.load import load_config
from hybridflow.config.plan import build_plan

from .failure_harness import assert_refused, check_in_process, run_subprocess
from .helpers import compose_config, tiny_run_overrides

# Scores 1.0 where it runs in another process than the one that loaded it (the driver), else 0.0
WHERE_IT_RAN = """
import os

LOADED_IN = os.getpid()


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(os.getpid() != LOADED_IN), "pid": float(os.getpid())}
"""


def run_scored_where(tmp_path, tiny_model_dir, tiny_parquet, workers: int) -> list[dict]:
    reward = tmp_path / "where_it_ran.py"
    reward.write_text(WHERE_IT_RAN)
    run_dir = tmp_path / f"run{workers}"
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir) + [
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.local_mode=true",
        f"custom_reward_function.path={reward}",
        f"reward.num_workers={workers}",
    ]
    outcome = run_subprocess("main_ppo", overrides, tmp_path)
    assert outcome.code == 0, outcome.stderr[-4000:]
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_each_sample_is_scored_in_a_scoring_process(tmp_path, tiny_model_dir, tiny_parquet):
    (in_processes,) = run_scored_where(tmp_path, tiny_model_dir, tiny_parquet, workers=2)
    assert in_processes["critic/score/min"] == 1.0
    (on_threads,) = run_scored_where(tmp_path, tiny_model_dir, tiny_parquet, workers=0)
    assert on_threads["critic/score/max"] == 0.0


def test_with_a_reward_model_they_are_noted_as_unused(base, tiny_model_dir):
    model = ["reward_model.enable=true", f"reward_model.model.path={tiny_model_dir}", "reward.num_workers=4"]
    notes = build_plan(load_config(compose_config(base + model)), 16).notes
    assert "reward_model.num_workers=4 starts no process: the reward model scores in its own workers" in notes


def test_a_manager_that_cannot_use_them_is_refused(base, capsys, monkeypatch, tmp_path):
    remote = ["reward_model.reward_manager=remote", "+reward_model.reward_kwargs.url=http://127.0.0.1:1/score"]
    error = assert_refused(
        check_in_process("main_ppo", base + remote + ["reward.num_workers=2"], capsys, monkeypatch, tmp_path),
        "reward_model.num_workers=2: reward manager 'remote' does not run its calls in scoring processes",
    )
    assert "\n" not in error
    negative = check_in_process("main_ppo", base + ["reward.num_workers=-1"], capsys, monkeypatch, tmp_path)
    assert_refused(negative, "reward_model.num_workers=-1 must be 0")
