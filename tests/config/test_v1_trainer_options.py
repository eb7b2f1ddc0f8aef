"""``trainer.v1.*``: verl's V1 trainer modes read under verl's keys, colocate_async's and separate_async's plans,
and what they cannot run refused in one line before anything starts."""

import pytest

from hybridflow.config.load import load_config_with_notes
from hybridflow.config.plan import COLOCATE_ASYNC, SEPARATE_ASYNC, SYNC
from tests.trainer.helpers import compose_config, config_errors, plan_of

MODE = "trainer.v1.trainer_mode=colocate_async"
SEPARATE = "trainer.v1.trainer_mode=separate_async"
# base's 4 prompts a step in mini-batches of 2
SEPARATE_RUN = [SEPARATE, "trainer.v1.separate_async.parameter_sync_step=2"]
SWITCH = "trainer.v1.separate_async.hybrid_rollout"


def test_a_verl_v1_colocate_async_command_line_plans_partial_rollout(base):
    plan = plan_of(base + ["trainer.use_v1=true", MODE, "trainer.v1.colocate_async.num_warmup_batches=2"])
    assert plan.mode == COLOCATE_ASYNC
    assert (
        plan.trainer.v1.sampler.max_off_policy_threshold == 8
        and plan.trainer.v1.sampler.max_off_policy_strategy == "drop"
    )
    assert "verl's V1 colocate_async: 3 batch(es) of prompts in flight" in plan.phases["gen"].why
    assert plan_of(base + ["trainer.v1.trainer_mode=sync"]).mode == SYNC


def test_a_verl_v1_separate_async_command_line_plans_a_pool_of_its_own_and_mini_batch_passes(base):
    """verl's keys as its V1 scripts set them: the standalone pool's size under actor_rollout_ref.rollout, the
    TransferQueue switch (accepted, not read: batches travel as DataProto)."""
    overrides = (
        base
        + SEPARATE_RUN
        + [
            "trainer.use_v1=true",
            "transfer_queue.enable=true",
            "data.gen_batch_size=1",
            "actor_rollout_ref.rollout.nnodes=1",
            "actor_rollout_ref.rollout.n_gpus_per_node=1",
        ]
    )
    plan = plan_of(overrides)
    assert plan.mode == SEPARATE_ASYNC
    assert plan.passes_per_step == 2 and plan.prompts_per_step == 2 and plan.prompts_per_generation == 1
    assert plan.worker_roles == {"actor_rollout_ref": "actor", "rollout": "rollout"}
    assert plan.resources.pools["rollout_pool"].world_size == 1
    # One optimizer step per mini-batch: the learning-rate schedule spans the run's mini-batches
    assert plan.actor_rollout_ref.actor.optim.total_training_steps == 2 * plan.total_training_steps
    assert "the step's starting weights" in plan.phases["old_log_prob"].why
    assert plan.phases["update_weights"].runs
    _, unread = load_config_with_notes(compose_config(overrides), check_environment=False)
    assert [line.split(" ")[0] for line in unread] == ["transfer_queue.enable=True"]


@pytest.mark.parametrize(
    "setting, named",
    [
        ("async_training.enable=true", "async_training.enable=true"),
        ("actor_rollout_ref.rollout.multi_turn.enable=true", "multi_turn.enable=true"),
        ("data.gen_batch_size=4", "data.gen_batch_size=4"),
    ],
)
def test_what_separate_async_cannot_run_with_is_refused_in_one_line(base, setting, named):
    lines = [line for line in config_errors(base + SEPARATE_RUN + [setting]) if line.startswith(SEPARATE)]
    assert len(lines) == 1 and named in lines[0] and "use trainer.v1.trainer_mode=sync" in lines[0], lines


def test_separate_async_needs_the_batch_to_be_its_mini_batches_as_verl_asserts(base):
    (line,) = config_errors(base + [SEPARATE, "trainer.v1.separate_async.parameter_sync_step=3"])
    assert line.startswith("data.train_batch_size=4 must equal trainer.v1.separate_async.parameter_sync_step=3 x")


def test_separate_async_step_switching_gives_the_actors_processes_a_rollout_engine(base):
    """verl's step switching: the trainer's processes generate between steps with the hybrid engine's rollout."""
    plan = plan_of(base + SEPARATE_RUN + [f"{SWITCH}.enable_switch=true", f"{SWITCH}.switch_threshold_ratio=0.5"])
    assert plan.worker_roles["actor_rollout_ref"].startswith("actor_rollout")
    assert plan.trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio == 0.5
    assert not plan_of(base + SEPARATE_RUN).worker_roles["actor_rollout_ref"].startswith("actor_rollout")


