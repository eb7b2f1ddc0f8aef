"""Checks shared by the packing tests: each sample run alone (the ground truth), and packed against padded."""

import torch

from hybridflow.models.log_probs import forward_log_probs
from tests.float_bounds import longest_reduction, model_output_bound


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
    torch.testing.assert_close(packed_entropy, padded_entropy, atol=model_output_bound(padded_entropy, num_terms), rtol=0)
    return packed
