"""The top-k statistics of a forward pass (on-policy distillation's teacher and student) in every layout equal the
full batch's logits: the teacher's top-k log-probs and ids, the student's log-probs at the teacher's ids."""

import pytest
import torch

from hybridflow.models.layouts import PADDED, choose_layout
from hybridflow.models.log_probs import forward_token_statistics, response_prediction_mask
from tests.models.test_layouts import GROUPS, grouped_batch


@pytest.mark.parametrize("use_remove_padding", [True, False])
def test_forward_top_statistics_in_every_layout(tiny_model, padded_batch, use_remove_padding):
    input_ids, attention_mask, position_ids, _ = padded_batch([4, 2], [3, 1], 4, 3)
    layout = choose_layout(tiny_model, input_ids, attention_mask, 3, False, use_remove_padding)
    with torch.no_grad():
        teacher = forward_token_statistics(tiny_model, input_ids, attention_mask, position_ids, 3, layout, topk=5)
        logits = tiny_model(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    # The columns predicting real response tokens, in order: the same rows of the full batch's logits
    predicts = response_prediction_mask(attention_mask, 3)[:, -4:-1]
    full = logits[:, -4:-1].float().log_softmax(-1).topk(5)
    bound = 1e-4  # the packed layout sums in another order than the padded batch
    torch.testing.assert_close(teacher.topk_log_probs[predicts], full.values[predicts], atol=bound, rtol=0)
    assert torch.equal(teacher.topk_ids[predicts], full.indices[predicts])
    # Padding positions hold zeros
    assert teacher.topk_log_probs[~predicts].abs().sum() == 0 and (~predicts).any()
    student = forward_token_statistics(
        tiny_model, input_ids, attention_mask, position_ids, 3, layout, at_ids=teacher.topk_ids
    )
    torch.testing.assert_close(student.topk_log_probs, teacher.topk_log_probs, atol=bound, rtol=0)
    assert torch.equal(student.topk_ids, teacher.topk_ids)


@pytest.mark.parametrize("groups", sorted(GROUPS))
def test_top_statistics_with_shared_prompts_equal_the_padded_ones(tiny_model, padded_batch, groups):
    """A prompt run once for its samples (the actor's and the teacher's prefix grouper) gives every sample the
    same top-k statistics as its own padded row."""
    prompts, samples, response_lengths = GROUPS[groups]
    input_ids, attention_mask, position_ids, _ = grouped_batch(padded_batch, prompts, samples, response_lengths)
    shared = choose_layout(tiny_model, input_ids, attention_mask, 6, True, True)
    assert shared.share_prompts
    with torch.no_grad():
        teacher = {
            layout: forward_token_statistics(tiny_model, input_ids, attention_mask, position_ids, 6, layout, topk=3)
            for layout in (shared, PADDED)
        }
        student = forward_token_statistics(
            tiny_model, input_ids, attention_mask, position_ids, 6, shared, at_ids=teacher[PADDED].topk_ids
        )
    predicts = response_prediction_mask(attention_mask, 6)[:, -7:-1]
    bound = 1e-4  # the shared layout sums in another order than the padded rows
    torch.testing.assert_close(teacher[shared].topk_log_probs, teacher[PADDED].topk_log_probs, atol=bound, rtol=0)
    assert torch.equal(teacher[shared].topk_ids[predicts], teacher[PADDED].topk_ids[predicts])
    torch.testing.assert_close(student.topk_log_probs, teacher[PADDED].topk_log_probs, atol=bound, rtol=0)
