"""The phase objects' own logic: which samples go on to the update when zero-signal samples are skipped, how a
batch is reordered so the data-parallel ranks get about the same number of tokens, where the rollout
correction sits in phase 5, and how several distillation teachers share a step's rows."""

import math

import numpy as np
import pytest
import torch

from hybridflow.algos import CorrectionSettings, compute_optimal_token_baseline_advantage
from hybridflow.config.distillation_options import TeacherModel, TeacherSpec
from hybridflow.config.schema import AlgorithmConfig
from hybridflow.errors import HybridflowError
from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.phases import (
    AdvantageEstimator,
    Advantages,
    KLInReward,
    PhaseCalls,
    RolloutCorrection,
    RolloutLogProbsAsOld,
    StepTimer,
    TeacherScores,
    balance_batch,
    rows_with_signal,
)


def _batch(advantages, response_mask):
    advantages, response_mask = torch.tensor(advantages), torch.tensor(response_mask)
    rows = torch.arange(len(advantages))
    return DataProto.from_dict({"advantages": advantages, "response_mask": response_mask, "row": rows})


def test_samples_with_signal_are_kept_in_order_and_padded_with_inert_rows():
    batch = _batch(
        [[1.0, 0.0], [0.0, 0.0], [0.0, -2.0], [0.0, 3.0], [0.5, 0.5]],
        [[1, 1], [1, 0], [1, 1], [1, 0], [1, 1]],  # row 3's advantage sits on a masked-out token: no signal
    )
    kept, counts = rows_with_signal(batch, num_ranks=2)
    assert kept.batch["row"].tolist() == [0, 2, 4, 0]
    assert kept.batch["response_mask"][-1].sum() == 0 and kept.batch["advantages"][-1].abs().sum() == 0
    assert batch.batch["response_mask"][0].sum() == 2  # the padding copy is not a view of the batch
    assert counts == {"global_token_count": 8.0, "global_seq_count": 5.0}


def test_no_sample_with_signal_leaves_an_empty_batch_with_the_whole_counts():
    kept, counts = rows_with_signal(_batch([[0.0, 0.0], [0.0, 0.0]], [[1, 1], [1, 0]]), num_ranks=2)
    assert len(kept) == 0 and kept.batch["advantages"].shape == (0, 2)
    assert counts == {"global_token_count": 3.0, "global_seq_count": 2.0}


def test_balancing_reorders_the_rows_with_their_columns_and_logs_verls_seqlen_metrics():
    tokens = [10, 10, 10, 10, 1, 1, 1, 1]  # real tokens per sample: rank 0 would get 40, rank 1 gets 4
    attention_mask = (torch.arange(10)[None, :] < torch.tensor(tokens)[:, None]).long()
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "d"], dtype=object)
    batch = DataProto.from_dict(
        {"attention_mask": attention_mask, "row": torch.arange(8)}, non_tensors={"uid": uids}, meta_info={"t": 1}
    )
    balanced, metrics = balance_batch(batch, num_ranks=2, keep_groups=False)
    assert balanced is batch  # reordered in place
    assert batch.batch["row"].tolist() == [0, 3, 5, 7, 1, 2, 4, 6]  # rows 0,3,5,7 (22 tokens) on rank 0
    assert list(batch.non_tensor_batch["uid"]) == ["a", "b", "c", "d", "a", "b", "c", "d"]
    assert batch.meta_info == {"t": 1}
    assert metrics == {
        "global_seqlen/min": 4,
        "global_seqlen/max": 40,
        "global_seqlen/minmax_diff": 36,
        "global_seqlen/balanced_min": 22,
        "global_seqlen/balanced_max": 22,
        "global_seqlen/mean": 22.0,
    }
    empty, no_metrics = balance_batch(batch[0:0], num_ranks=2, keep_groups=False)
    assert len(empty) == 0 and no_metrics == {}


def test_balancing_that_keeps_groups_gives_each_rank_whole_prompts():
    tokens = [10, 10, 10, 10, 1, 1, 1, 1]  # prompts a, b: 20 tokens each; c, d: 2 each
    attention_mask = (torch.arange(10)[None, :] < torch.tensor(tokens)[:, None]).long()
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "d"], dtype=object)
    batch = DataProto.from_dict({"attention_mask": attention_mask, "row": torch.arange(8)}, non_tensors={"uid": uids})
    _, metrics = balance_batch(batch, num_ranks=2, keep_groups=True)
    assert list(batch.non_tensor_batch["uid"]) == ["a", "a", "c", "c", "b", "b", "d", "d"]
    assert (metrics["global_seqlen/balanced_min"], metrics["global_seqlen/balanced_max"]) == (22, 22)


