"""Shared prompts: log-probs, entropies, critic values and gradients equal the unshared forward's up to
float32 order."""

import itertools

import pytest
import torch

from hybridflow.models.log_probs import forward_log_probs
from hybridflow.models.padding import attention_pair_cost
from hybridflow.models.shared_prompts import prompt_groups, shared_prompt_layout
from hybridflow.models.value_model import forward_values, load_value_model
from tests.float_bounds import longest_reduction, model_output_bound, reordered_sum_bound, score_head_bound


def grouped_batch(padded_batch, prompts, samples, response_lengths, prompt_width=12, response_width=6):
    """A rollout batch of ``prompts`` prompt groups with ``samples[g]`` samples each: equal prompt tokens within
    a group (prompt g has ``prompts[g]`` real tokens), random responses of the given lengths."""
    prompt_lengths = [length for length, count in zip(prompts, samples) for _ in range(count)]
    input_ids, attention_mask, position_ids, response_mask = padded_batch(
        prompt_lengths, response_lengths, prompt_width, response_width
    )
    first = 0
    for count in samples:
        input_ids[first:first + count, :prompt_width] = input_ids[first, :prompt_width].clone()
        first += count
    return input_ids, attention_mask, position_ids, response_mask


# (real prompt tokens per group, samples per group, response tokens per sample)
LAYOUTS = {
    "grpo_groups": ([12, 9, 5], [4, 4, 4], [6, 3, 1, 6, 2, 6, 5, 4, 6, 6, 1, 3]),
    "uneven_groups_and_an_empty_response": ([7, 11, 4], [1, 3, 2], [6, 0, 4, 6, 2, 5]),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_shared_and_unshared_log_probs_entropies_and_gradients_agree(tiny_model, padded_batch, layout):
    prompts, samples, response_lengths = LAYOUTS[layout]
    batch = grouped_batch(padded_batch, prompts, samples, response_lengths)
    response_mask = batch[3]

    def forward(share_prompts):
        log_probs, entropy = forward_log_probs(
            tiny_model, *batch[:3], 6, use_remove_padding=False, calculate_entropy=True, share_prompts=share_prompts
        )
        return (log_probs, entropy), (log_probs + 0.1 * entropy) * response_mask

    ((shared_lp, shared_entropy), shared_grads), ((lp, entropy), grads) = shared_then_unshared(tiny_model, forward)
    assert torch.equal(lp == 0, response_mask == 0) and torch.equal(shared_lp == 0, response_mask == 0)
    # The same sums in other orders (tests/float_bounds.py); a gradient adds every response token's share.
    num_terms = longest_reduction(tiny_model.config)
    torch.testing.assert_close(shared_lp, lp, atol=model_output_bound(lp, num_terms), rtol=0)
    torch.testing.assert_close(shared_entropy, entropy, atol=model_output_bound(entropy, num_terms), rtol=0)
    assert_gradients_agree(shared_grads, grads, num_terms + int(response_mask.sum()))


def shared_then_unshared(model, forward):
    """``forward(share_prompts)`` -> (outputs, per-token loss terms), run shared then unshared: each run's
    detached outputs and parameter gradients."""
    results = []
    for share_prompts in (True, False):
        model.zero_grad()
        outputs, terms = forward(share_prompts)
        terms.sum().backward()
        results.append((tuple(output.detach() for output in outputs), [p.grad.clone() for p in model.parameters()]))
    return results


def assert_gradients_agree(shared_grads, grads, num_terms):
    for shared_grad, grad in itertools.zip_longest(shared_grads, grads):
        torch.testing.assert_close(shared_grad, grad, atol=reordered_sum_bound(grad.abs().max(), num_terms), rtol=0)


def test_each_response_attends_to_its_prompt_and_its_own_tokens_only(padded_batch):
    input_ids, attention_mask, _, _ = grouped_batch(padded_batch, [3], [2], [2, 1], prompt_width=4, response_width=2)
    layout = shared_prompt_layout(input_ids, attention_mask, 2, pair_cost=0.0, alternative_cost=None)
    # One row: prompt (3 slots), sample 0's 2 tokens, sample 1's 1 token.
    expected = torch.tensor([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(layout.attention_mask[0, 0], expected)
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]
    # Sample 0's first token and sample 1's first token are both predicted by the prompt's last slot.
    assert layout.labels.tolist() == [input_ids[0, 4].item(), input_ids[0, 5].item(), input_ids[1, 4].item()]
    assert (layout.rows.tolist(), layout.cols.tolist()) == ([0, 0, 1], [0, 1, 0])
    assert layout.logit_row.tolist() == [0, 1, 0]


def test_no_repeated_prompt_or_a_cheaper_layout_leaves_the_batch_unshared(tiny_model, padded_batch):
    distinct = padded_batch([5, 6], [3, 3], 8, 4)
    assert shared_prompt_layout(distinct[0], distinct[1], 4, pair_cost=0.0, alternative_cost=None) is None
    grouped = grouped_batch(padded_batch, [12], [4], [6, 6, 6, 6])
    pair_cost = attention_pair_cost(tiny_model.config)
    assert shared_prompt_layout(grouped[0], grouped[1], 6, pair_cost, alternative_cost=None) is not None
    assert shared_prompt_layout(grouped[0], grouped[1], 6, pair_cost, alternative_cost=1.0) is None


def test_prompts_group_by_their_real_tokens_whatever_the_padding_holds(padded_batch):
    input_ids, attention_mask, _, _ = grouped_batch(padded_batch, [4, 4], [2, 1], [1, 1, 1])
    input_ids[1, 0] = 7  # a padding slot of sample 1's prompt
    assert prompt_groups(input_ids, attention_mask, 6) == [[0, 1], [2]]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_shared_and_unshared_critic_values_and_gradients_agree(tiny_model_dir, padded_batch, layout):
    critic = load_value_model(tiny_model_dir).eval()
    prompts, samples, response_lengths = LAYOUTS[layout]
    batch = grouped_batch(padded_batch, prompts, samples, response_lengths)
    response_mask = batch[3]

    def forward(share_prompts):
        values = forward_values(critic, *batch[:3], 6, use_remove_padding=False, share_prompts=share_prompts)
        return (values,), values * response_mask

    ((shared_values,), shared_grads), ((values,), grads) = shared_then_unshared(critic, forward)
    assert torch.all(shared_values[response_mask == 0] == 0)
    num_terms = longest_reduction(critic.config)
    torch.testing.assert_close(shared_values, values, atol=score_head_bound(critic, num_terms), rtol=0)
    assert_gradients_agree(shared_grads, grads, num_terms + int(response_mask.sum()))
