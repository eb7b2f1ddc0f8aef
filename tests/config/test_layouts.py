"""``trainer.placement`` spelled as a layout (``actor+ref:2/critic:2``) and the layouts ``auto`` ranks."""

import pytest

from hybridflow.config.layouts import LayoutError, candidate_layouts, parse_layout
from hybridflow.config.load import load_config
from hybridflow.config.plan import build_plan
from tests.trainer.helpers import compose_config, config_errors

PPO = ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true", "trainer.n_gpus_per_node=4"]
PPO += [
    "trainer.cpus_per_worker=0.5",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_micro_batch_size_per_gpu=1",
]
ROLES = ["actor_rollout_ref", "ref", "critic"]


def test_a_layout_reads_back_as_spelled_and_takes_the_devices_node_by_node():
    layout = parse_layout("actor:2/ref:1/critic:1", ROLES, 4)
    assert layout.spelled() == "actor:2/ref:1/critic:1" and layout.ref_apart
    assert [layout.devices_of(role) for role in ROLES] == [2, 1, 1]
    assert layout.node_counts(processes_per_node=2) == [[2], [1], [1]]
    assert parse_layout("critic:1/actor:3", ROLES, 4).node_counts(processes_per_node=2) == [[1], [1, 2]]
    fused = parse_layout("actor:3/critic:1", ROLES, 4)
    assert not fused.ref_apart and fused.devices_of("ref") == 3


@pytest.mark.parametrize(
    "spelled, fragment",
    [
        ("actor:2/critc:2", "pool 'critc:2' is not roles:devices"),
        ("actor:2", "missing ['critic']"),
        ("actor+critic:2/critic:2", "placed twice ['critic']"),
        ("actor:3/critic:2", "takes 5 devices but the run has 4"),
        ("actor:0/critic:4", "pool 'actor:0' is not roles:devices"),
    ],
)
def test_a_bad_layout_is_one_line_naming_it(spelled, fragment):
    with pytest.raises(LayoutError) as error:
        parse_layout(spelled, ROLES, 4)
    assert fragment in str(error.value) and str(error.value).startswith(f"trainer.placement={spelled!r}")


def test_the_candidates_are_the_papers_three_placements_over_every_device_split():
    spelled = [layout.spelled() for layout in candidate_layouts(ROLES, 4)]
    assert spelled == [
        "actor+critic:4",
        *(f"actor:{a}/critic:{4 - a}" for a in (1, 2, 3)),
        "actor:1/ref:1/critic:2",
        "actor:1/ref:2/critic:1",
        "actor:2/ref:1/critic:1",
    ]
    assert [layout.spelled() for layout in candidate_layouts(["actor_rollout_ref", "critic"], 2)] == [
        "actor+critic:2",
        "actor:1/critic:1",
    ]
    assert [layout.spelled() for layout in candidate_layouts(["actor_rollout_ref", "ref"], 2)] == [
        "actor:2",
        "actor:1/ref:1",
    ]


def test_a_layout_makes_pools_of_its_sizes_and_a_reference_role_of_its_own(base):
    config = load_config(compose_config(base + PPO + ["trainer.placement=actor:2/ref:1/critic:1"]))
    plan = build_plan(config, 16)
    sizes = {name: pool.world_size for name, pool in plan.resources.pools.items()}
    assert sizes == {"actor_pool": 2, "ref_pool": 1, "critic_pool": 1}
    assert plan.worker_roles == {"actor_rollout_ref": "actor_rollout", "ref": "ref", "critic": "critic"}
    assert plan.world_size == 2 and plan.overlap_pools
    fused = build_plan(load_config(compose_config(base + PPO + ["trainer.placement=actor+critic:4"])), 16)
    assert fused.worker_roles["actor_rollout_ref"] == "actor_rollout_ref" and not fused.overlap_pools


def test_layouts_are_checked_against_the_run(base):
    assert config_errors(base + PPO + ["trainer.placement=colocatd"]) == [
        "trainer.placement='colocatd' is not one of ['colocated', 'split', 'auto'] nor a layout such as "
        "actor+ref:2/critic:2; did you mean 'colocated'?"
    ]
    (local,) = config_errors(
        base + PPO + ["trainer.placement=auto", "trainer.local_mode=true", "trainer.n_gpus_per_node=1"]
    )
    assert local.startswith("trainer.placement=auto: trainer.local_mode=true runs every role in this process")
    # 4 prompts x 2 samples in mini-batches of 2 prompts: 3 actor ranks cannot share a mini-batch of 4 samples
    (batch,) = config_errors(base + PPO + ["trainer.placement=actor:3/critic:1"])
    assert batch.startswith("trainer.placement=actor:3/critic:1: actor_rollout_ref.actor")


def test_parallel_sizes_are_checked_on_each_roles_pool(base):
    split = [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.fsdp_config.tensor_parallel_size=2",
        "critic.model.fsdp_config.tensor_parallel_size=2",
    ]
    plan = build_plan(load_config(compose_config(base + PPO + split + ["trainer.placement=actor:2/critic:2"])), 16)
    assert {name: pool.world_size for name, pool in plan.resources.pools.items()} == {"actor_pool": 2, "critic_pool": 2}
    errors = config_errors(base + PPO + split + ["trainer.placement=actor:2/critic:1/ref:1"])
    assert errors == [  # the reference follows the actor's split
        f"{role}.fsdp_config.tensor_parallel_size=2 does not divide the 1 training processes (its pool of "
        "trainer.placement=actor:2/critic:1/ref:1); choose a divisor of 1"
        for role in ("actor_rollout_ref.ref", "critic.model")
    ]
    ulysses = ["critic.ulysses_sequence_parallel_size=2", "trainer.placement=actor:3/critic:1"]
    assert any(
        error.startswith("critic.ulysses_sequence_parallel_size=2 does not divide the 1 worker processes (its pool")
        for error in config_errors(base + PPO + ulysses)
    )
    (auto,) = config_errors(base + PPO + split + ["trainer.placement=auto"])
    assert auto.startswith(
        "trainer.placement=auto chooses each role's tensor and sequence parallel sizes itself, but "
        "actor_rollout_ref.actor.fsdp_config.tensor_parallel_size=2, "
    )
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=2 set; remove them" in auto
