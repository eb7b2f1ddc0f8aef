"""Layouts: packing round-trips, the layout choice (once per pass, then applied to each micro-batch), packed
log-probs equal to the padded computation (CPU sdpa) in one row and in several, and shared prompts: log-probs,
entropies, critic values and gradients equal to the unshared forward's up to float32 order."""

import itertools
import types
from fractions import Fraction

import pytest
import torch

from hybridflow.models import layouts
from hybridflow.models.layouts import (
    MIN_PACKED_SAVING,
    PADDED,
    Layout,
    attention_pair_cost,
    balanced_rows,
    cheapest_rows,
    choose_layout,
    choose_packing,
    layout_cost,
    pack_padded,
    pack_values,
    packed_outputs,
    prompt_groups,
    shared_prompt_rows,
    unpack,
)
from hybridflow.models.log_probs import forward_log_probs, forward_token_statistics
from hybridflow.models.value_model import forward_reward_scores, forward_values, load_reward_model, load_value_model
from tests.float_bounds import longest_reduction, model_output_bound, reordered_sum_bound, score_head_bound
from tests.models.packing_checks import assert_packed_equals_padded_and_unpadded, assert_packed_gradients_equal_padded

# Prompt and response lengths of a ragged batch: empty-ish, full and in-between rows.
PROMPT_LENGTHS = [7, 3, 5, 1, 7]
RESPONSE_LENGTHS = [6, 2, 4, 1, 0]

# (prompt lengths, response lengths, prompt width, response width, rows to pack into)
PACKINGS = {
    "ragged_one_row": (PROMPT_LENGTHS, RESPONSE_LENGTHS, 7, 6, 1),
    "ragged_two_rows": (PROMPT_LENGTHS, RESPONSE_LENGTHS, 7, 6, 2),
    "ragged_row_each": (PROMPT_LENGTHS, RESPONSE_LENGTHS, 7, 6, 5),
    "random_lengths": ([6, 1, 8, 3, 2, 7, 4, 5, 1, 8, 2, 6], [5, 0, 6, 2, 6, 1, 3, 4, 6, 0, 1, 2], 8, 6, 4),
    # One sample (16 tokens) is longer than any two others together: it fills a row alone.
    "one_long": ([8, 1, 2, 1, 2, 1], [8, 1, 1, 2, 1, 1], 8, 8, 3),
    # Lengths 10, 5, 5 in two rows: both rows exactly at the 10-token width, no padding slot at all.
    "exactly_full_rows": ([6, 3, 2], [4, 2, 3], 6, 4, 2),
}


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


def test_pack_into_rows_pads_short_rows_with_one_token_sequences():
    input_ids = torch.tensor([[0, 1, 2, 3], [0, 0, 4, 5], [0, 0, 0, 6]])
    attention_mask = (input_ids > 0).long()
    packed = pack_padded(input_ids, attention_mask, num_rows=2)
    # Longest first onto the shortest row: [1, 2, 3] alone, then [4, 5] and [6] share a row.
    assert packed.input_ids.tolist() == [[1, 2, 3], [4, 5, 6]]
    assert packed.position_ids.tolist() == [[0, 1, 2], [0, 1, 0]]
    packed = pack_padded(input_ids, attention_mask, num_rows=3)
    assert packed.input_ids.tolist() == [[1, 2, 3], [4, 5, 0], [6, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2], [0, 1, 0], [0, 0, 0]]
    outputs = packed.input_ids.float() * 10
    assert unpack(packed_outputs(outputs, packed), packed).tolist() == (input_ids * 10).tolist()


def test_balanced_rows_deal_longest_first_onto_the_shortest_row():
    assert balanced_rows([5, 4, 3, 3, 2, 1], 3) == [[0, 5], [1, 4], [2, 3]]
    assert balanced_rows([5, 4], 4) == [[0], [1]]


def test_pack_rejects_mismatched_shapes_and_no_rows():
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        pack_padded(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 4))
    with pytest.raises(ValueError, match="num_rows=0"):
        pack_padded(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), num_rows=0)


