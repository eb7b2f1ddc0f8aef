"""FSDP2 sharding of the workers' models and gathering their full weights."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from hybridflow.models.loading import load_causal_lm
from hybridflow.models.lora import apply_lora, merged_state_dict
from hybridflow.workers.config import FSDPConfig, MixedPrecisionConfig
from hybridflow.workers.fsdp import build_device_mesh, iter_full_parameters, iter_hf_weights, shard_model

pytestmark = pytest.mark.usefixtures("process_group")

CPU = torch.device("cpu")


def test_every_decoder_layer_and_the_root_are_sharded_and_gather_back_exactly(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    original = {name: tensor.clone() for name, tensor in model.named_parameters()}
    shard_model(model, build_device_mesh(-1, CPU), FSDPConfig())
    assert isinstance(model, FSDPModule)
    assert all(isinstance(layer, FSDPModule) for layer in model.model.layers)
    assert all(isinstance(param, DTensor) for param in model.parameters())
    gathered = dict(iter_full_parameters(model))
    assert gathered.keys() == original.keys()  # the tied lm_head appears once, as in named_parameters
    for name, tensor in gathered.items():
        assert torch.equal(tensor, original[name]), name


def test_lora_weights_are_merged_under_the_base_names(tiny_model_dir):
    model = apply_lora(load_causal_lm(tiny_model_dir), rank=4, alpha=8)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(generator=torch.Generator().manual_seed(len(name)))
    expected = merged_state_dict(copy.deepcopy(model))
    shard_model(model, build_device_mesh(-1, CPU), FSDPConfig())
    merged = dict(iter_hf_weights(model))
    assert merged.keys() == {name for name, _ in load_causal_lm(tiny_model_dir).named_parameters()}
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=1e-6, msg=name)


def test_bf16_mixed_precision_computes_in_bf16_and_keeps_float32_shards(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    precision = MixedPrecisionConfig(param_dtype="bfloat16", reduce_dtype="float32")
    shard_model(model, build_device_mesh(-1, CPU), FSDPConfig(mixed_precision=precision))
    logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert logits.dtype == torch.bfloat16
    logits.float().sum().backward()
    assert all(param.dtype == torch.float32 and param.grad.dtype == torch.float32 for param in model.parameters())
