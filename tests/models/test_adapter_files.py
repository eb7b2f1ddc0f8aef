"""Saved LoRA adapter folders are read without peft, and what is not one is named."""

import json

import pytest

from hybridflow.models.adapter_files import LoraAdapterError, read_adapter_config


def test_read_adapter_config_refuses_what_is_not_a_saved_lora_adapter(tiny_model_dir, tmp_path):
    from hybridflow.models.loading import load_causal_lm
    from hybridflow.models.lora import apply_lora

    with pytest.raises(LoraAdapterError, match="no adapter_config.json"):
        read_adapter_config(tmp_path)
    apply_lora(load_causal_lm(tiny_model_dir), rank=2, alpha=4).peft_config["default"].save_pretrained(tmp_path)
    with pytest.raises(LoraAdapterError, match="no adapter_model.safetensors"):
        read_adapter_config(tmp_path)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    assert read_adapter_config(tmp_path)["r"] == 2


def test_an_adapter_of_another_peft_method_is_refused(saved_adapter, tmp_path):
    config = json.loads((saved_adapter / "adapter_config.json").read_text())
    (tmp_path / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "IA3"}))
    (tmp_path / "adapter_model.safetensors").write_bytes(b"")
    with pytest.raises(LoraAdapterError, match="is a 'IA3' adapter; only LoRA adapters load"):
        read_adapter_config(tmp_path)
