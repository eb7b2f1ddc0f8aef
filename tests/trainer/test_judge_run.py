"""``main_ppo`` scored by a generative judge (``reward_model.judge``) served by the ``hf`` rollout engine: a judge
whose answer is known scores every sample by it, a judge whose answers hold no score stops the run in one line,
and colocated on Ray the judge's engine sleeps while the policy trains."""

import json

import pytest

from hybridflow.config.load import load_config
from hybridflow.trainer.main_ppo import build_trainer
from tests.rewards.constant_judge import build_constant_judge

from .failure_harness import assert_refused, run_subprocess
from .helpers import compose_config, tiny_run_overrides


def judged_run(tiny_model_dir, tiny_parquet, run_dir, judge_dir, *extra):
    return tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir) + [
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "reward_model.enable=true",
        f"reward_model.model.path={judge_dir}",
        "reward_model.judge.enable=true",
        "reward_model.judge.response_length=1",
        *extra,
    ]


def test_every_sample_scores_what_the_judge_answers(tiny_model_dir, tiny_parquet, tmp_path):
    judge = build_constant_judge(tmp_path / "judge7", "7")  # answers "7": 7 / max_score 10
    overrides = judged_run(tiny_model_dir, tiny_parquet, tmp_path / "run", judge, "trainer.local_mode=true")
    outcome = run_subprocess("main_ppo", overrides, tmp_path)
    assert outcome.code == 0, outcome.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    for row in rows:  # float32 scores: 0.7 to within one rounding
        assert row["critic/score/min"] == row["critic/score/max"] == pytest.approx(0.7, abs=1e-7)
        assert row["reward/judge_unparsable_share"] == 0.0


def test_a_judge_that_answers_no_score_stops_the_run_in_one_line(tiny_model_dir, tiny_parquet, tmp_path):
    judge = build_constant_judge(tmp_path / "judge_x", "x")
    overrides = judged_run(tiny_model_dir, tiny_parquet, tmp_path / "run", judge, "trainer.local_mode=true")
    error = assert_refused(
        run_subprocess("main_ppo", overrides, tmp_path),
        "the judge's answer held no score",
        "for 8 of 8 samples, at least reward_model.judge.max_unparsable_share=0.5; first: 'x'",
        code=1,
        workers_started=True,
    )
    assert "\n" not in error


@pytest.mark.slow
def test_colocated_on_ray_the_judge_sleeps_while_the_policy_trains(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    judge = build_constant_judge(tmp_path / "judge7", "7")
    overrides = judged_run(tiny_model_dir, tiny_parquet, tmp_path / "run", judge, "trainer.cpus_per_worker=0.5")
    trainer = build_trainer(load_config(compose_config(overrides)))
    try:
        trainer.init_workers()
        judge_group = trainer.workers.roles["reward_model"]
        assert judge_group.engine_asleep()  # asleep from the start: the first thing to run is the rollout
        trainer.fit()
        assert judge_group.engine_asleep()
    finally:
        trainer.shutdown()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["critic/score/mean"] for row in rows] == pytest.approx([0.7, 0.7], abs=1e-7)


@pytest.mark.vllm
@pytest.mark.slow
def test_a_judge_served_by_vllm_scores_every_sample_what_it_answers(tiny_model_dir, tiny_parquet, tmp_path):
    """``reward_model.judge.engine=vllm`` (where vLLM is installed: `make test-vllm`), in local mode."""
    pytest.importorskip("vllm")
    judge = build_constant_judge(tmp_path / "judge7", "7")
    overrides = judged_run(
        tiny_model_dir,
        tiny_parquet,
        tmp_path / "run",
        judge,
        "trainer.local_mode=true",
        "reward_model.judge.engine=vllm",
    )
    outcome = run_subprocess("main_ppo", overrides, tmp_path)
    assert outcome.code == 0, outcome.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["critic/score/mean"] for row in rows] == pytest.approx([0.7, 0.7], abs=1e-7)
