"""The model families users bring (Llama, Qwen3, Gemma 3, Mistral, Seed-OSS, Qwen3 MoE), built tiny from their
transformers configs: each loads with its family's traits, its packed log-probs and gradients equal the padded and
the unpadded computation, sliding window included, and shared prompts fall back, saying so, where a sample outgrows
the window."""

import logging

import pytest
import torch
from transformers import AutoModelForCausalLM

from hybridflow.models import layouts
from hybridflow.models.layouts import choose_layout, sliding_window
from hybridflow.models.loading import load_causal_lm
from hybridflow.models.log_probs import forward_log_probs
from hybridflow.models.tiny import build_tiny_model
from tests.float_bounds import longest_reduction, model_output_bound
from tests.models.packing_checks import assert_packed_equals_padded_and_unpadded, assert_packed_gradients_equal_padded

# Per family: its model class, whether the LM head is the embedding, head_dim, sliding window.
TRAITS = {
    "llama": ("LlamaForCausalLM", False, 32, None),
    "qwen3": ("Qwen3ForCausalLM", True, 64, None),
    "gemma3": ("Gemma3ForCausalLM", True, 32, 8),
    "mistral": ("MistralForCausalLM", False, 32, 8),
    "seed_oss": ("SeedOssForCausalLM", False, 64, None),
    "qwen3_moe": ("Qwen3MoeForCausalLM", False, 64, None),
}
# A ragged batch whose samples (up to 13 tokens) outgrow the tiny models' window of 8.
PROMPT_LENGTHS, RESPONSE_LENGTHS, PROMPT_WIDTH, RESPONSE_WIDTH = [7, 3, 5, 1, 7], [6, 2, 4, 1, 0], 7, 6


@pytest.fixture
def family_model(family_model_dir):
    return load_causal_lm(family_model_dir).eval()


def test_each_family_loads_as_its_own_class_with_its_traits(model_family, family_model):
    class_name, tied, head_dim, window = TRAITS[model_family]
    assert type(family_model).__name__ == class_name
    assert (family_model.lm_head.weight is family_model.model.embed_tokens.weight) is tied
    assert family_model.model.layers[0].self_attn.q_proj.out_features == 4 * head_dim
    assert sliding_window(family_model.config) == window
    assert 50_000 < sum(p.numel() for p in family_model.parameters()) < 4_000_000


def test_an_unknown_family_is_refused_naming_the_known_ones(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"family='gpt2'.*\['gemma3', 'llama', 'mistral', 'qwen2', 'qwen3', 'qwen3_moe', 'qwen3_next', "
        r"'seed_oss'\]",
    ):
        build_tiny_model(tmp_path, family="gpt2")


@pytest.mark.parametrize("model_family", ["gemma3", "mistral"], indirect=True)
def test_the_sliding_window_changes_these_samples_log_probs(family_model_dir, family_model, padded_batch):
    """The control: the window bites on the batch below, so its packed = unpadded check covers the window."""
    batch = padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, PROMPT_WIDTH, RESPONSE_WIDTH)
    whole = AutoModelForCausalLM.from_pretrained(family_model_dir, sliding_window=1024).eval()
    with torch.no_grad():
        windowed, _ = forward_log_probs(family_model, *batch[:3], RESPONSE_WIDTH, use_remove_padding=False)
        unwindowed, _ = forward_log_probs(whole, *batch[:3], RESPONSE_WIDTH, use_remove_padding=False)
    assert (windowed - unwindowed).abs().max() > 1e-2


@pytest.mark.parametrize("num_rows", [1, 2])
def test_packed_log_probs_equal_padded_and_unpadded(family_model, padded_batch, packed_rows, num_rows):
    batch = padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, PROMPT_WIDTH, RESPONSE_WIDTH)
    packed_rows(num_rows)
    packed = assert_packed_equals_padded_and_unpadded(family_model, batch, RESPONSE_LENGTHS, RESPONSE_WIDTH)
    response_mask = batch[3]
    assert torch.all(packed[response_mask == 0] == 0) and torch.all(packed[response_mask == 1] < 0)


def test_packed_and_padded_gradients_agree(family_model, padded_batch, packed_rows):
    batch = padded_batch(PROMPT_LENGTHS, RESPONSE_LENGTHS, PROMPT_WIDTH, RESPONSE_WIDTH)
    packed_rows(2)
    assert_packed_gradients_equal_padded(family_model, batch, RESPONSE_WIDTH)


@pytest.mark.parametrize("response_lengths", [[2, 1, 3, 2], [6, 2, 4, 1]], ids=["within_window", "past_window"])
def test_shared_prompts_run_where_exact_and_otherwise_fall_back_saying_so(
    model_family, family_model, padded_batch, response_lengths, caplog, monkeypatch
):
    """Samples of 5-8 tokens fit the window of 8 and share their prompts; samples of up to 11 share only in the
    families without a window, and the others say so once per model type."""
    input_ids, attention_mask, position_ids, _ = padded_batch([5, 5, 5, 5], response_lengths, 5, 6)
    input_ids[1, :5], input_ids[3, :5] = input_ids[0, :5], input_ids[2, :5]  # two prompts, two samples each
    window = TRAITS[model_family][3]
    shares = window is None or int(attention_mask.sum(dim=1).max()) <= window
    monkeypatch.setattr(layouts, "_TOLD_WINDOW_TOO_SHORT", set())
    with caplog.at_level(logging.WARNING, logger=layouts.__name__):
        chosen = [choose_layout(family_model, input_ids, attention_mask, 6, True, False) for _ in range(2)]
    assert all(layout.share_prompts is shares for layout in chosen)
    told = [record.getMessage() for record in caplog.records]
    assert told == (
        []
        if shares
        else [
            f"{family_model.config.model_type}: samples longer than its sliding window "
            "(8 tokens; this batch has one of "
            "11) do not share prompts (use_prefix_grouper): one mask for all layers cannot hold the window; they run "
            "packed or padded"
        ]
    )
    batch = (input_ids, attention_mask, position_ids, 6)
    with torch.no_grad():
        shared, _ = forward_log_probs(family_model, *batch, share_prompts=True)
        padded, _ = forward_log_probs(family_model, *batch, use_remove_padding=False)
    num_terms = longest_reduction(family_model.config)
    torch.testing.assert_close(shared, padded, atol=model_output_bound(padded, num_terms), rtol=0)
