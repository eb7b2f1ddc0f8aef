"""The driver in-process on the shared local Ray cluster: every registered advantage estimator runs a step."""

import math
import pathlib

import pytest
from safetensors.torch import load_file

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS, needs_critic
from hybridflow.trainer import metric_names as names
from hybridflow.trainer.main_ppo import build_trainer
from hybridflow.trainer.placement import WorkerGroups, create_worker_groups
from hybridflow.trainer.tracking import read_metrics
from hybridflow.trainer.validate import load_config
from tests.workers.test_actor import assert_same_adam_step

from .cli import DENSE_REWARD

FIRST_PROMPTS_REWARD = pathlib.Path(__file__).with_name("first_prompts_reward.py")
from .helpers import compose_config, tiny_run_overrides

pytestmark = pytest.mark.slow


class _Shared(WorkerGroups):
    """Groups kept running across trainers (each trainer re-runs init_model, reloading the weights)."""

    def shutdown(self):
        pass


@pytest.fixture(scope="module")
def start_shared_workers(ray_cluster):
    """A ``start_workers`` that starts one set of worker processes per role set and worker config, and reuses
    it (a worker keeps the config it was started with, e.g. whether the actor computes sum_pi_squared)."""
    started = {}

    def start(plan, role_classes):
        key = tuple((role, repr(spec.args), repr(spec.kwargs)) for role, spec in role_classes.items())
        if key not in started:
            started[key] = create_worker_groups(plan, role_classes)
        workers = started[key]
        return _Shared(workers.roles, workers.groups, workers.plan)

    yield start
    for workers in started.values():
        workers.shutdown()


# What an estimator needs beyond the run's defaults: GDPO the reward components (dense_reward.py returns
# score and acc), the optimal token baselines the actor's sum_pi_squared.
ESTIMATOR_OVERRIDES = {
    "gdpo": ["algorithm.gdpo_reward_keys=[score,acc]"],
    "optimal_token_baseline": ["actor_rollout_ref.actor.calculate_sum_pi_squared=true"],
    "tir_optimal_token_baseline": ["actor_rollout_ref.actor.calculate_sum_pi_squared=true"],
}
# The metrics only those runs log, as proof that their inputs arrived.
ESTIMATOR_METRICS = {
    "gdpo": ["gdpo/score/mean", "gdpo/acc/mean"],
    "optimal_token_baseline": ["variance_proxy/proxy2_total_power"],
    "tir_optimal_token_baseline": ["variance_proxy/proxy2_total_power"],
}


# An alias runs the very function of the name it stands for (tests/algos checks that), so it gets no run here.
@pytest.mark.parametrize("estimator", ADV_ESTIMATORS.primary_names())
def test_every_estimator_runs_a_step(estimator, start_shared_workers, tiny_model_dir, tiny_parquet, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run", estimator) + [
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.cpus_per_worker=0.5",
        f"custom_reward_function.path={DENSE_REWARD}", *ESTIMATOR_OVERRIDES.get(estimator, []),
    ]
    trainer = build_trainer(load_config(compose_config(overrides)))
    try:
        trainer.init_workers(start_workers=start_shared_workers)
        trainer.fit()
    finally:
        trainer.shutdown()
    (record,) = read_metrics(tmp_path / "run")
    assert record["step"] == 1
    assert (names.timing("values") in record) == needs_critic(estimator)
    assert record["actor/grad_norm"] > 0, "no policy gradient: the advantages were all zero"
    for name in ESTIMATOR_METRICS.get(estimator, []):
        assert math.isfinite(record[name]), name


def test_split_placement_runs_each_role_in_its_own_processes(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run", "gae") + [
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.cpus_per_worker=0.5",
        "trainer.placement=split", f"custom_reward_function.path={DENSE_REWARD}",
    ]
    trainer = build_trainer(load_config(compose_config(overrides)))
    try:
        trainer.init_workers()
        actor_pid = trainer.actor_rollout.worker_info()[0]["pid"]
        critic_pid = trainer.critic.worker_group.worker_info()[0]["pid"]
        assert actor_pid != critic_pid
        trainer.fit()
    finally:
        trainer.shutdown()
    (record,) = read_metrics(tmp_path / "run")
    assert record["critic/vf_loss"] > 0 and record["actor/grad_norm"] > 0


