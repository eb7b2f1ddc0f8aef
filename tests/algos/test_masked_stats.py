import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.algos.masked_stats import (
    LOSS_AGG_MODES,
    MaskedStatisticsError,
    agg_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from hybridflow.registry import UnknownNameError


def test_masked_sum_and_mean_ignore_masked_positions_even_nan():
    values = torch.tensor([[1.0, 2.0, 3.0, float("nan")], [4.0, 4.0, float("inf"), 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    assert masked_sum(values, mask).item() == 14.0
    assert masked_mean(values, mask).item() == pytest.approx(14.0 / 5)
    assert masked_mean(values, mask, dim=-1).tolist() == [2.0, 4.0]


def test_masked_mean_of_empty_row_is_zero_not_nan():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert masked_mean(values, mask, dim=-1).tolist() == [1.5, 0.0]


def test_float_mask_acts_as_weights():
    values = torch.tensor([2.0, 4.0])
    weights = torch.tensor([0.5, 1.5])
    assert masked_sum(values, weights).item() == 7.0
    assert masked_mean(values, weights).item() == 3.5


def test_masked_var_unbiased_and_biased():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # deviations -1, 0, 1: sum of squares 2, over n-1 = 2 -> 1; biased over n = 3 -> 2/3
    assert masked_var(values, mask).item() == pytest.approx(1.0)
    assert masked_var(values, mask, unbiased=False).item() == pytest.approx(2.0 / 3.0)


def test_masked_whiten_values():
    values = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    whitened = masked_whiten(values, mask)
    assert whitened[0, :3].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    assert whitened[0, 3].item() == pytest.approx(98.0, rel=1e-6)
    scaled_only = masked_whiten(values, mask, shift_mean=False)
    assert scaled_only[0, :3].tolist() == pytest.approx([1.0, 2.0, 3.0], abs=1e-6)


def test_unbiased_variance_of_one_position_raises_with_count():
    with pytest.raises(MaskedStatisticsError, match="at least 2 selected positions, got 1"):
        masked_var(torch.tensor([5.0, 1.0]), torch.tensor([1, 0]))


def test_whiten_uses_epsilon_for_constant_values():
    whitened = masked_whiten(torch.tensor([3.0, 3.0, 3.0]), torch.ones(3))
    assert whitened.tolist() == [0.0, 0.0, 0.0]
    assert not any(math.isnan(x) for x in whitened.tolist())


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # the third sequence is empty


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("token-sum", 7.0),
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 non-empty sequences
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2
        ("seq-mean-token-sum-norm", 7 / 2 / 3),  # (3 + 4) / 2 sequences / T = 3
    ],
)
def test_modes_hand_case(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_seq_mean_token_sum_norm_uses_constant_scale_factor():
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=7).item() == pytest.approx(0.5)


def test_empty_mask_gives_zero_not_nan():
    for mode in LOSS_AGG_MODES:
        assert agg_loss(LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def test_unknown_mode_names_the_config_key_and_choices():
    with pytest.raises(UnknownNameError, match="actor_rollout_ref.actor.loss_agg_mode='mean'.*token-mean"):
        agg_loss(LOSS, MASK, "mean")


def test_global_counts_make_micro_batch_losses_add_up_hand_case():
    first = agg_loss(LOSS[:1], MASK[:1], "token-mean", global_token_count=3)
    second = agg_loss(LOSS[1:], MASK[1:], "token-mean", global_token_count=3)
    assert (first + second).item() == pytest.approx(7 / 3)


@settings(max_examples=50, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    batch=st.integers(1, 8),
    length=st.integers(1, 6),
    num_splits=st.integers(1, 4),
    mode=st.sampled_from(sorted(LOSS_AGG_MODES.names())),
)
def test_micro_batches_with_global_counts_equal_whole_batch(seed, batch, length, num_splits, mode):
    generator = torch.Generator().manual_seed(seed)
    loss_mat = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    mask = (torch.rand(batch, length, generator=generator) < 0.6).to(torch.float64)
    global_tokens = mask.sum()
    global_seqs = (mask.sum(-1) > 0).sum()
    whole = agg_loss(loss_mat, mask, mode, loss_scale_factor=length)
    parts = [
        agg_loss(
            loss_part,
            mask_part,
            mode,
            global_token_count=global_tokens,
            global_seq_count=global_seqs,
            loss_scale_factor=length,
        )
        for loss_part, mask_part in zip(loss_mat.tensor_split(num_splits), mask.tensor_split(num_splits))
    ]
    torch.testing.assert_close(sum(parts), whole)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), mode=st.sampled_from(sorted(LOSS_AGG_MODES.names())))
def test_masked_positions_never_change_the_loss(seed, mode):
    generator = torch.Generator().manual_seed(seed)
    loss_mat = torch.randn(4, 5, generator=generator)
    mask = torch.rand(4, 5, generator=generator) < 0.5
    perturbed = torch.where(mask, loss_mat, torch.full_like(loss_mat, float("nan")))
    torch.testing.assert_close(agg_loss(perturbed, mask, mode), agg_loss(loss_mat, mask, mode))
