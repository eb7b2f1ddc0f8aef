"""Hand-computed cases for the driver's per-step metrics."""

import math

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.metrics import (
    compute_actor_mfu_metrics,
    compute_data_metrics,
    compute_rollout_probs_diff_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    reduce_worker_metrics,
)


def _batch() -> DataProto:
    # Two samples, prompt window 3, response window 4.
    # Sample 0: prompt 2 tokens (left-padded), response 4 tokens (hits the limit).
    # Sample 1: prompt 3 tokens, response 2 tokens.
    attention_mask = torch.tensor([[0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0, 0]])
    response_mask = attention_mask[:, 3:]
    scores = torch.tensor([[0, 0, 0, 1.0], [0, 0.5, 0, 0]])
    return DataProto.from_dict(
        {
            "responses": torch.zeros(2, 4, dtype=torch.long),
            "attention_mask": attention_mask,
            "response_mask": response_mask,
            "token_level_scores": scores,
            "token_level_rewards": scores - 0.25 * response_mask,
            "advantages": torch.tensor([[1.0, 2.0, 3.0, 4.0], [-1.0, -2.0, 9.0, 9.0]]),
            "returns": torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 9.0, 9.0]]),
            "values": torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 5.0, 5.0]]),
        }
    )


def test_data_metrics_by_hand():
    metrics = compute_data_metrics(_batch(), use_critic=True)
    assert metrics["critic/score/mean"] == pytest.approx(0.75)
    assert metrics["critic/score/max"] == 1.0 and metrics["critic/score/min"] == 0.5
    assert metrics["critic/rewards/mean"] == pytest.approx((0.0 + 0.0) / 2)  # 1-4*.25, .5-2*.25
    # Advantages over response tokens only: 1,2,3,4,-1,-2.
    assert metrics["critic/advantages/mean"] == pytest.approx(7 / 6)
    assert metrics["critic/advantages/max"] == 4.0 and metrics["critic/advantages/min"] == -2.0
    assert metrics["response_length/mean"] == 3.0 and metrics["response_length/max"] == 4.0
    assert metrics["response_length/clip_ratio"] == 0.5
    assert metrics["prompt_length/mean"] == 2.5 and metrics["prompt_length/clip_ratio"] == 0.5
    # Returns equal values on the masked tokens, so the critic explains everything.
    assert metrics["critic/vf_explained_var"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["critic/values/mean"] == pytest.approx(4 / 6)


def test_data_metrics_without_critic_have_no_values():
    metrics = compute_data_metrics(_batch(), use_critic=False)
    assert not any(key.startswith("critic/values") for key in metrics)
    assert names.VF_EXPLAINED_VAR not in metrics
    assert not any(key.startswith("num_turns") for key in metrics)  # not a multi-turn rollout


def test_multi_turn_rollouts_log_their_turns_as_verl_does():
    batch = _batch()
    batch.non_tensor_batch["num_turns"] = np.array([3, 1], dtype=np.int64)  # call, tool, answer; one answer
    metrics = compute_data_metrics(batch, use_critic=False)
    assert (metrics["num_turns/mean"], metrics["num_turns/max"], metrics["num_turns/min"]) == (2.0, 3.0, 1.0)


def test_timing_per_token_uses_response_tokens_for_generation():
    metrics = compute_timing_metrics(_batch(), {"gen": 0.6, "adv": 0.022, "update_actor": 1.1, "step": 2.0})
    assert metrics["timing_s/gen"] == 0.6 and metrics["timing_s/step"] == 2.0
    # 6 response tokens; 5 prompt + 6 response = 11 tokens in all.
    assert metrics["timing_per_token_ms/gen"] == pytest.approx(600 / 6)
    assert metrics["timing_per_token_ms/adv"] == pytest.approx(22 / 11)
    assert metrics["timing_per_token_ms/update_actor"] == pytest.approx(1100 / 11)
    assert "timing_per_token_ms/step" not in metrics


def test_timing_per_token_is_zero_for_a_step_without_tokens():
    batch = _batch()
    batch.batch["attention_mask"].zero_()
    batch.batch["response_mask"].zero_()
    metrics = compute_timing_metrics(batch, {"gen": 0.5, "ref": 0.3, "values": 0.2})
    assert metrics["timing_s/gen"] == 0.5
    assert {key: value for key, value in metrics.items() if key.startswith("timing_per_token_ms/")} == {
        "timing_per_token_ms/gen": 0.0,
        "timing_per_token_ms/ref": 0.0,
        "timing_per_token_ms/values": 0.0,
    }


def test_data_metrics_over_no_response_tokens_are_nan():
    batch = _batch()
    batch.batch["response_mask"].zero_()
    metrics = compute_data_metrics(batch, use_critic=True)
    assert all(math.isnan(metrics[f"critic/advantages/{stat}"]) for stat in ("mean", "max", "min"))
    assert math.isnan(metrics["critic/values/mean"]) and math.isnan(metrics["critic/vf_explained_var"])
    assert metrics["critic/score/mean"] == pytest.approx(0.75)


def test_throughput_and_mfu():
    batch = _batch()
    perf = compute_throughput_metrics(batch, step_seconds=2.0, num_processes=2)
    assert perf["perf/total_num_tokens"] == 11 and perf["perf/throughput"] == pytest.approx(11 / 4)
    mfu = compute_actor_mfu_metrics(
        batch, 0.5, num_parameters=1000, ppo_epochs=2, peak_flops_per_process=1e6, num_processes=1
    )
    assert mfu["perf/mfu/actor"] == pytest.approx(6 * 1000 * 11 * 2 / (0.5 * 1e6))


def test_worker_lists_are_averaged():
    assert reduce_worker_metrics({"pg_loss": [1.0, 3.0], "lr": 0.1}) == {"pg_loss": 2.0, "lr": 0.1}
    # Through a worker group: one list per reporting rank (DataProto.concat), here rank 0's alone.
    assert reduce_worker_metrics({"pg_loss": [[1.0, 3.0]], "lr": [0.1]}) == {"pg_loss": 2.0, "lr": 0.1}


def test_worker_metrics_named_max_or_min_keep_their_extreme():
    metrics = {"seq_len_max": [[3.0, 7.0], [5.0, 4.0]], "seq_len_min": [[3.0, 7.0], [5.0, 4.0]], "loss": [[1.0], [2.0]]}
    assert reduce_worker_metrics(metrics) == {"seq_len_max": 7.0, "seq_len_min": 3.0, "loss": 1.5}


def test_zero_signal_frac_counts_samples_whose_response_advantages_are_all_zero():
    batch = _batch()
    assert compute_data_metrics(batch, use_critic=False)[names.ZERO_SIGNAL_FRAC] == 0.0
    batch.batch["advantages"][1, :2] = 0.0  # only its masked-out tokens keep non-zero values
    assert compute_data_metrics(batch, use_critic=False)[names.ZERO_SIGNAL_FRAC] == 0.5


def test_rollout_probs_diff_by_hand():
    # Response tokens: sample 0 both, sample 1 the first only (the masked one must not count).
    actor = torch.tensor([[0.5, 0.25], [0.8, 0.1]])
    rollout = torch.tensor([[0.5, 0.5], [0.4, 0.9]])
    batch = DataProto.from_dict(
        {
            "response_mask": torch.tensor([[1, 1], [1, 0]]),
            "old_log_probs": actor.log(),
            "rollout_log_probs": rollout.log(),
        }
    )
    metrics = compute_rollout_probs_diff_metrics(batch)
    diffs = [0.0, 0.25, 0.4]
    mean = sum(diffs) / 3
    assert metrics["training/rollout_probs_diff_valid"] == 1.0
    assert metrics["training/rollout_probs_diff_max"] == pytest.approx(0.4)
    assert metrics["training/rollout_probs_diff_mean"] == pytest.approx(0.65 / 3)
    unbiased_std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert metrics["training/rollout_probs_diff_std"] == pytest.approx(unbiased_std)
    # Pearson of (0.5, 0.25, 0.8) and (0.5, 0.5, 0.4): means 31/60 and 7/15.
    a = [0.5 - 31 / 60, 0.25 - 31 / 60, 0.8 - 31 / 60]
    r = [0.5 - 7 / 15, 0.5 - 7 / 15, 0.4 - 7 / 15]
    expected = sum(x * y for x, y in zip(a, r)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in r))
    assert expected == pytest.approx(-0.891, abs=1e-3)
    assert metrics["training/rollout_actor_probs_pearson_corr"] == pytest.approx(expected, rel=1e-5)


def test_rollout_probs_diff_needs_both_log_probs_and_a_response_token():
    log_probs = torch.zeros(1, 2)
    assert (
        compute_rollout_probs_diff_metrics(
            DataProto.from_dict({"response_mask": torch.ones(1, 2), "old_log_probs": log_probs})
        )
        == {}
    )
    empty = compute_rollout_probs_diff_metrics(
        DataProto.from_dict(
            {"response_mask": torch.zeros(1, 2), "old_log_probs": log_probs, "rollout_log_probs": log_probs}
        )
    )
    assert empty["training/rollout_probs_diff_valid"] == 0.0 and math.isnan(empty["training/rollout_probs_diff_mean"])
