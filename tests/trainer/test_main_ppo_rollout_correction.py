"""Rollout correction end to end through ``python -m hybridflow.trainer.main_ppo``: GRPO on the tiny model with the
``hf`` engine's log-probs, decoupled (token-level importance weights + rejection) and in bypass mode.

The ``hf`` engine records ``log softmax(logits / T)`` of each sampled token, the quantity the trainer computes
at the same temperature, from the same float32 weights (synced after every update). The two differ only by
float32 rounding along two forward paths (KV-cache decoding vs one packed forward). A token log-prob here is
at most about ln(vocab) + a few = 10 in size, where one float32 ulp is 1e-6; the paths differ by a few ulps.
``MISMATCH`` = 1e-5 (10 ulps) bounds |log r|, so: weights within 1e-5 of 1, |kl| and |log_ppl_diff| <= 1e-5,
|p_actor - p_rollout| <= p |log r| <= 1e-5, and no token leaves a 1% ratio band. k3 = r - 1 - log r is
(log r)^2 / 2 = 5e-11 exactly, but float32 resolves r - 1 near 1 only to ulp(1) = 1.2e-7: |k3| <= 1.2e-7.
"""

import math

import pytest

from hybridflow.tracking import metric_names as names
from hybridflow.tracking.trackers import read_metrics

from .cli import run_cli
from .helpers import tiny_run_overrides

pytestmark = pytest.mark.slow

MISMATCH = 1e-5
ULP_OF_ONE = 1.2e-7
CORRECTION = "algorithm.rollout_correction"


def _run(tiny_model_dir, tiny_parquet, tmp_path, *overrides):
    run_dir = tmp_path / "run"
    base = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir, "grpo") + [
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.temperature=0.7",
    ]
    run_cli(base + list(overrides), cwd=tmp_path)
    records = {record["step"]: record for record in read_metrics(run_dir)}
    assert sorted(records) == [1, 2]
    return records


def test_decoupled_token_weights_and_rejection_see_rollout_and_trainer_agree(tiny_model_dir, tiny_parquet, tmp_path):
    records = _run(
        tiny_model_dir,
        tiny_parquet,
        tmp_path,
        f"{CORRECTION}.rollout_is=token",
        f"{CORRECTION}.rollout_rs=token_k1",
        f"{CORRECTION}.rollout_rs_threshold=0.99_1.01",
    )
    for step, record in records.items():
        assert names.timing("old_log_prob") in record, step  # two mini-batches per step: the pass runs
        for stat in ("mean", "max", "min"):
            assert abs(record[f"rollout_corr/rollout_is_{stat}"] - 1) <= MISMATCH, (step, stat)
        assert abs(record["rollout_corr/rollout_is_eff_sample_size"] - 1) <= 4 * MISMATCH
        assert abs(record["rollout_corr/kl"]) <= MISMATCH and abs(record["rollout_corr/k3_kl"]) <= ULP_OF_ONE
        assert abs(record["rollout_corr/log_ppl_diff"]) <= MISMATCH
        assert abs(record["rollout_corr/ppl_ratio"] - 1) <= 2 * MISMATCH
        assert record["rollout_corr/rollout_rs_masked_fraction"] == 0.0
        assert record["rollout_corr/rollout_rs_token_k1_max"] <= MISMATCH
        assert record["training/rollout_probs_diff_max"] <= MISMATCH
        assert record["actor/pg_loss"] != 0 and math.isfinite(record["actor/grad_norm"])


def test_bypass_mode_runs_no_old_log_prob_pass(tiny_model_dir, tiny_parquet, tmp_path):
    # verl's multi-RS example (token_k1 + seq_max_k2, its quoted thresholds) with one mini-batch per step, so
    # the policy the loss sees is the one that sampled: the in-loss mismatch is rounding only.
    records = _run(
        tiny_model_dir,
        tiny_parquet,
        tmp_path,
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        f"{CORRECTION}.bypass_mode=true",
        f"{CORRECTION}.loss_type=ppo_clip",
        f"{CORRECTION}.rollout_is=token",
        f"{CORRECTION}.rollout_rs='token_k1,seq_max_k2'",
        f"{CORRECTION}.rollout_rs_threshold='0.6_1.6,2.5'",
    )
    for step, record in records.items():
        assert names.timing("old_log_prob") not in record, step
        assert not any(key.startswith("training/rollout_probs_diff") for key in record)
        assert (
            abs(record["rollout_corr/kl"]) <= MISMATCH and abs(record["rollout_corr/rollout_is_mean"] - 1) <= MISMATCH
        )
        assert record["rollout_corr/rollout_rs_masked_fraction"] == 0.0
        assert record["actor/pg_clipfrac"] == 0.0  # ratio pi_theta / pi_rollout = 1 up to rounding
        assert record["actor/pg_loss"] != 0 and names.timing("update_actor") in record
