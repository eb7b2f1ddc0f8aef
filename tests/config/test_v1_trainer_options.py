"""``trainer.v1.*``: verl's V1 trainer modes read under verl's keys, colocate_async's plan, and what it cannot run
refused in one line before anything starts."""

import pytest

from hybridflow.config.load import load_config_with_notes
from hybridflow.config.plan import COLOCATE_ASYNC, SYNC
from tests.trainer.helpers import compose_config, config_errors, plan_of

MODE = "trainer.v1.trainer_mode=colocate_async"


def test_a_verl_v1_colocate_async_command_line_plans_partial_rollout(base):
    plan = plan_of(base + ["trainer.use_v1=true", MODE, "trainer.v1.colocate_async.num_warmup_batches=2"])
    assert plan.mode == COLOCATE_ASYNC
    assert (
        plan.trainer.v1.sampler.max_off_policy_threshold == 8
        and plan.trainer.v1.sampler.max_off_policy_strategy == "drop"
    )
    assert "verl's V1 colocate_async: 3 batch(es) of prompts in flight" in plan.phases["gen"].why
    assert plan_of(base + ["trainer.v1.trainer_mode=sync"]).mode == SYNC


def test_separate_async_is_refused_with_hybridflows_asynchronous_pool_named(base):
    (line,) = config_errors(base + ["trainer.v1.trainer_mode=separate_async"])
    assert line.startswith("trainer.v1.trainer_mode=separate_async") and "async_training.enable=true" in line


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
        ("trainer.v1.trainer_mode=async", "is not one of [sync, colocate_async]"),
        ("trainer.v1.colocate_async.num_warmup_batches=-1", "must be >= 0"),
        ("trainer.v1.sampler.max_off_policy_threshold=0", "must be >= 1 (or null: no limit)"),
        ("trainer.v1.sampler.max_off_policy_strategy=evict", "is not one of [drop, wait]"),
    ],
)
def test_bad_v1_values_are_refused_by_key(base, setting, named):
    (line,) = config_errors(base + [setting])
    assert line.startswith(setting.split("=")[0]) and named in line


def test_colocate_async_settings_without_the_mode_are_listed_as_not_read(base):
    overrides = ["trainer.v1.colocate_async.num_warmup_batches=3", "trainer.v1.sampler.max_off_policy_strategy=wait"]
    _, unread = load_config_with_notes(compose_config(base + overrides), check_environment=False)
    assert [line for line in unread if line.startswith("trainer.v1")] == [
        "trainer.v1.colocate_async.num_warmup_batches=3 (read only with trainer.v1.trainer_mode=colocate_async)",
        "trainer.v1.sampler.max_off_policy_strategy=wait (read only with trainer.v1.trainer_mode=colocate_async)",
    ]
    _, unread = load_config_with_notes(compose_config(base + overrides + [MODE]), check_environment=False)
    assert not [line for line in unread if line.startswith("trainer.v1")]
