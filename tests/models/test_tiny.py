"""The tiny model and tokenizer load offline, round-trip text and render the Qwen-style chat template."""

import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_special_tokens_have_qwen_roles(tokenizer):
    assert len(tokenizer) == 263
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == 256
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 258
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") == 257


def test_ascii_is_one_token_per_character_and_any_text_round_trips(tokenizer):
    arithmetic = "(12+3)*4-5/6=51\nSort: b a C"
    assert len(tokenizer(arithmetic)["input_ids"]) == len(arithmetic)
    text = "naïve café: 3 × 4 = 12 ✓"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_tool_tags_are_single_tokens_kept_when_skipping_special_tokens(tokenizer):
    text = "<tool_call>\n{}\n</tool_call><tool_response>1</tool_response><|im_end|>"
    ids = tokenizer(text)["input_ids"]
    assert ids == [259, ord("\n"), ord("{"), ord("}"), ord("\n"), 260, 261, ord("1"), 262, 258]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text.replace("<|im_end|>", "")


def test_chat_template_is_chatml_with_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    no_system = tokenizer.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=False)
    assert no_system == "<|im_start|>user\n2+3?<|im_end|>\n"


def test_chat_template_renders_tools_calls_and_responses_hermes_style(tokenizer):
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    messages = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc", "arguments": {"e": "2+3"}}}]},
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "ok"},
        {"role": "assistant", "content": "5"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '<tools>\n{"type": "function", "function": {"name": "calc"' in text
    call = '<tool_call>\n{"name": "calc", "arguments": {"e": "2+3"}}\n</tool_call>'
    assert f"<|im_start|>assistant\n{call}<|im_end|>\n" in text
    # Consecutive tool results share one user turn, as in Qwen2.5.
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n5<|im_end|>\n")


def test_same_seed_same_weights_and_caller_rng_untouched(tmp_path):
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    started = time.process_time()  # CPU time: the machine is shared, wall time is not ours
    first = build_tiny_model(tmp_path / "a", seed=7)
    assert time.process_time() - started < 2.0
    assert torch.equal(torch.rand(3), expected_draw)
    second = build_tiny_model(tmp_path / "b", seed=7)
    other = build_tiny_model(tmp_path / "c", seed=8)
    weights = [AutoModelForCausalLM.from_pretrained(path).state_dict() for path in (first, second, other)]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])
    assert not torch.equal(weights[0]["model.embed_tokens.weight"], weights[2]["model.embed_tokens.weight"])


def test_model_is_a_small_tied_qwen2_with_generation_ids(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 4_000_000
    assert (model.config.eos_token_id, model.config.pad_token_id) == (258, 256)
    assert (model.generation_config.eos_token_id, model.generation_config.pad_token_id) == (258, 256)
    assert (tiny_model_dir / "model.safetensors").is_file()


def test_size_keywords_build_a_larger_model(tmp_path):
    path = build_tiny_model(tmp_path, hidden_size=64, num_hidden_layers=3, intermediate_size=128)
    config = AutoModelForCausalLM.from_pretrained(path).config
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (64, 3, 128)
