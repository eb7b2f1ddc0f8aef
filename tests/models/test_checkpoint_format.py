"""A model's tensors in its files' format, one tensor at a time: a Qwen3 MoE's stacked experts come out as the
files saved by ``save_pretrained`` hold them, name for name and value for value; a dense model's pass unchanged."""

import safetensors.torch
import torch

from hybridflow.models.checkpoint_format import CheckpointFormat
from hybridflow.models.loading import load_causal_lm, load_model_config
from hybridflow.models.tiny import build_tiny_model


def test_stacked_experts_come_out_as_the_files_hold_them(tmp_path):
    model_dir = build_tiny_model(tmp_path, family="qwen3_moe")
    model = load_causal_lm(model_dir)
    assert any(name.endswith("mlp.experts.gate_up_proj") for name, _ in model.named_parameters())
    in_files = safetensors.torch.load_file(model_dir / "model.safetensors")
    checkpoint_format = CheckpointFormat(load_model_config(model_dir))
    converted = dict(checkpoint_format((name, tensor.detach()) for name, tensor in model.named_parameters()))
    assert checkpoint_format.converts
    assert converted.keys() == in_files.keys()
    assert all(torch.equal(converted[name], tensor) for name, tensor in in_files.items())


def test_a_dense_models_tensors_pass_as_they_are(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    checkpoint_format = CheckpointFormat(load_model_config(tiny_model_dir))
    tensors = [(name, tensor.detach()) for name, tensor in model.named_parameters()]
    assert not checkpoint_format.converts
    assert all(a is b for (_, a), (_, b) in zip(checkpoint_format(tensors), tensors, strict=True))
