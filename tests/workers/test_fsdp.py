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
from hybridflow.workers.training import hand_over_gradients

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


@pytest.mark.parametrize(
    ("param_dtype", "reduce_dtype"), [("float32", "float32"), ("bfloat16", "float32"), ("bfloat16", "bfloat16")]
)
def test_one_rank_hands_over_the_summed_gradients_fsdp2_would_reduce(tiny_model_dir, param_dtype, reduce_dtype):
    precision = MixedPrecisionConfig(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    reduced, handed_over = (
        shard_model(load_causal_lm(tiny_model_dir), build_device_mesh(-1, CPU), FSDPConfig(mixed_precision=precision))
        for _ in range(2)
    )
    hand_over_gradients(handed_over)  # before any forward (a rank whose mini-batch was empty): nothing to take
    assert all(param.grad is None for param in handed_over.parameters())
    micro_batches = torch.randint(0, 50, (3, 2, 5), generator=torch.Generator().manual_seed(0))
    for index, input_ids in enumerate(micro_batches):
        reduced.set_requires_gradient_sync(index == len(micro_batches) - 1)
        handed_over.set_requires_gradient_sync(False)
        for model in (reduced, handed_over):
            model(input_ids=input_ids).logits.float().logsumexp(-1).mean().backward()
    assert all(param.grad is None for param in handed_over.parameters())
    hand_over_gradients(handed_over)
    for (name, expected), actual in zip(reduced.named_parameters(), handed_over.parameters()):
        assert actual.grad.dtype == torch.float32 and actual.grad.placements == expected.grad.placements, name
        assert torch.equal(actual.grad.to_local(), expected.grad.to_local()), name
    # Taken over, not copied: a second hand-over finds nothing left on the unsharded parameters.
    grads = [param.grad for param in handed_over.parameters()]
    hand_over_gradients(handed_over)
    assert all(param.grad is grad for param, grad in zip(handed_over.parameters(), grads))
