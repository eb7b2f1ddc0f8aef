"""Placement plans (``config/parallel_plans.py``): a layout and each role's split, spelled as the overrides that run
it, and the splits a pool of ranks has."""

from hybridflow.config.layouts import parse_layout
from hybridflow.config.load import load_config
from hybridflow.config.parallel_plans import GENERATION, Plan, splits_of, with_overrides
from tests.trainer.helpers import compose_config

ROLES = ["actor_rollout_ref", "ref", "critic"]
OWNERS = ["actor_rollout_ref", "ref", "critic", GENERATION]
PPO = ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true", "trainer.n_gpus_per_node=4"]
PPO += [
    "trainer.cpus_per_worker=0.5",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_micro_batch_size_per_gpu=1",
]


def test_a_pool_splits_by_each_divisor_of_its_ranks():
    assert splits_of(1) == ["dp"]
    assert splits_of(4) == ["dp", "tp2", "tp4", "sp2", "sp4"]
    assert splits_of(3) == ["dp", "tp3", "sp3"]


def test_a_plan_is_run_by_its_overrides(base):
    plan = Plan(parse_layout("actor:2/critic:2", ROLES, 4), (("critic", "sp2"), (GENERATION, "tp2")))
    assert plan.spelled() == "actor:2/critic:2 (critic sp2, generation tp2)"
    assert plan.split("actor_rollout_ref") == "dp" and plan.devices_of(GENERATION) == 2
    overrides = plan.overrides(OWNERS)
    assert overrides == [
        "trainer.placement=actor:2/critic:2",
        "actor_rollout_ref.actor.fsdp_config.tensor_parallel_size=1",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "actor_rollout_ref.ref.fsdp_config.tensor_parallel_size=1",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1",
        "critic.model.fsdp_config.tensor_parallel_size=1",
        "critic.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    ]
    config = with_overrides(load_config(compose_config(base + PPO)), overrides)
    assert config.trainer.placement == "actor:2/critic:2"
    assert config.critic.ulysses_sequence_parallel_size == 2
    assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
    assert Plan(parse_layout("actor+critic:4", ROLES, 4)).sizes_spelled() == "dp"
