"""``trainer.placement=auto`` through ``main_ppo``: calibrated on the run's own Ray cluster, the layouts ranked and
printed, the fastest run, and a resumed run kept on the layout its checkpoint was written under."""

import json

import pytest

from hybridflow.config.load import load_config
from hybridflow.trainer.auto_placement import CHOICE_FILE, resolve_auto_placement

from .cli import run_cli
from .helpers import compose_config, tiny_run_overrides

# actor, reference and critic over 2 devices: every role together, or the actor (and reference) apart from the critic
AUTO = [
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "trainer.placement=auto",
    "trainer.n_gpus_per_node=2",
    "trainer.cpus_per_worker=0.5",
    "trainer.val_before_train=false",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_micro_batch_size_per_gpu=1",
]


def ranked_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("[hybridflow]   ") and " s (generate " in line]


def test_the_one_layout_that_fits_is_run_without_calibrating(base):
    config = load_config(compose_config(base + ["algorithm.adv_estimator=gae", "trainer.placement=auto"]))

    def start_ray():
        raise AssertionError("nothing to rank: no calibration, no cluster")

    assert resolve_auto_placement(config, start_ray).trainer.placement == "actor+critic:1"


@pytest.mark.slow
def test_plan_prints_the_ranked_layouts_and_trains_nothing(tiny_model_dir, tiny_parquet, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir) + AUTO + ["--plan"], tmp_path)
    record = json.loads((run_dir / CHOICE_FILE).read_text())
    assert sorted(layout for layout, _ in record["ranked"]) == ["actor+critic:2", "actor:1/critic:1"]
    steps = [estimate["step"] for _, estimate in record["ranked"]]
    assert steps == sorted(steps) and all(step > 0 for step in steps) and record["chosen"] == record["ranked"][0][0]
    lines = ranked_lines(result.stdout)
    assert len(lines) == 2 and lines[0].endswith("<- chosen") and record["chosen"] in lines[0]
    pools = {"actor+critic:2": "pool global_pool: 2 process(es)", "actor:1/critic:1": "pool critic_pool: 1 process(es)"}
    assert pools[record["chosen"]] in result.stdout
    assert not (run_dir / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_resumed_run_keeps_the_layout_it_started_with(tiny_model_dir, tiny_parquet, tmp_path):
    run_dir = tmp_path / "run"
    base = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir) + AUTO + ["trainer.save_freq=1"]
    first = run_cli(base + ["trainer.total_training_steps=1"], tmp_path)
    chosen = json.loads((run_dir / CHOICE_FILE).read_text())["chosen"]
    assert len(ranked_lines(first.stdout)) == 2
    # Another choice on file stands for a run that chose differently: the resumed run must not calibrate again
    record = json.loads((run_dir / CHOICE_FILE).read_text())
    other = next(layout for layout, _ in record["ranked"] if layout != chosen)
    (run_dir / CHOICE_FILE).write_text(json.dumps({**record, "chosen": other}))
    second = run_cli(base + ["trainer.total_training_steps=2"], tmp_path)
    assert f"trainer.placement=auto: {other}, as chosen when this run started" in second.stdout
    assert not ranked_lines(second.stdout) and "resumed from" in second.stdout
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
