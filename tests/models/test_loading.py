"""Loading models and tokenizers from a folder: dtype and attention from config, clear errors."""

import pytest
import torch
from transformers import AutoTokenizer

from hybridflow.models.loading import ModelLoadError, load_causal_lm, load_model_config, load_tokenizer, resolve_dtype


def test_load_causal_lm_applies_dtype_and_attention(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir, dtype="bf16", attn_implementation="eager")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.config._attn_implementation == "eager"
    assert load_causal_lm(str(tiny_model_dir)).config._attn_implementation == "sdpa"


def test_load_tokenizer_and_config(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir, padding_side="left")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == 256
    assert load_model_config(tiny_model_dir).vocab_size == len(tokenizer)


def test_tokenizer_without_pad_token_pads_with_eos(tiny_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenizer.pad_token = None
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    assert load_tokenizer(tmp_path).pad_token == "<|im_end|>"


def test_missing_folder_and_folder_without_config_name_the_path(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_causal_lm(tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match=f"{tmp_path}.*no config.json"):
        load_causal_lm(tmp_path)


def test_unknown_hub_id_offline_raises_model_load_error():
    with pytest.raises(ModelLoadError, match="no-such-org/no-such-model"):
        load_causal_lm("no-such-org/no-such-model")


def test_unknown_dtype_lists_the_choices():
    with pytest.raises(ModelLoadError, match="dtype='float8'.*bfloat16"):
        resolve_dtype("float8")
    assert resolve_dtype(torch.float16) is torch.float16