def test_the_rollout_correction_runs_after_the_kl_penalty_and_before_the_advantages():
    """verl's order: the KL penalty in the reward sees the engine's mask, the estimator the corrected one."""
    # Two samples of one prompt, two tokens each; log r = old - rollout = 0.2 on token (0, 1), 0 elsewhere.
    old_log_probs = torch.tensor([[-1.0, -0.8], [-1.0, -1.0]])
    rollout_log_probs = torch.full((2, 2), -1.0)
    batch = DataProto.from_dict(
        {
            "old_log_probs": old_log_probs,
            "rollout_log_probs": rollout_log_probs,
            "ref_log_prob": torch.full((2, 2), -1.5),
            "response_mask": torch.ones(2, 2, dtype=torch.long),
            "token_level_scores": torch.tensor([[0.0, 1.0], [0.0, 0.0]]),
        },
        non_tensors={"uid": np.array(["a", "a"], dtype=object)},
    )
    algorithm = AlgorithmConfig(adv_estimator="grpo", use_kl_in_reward=True)
    algorithm.kl_ctrl.kl_coef = 0.1
    # token_k2 at 0.01 rejects (0.2)^2 / 2 = 0.02; weights min(e^0.2, 2) = 1.2214 and 1 elsewhere
    settings = CorrectionSettings.from_keys("token", 2.0, False, "token_k2", 0.01)
    phase = Advantages(KLInReward(algorithm), RolloutCorrection(settings), AdvantageEstimator(algorithm))
    timer = StepTimer()
    batch, metrics = phase(batch, timer)
    tensors = batch.batch
    assert torch.equal(tensors["response_mask"], torch.tensor([[1, 0], [1, 1]]))
    torch.testing.assert_close(tensors["rollout_is_weights"], torch.tensor([[1.0, math.exp(0.2)], [1.0, 1.0]]))
    # KL k1 = old - ref per token, on every engine token (the rejected one included): 0.5, 0.7 | 0.5, 0.5
    torch.testing.assert_close(tensors["token_level_rewards"], torch.tensor([[-0.05, 1.0 - 0.07], [-0.05, -0.05]]))
    assert tensors["advantages"][0, 1] == 0 and tensors["advantages"][0, 0] != 0
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.25
    assert metrics[names.KL_IN_REWARD] == pytest.approx((0.6 + 0.5) / 2)
    assert "adv" in timer.seconds


def test_bypass_mode_takes_the_engines_log_probs_as_old_ones():
    rollout = torch.tensor([[-0.5, -2.0]])
    batch = DataProto.from_dict({"rollout_log_probs": rollout})
    assert RolloutLogProbsAsOld().start(batch, StepTimer(), 1) is None  # no pass to wait for
    assert batch.batch["old_log_probs"] is rollout


def test_the_optimal_token_baseline_gets_the_rollout_weights_when_the_batch_has_them():
    tensors = {
        "token_level_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0]]),
        "response_mask": torch.ones(3, 2),
        "old_log_probs": torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.5], [0.9, 0.1]])),
        "sum_pi_squared": torch.full((3, 2), 0.4),
    }
    uids = np.array(["a", "a", "a"], dtype=object)
    weights = torch.tensor([[1.0, 2.0], [0.5, 1.0], [1.0, 1.0]])
    estimate = AdvantageEstimator(AlgorithmConfig(adv_estimator="optimal_token_baseline"))
    inputs = dict(tensors, index=uids)
    without = estimate(DataProto.from_dict(dict(tensors), non_tensors={"uid": uids})).batch["advantages"]
    expected, _ = compute_optimal_token_baseline_advantage(**inputs, rollout_is_weights=None)
    torch.testing.assert_close(without, expected)
    weighted = estimate(DataProto.from_dict(dict(tensors, rollout_is_weights=weights), non_tensors={"uid": uids}))
    expected, _ = compute_optimal_token_baseline_advantage(**inputs, rollout_is_weights=weights)
    torch.testing.assert_close(weighted.batch["advantages"], expected)
    assert not torch.allclose(expected, without)


class _Teachers:
    """A teacher group whose teacher ``t`` scores each response token ``100 t + its token id``."""

    def __init__(self):
        self.calls = []

    def compute_teacher_log_probs(self, data, teacher=0):
        self.calls.append((teacher, len(data)))
        return DataProto.from_dict({"teacher_logprobs": 100.0 * teacher + data.batch["responses"].float()})


def _routed_batch(sources):
    rows = len(sources)
    batch = DataProto.from_dict(
        {
            "input_ids": torch.zeros(rows, 3, dtype=torch.long),
            "attention_mask": torch.ones(rows, 3, dtype=torch.long),
            "position_ids": torch.arange(3).repeat(rows, 1),
            "responses": torch.arange(rows * 2).reshape(rows, 2),
        }
    )
    batch.non_tensor_batch["data_source"] = np.array(sources, dtype=object)
    return batch


def test_several_teachers_each_score_their_own_rows_which_come_back_in_the_batchs_order():
    spec = TeacherSpec((TeacherModel("a", "f32", "gsm8k"), TeacherModel("b", "f32", "math")), None, "data_source")
    group = _Teachers()
    batch = _routed_batch(["math", "gsm8k", "math", "math", "gsm8k"])
    scored = TeacherScores(group, PhaseCalls(overlap=False), spec).start(batch, StepTimer()).join(StepTimer())
    # One call per teacher, over its own rows only
    assert group.calls == [(0, 2), (1, 3)]
    teacher = torch.tensor([1, 0, 1, 1, 0]).unsqueeze(1)
    assert torch.equal(scored.batch["teacher_logprobs"], 100.0 * teacher + batch.batch["responses"].float())
    # A step with one source's rows only calls that source's teacher
    group.calls.clear()
    TeacherScores(group, PhaseCalls(overlap=False), spec).start(_routed_batch(["math"] * 2), StepTimer())
    assert group.calls == [(1, 2)]


def test_a_row_no_teacher_is_keyed_to_is_named():
    spec = TeacherSpec((TeacherModel("a", "f32", "gsm8k"), TeacherModel("b", "f32", "math")), None, "data_source")
    with pytest.raises(HybridflowError, match=r"batch row 1 has data_source='code', which no teacher's key names"):
        TeacherScores(_Teachers(), PhaseCalls(overlap=False), spec).start(_routed_batch(["math", "code"]), StepTimer())
