"""global_profiler end to end: PPO steps traced by torch.profiler, one chrome trace per process and step range
under verl's keys. In local mode the actor, reference and critic share the driver's process, so one trace holds
them all, named by both groups; on Ray with split placement each pool writes its own."""

import json

import pytest

from .cli import run_cli
from .helpers import tiny_run_overrides

pytestmark = pytest.mark.slow


def traced_ppo(tiny_model_dir, tiny_parquet, tmp_path, *extra: str) -> list[str]:
    """Two PPO steps, the actor's and the critic's profilers on, ``extra`` choosing the mode and the steps."""
    return tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run", estimator="gae") + [
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "global_profiler.tool=torch",
        f"global_profiler.save_path={tmp_path / 'profile'}",
        "actor_rollout_ref.actor.profiler.enable=true",
        "critic.profiler.enable=true",
        *extra,
    ]


def test_a_traced_ppo_step_writes_a_chrome_trace_per_process(tiny_model_dir, tiny_parquet, tmp_path):
    traces = tmp_path / "profile"
    overrides = traced_ppo(
        tiny_model_dir, tiny_parquet, tmp_path, "trainer.local_mode=true", "global_profiler.steps=[2]"
    )
    completed = run_cli(overrides, cwd=tmp_path)
    (trace,) = traces.iterdir()
    assert trace.name == "actor_rollout_ref+critic_step2_rank0.json"
    assert f"[hybridflow] profiler: wrote {trace}" in completed.stdout
    names = {event.get("name", "") for event in json.loads(trace.read_text())["traceEvents"]}
    assert "aten::mm" in names or "aten::matmul" in names, sorted(names)[:20]


def test_on_ray_each_pool_writes_its_own_trace_of_a_run_of_consecutive_steps(tiny_model_dir, tiny_parquet, tmp_path):
    traces = tmp_path / "profile"
    split = ["trainer.placement=split", "trainer.cpus_per_worker=0.5"]
    steps = ["global_profiler.steps=[1,2]", "global_profiler.profile_continuous_steps=true"]
    run_cli(traced_ppo(tiny_model_dir, tiny_parquet, tmp_path, *split, *steps), cwd=tmp_path)
    assert sorted(trace.name for trace in traces.iterdir()) == [
        "actor_rollout_ref_step1-2_rank0.json",
        "critic_step1-2_rank0.json",
    ]
    for trace in traces.iterdir():
        assert json.loads(trace.read_text())["traceEvents"]