def test_cheapest_rows_finds_the_best_row_count_or_padding():
    generator = torch.Generator().manual_seed(0)
    pair_cost = 2e-3
    for _ in range(20):
        lengths = torch.randint(1, 200, (int(torch.randint(2, 40, (1,), generator=generator)),), generator=generator)
        lengths = lengths.tolist()
        padded = layout_cost(len(lengths), 200, pair_cost)
        costs = []
        for num_rows in range(1, len(lengths) + 1):
            rows = balanced_rows(lengths, num_rows)
            costs.append(layout_cost(len(rows), max(sum(lengths[i] for i in row) for row in rows), pair_cost))
        chosen = cheapest_rows(lengths, 200, pair_cost)
        if min(costs) < (1 - MIN_PACKED_SAVING) * padded:
            width = max(sum(lengths[i] for i in row) for row in chosen)
            assert layout_cost(len(chosen), width, pair_cost) == pytest.approx(min(costs))
        else:
            assert chosen is None


def test_packing_picks_one_row_for_flash_rows_for_ragged_and_padding_for_uniform(tiny_model, padded_batch):
    # Prompts of 16-64 tokens and responses of 16-180: about half the [8, 256] rectangle is padding.
    ragged = padded_batch([60, 20, 35, 16, 64, 40, 25, 50], [180, 20, 60, 16, 100, 30, 150, 40], 64, 192)
    flash = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="flash_attention_2"))
    assert choose_packing(flash, ragged[1])[0].pack(*ragged[:2]).input_ids.shape[0] == 1
    layout, (rows, width) = choose_packing(tiny_model, ragged[1])
    packed = layout.pack(*ragged[:2])
    assert packed.input_ids.shape == (rows, width) and 1 < rows < 8 and width <= 256
    assert packed.input_ids.numel() < (1 - MIN_PACKED_SAVING) * ragged[0].numel()
    uniform = padded_batch([6] * 8, [5] * 7 + [6], 6, 6)
    assert choose_packing(tiny_model, uniform[1]) == (PADDED, (8, 12)) and PADDED.pack(*uniform[:2]) is None
    assert 0 < attention_pair_cost(tiny_model.config) < 1e-2


def test_a_packing_chosen_for_the_whole_batch_gives_each_micro_batch_its_share_of_rows(padded_batch):
    input_ids, attention_mask, _, _ = padded_batch([16, 12, 9, 8, 5, 3], [1] * 6, 16, 1)
    layout = Layout(rows_per_sample=Fraction(3, 6))
    whole = layout.pack(input_ids, attention_mask)
    assert whole.input_ids.tolist() == pack_padded(input_ids, attention_mask, num_rows=3).input_ids.tolist()
    # A micro-batch of half the samples runs ceil(3 / 2) rows, one sample a row of its own.
    assert layout.pack(input_ids[:3], attention_mask[:3]).input_ids.shape[0] == 2
    assert layout.pack(input_ids[:1], attention_mask[:1]).input_ids.shape[0] == 1


@pytest.mark.parametrize("layout", PACKINGS)
def test_packed_equals_padded_and_unpadded_log_probs(tiny_model, padded_batch, packed_rows, layout):
    prompt_lengths, response_lengths, prompt_width, response_width, num_rows = PACKINGS[layout]
    batch = padded_batch(prompt_lengths, response_lengths, prompt_width, response_width)
    response_mask = batch[3]
    packed_rows(num_rows)
    packed = assert_packed_equals_padded_and_unpadded(tiny_model, batch, response_lengths, response_width)
    assert torch.all(packed[response_mask == 0] == 0) and torch.all(packed[response_mask == 1] < 0)


def test_exactly_full_rows_have_no_padding_slot(padded_batch):
    prompt_lengths, response_lengths, prompt_width, response_width, num_rows = PACKINGS["exactly_full_rows"]
    input_ids, attention_mask, _, _ = padded_batch(prompt_lengths, response_lengths, prompt_width, response_width)
    packed = pack_padded(input_ids, attention_mask, num_rows=num_rows)
    assert packed.input_ids.shape == (2, 10) and packed.num_tokens == 20
    assert packed.position_ids.tolist() == [list(range(10)), list(range(5)) * 2]


