"""``async_training.enable=true`` (fully async training): verl's keys, the run's length, and what it cannot run,
refused before anything starts."""

import subprocess
import sys

from hybridflow.config.fully_async_options import (
    concurrent_samples,
    max_required_samples,
    partial_rollout,
    required_samples,
    training_steps,
)
from hybridflow.config.load import load_config, load_config_with_notes
from hybridflow.config.plan import build_plan, describe
from hybridflow.experimental.fully_async_policy.fully_async_main import CONFIG_NAME
from tests.trainer.cli import HANG_GUARD_S, cli_env
from tests.trainer.helpers import compose_config, config_errors, tiny_run_overrides

ASYNC = ["actor_rollout_ref.hybrid_engine=false", "async_training.enable=true", "async_training.partial_rollout=false"]


def test_verls_async_keys_size_the_steps_the_budget_and_the_run(base):
    config = load_config(
        compose_config(
            base
            + ASYNC
            + [
                "data.train_batch_size=0",
                "async_training.require_batches=3",
                "async_training.staleness_threshold=0.5",
                "async_training.trigger_parameter_sync_step=2",
                "rollout.total_rollout_steps=13",
            ]
        )
    )
    # 3 mini-batches of 2 prompts a step; int(6 x 1.5 x 2) prompts per weight version
    assert required_samples(config) == 6 and max_required_samples(config) == 18
    assert training_steps(config, prompts_per_epoch=16) == 2  # 13 prompts of the 16 x 1 epoch
    assert training_steps(config, prompts_per_epoch=4) == 0
    plan = build_plan(config, train_prompts=16)
    assert "samples per step: 6 prompts x 2 = 12" in describe(plan)
    assert plan.phases["gen"].why == (
        "engine 'hf', 2 sample(s) per prompt on a rollout pool of its own (1 process(es)) generating fully async "
        "into a "
        "queue: at most 18 prompts per weight version, 16 at once"
    )
    assert plan.phases["sync_rollout_weights"].why.endswith("every 2 step(s)")
    config.trainer.total_training_steps = 1
    assert training_steps(config, prompts_per_epoch=16) == 1


def test_what_fully_async_cannot_run_is_refused_in_one_line_each(base):
    errors = config_errors(
        base
        + [
            "async_training.enable=true",
            "async_training.staleness_threshold=0.2",
            "async_training.trigger_parameter_sync_step=0",
            "async_training.use_trainer_do_validate=true",
            "async_training.use_dynamic_resource_scheduling=true",
            "data.gen_batch_size=4",
            "rollout.total_rollout_steps=1",
        ]
    )
    assert errors == [
        "async_training.enable=true generates on a rollout pool of its own; set actor_rollout_ref.hybrid_engine=false "
        "(and size the pool with rollout.nnodes / rollout.n_gpus_per_node)",
        "async_training.trigger_parameter_sync_step=0 must be >= 1",
        "async_training.use_trainer_do_validate=true needs validation on the training pool, which hybridflow does "
        "not have; set it to false (the rollout pool validates with synced weights)",
        "async_training.use_dynamic_resource_scheduling=true needs training GPUs lent to the rollout, which "
        "hybridflow does not have; set it to false",
        "data.gen_batch_size=4: async_training.enable=true feeds the rollout one prompt at a time (verl supports "
        "only 1); set data.gen_batch_size=1",
        "rollout.total_rollout_steps=1 prompts make no training step of async_training.require_batches x "
        "actor_rollout_ref.actor.ppo_mini_batch_size = 2 prompts; raise it or lower those",
    ]


def test_partial_rollout_needs_staleness_the_hf_engine_and_a_single_turn(base):
    """verl: partial rollout only takes effect with staleness_threshold > 0 (at 0 nothing is in flight at a sync)."""
    partial = ASYNC[:2] + ["async_training.partial_rollout=true"]
    assert partial_rollout(load_config(compose_config(base + partial + ["async_training.staleness_threshold=0.5"])))
    config, unread = load_config_with_notes(
        compose_config(base + partial + ["async_training.staleness_threshold=0"]), check_environment=False
    )
    assert not partial_rollout(config)
    assert unread[0] == (
        "async_training.partial_rollout=True (takes effect only with staleness_threshold > 0: at 0 nothing is in "
        "flight at a sync)"
    )
    errors = config_errors(
        base
        + partial
        + [
            "async_training.staleness_threshold=0.5",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
        ]
    )
    assert [error for error in errors if "partial_rollout" in error] == [  # vLLM lands them too
        "async_training.partial_rollout=true tags each token with the weights that drew it in single-turn rollouts "
        "only; set actor_rollout_ref.rollout.multi_turn.enable=false or async_training.partial_rollout=false"
    ]


