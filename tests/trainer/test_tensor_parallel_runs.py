"""Tensor-parallel generation through the whole driver on a real Ray group: two GRPO steps on 2 ranks, once with
a whole generation model per rank and once with the two ranks sharing one model split in halves (the weight
sync resharding the actor's FSDP2 shards into it). The seeds are the same, so the samples must be the same,
token for token. The training differs only in how FSDP2 splits the row-split layers (by columns, for the
resharding): the gradient norm's sum runs in another order, so the losses and weights agree within the float32
bounds of tests/float_bounds.py."""

import pytest
from transformers import AutoConfig

from hybridflow.models.tiny import build_tiny_model
from hybridflow.tracking import metric_names as names
from tests.float_bounds import longest_reduction, reordered_sum_bound
from tests.workers.helpers import assert_same_adamw_steps, gradient_bound

from .cli import DENSE_REWARD
from .helpers import tiny_run_overrides, two_rank_steps
from .test_ppo_trainer import _trained_weights, log_prob_magnitude

pytestmark = pytest.mark.slow


def test_split_generation_steps_equal_the_whole_model_ones(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    base = two_rank_steps(tiny_model_dir, tiny_parquet, "grpo", DENSE_REWARD)
    _assert_same_steps(_split_and_whole(base, tmp_path), tiny_model_dir)


def test_a_split_rollout_pool_steps_like_a_whole_one(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    """One-step-off, the rollout on a pool of 2 processes: split in halves, each rank loads only its own slices
    of each bucketed sync. The actor trains alone in its process either way, so the runs are
    equal to the bit: samples, losses and weights (a sync that did not take would change the later samples)."""
    base = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "unused", "grpo") + [
        "trainer.total_training_steps=3",
        "trainer.val_before_train=false",
        "trainer.cpus_per_worker=0.5",
        "data.shuffle=false",
        "actor_rollout_ref.hybrid_engine=false",
        "rollout.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
        f"custom_reward_function.path={DENSE_REWARD}",
    ]
    (weights, records), (expected, expected_records) = _split_and_whole(base, tmp_path)
    for record, expected_record in zip(records, expected_records, strict=True):
        for key in (names.stat(names.RESPONSE_LENGTH, "mean"), names.stat(names.SCORE, "mean"), "actor/pg_loss"):
            assert record[key] == expected_record[key], key
    assert all(weights[name].equal(tensor) for name, tensor in expected.items())


def _assert_same_steps(runs: list, model_dir) -> None:
    """Two runs' ``(weights, metrics)``: the same samples each step, the policy losses and the weights after two
    AdamW steps within the float32 bounds of a reordered sum."""
    (weights, records), (expected, expected_records) = runs
    config = AutoConfig.from_pretrained(model_dir)
    num_terms = longest_reduction(config)
    log_prob_bound = reordered_sum_bound(log_prob_magnitude(expected, config), num_terms)
    for record, expected_record in zip(records, expected_records, strict=True):
        for key in (names.stat(names.RESPONSE_LENGTH, "mean"), names.stat(names.SCORE, "mean")):
            assert record[key] == expected_record[key], key
        term = 1.2 * max(abs(expected_record[names.stat(names.ADVANTAGES, reduction)]) for reduction in ("max", "min"))
        pg_loss_bound = term * log_prob_bound + reordered_sum_bound(term, 64)
        assert record["actor/pg_loss"] == pytest.approx(expected_record["actor/pg_loss"], rel=0, abs=pg_loss_bound)
    assert_same_adamw_steps(
        weights, expected, steps=2, lr=1e-3, gradient_rel_bound=gradient_bound(log_prob_bound, num_terms)
    )


def _split_and_whole(base: list[str], tmp_path) -> tuple:
    """``base`` run with the rollout split in two, and whole: each run's weights and metrics."""
    runs = []
    for size in (2, 1):
        run_dir = tmp_path / str(size)
        overrides = [f"actor_rollout_ref.rollout.tensor_model_parallel_size={size}"]
        runs.append(_trained_weights(base + overrides + [f"trainer.default_local_dir={run_dir}"], run_dir))
    return tuple(runs)


@pytest.fixture(scope="module")
def qwen3_model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen3"), family="qwen3")


def test_split_training_steps_equal_the_data_parallel_ones(ray_cluster, qwen3_model_dir, tiny_parquet, tmp_path):
    """Two GAE steps with a KL loss on 2 ranks: the actor, its reference and the critic split in halves over the
    pair (t, d) = (2, 1), against FSDP2 over both (1, 2), on a tiny Qwen3 (its q and k norms, which each rank
    applies to its own heads, are one weight trained by both). The rollout holds the whole model either way (the
    sync gathers the split weights), the seeds are the same: the first step's samples are the same, the losses
    and the weights agree within the float32 bounds of a reordered sum (the critic's values and gradients are held
    to theirs in tests/models/test_tensor_parallel_training.py)."""
    base = two_rank_steps(qwen3_model_dir, tiny_parquet, "gae", DENSE_REWARD) + [
        "actor_rollout_ref.actor.use_kl_loss=true",
        "critic.ppo_mini_batch_size=2",
    ]
    runs = []
    for size in (2, 1):
        overrides = [
            f"actor_rollout_ref.actor.fsdp_config.tensor_parallel_size={size}",
            f"critic.model.fsdp_config.tensor_parallel_size={size}",
            f"trainer.default_local_dir={tmp_path / str(size)}",
            "trainer.save_freq=1",
        ]
        runs.append(_trained_weights(base + overrides, tmp_path / str(size)))
    _assert_same_steps(runs, qwen3_model_dir)
    (weights, records), _ = runs
    # Resumed from its first step's checkpoint, the split run takes the uninterrupted run's second step exactly.
    resumed_dir = tmp_path / "resumed"
    resume = [
        "actor_rollout_ref.actor.fsdp_config.tensor_parallel_size=2",
        "critic.model.fsdp_config.tensor_parallel_size=2",
        f"trainer.default_local_dir={resumed_dir}",
        "trainer.resume_mode=resume_path",
        f"trainer.resume_from_path={tmp_path / '2' / 'global_step_1'}",
    ]
    resumed, resumed_records = _trained_weights(base + resume, resumed_dir)
    assert all(resumed[name].equal(tensor) for name, tensor in weights.items())
    assert resumed_records[-1]["actor/pg_loss"] == records[-1]["actor/pg_loss"]


def test_a_layout_of_split_pools_trains_as_the_colocated_run(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    """actor:2/critic:2 with the actor and the critic each split in halves (t = 2) and the rollout too: each role
    computes on a pair of ranks as in the colocated run on 2 ranks, so the logged numbers are the same."""
    base = two_rank_steps(tiny_model_dir, tiny_parquet, "gae", DENSE_REWARD) + [
        "critic.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.fsdp_config.tensor_parallel_size=2",
        "critic.model.fsdp_config.tensor_parallel_size=2",
    ]
    records = []
    for placement, devices in (("colocated", 2), ("actor:2/critic:2", 4)):
        run_dir = tmp_path / placement.replace("/", "_").replace(":", "")
        overrides = [f"trainer.placement={placement}", f"trainer.n_gpus_per_node={devices}"]
        records.append(_trained_weights(base + overrides + [f"trainer.default_local_dir={run_dir}"], run_dir)[1])
    compared = ["actor/pg_loss", "critic/vf_loss", "critic/vf_clipfrac", names.stat(names.RESPONSE_LENGTH, "mean")]
    colocated, layout = records
    assert [[record[name] for name in compared] for record in layout] == [
        [record[name] for name in compared] for record in colocated
    ]
