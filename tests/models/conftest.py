"""Fixtures for the model tests: one torch thread, a freshly loaded tiny model, padded batches and a forced
packing (the unpadded reference log-probs are in packing_checks.py)."""

import pytest
import torch

from hybridflow.models import layouts
from hybridflow.models.loading import load_causal_lm


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tests share two cores with other processes; one thread avoids spin-waiting."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tiny_model(tiny_model_dir):
    """The tiny causal LM, loaded anew for each test (LoRA and training modify it in place)."""
    return load_causal_lm(tiny_model_dir).eval()


@pytest.fixture
def padded_batch():
    """``padded_batch(prompt_lengths, response_lengths, prompt_width, response_width)``: see make_padded_batch."""
    return make_padded_batch


def make_padded_batch(prompt_lengths, response_lengths, prompt_width, response_width, pad_id=256, seed=0):
    """Random tokens as a rollout batch: left-padded prompts, right-padded responses.

    Returns ``input_ids``, ``attention_mask``, ``position_ids`` (each ``[B, P + R]``), ``response_mask``
    ``[B, R]``.
    """
    generator = torch.Generator().manual_seed(seed)
    batch_size = len(prompt_lengths)
    input_ids = torch.randint(0, 256, (batch_size, prompt_width + response_width), generator=generator)
    attention_mask = torch.zeros_like(input_ids)
    for row, (prompt_length, response_length) in enumerate(zip(prompt_lengths, response_lengths)):
        attention_mask[row, prompt_width - prompt_length : prompt_width + response_length] = 1
    input_ids = input_ids.masked_fill(attention_mask == 0, pad_id)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    response_mask = attention_mask[:, prompt_width:]
    return input_ids, attention_mask, position_ids, response_mask


@pytest.fixture
def packed_rows(monkeypatch):
    """``packed_rows(n)``: make the packing chosen for a batch its ``n`` balanced rows."""

    def use(num_rows):
        monkeypatch.setattr(
            layouts, "cheapest_rows", lambda lengths, width, pair_cost: layouts.balanced_rows(lengths, num_rows)
        )

    return use