def test_a_split_rollout_pool_lands_syncs_mid_generation_on_vllm_only(base):
    """vLLM's ranks agree on the step where a sync lands (``rollout/group_landing.py``); the hf engine's do not.
    Without partial rollout a sync waits for the call in flight on every rank, on either engine."""
    split = ASYNC[:2] + [
        "async_training.staleness_threshold=0.5",
        "rollout.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    ]
    partial = ["async_training.partial_rollout=true"]
    assert [error for error in config_errors(base + split + partial) if "tensor_model_parallel_size" in error] == [
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2 with async_training.partial_rollout=true on the hf "
        "engine: its ranks land a sync between their own decode steps, not at one the group agrees on (the vllm "
        "engine's do); set actor_rollout_ref.rollout.tensor_model_parallel_size=1, "
        "actor_rollout_ref.rollout.name=vllm or async_training.partial_rollout=false"
    ]
    for accepted in (["async_training.partial_rollout=false"], partial + ["actor_rollout_ref.rollout.name=vllm"]):
        config, _ = load_config_with_notes(compose_config(base + split + accepted), check_environment=False)
        assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == 2
        # 2 processes, one replica: a call of concurrent_samples_per_replica prompts, as verl's one server
        assert concurrent_samples(config) == config.async_training.concurrent_samples_per_replica


def test_the_async_keys_are_listed_as_not_read_unless_fully_async(base):
    _, unread = load_config_with_notes(
        compose_config(base + ["async_training.trigger_parameter_sync_step=2", "rollout.total_rollout_steps=8"]),
        check_environment=False,
    )
    assert unread == [
        "async_training.trigger_parameter_sync_step=2 (read only with async_training.enable=true)",
        "rollout.total_rollout_steps=8 (read only with async_training.enable=true)",
    ]
    _, unread = load_config_with_notes(
        compose_config(
            base
            + ASYNC
            + [
                "data.train_batch_size=4",
                "async_training.dynamic_schedule_policy=mine",
                "actor_rollout_ref.actor.use_rollout_log_probs=true",
            ]
        ),
        check_environment=False,
    )
    assert unread == [
        "actor_rollout_ref.actor.use_rollout_log_probs=True (algorithm.rollout_correction.bypass_mode decides whether "
        "the rollout's log-probs are the old ones)",
        "async_training.dynamic_schedule_policy=mine "
        "(read only with async_training.use_dynamic_resource_scheduling=true)",
        "data.train_batch_size=4 (async_training.enable=true trains on async_training.require_batches x "
        "actor_rollout_ref.actor.ppo_mini_batch_size = 2 prompts a step)",
    ]


def test_verls_fully_async_entry_point_runs_on_its_config(tiny_model_dir, tiny_parquet, tmp_path):
    """A verl fully async command line with the module renamed (verl's scripts set train_batch_size=0 and
    gen_batch_size=1): its config turns on the pool, the engine's log-probs and bypass mode; the check passes."""
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run")
    config = load_config(compose_config(overrides, CONFIG_NAME))
    assert config.async_training.enable and not config.actor_rollout_ref.hybrid_engine
    assert config.actor_rollout_ref.rollout.calculate_log_probs and config.algorithm.rollout_correction.bypass_mode
    line = overrides + [
        "data.train_batch_size=0",
        "data.gen_batch_size=1",
        "actor_rollout_ref.hybrid_engine=False",
        "rollout.nnodes=1",
        "rollout.n_gpus_per_node=1",
        "rollout.total_rollout_steps=8",
        "async_training.staleness_threshold=0.1",
        "async_training.trigger_parameter_sync_step=2",
        "async_training.require_batches=1",
        "async_training.partial_rollout=False",
    ]
    result = subprocess.run(
        [sys.executable, "-m", "hybridflow.experimental.fully_async_policy.fully_async_main", *line],
        env={**cli_env(), "HYBRIDFLOW_CONFIG_CHECK": "surface"},
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert result.returncode == 0, result.stderr
