"""forward_log_probs: response log-probs from a model, with entropy and temperature."""

import pytest
import torch

from hybridflow.models.log_probs import forward_log_probs, forward_token_statistics, response_prediction_mask
from tests.float_bounds import longest_reduction, model_output_bound


def _naive(logits, labels, temperature=1.0):
    log_softmax = (logits.float() / temperature).log_softmax(-1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    return log_softmax.gather(-1, labels.unsqueeze(-1)).squeeze(-1), entropy


def test_prediction_mask_marks_the_columns_before_real_response_tokens():
    attention_mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    assert response_prediction_mask(attention_mask, 2).int().tolist() == [[0, 0, 1, 0, 0], [0, 0, 1, 1, 0]]
    with pytest.raises(ValueError, match="response_length=5"):
        response_prediction_mask(attention_mask, 5)


def test_forward_log_probs_entropy_only_when_asked_and_temperature_applied(tiny_model, padded_batch):
    input_ids, attention_mask, position_ids, _ = padded_batch([4, 2], [3, 1], 4, 3)
    with torch.no_grad():
        log_probs, entropy = forward_log_probs(tiny_model, input_ids, attention_mask, position_ids, 3)
        hot, _ = forward_log_probs(tiny_model, input_ids, attention_mask, position_ids, 3, temperature=2.0)
        logits = tiny_model(input_ids[:1]).logits[0, 3:6]
    assert entropy is None and log_probs.shape == (2, 3)
    # One row alone against two in a batch: the same sums in other orders (tests/float_bounds.py).
    bound = model_output_bound(hot, longest_reduction(tiny_model.config))
    torch.testing.assert_close(hot[0], _naive(logits, input_ids[0, 4:7], 2.0)[0], atol=bound, rtol=0)


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_batch_without_response_tokens_gives_zeros_and_backpropagates(tiny_model, use_remove_padding):
    input_ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0]])
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    log_probs, entropy = forward_log_probs(
        tiny_model, input_ids, attention_mask, position_ids, 3, use_remove_padding=use_remove_padding,
        calculate_entropy=True,
    )
    assert torch.equal(log_probs, torch.zeros(2, 3)) and torch.equal(entropy, torch.zeros(2, 3))
    (log_probs.sum() + entropy.sum()).backward()


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_sum_pi_squared_of_each_response_position(tiny_model, padded_batch, use_remove_padding):
    input_ids, attention_mask, position_ids, _ = padded_batch([4, 2], [3, 1], 4, 3)
    with torch.no_grad():
        statistics = forward_token_statistics(
            tiny_model, input_ids, attention_mask, position_ids, 3, temperature=0.5,
            use_remove_padding=use_remove_padding, calculate_sum_pi_squared=True,
        )
        logits = tiny_model(input_ids[:1]).logits[0, 3:6]
    expected = ((logits.float() / 0.5).softmax(-1) ** 2).sum(-1)
    torch.testing.assert_close(statistics.sum_pi_squared[0], expected, atol=1e-5, rtol=0)
    # row 1 has one response token: its other two positions are padding
    assert statistics.sum_pi_squared[1, 1:].tolist() == [0.0, 0.0] and statistics.sum_pi_squared[1, 0] > 0
    assert statistics.entropy is None
    plain = forward_token_statistics(tiny_model, input_ids, attention_mask, position_ids, 3, temperature=0.5)
    assert plain.sum_pi_squared is None
    torch.testing.assert_close(plain.log_probs, statistics.log_probs)
