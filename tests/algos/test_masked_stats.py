import math

import pytest
import torch

from hybridflow.algos.masked_stats import MaskedStatisticsError, masked_mean, masked_sum, masked_var, masked_whiten


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