@pytest.mark.parametrize(
    "setting, line",
    [
        ("switch_threshold_ratio=0", f"{SWITCH}.switch_threshold_ratio=0.0 must be in (0, 1]"),
        ("switch_threshold_ratio=1.5", f"{SWITCH}.switch_threshold_ratio=1.5 must be in (0, 1]"),
        ("switch_threshold_step_up=-0.1", f"{SWITCH}.switch_threshold_step_up=-0.1 must be >= 0"),
        ("switch_cost_window_size=0", f"{SWITCH}.switch_cost_window_size=0 must be >= 1"),
    ],
)
def test_step_switching_settings_out_of_range_are_refused_in_one_line(base, setting, line):
    assert config_errors(base + SEPARATE_RUN + [f"{SWITCH}.enable_switch=true", f"{SWITCH}.{setting}"]) == [line]


def test_step_switching_without_the_hybrid_engine_is_refused(base):
    (line,) = config_errors(
        base + SEPARATE_RUN + [f"{SWITCH}.enable_switch=true", "actor_rollout_ref.hybrid_engine=false"]
    )
    assert line.startswith(f"{SWITCH}.enable_switch=true with actor_rollout_ref.hybrid_engine=false")


def test_step_switching_knobs_without_it_or_without_separate_async_are_listed_as_unread(base):
    knob = f"{SWITCH}.switch_threshold_ratio=0.5"
    _, unread = load_config_with_notes(compose_config(base + SEPARATE_RUN + [knob]), check_environment=False)
    assert unread == [f"{knob} (read only with {SWITCH}.enable_switch=true)"]
    _, unread = load_config_with_notes(compose_config(base + [f"{SWITCH}.enable_switch=true"]), check_environment=False)
    assert unread == [f"{SWITCH}.enable_switch=True (read only with trainer.v1.trainer_mode=separate_async)"]


def test_separate_async_runs_its_pool_in_processes_of_its_own(base):
    errors = config_errors(base + SEPARATE_RUN + ["trainer.local_mode=true"])
    assert f"{SEPARATE} runs the rollout in processes of its own" in errors[0]


@pytest.mark.parametrize(
    "setting, named",
    [
        ("actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.hybrid_engine=false"),
        ("actor_rollout_ref.rollout.multi_turn.enable=true", "multi_turn.enable=true"),
        ("algorithm.filter_groups.enable=true", "algorithm.filter_groups.enable=true"),
        ("algorithm.adv_estimator=remax", "algorithm.adv_estimator=remax"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=2", "tensor_model_parallel_size=2"),
    ],
)
def test_what_colocate_async_cannot_run_with_is_refused_in_one_line(base, setting, named):
    lines = [line for line in config_errors(base + [MODE, setting]) if line.startswith(MODE)]
    assert len(lines) == 1 and named in lines[0] and "use trainer.v1.trainer_mode=sync" in lines[0], lines


@pytest.mark.parametrize(
    "setting, named",
    [
        ("trainer.v1.trainer_mode=async", "is not one of [sync, colocate_async, separate_async]"),
        ("trainer.v1.separate_async.num_warmup_batches=-1", "must be >= 0"),
        ("trainer.v1.colocate_async.num_warmup_batches=-1", "must be >= 0"),
        ("trainer.v1.sampler.max_off_policy_threshold=0", "must be >= 1 (or null: no limit)"),
        ("trainer.v1.sampler.max_off_policy_strategy=evict", "is not one of [drop, wait]"),
    ],
)
def test_bad_v1_values_are_refused_by_key(base, setting, named):
    (line,) = config_errors(base + [setting])
    assert line.startswith(setting.split("=")[0]) and named in line


def test_colocate_async_settings_without_the_mode_are_listed_as_not_read(base):
    overrides = [
        "trainer.v1.colocate_async.num_warmup_batches=3",
        "trainer.v1.separate_async.parameter_sync_step=2",
        "trainer.v1.sampler.max_off_policy_strategy=wait",
    ]
    _, unread = load_config_with_notes(compose_config(base + overrides), check_environment=False)
    assert [line for line in unread if line.startswith("trainer.v1")] == [
        "trainer.v1.colocate_async.num_warmup_batches=3 (read only with trainer.v1.trainer_mode=colocate_async)",
        "trainer.v1.separate_async.parameter_sync_step=2 (read only with trainer.v1.trainer_mode=separate_async)",
        "trainer.v1.sampler.max_off_policy_strategy=wait (read only with trainer.v1.trainer_mode=colocate_async or "
        "separate_async)",
    ]
    _, unread = load_config_with_notes(compose_config(base + overrides + [MODE]), check_environment=False)
    assert [line.split(" ")[0] for line in unread if line.startswith("trainer.v1")] == [
        "trainer.v1.separate_async.parameter_sync_step=2"
    ]
