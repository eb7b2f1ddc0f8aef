"""The driver in-process on the shared local Ray cluster: every registered advantage estimator runs a step."""

import math
import pathlib

import pytest
from safetensors.torch import load_file
from transformers import AutoConfig

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS
from hybridflow.config.load import load_config
from hybridflow.tracking import metric_names as names
from hybridflow.tracking.trackers import read_metrics
from hybridflow.trainer.main_ppo import build_trainer
from hybridflow.trainer.worker_groups import WorkerGroups, create_worker_groups
from tests.float_bounds import longest_reduction, reordered_sum_bound
from tests.workers.helpers import assert_same_adamw_steps, gradient_bound

from .cli import DENSE_REWARD
from .helpers import compose_config, tiny_run_overrides

FIRST_PROMPTS_REWARD = pathlib.Path(__file__).with_name("first_prompts_reward.py")

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
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.cpus_per_worker=0.5",
        f"custom_reward_function.path={DENSE_REWARD}",
        *ESTIMATOR_OVERRIDES.get(estimator, []),
    ]
    trainer = build_trainer(load_config(compose_config(overrides)))
    try:
        trainer.init_workers(start_workers=start_shared_workers)
        trainer.fit()
    finally:
        trainer.shutdown()
    (record,) = read_metrics(tmp_path / "run")
    assert record["step"] == 1
    assert (names.timing("values") in record) == ADV_ESTIMATORS.traits(estimator)["needs_critic"]
    assert record["actor/grad_norm"] > 0, "no policy gradient: the advantages were all zero"
    for name in ESTIMATOR_METRICS.get(estimator, []):
        assert math.isfinite(record[name]), name


def test_split_placement_runs_each_role_in_its_own_processes(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run", "gae") + [
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.cpus_per_worker=0.5",
        "trainer.placement=split",
        f"custom_reward_function.path={DENSE_REWARD}",
    ]
    trainer = build_trainer(load_config(compose_config(overrides)))
    try:
        trainer.init_workers()
        actor_pid = trainer.actor_rollout.worker_info()[0]["pid"]
        critic_pid = trainer.phases.critic.worker_group.worker_info()[0]["pid"]
        assert actor_pid != critic_pid
        trainer.fit()
    finally:
        trainer.shutdown()
    (record,) = read_metrics(tmp_path / "run")
    assert record["critic/vf_loss"] > 0 and record["actor/grad_norm"] > 0


def test_a_layout_with_the_reference_apart_trains_as_the_colocated_run(
    ray_cluster, tiny_model_dir, tiny_parquet, tmp_path
):
    """actor:1/ref:1/critic:1 runs each role on a rank of its own, the reference in a worker of its own: every
    role computes on one rank as in the colocated run, so the logged losses are the same numbers."""
    records = {}
    for placement in ("colocated", "actor:1/ref:1/critic:1"):
        run_dir = tmp_path / placement.replace("/", "_")
        overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir, "gae") + [
            "trainer.total_training_steps=2",
            "trainer.val_before_train=false",
            "trainer.cpus_per_worker=0.5",
            "data.shuffle=false",
            "actor_rollout_ref.actor.use_kl_loss=true",
            f"trainer.n_gpus_per_node={1 if placement == 'colocated' else 3}",
            f"trainer.placement={placement}",
            f"custom_reward_function.path={DENSE_REWARD}",
        ]
        trainer = build_trainer(load_config(compose_config(overrides)))
        try:
            trainer.init_workers()
            if placement != "colocated":
                pids = {trainer.workers.roles[role].worker_info()[0]["pid"] for role in ("actor_rollout_ref", "ref")}
                assert len(pids) == 2, "the reference shares the actor's process"
            trainer.fit()
        finally:
            trainer.shutdown()
        records[placement] = read_metrics(run_dir)
    compared = ["actor/pg_loss", "actor/kl_loss", "critic/vf_loss", "critic/vf_clipfrac"]
    colocated, apart = records.values()
    assert [[record[name] for name in compared] for record in apart] == [
        [record[name] for name in compared] for record in colocated
    ]
    assert all(record["actor/kl_loss"] != 0 for record in apart[1:])


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
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.cpus_per_worker=0.5",
        f"trainer.n_gpus_per_node={ranks}",
        "data.shuffle=false",
        f"custom_reward_function.path={FIRST_PROMPTS_REWARD}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        # Stop on ~40% of the vocabulary, so the untrained model's responses vary in length.
        f"actor_rollout_ref.rollout.stop_token_ids=[{','.join(map(str, range(100)))}]",
    ]
    runs = {}
    for name, switches in (("full", ["false", "false"]), ("skipping", ["null", "null"])):
        overrides = base + [
            f"trainer.default_local_dir={tmp_path / name}",
            f"actor_rollout_ref.actor.skip_old_log_prob={switches[0]}",
            f"algorithm.skip_zero_signal_samples={switches[1]}",
        ]
        runs[name] = _trained_weights(overrides, tmp_path / name)
    (weights, records), (expected, expected_records) = runs["skipping"], runs["full"]
    assert 0 < records[0][names.ZERO_SIGNAL_FRAC] < 1 and records[1][names.ZERO_SIGNAL_FRAC] == 1
    assert names.timing("old_log_prob") not in records[0] and names.timing("old_log_prob") in expected_records[0]
    # The full run's ratio is e^(update's log pi - separate pass's), 1 within the log-prob bound, the skipping
    # run's exactly 1; on two ranks each rank sums other rows. Bounds from tests/float_bounds.py.
    config = AutoConfig.from_pretrained(tiny_model_dir)
    num_terms = longest_reduction(config)
    log_prob_bound = reordered_sum_bound(log_prob_magnitude(expected, config), num_terms)
    for record, expected_record in zip(records, expected_records):
        for key in ("actor/lr", "critic/advantages/mean"):  # made before any model ran: the same operations
            assert record[key] == expected_record[key], key
        # -A * ratio per token (ratio < 1.2 unclipped), a mean over at most 8 samples x 8 tokens.
        term = 1.2 * max(abs(expected_record[names.stat(names.ADVANTAGES, reduction)]) for reduction in ("max", "min"))
        pg_loss_bound = term * log_prob_bound + reordered_sum_bound(term, 64)
        assert record["actor/pg_loss"] == pytest.approx(expected_record["actor/pg_loss"], rel=0, abs=pg_loss_bound)
        grad_bound = gradient_bound(log_prob_bound, num_terms)
        assert record["actor/grad_norm"] == pytest.approx(expected_record["actor/grad_norm"], rel=grad_bound)
    assert_same_adamw_steps(
        weights, expected, steps=2, lr=1e-3, gradient_rel_bound=gradient_bound(log_prob_bound, num_terms)
    )