def _trained_weights(overrides, run_dir):
    """Run ``overrides`` to the end on fresh workers; returns the actor's weights and the logged metrics."""
    trainer = build_trainer(load_config(compose_config(overrides)))
    try:
        trainer.init_workers()
        trainer.fit()
        trainer.actor_rollout.export_hf(str(run_dir / "weights"))
    finally:
        trainer.shutdown()
    return load_file(run_dir / "weights" / "model.safetensors"), read_metrics(run_dir)


@pytest.mark.parametrize("ranks", [1, 2])
def test_skipping_zero_signal_samples_and_the_old_log_prob_pass_leaves_the_weights_unchanged(
    ranks, ray_cluster, tiny_model_dir, tiny_parquet, tmp_path
):
    """Two GRPO steps, the first with some zero-signal groups, the second with nothing but."""
    base = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "unused", "grpo") + [
        "trainer.total_training_steps=2", "trainer.val_before_train=false", "trainer.cpus_per_worker=0.5",
        f"trainer.n_gpus_per_node={ranks}", "data.shuffle=false", f"custom_reward_function.path={FIRST_PROMPTS_REWARD}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        # Stop on ~40% of the vocabulary, so the untrained model's responses vary in length.
        f"actor_rollout_ref.rollout.stop_token_ids=[{','.join(map(str, range(100)))}]",
    ]
    runs = {}
    for name, switches in (("full", ["false", "false"]), ("skipping", ["null", "null"])):
        overrides = base + [
            f"trainer.default_local_dir={tmp_path / name}", f"actor_rollout_ref.actor.skip_old_log_prob={switches[0]}",
            f"algorithm.skip_zero_signal_samples={switches[1]}",
        ]
        runs[name] = _trained_weights(overrides, tmp_path / name)
    (weights, records), (expected, expected_records) = runs["skipping"], runs["full"]
    assert 0 < records[0][names.ZERO_SIGNAL_FRAC] < 1 and records[1][names.ZERO_SIGNAL_FRAC] == 1
    assert names.timing("old_log_prob") not in records[0] and names.timing("old_log_prob") in expected_records[0]
    for record, expected_record in zip(records, expected_records):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/lr", "critic/advantages/mean"):
            assert record[key] == pytest.approx(expected_record[key], rel=1e-6, abs=1e-9), key
    assert weights.keys() == expected.keys()
    for name, tensor in weights.items():
        # Equal to 1e-6 of the tensor's largest entry (two ranks may sum the gradients in another order).
        assert (tensor - expected[name]).abs().max() <= 1e-6 * expected[name].abs().max(), name


def test_balancing_the_ranks_leaves_a_two_rank_update_unchanged(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    """One GRPO step of one mini-batch on 2 ranks: balancing moves samples between ranks, not the update."""
    base = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "unused", "grpo") + [
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.cpus_per_worker=0.5",
        "trainer.n_gpus_per_node=2", "data.shuffle=false", f"custom_reward_function.path={DENSE_REWARD}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        # Stop on ~40% of the vocabulary, so the untrained model's responses vary in length.
        f"actor_rollout_ref.rollout.stop_token_ids=[{','.join(map(str, range(100)))}]",
    ]
    runs = {
        switch: _trained_weights(
            base + [f"trainer.default_local_dir={tmp_path / switch}", f"trainer.balance_batch={switch}"],
            tmp_path / switch,
        )
        for switch in ("false", "true")
    }
    (weights, (record,)), (expected, (expected_record,)) = runs["true"], runs["false"]
    assert record["global_seqlen/balanced_max"] - record["global_seqlen/balanced_min"] < (
        record["global_seqlen/minmax_diff"]
    ), "the batch was balanced already: the test would not move a sample"
    # The loss is a token mean over the whole mini-batch, its denominators summed over the ranks, so only the
    # order of the float32 sums changes: at most n * 2**-24 of the summed magnitudes (n = 64 response tokens,
    # |advantage| <= 1.5 for groups of 2). GRPO's pg_loss is a near-0 sum of +-A, so it gets that absolute bound.
    assert record["actor/pg_loss"] == pytest.approx(expected_record["actor/pg_loss"], rel=0, abs=64 * 2**-24 * 1.5)
    assert record["actor/grad_norm"] == pytest.approx(expected_record["actor/grad_norm"], rel=64 * 2**-24)
    assert_same_adam_step(weights, expected)
