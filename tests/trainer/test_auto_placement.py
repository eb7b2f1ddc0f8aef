"""``trainer.placement=auto`` through ``main_ppo``: each role offered the splits the rules allow, calibrated on the
run's own Ray cluster, the plans ranked and printed, the fastest run, and a resumed run kept on the plan its
checkpoint was written under."""

import json

import pytest

from bench.bench_placement import other_splits
from hybridflow.config.load import load_config
from hybridflow.config.parallel_plans import GENERATION, Plan
from hybridflow.trainer.auto_placement import (
    CHOICE_FILE,
    layout_plans,
    resolve_auto_placement,
    runnable_options,
    split_owners,
)

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
# A pool each layout's run starts with, as the run prints it
POOLS = {"actor+critic:2": "global_pool: 2 process(es)", "actor:1/critic:1": "critic_pool: 1 process(es)"}


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
    assert sorted(entry["layout"] for entry in record["ranked"]) == ["actor+critic:2", "actor:1/critic:1"]
    steps = [entry["seconds"]["step"] for entry in record["ranked"]]
    assert steps == sorted(steps) and all(step > 0 for step in steps)
    assert record["chosen"] == record["ranked"][0]
    # on 2 ranks each of actor, reference and critic is dp, tp2 or sp2 and generation dp or tp2; 1 rank: dp
    assert len(record["plans"]) == 3 * 3 * 3 * 2 + 1
    calibrations = [line for line in result.stdout.splitlines() if "timing two steps on" in line]
    assert [line.split("timing two steps on ")[1] for line in calibrations] == [
        "1 rank(s), dp (1 of 4)",
        "2 rank(s), dp (2 of 4)",
        "2 rank(s), sp2 (3 of 4)",
        "2 rank(s), tp2 (4 of 4)",
    ]
    lines = ranked_lines(result.stdout)
    chosen = record["ranked"][0]["layout"]
    assert len(lines) == 2 and lines[0].endswith("<- chosen") and f" {chosen} (" in lines[0]
    assert f"pool {POOLS[chosen]}" in result.stdout
    assert not (run_dir / "metrics.jsonl").exists()
    # bench_placement's passed-over plans: here the colocated layout's, every role under one split
    one_split = {
        "actor+critic:2 (actor sp2, ref sp2, critic sp2)",
        "actor+critic:2 (actor tp2, ref tp2, critic tp2, generation tp2)",
    }
    ranked = {entry["plan"] for entry in record["ranked"]}
    assert {entry["plan"] for entry in other_splits(record)} == one_split - ranked


@pytest.mark.slow
def test_a_resumed_run_keeps_the_plan_it_started_with(tiny_model_dir, tiny_parquet, tmp_path):
    # A run that started under auto, chose the layout apart and saved a step (the choosing is the test above's)
    run_dir = tmp_path / "run"
    base = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir) + AUTO + ["trainer.save_freq=1"]
    config = load_config(compose_config(base))
    owners = split_owners(config)
    layout = next(layout for layout in runnable_options(config, owners) if layout.spelled() == "actor:1/critic:1")
    chosen = {"plan": Plan(layout).spelled(), "overrides": Plan(layout).overrides(owners)}
    run_cli(base + chosen["overrides"] + ["trainer.total_training_steps=1"], tmp_path)
    (run_dir / CHOICE_FILE).write_text(json.dumps({"chosen": chosen}))
    # The same command resumes on that plan without calibrating again
    resumed = run_cli(base + ["trainer.total_training_steps=2"], tmp_path)
    assert f"trainer.placement=auto: {chosen['plan']}, as chosen when this run started" in resumed.stdout
    assert f"pool {POOLS['actor:1/critic:1']}" in resumed.stdout
    assert not ranked_lines(resumed.stdout) and "resumed from" in resumed.stdout
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_each_role_is_offered_the_splits_the_rules_allow_on_its_pool(base):
    # the tiny model: 4 attention heads, 2 key-value heads; 4 devices on one node
    config = load_config(compose_config(base + AUTO + ["trainer.n_gpus_per_node=4", "trainer.cpus_per_worker=0.25"]))
    owners = split_owners(config)
    assert owners == ["actor_rollout_ref", "ref", "critic", GENERATION]
    options = {layout.spelled(): owned for layout, owned in runnable_options(config, owners).items()}
    assert options["actor+critic:4"] == {
        "actor_rollout_ref": ["dp", "tp2", "sp2", "sp4"],  # tp4 would split the 2 key-value heads
        "ref": ["dp", "tp2", "sp2", "sp4"],
        "critic": ["dp", "tp2", "sp2", "sp4"],
        GENERATION: ["dp", "tp2"],
    }
    assert options["actor:1/ref:1/critic:2"] == {
        "actor_rollout_ref": ["dp"],
        "ref": ["dp"],
        "critic": ["dp", "tp2", "sp2"],
        GENERATION: ["dp"],
    }
    plans = layout_plans(
        next(layout for layout in runnable_options(config, owners) if layout.spelled() == "actor:1/ref:1/critic:2"),
        options["actor:1/ref:1/critic:2"],
    )
    assert [plan.sizes_spelled() for plan in plans] == ["dp", "critic tp2", "critic sp2"]
