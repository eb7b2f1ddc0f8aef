"""The top-k statistics of a forward pass (on-policy distillation's teacher and student) in every layout equal the
full batch's logits: the teacher's top-k log-probs and ids, the student's log-probs at the teacher's ids."""

import pytest
import torch

from hybridflow.models.layouts import choose_layout
from hybridflow.models.log_probs import forward_token_statistics, response_prediction_mask


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
