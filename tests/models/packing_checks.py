"""Checks shared by the packing tests: each sample run alone (the ground truth), and packed against padded, forward
and backward."""

import itertools

import torch

from hybridflow.models.log_probs import forward_log_probs
from tests.float_bounds import longest_reduction, model_output_bound, reordered_sum_bound


def unpadded_log_probs_of(model, input_ids, attention_mask, response_lengths, response_width):
    reference = torch.zeros(len(response_lengths), response_width)
    for row, length in enumerate(response_lengths):
        tokens = input_ids[row][attention_mask[row].bool()]
        log_probs = model(tokens[None]).logits[0].float().log_softmax(-1)
        per_token = log_probs[:-1].gather(-1, tokens[1:, None])[:, 0]
        reference[row, :length] = per_token[len(per_token) - length :]
    return reference


def assert_packed_equals_padded_and_unpadded(model, batch, response_lengths, response_width):
    """Log-probs and entropy of ``batch`` packed (``use_remove_padding``) equal the padded path's and each sample
    run alone; the three run the same sums over rows of other lengths (see tests/float_bounds.py). Returns the
    packed log-probs."""
    input_ids, attention_mask = batch[:2]
    with torch.no_grad():
        packed, packed_entropy = forward_log_probs(
            model, *batch[:3], response_width, use_remove_padding=True, calculate_entropy=True
        )
        padded, padded_entropy = forward_log_probs(
            model, *batch[:3], response_width, use_remove_padding=False, calculate_entropy=True
        )
        reference = unpadded_log_probs_of(model, input_ids, attention_mask, response_lengths, response_width)
    num_terms = longest_reduction(model.config)
    torch.testing.assert_close(packed, padded, atol=model_output_bound(padded, num_terms), rtol=0)
    torch.testing.assert_close(packed, reference, atol=model_output_bound(reference, num_terms), rtol=0)
    torch.testing.assert_close(
        packed_entropy, padded_entropy, atol=model_output_bound(padded_entropy, num_terms), rtol=0
    )
    return packed


def assert_packed_gradients_equal_padded(model, batch, response_width):
    """The gradients of a loss of log-probs and entropy, packed against padded. A parameter's gradient sums the
    response tokens' contributions, each through the backward pass's sums (at most num_terms terms): bounded at
    the tensor's largest entry (tests/float_bounds.py)."""
    response_mask = batch[3]
    gradients = []
    for use_remove_padding in (True, False):
        model.zero_grad()
        log_probs, entropy = forward_log_probs(
            model, *batch[:3], response_width, use_remove_padding=use_remove_padding, calculate_entropy=True
        )
        ((log_probs + 0.1 * entropy) * response_mask).sum().backward()
        gradients.append([p.grad.clone() for p in model.parameters()])
    num_terms = longest_reduction(model.config) + int(response_mask.sum())
    for packed_grad, padded_grad in itertools.zip_longest(*gradients):
        bound = reordered_sum_bound(padded_grad.abs().max(), num_terms)
        torch.testing.assert_close(packed_grad, padded_grad, atol=bound, rtol=0)