def test_packing_without_restarting_positions_would_leak_across_samples(tiny_model, padded_batch):
    """The control: one causal sequence over the packed row differs, so the tests above have teeth."""
    input_ids, attention_mask, _, _ = padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, 7, 6)
    packed = pack_padded(input_ids, attention_mask)
    with torch.no_grad():
        separate = tiny_model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits
        one_sequence = tiny_model(input_ids=packed.input_ids, use_cache=False).logits
    first_sample = int(attention_mask.sum(1).max())  # the longest sample is packed first
    torch.testing.assert_close(separate[:, :first_sample], one_sequence[:, :first_sample])
    assert (separate[:, first_sample:] - one_sequence[:, first_sample:]).abs().max() > 1e-3


@pytest.mark.parametrize("layout", ["ragged_one_row", "random_lengths", "one_long", "exactly_full_rows"])
def test_packed_and_padded_gradients_agree(tiny_model, padded_batch, packed_rows, layout):
    prompt_lengths, response_lengths, prompt_width, response_width, num_rows = PACKINGS[layout]
    batch = padded_batch(prompt_lengths, response_lengths, prompt_width, response_width)
    packed_rows(num_rows)
    assert_packed_gradients_equal_padded(tiny_model, batch, response_width)


def grouped_batch(padded_batch, prompts, samples, response_lengths, prompt_width=12, response_width=6):
    """A rollout batch of ``prompts`` prompt groups with ``samples[g]`` samples each: equal prompt tokens within
    a group (prompt g has ``prompts[g]`` real tokens), random responses of the given lengths."""
    prompt_lengths = [length for length, count in zip(prompts, samples) for _ in range(count)]
    input_ids, attention_mask, position_ids, response_mask = padded_batch(
        prompt_lengths, response_lengths, prompt_width, response_width
    )
    first = 0
    for count in samples:
        input_ids[first : first + count, :prompt_width] = input_ids[first, :prompt_width].clone()
        first += count
    return input_ids, attention_mask, position_ids, response_mask


# (real prompt tokens per group, samples per group, response tokens per sample)
GROUPS = {
    "grpo_groups": ([12, 9, 5], [4, 4, 4], [6, 3, 1, 6, 2, 6, 5, 4, 6, 6, 1, 3]),
    "uneven_groups_and_an_empty_response": ([7, 11, 4], [1, 3, 2], [6, 0, 4, 6, 2, 5]),
}


@pytest.mark.parametrize("layout", sorted(GROUPS))
def test_shared_and_unshared_log_probs_entropies_and_gradients_agree(tiny_model, padded_batch, layout):
    prompts, samples, response_lengths = GROUPS[layout]
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
    layout = shared_prompt_rows(input_ids, attention_mask, 2)
    # One row: prompt (3 slots), sample 0's 2 tokens, sample 1's 1 token.
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(layout.attention_mask[0, 0], expected)
    assert layout.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]
    # Sample 0's first token and sample 1's first token are both predicted by the prompt's last slot.
    assert layout.labels.tolist() == [input_ids[0, 4].item(), input_ids[0, 5].item(), input_ids[1, 4].item()]
    assert (layout.rows.tolist(), layout.cols.tolist()) == ([0, 0, 1], [0, 1, 0])
    assert layout.logit_row.tolist() == [0, 1, 0]


def test_no_repeated_prompt_or_a_cheaper_layout_leaves_the_batch_unshared(tiny_model, padded_batch, monkeypatch):
    distinct = padded_batch([5, 6], [3, 3], 8, 4)
    assert choose_layout(tiny_model, distinct[0], distinct[1], 4, True, False) == PADDED
    # One prompt token, four samples of 6: shared, one row of 25 tokens; packed, four rows of 7.
    input_ids, attention_mask, _, _ = grouped_batch(padded_batch, [1], [4], [6, 6, 6, 6])
    shared, packed = Layout(share_prompts=True), Layout(rows_per_sample=Fraction(4, 4))
    assert choose_packing(tiny_model, attention_mask) == (packed, (4, 7))
    assert choose_layout(tiny_model, input_ids, attention_mask, 6, True, True) == shared
    assert choose_layout(tiny_model, input_ids, attention_mask, 6, None, True) == shared  # the cost model's choice
    assert choose_layout(tiny_model, input_ids, attention_mask, 6, False, True) == packed
    # Where attention dominates, the row of 25 costs more than four of 7: shared only when asked for.
    monkeypatch.setattr(layouts, "attention_pair_cost", lambda config: 1.0)
    assert choose_layout(tiny_model, input_ids, attention_mask, 6, None, True) == packed
    assert choose_layout(tiny_model, input_ids, attention_mask, 6, True, True) == shared


