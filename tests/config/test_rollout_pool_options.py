"""``actor_rollout_ref.hybrid_engine=false`` (one-step-off policy): its pool, and what it cannot run, refused
before anything starts."""

import subprocess
import sys

from hybridflow.config.load import load_config, load_config_with_notes
from hybridflow.config.placement import make_resource_plan
from hybridflow.config.plan import build_plan
from hybridflow.experimental.one_step_off_policy.main_ppo import CONFIG_NAME
from tests.trainer.cli import HANG_GUARD_S, cli_env
from tests.trainer.helpers import compose_config, config_errors, tiny_run_overrides

OFF = "actor_rollout_ref.hybrid_engine=false"


def test_the_rollout_pool_takes_verls_one_step_off_keys(base):
    config = load_config(compose_config(base + [OFF, "rollout.n_gpus_per_node=2", "ray_kwargs.ray_init.num_cpus=3"]))
    assert not config.actor_rollout_ref.hybrid_engine
    assert (config.rollout.nnodes, config.rollout.n_gpus_per_node) == (1, 2)
    assert config.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes == 2048
    assert "on a rollout pool of its own (2 process(es)) one step ahead" in build_plan(config, 16).phases["gen"].why
    assert load_config(compose_config(base)).actor_rollout_ref.hybrid_engine


def test_the_pools_keys_are_listed_as_not_read_with_the_hybrid_engine(base):
    _, unread = load_config_with_notes(
        compose_config(
            base
            + [
                "rollout.n_gpus_per_node=2",
                "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=512",
            ]
        ),
        check_environment=False,
    )
    assert [line.split(" ")[0] for line in unread] == [
        "rollout.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=512",
    ]
    _, unread = load_config_with_notes(
        compose_config(base + [OFF, "rollout.n_gpus_per_node=2"]), check_environment=False
    )
    assert unread == []


def test_what_cannot_generate_a_step_ahead_is_refused_in_one_line_each(base):
    errors = config_errors(
        base
        + [
            OFF,
            "trainer.local_mode=true",
            "algorithm.filter_groups.enable=true",
            "algorithm.adv_estimator=remax",
            "rollout.n_gpus_per_node=0",
        ]
    )
    assert errors == [
        f"rollout.n_gpus_per_node=0 must be >= 1 (the rollout pool of {OFF})",
        f"{OFF} runs the rollout in processes of its own, which trainer.local_mode=true does not start; set "
        "trainer.local_mode=false or hybrid_engine=true",
        f"{OFF} generates ahead of training, but dynamic sampling (algorithm.filter_groups.enable=true) decides how "
        "many batches a step needs after scoring them; turn one of them off",
        f"{OFF} generates ahead of training, but algorithm.adv_estimator=remax needs a greedy response from the "
        "current policy each step; use hybrid_engine=true with it",
    ]


def test_a_local_cluster_must_hold_both_pools(base):
    errors = config_errors(base + [OFF, "rollout.n_gpus_per_node=2", "ray_kwargs.ray_init.num_cpus=2"])
    assert errors == [
        "trainer.placement=colocated needs 3 CPUs (1 pool(s) x 1 process(es) + 2 rollout-pool process(es) x "
        "trainer.cpus_per_worker=1) but ray_kwargs.ray_init.num_cpus=2; lower trainer.n_gpus_per_node or "
        "trainer.cpus_per_worker, or raise ray_kwargs.ray_init.num_cpus"
    ]


def test_the_rollout_role_gets_its_own_pool_under_either_placement():
    for placement, training_pools in (
        ("colocated", ["global_pool"]),
        ("split", ["actor_rollout_ref_pool", "critic_pool"]),
    ):
        plan = make_resource_plan(
            placement,
            ["actor_rollout_ref", "critic", "rollout"],
            nnodes=1,
            processes_per_node=2,
            use_gpu=False,
            cpus_per_process=1.0,
            own_pools={"rollout": (1, 3)},
        )
        assert list(plan.pools) == training_pools + ["rollout_pool"]
        assert plan.role_pool["rollout"] == "rollout_pool"
        assert plan.pools["rollout_pool"].world_size == 3 and plan.pools[training_pools[0]].world_size == 2


def test_verls_one_step_off_entry_point_runs_on_its_config(tiny_model_dir, tiny_parquet, tmp_path):
    """A verl one-step-off command line with the module renamed: its config turns on the engine's log-probs and
    bypass mode (as verl's one_step_off_ppo_trainer.yaml does); the check passes. (verl's config also picks the
    nccl checkpoint_engine.backend; set on the command line, it is refused: weights travel through Ray's object
    store here.)"""
    config = compose_config(tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run"), CONFIG_NAME)
    assert config.actor_rollout_ref.rollout.calculate_log_probs and config.algorithm.rollout_correction.bypass_mode
    line = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run") + [
        "actor_rollout_ref.hybrid_engine=False",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "hybridflow.experimental.one_step_off_policy.main_ppo", *line],
        env={**cli_env(), "HYBRIDFLOW_CONFIG_CHECK": "surface"},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 0, result.stderr
