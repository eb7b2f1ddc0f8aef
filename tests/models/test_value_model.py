"""The critic and reward model: loadable from a causal-LM or reward-model folder, packed == padded."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from hybridflow.models import layouts
from hybridflow.models.layouts import PADDED, choose_layout
from hybridflow.models.value_model import forward_reward_scores, forward_values, load_reward_model, load_value_model
from tests.float_bounds import longest_reduction, score_head_bound


@pytest.fixture(scope="module")
def reward_model_dir(tiny_model_dir, tmp_path_factory):
    """A one-label sequence-classification model on the tiny body, with a non-zero score head."""
    config = AutoConfig.from_pretrained(tiny_model_dir, num_labels=1)
    torch.manual_seed(3)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, config=config)
    path = tmp_path_factory.mktemp("reward_model")
    model.save_pretrained(path)
    return path


def test_value_model_from_causal_lm_keeps_the_body_and_adds_a_scalar_head(tiny_model_dir, tiny_model):
    critic = load_value_model(tiny_model_dir)
    body = critic.model.state_dict()
    assert all(torch.equal(body[key], value) for key, value in tiny_model.model.state_dict().items())
    assert critic.score.out_features == 1 and critic.score.bias is not None
    assert critic.dropout.p == 0.0


def test_a_new_head_is_the_same_in_every_load_and_leaves_the_callers_rng_alone(tiny_model_dir):
    torch.manual_seed(5)
    expected_draw = torch.rand(3)
    torch.manual_seed(5)
    first = load_value_model(tiny_model_dir)
    assert torch.equal(torch.rand(3), expected_draw)
    torch.manual_seed(6)
    second = load_value_model(tiny_model_dir)
    assert torch.equal(first.score.weight, second.score.weight) and torch.equal(first.score.bias, second.score.bias)
    assert first.score.weight.abs().max() > 0


def test_values_zero_on_padding_and_packed_equals_padded(tiny_model_dir, padded_batch):
    critic = load_value_model(tiny_model_dir).eval()
    input_ids, attention_mask, position_ids, response_mask = padded_batch([5, 2, 4], [3, 1, 0], 5, 3)
    with torch.no_grad():
        layout = choose_layout(critic, input_ids, attention_mask, 3, False, True)
        packed = forward_values(critic, input_ids, attention_mask, position_ids, 3, layout)
        padded = forward_values(critic, input_ids, attention_mask, position_ids, 3, PADDED)
        alone = critic(input_ids[:1, :7]).logits[0, 4:7, 0]
    # The same sums over rows of other lengths (tests/float_bounds.py).
    bound = score_head_bound(critic, longest_reduction(critic.config))
    torch.testing.assert_close(packed, padded, atol=bound, rtol=0)
    torch.testing.assert_close(packed[0], alone, atol=bound, rtol=0)
    assert torch.all(packed[response_mask == 0] == 0)


@pytest.mark.parametrize("num_rows", [1, 2, 4])
def test_values_packed_in_rows_equal_padded(tiny_model_dir, padded_batch, monkeypatch, num_rows):
    monkeypatch.setattr(
        layouts, "cheapest_rows", lambda lengths, width, pair_cost: layouts.balanced_rows(lengths, num_rows)
    )
    critic = load_value_model(tiny_model_dir).eval()
    batch = padded_batch([5, 2, 4, 1], [3, 1, 0, 3], 5, 3)
    with torch.no_grad():
        layout = choose_layout(critic, *batch[:2], 3, False, True)
        assert layout.rows_per_sample is not None
        packed = forward_values(critic, *batch[:3], 3, layout)
        padded = forward_values(critic, *batch[:3], 3, PADDED)
    torch.testing.assert_close(packed, padded, atol=score_head_bound(critic, longest_reduction(critic.config)), rtol=0)


def test_reward_scores_match_sequence_classification(reward_model_dir, padded_batch):
    reference = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    reward_model = load_reward_model(reward_model_dir).eval()
    assert torch.equal(reward_model.score.weight, reference.score.weight) and reward_model.score.bias is None
    input_ids, attention_mask, position_ids, _ = padded_batch([5, 2, 4], [3, 1, 2], 5, 3)
    bound = score_head_bound(reference, longest_reduction(reference.config))
    with torch.no_grad():
        expected = reference(input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[:, 0]
        for use_remove_padding in (True, False):
            scores = forward_reward_scores(reward_model, input_ids, attention_mask, position_ids, use_remove_padding)
            torch.testing.assert_close(scores, expected, atol=bound, rtol=0)


def test_critic_initialised_from_a_reward_model_takes_its_head(reward_model_dir):
    reference = AutoModelForSequenceClassification.from_pretrained(reward_model_dir)
    critic = load_value_model(reward_model_dir)
    assert torch.equal(critic.score.weight, reference.score.weight)
    assert torch.equal(critic.score.bias, torch.zeros(1))