def test_a_shared_layout_runs_a_micro_batch_without_repeated_prompts_one_row_per_sample(tiny_model, padded_batch):
    """The layout is chosen for the whole batch; a micro-batch of it whose prompts do not repeat still runs it."""
    input_ids, attention_mask, position_ids, response_mask = grouped_batch(padded_batch, [12, 9], [1, 1], [6, 3])
    shared = Layout(share_prompts=True)
    assert shared.arrange(input_ids, attention_mask, 6).input_ids.shape == (2, 18)
    with torch.no_grad():
        log_probs = forward_token_statistics(tiny_model, input_ids, attention_mask, position_ids, 6, shared).log_probs
        padded = forward_token_statistics(tiny_model, input_ids, attention_mask, position_ids, 6, PADDED).log_probs
    num_terms = longest_reduction(tiny_model.config)
    torch.testing.assert_close(log_probs, padded, atol=model_output_bound(padded, num_terms), rtol=0)
    assert torch.equal(log_probs == 0, response_mask == 0)


def test_prompts_group_by_their_real_tokens_whatever_the_padding_holds(padded_batch):
    input_ids, attention_mask, _, _ = grouped_batch(padded_batch, [4, 4], [2, 1], [1, 1, 1])
    input_ids[1, 0] = 7  # a padding slot of sample 1's prompt
    assert prompt_groups(input_ids, attention_mask, 6) == [[0, 1], [2]]


@pytest.mark.parametrize("layout", sorted(GROUPS))
def test_shared_and_unshared_critic_values_and_gradients_agree(tiny_model_dir, padded_batch, layout):
    critic = load_value_model(tiny_model_dir).eval()
    prompts, samples, response_lengths = GROUPS[layout]
    batch = grouped_batch(padded_batch, prompts, samples, response_lengths)
    response_mask = batch[3]

    def forward(share_prompts):
        values = forward_values(critic, *batch[:3], 6, Layout(share_prompts=share_prompts))
        return (values,), values * response_mask

    ((shared_values,), shared_grads), ((values,), grads) = shared_then_unshared(critic, forward)
    assert torch.all(shared_values[response_mask == 0] == 0)
    num_terms = longest_reduction(critic.config)
    torch.testing.assert_close(shared_values, values, atol=score_head_bound(critic, num_terms), rtol=0)
    assert_gradients_agree(shared_grads, grads, num_terms + int(response_mask.sum()))


@pytest.mark.parametrize("layout", sorted(GROUPS))
def test_shared_and_unshared_reward_scores_agree(tiny_model_dir, padded_batch, layout):
    """A reward model's score at each sample's last real token (the prompt's last for an empty response) is the
    unshared forward's up to float32 order."""
    reward_model = load_reward_model(tiny_model_dir).eval()
    prompts, samples, response_lengths = GROUPS[layout]
    input_ids, attention_mask, position_ids, _ = grouped_batch(padded_batch, prompts, samples, response_lengths)
    with torch.no_grad():
        shared = forward_reward_scores(
            reward_model, input_ids, attention_mask, position_ids, layout=Layout(share_prompts=True), response_length=6
        )
        unshared = forward_reward_scores(reward_model, input_ids, attention_mask, position_ids)
    assert shared.shape == (len(response_lengths),)
    bound = score_head_bound(reward_model, longest_reduction(reward_model.config))
    torch.testing.assert_close(shared, unshared, atol=bound, rtol=0)