def log_prob_magnitude(weights, config) -> float:
    """An upper bound on any token's ``|log pi|`` under ``weights``: ``log V`` plus the logits' spread,
    ``|z_i| <= ||W_i|| ||h||`` with ``||h|| <= sqrt(hidden) max|gain|`` after the final RMSNorm."""
    head = weights.get("lm_head.weight", weights["model.embed_tokens.weight"])
    hidden_norm = config.hidden_size**0.5 * float(weights["model.norm.weight"].abs().max())
    return math.log(config.vocab_size) + 2 * float(head.norm(dim=-1).max()) * hidden_norm


def test_balancing_the_ranks_leaves_a_two_rank_update_unchanged(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    """One GRPO step of one mini-batch on 2 ranks: balancing moves samples between ranks, not the update."""
    base = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "unused", "grpo") + [
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.cpus_per_worker=0.5",
        "trainer.n_gpus_per_node=2",
        "data.shuffle=false",
        # Samples balanced one by one (prompt groups kept whole could not even out this batch)
        "actor_rollout_ref.actor.use_prefix_grouper=false",
        f"custom_reward_function.path={DENSE_REWARD}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
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
    assert (
        record["global_seqlen/balanced_max"] - record["global_seqlen/balanced_min"]
        < (record["global_seqlen/minmax_diff"])
    ), "the batch was balanced already: the test would not move a sample"
    # A moved sample runs in another rank's packed rows, so its log-probs are equal within the log-prob bound
    # and the loss's float32 sums run in another order (the bounds of the skipping test above).
    config = AutoConfig.from_pretrained(tiny_model_dir)
    num_terms = longest_reduction(config)
    log_prob_bound = reordered_sum_bound(log_prob_magnitude(expected, config), num_terms)
    term = 1.2 * max(abs(expected_record[names.stat(names.ADVANTAGES, reduction)]) for reduction in ("max", "min"))
    pg_loss_bound = term * log_prob_bound + reordered_sum_bound(term, 64)
    assert record["actor/pg_loss"] == pytest.approx(expected_record["actor/pg_loss"], rel=0, abs=pg_loss_bound)
    grad_bound = gradient_bound(log_prob_bound, num_terms)
    assert record["actor/grad_norm"] == pytest.approx(expected_record["actor/grad_norm"], rel=grad_bound)
    assert_same_adamw_steps(weights, expected, steps=1, lr=1e-3, gradient_rel_bound=grad_bound)
