"""Remove padding: packing round-trips, and packed log-probs equal the padded computation (CPU sdpa)."""

import pytest
import torch

from hybridflow.models.log_probs import forward_log_probs
from hybridflow.models.padding import pack_padded, pack_values, unpack

# Prompt and response lengths of a ragged batch: empty-ish, full and in-between rows.
PROMPT_LENGTHS = [7, 3, 5, 1, 7]
RESPONSE_LENGTHS = [6, 2, 4, 1, 0]


def test_pack_keeps_real_tokens_with_positions_restarting_per_sample():
    input_ids = torch.tensor([[9, 9, 1, 2, 3], [4, 5, 6, 9, 9]])
    attention_mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    packed = pack_padded(input_ids, attention_mask)
    assert packed.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    assert packed.token_index.tolist() == [2, 3, 4, 5, 6, 7]
    values = torch.arange(6.0, requires_grad=True)
    rectangle = unpack(values, packed, fill_value=-1.0)
    assert rectangle.tolist() == [[-1, -1, 0, 1, 2], [3, 4, 5, -1, -1]]
    assert torch.equal(pack_values(rectangle, packed), values)
    rectangle.sum().backward()
    assert torch.equal(values.grad, torch.ones(6))


def test_pack_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        pack_padded(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4))


def _unpadded_reference(model, input_ids, attention_mask, response_lengths, response_width):
    """Each sample run alone, without any padding: the ground truth both paths must match."""
    reference = torch.zeros(len(response_lengths), response_width)
    for row, length in enumerate(response_lengths):
        tokens = input_ids[row][attention_mask[row].bool()]
        log_probs = model(tokens[None]).logits[0].float().log_softmax(-1)
        per_token = log_probs[:-1].gather(-1, tokens[1:, None])[:, 0]
        reference[row, :length] = per_token[len(per_token) - length :]
    return reference


def test_packed_equals_padded_and_unpadded_log_probs(tiny_model, padded_batch):
    input_ids, attention_mask, position_ids, response_mask = padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, 7, 6)
    with torch.no_grad():
        packed, packed_entropy = forward_log_probs(
            tiny_model, input_ids, attention_mask, position_ids, 6, use_remove_padding=True, calculate_entropy=True
        )
        padded, padded_entropy = forward_log_probs(
            tiny_model, input_ids, attention_mask, position_ids, 6, use_remove_padding=False, calculate_entropy=True
        )
        reference = _unpadded_reference(tiny_model, input_ids, attention_mask, RESPONSE_LENGTHS, 6)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed_entropy, padded_entropy, atol=1e-5, rtol=0)
    assert torch.all(packed[response_mask == 0] == 0) and torch.all(packed[response_mask == 1] < 0)


def test_packing_without_restarting_positions_would_leak_across_samples(tiny_model, padded_batch):
    """The control: one causal sequence over the packed row differs, so the test above has teeth."""
    input_ids, attention_mask, _, _ = padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, 7, 6)
    packed = pack_padded(input_ids, attention_mask)
    with torch.no_grad():
        separate = tiny_model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits
        one_sequence = tiny_model(input_ids=packed.input_ids, use_cache=False).logits
    first_sample = int(attention_mask[0].sum())
    torch.testing.assert_close(separate[:, :first_sample], one_sequence[:, :first_sample])
    assert (separate[:, first_sample:] - one_sequence[:, first_sample:]).abs().max() > 1e-3


def test_packed_and_padded_gradients_agree(tiny_model, padded_batch):
    input_ids, attention_mask, position_ids, response_mask = padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, 7, 6)
    gradients = []
    for use_remove_padding in (True, False):
        tiny_model.zero_grad()
        log_probs, _ = forward_log_probs(
            tiny_model, input_ids, attention_mask, position_ids, 6, use_remove_padding=use_remove_padding
        )
        (log_probs * response_mask).sum().backward()
        gradients.append([p.grad.clone() for p in tiny_model.parameters()])
    for packed_grad, padded_grad in zip(*gradients):
        torch.testing.assert_close(packed_grad, padded_grad, atol=1e-5, rtol=1e-4)
