"""Remove padding: packing layouts round-trip, the layout choice, and packed log-probs equal the padded
computation (CPU sdpa) in one row and in several."""

import types

import pytest
import torch

from hybridflow.models.padding import (
    MIN_PACKED_SAVING,
    attention_pair_cost,
    balanced_rows,
    cheapest_rows,
    layout_cost,
    pack_for_model,
    pack_padded,
    pack_values,
    packed_outputs,
    unpack,
)
from tests.models.packing_checks import (
    assert_packed_equals_padded_and_unpadded, assert_packed_gradients_equal_padded,
)

# Prompt and response lengths of a ragged batch: empty-ish, full and in-between rows.
PROMPT_LENGTHS = [7, 3, 5, 1, 7]
RESPONSE_LENGTHS = [6, 2, 4, 1, 0]

# (prompt lengths, response lengths, prompt width, response width, rows to pack into)
LAYOUTS = {
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


def test_pack_for_model_picks_one_row_for_flash_rows_for_ragged_and_padding_for_uniform(tiny_model, padded_batch):
    # Prompts of 16-64 tokens and responses of 16-180: about half the [8, 256] rectangle is padding.
    ragged = padded_batch([60, 20, 35, 16, 64, 40, 25, 50], [180, 20, 60, 16, 100, 30, 150, 40], 64, 192)
    flash = types.SimpleNamespace(config=types.SimpleNamespace(_attn_implementation="flash_attention_2"))
    assert pack_for_model(flash, *ragged[:2]).num_rows == 1
    packed = pack_for_model(tiny_model, *ragged[:2])
    assert 1 < packed.num_rows < 8 and packed.input_ids.shape[1] <= 256
    assert packed.input_ids.numel() < (1 - MIN_PACKED_SAVING) * ragged[0].numel()
    uniform = padded_batch([6] * 8, [5] * 7 + [6], 6, 6)
    assert pack_for_model(tiny_model, *uniform[:2]) is None
    assert 0 < attention_pair_cost(tiny_model.config) < 1e-2


@pytest.mark.parametrize("layout", LAYOUTS)
def test_packed_equals_padded_and_unpadded_log_probs(tiny_model, padded_batch, packed_rows, layout):
    prompt_lengths, response_lengths, prompt_width, response_width, num_rows = LAYOUTS[layout]
    batch = padded_batch(prompt_lengths, response_lengths, prompt_width, response_width)
    response_mask = batch[3]
    packed_rows(num_rows)
    packed = assert_packed_equals_padded_and_unpadded(tiny_model, batch, response_lengths, response_width)
    assert torch.all(packed[response_mask == 0] == 0) and torch.all(packed[response_mask == 1] < 0)


def test_exactly_full_rows_have_no_padding_slot(padded_batch):
    prompt_lengths, response_lengths, prompt_width, response_width, num_rows = LAYOUTS["exactly_full_rows"]
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
    prompt_lengths, response_lengths, prompt_width, response_width, num_rows = LAYOUTS[layout]
    batch = padded_batch(prompt_lengths, response_lengths, prompt_width, response_width)
    packed_rows(num_rows)
    assert_packed_gradients_equal_padded(tiny_model, batch, response_width)
