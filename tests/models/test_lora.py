"""LoRA: only adapters train; the reference policy is the base model with the adapter switched off."""

import copy

import pytest
import torch

from hybridflow.models.log_probs import forward_log_probs
from hybridflow.models.lora import (
    NotALoraModelError,
    adapter_disabled,
    add_lora_layers,
    apply_lora,
    lora_config,
    merge_lora,
    merged_state_dict,
)
from hybridflow.models.value_model import load_value_model


def _perturb_adapters(model, seed=0):
    """peft starts B at zero (a no-op adapter); give it weights so the adapter changes the output."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)


def _log_probs(model, batch):
    input_ids, attention_mask, position_ids, _ = batch
    with torch.no_grad():
        return forward_log_probs(model, input_ids, attention_mask, position_ids, 4)[0]


def test_only_adapter_weights_train(tiny_model, padded_batch):
    base_before = {name: p.detach().clone() for name, p in tiny_model.named_parameters()}
    model = apply_lora(tiny_model, rank=4, alpha=8)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert any("q_proj" in name for name in trainable) and not any("lm_head" in name for name in trainable)
    input_ids, attention_mask, position_ids, response_mask = padded_batch([3, 5], [4, 2], 5, 4)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    for _ in range(2):  # the first step moves only B (A's gradient is zero while B is zero)
        log_probs, _ = forward_log_probs(model, input_ids, attention_mask, position_ids, 4)
        (-(log_probs * response_mask).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    merged = merged_state_dict(model)
    changed = {name for name, before in base_before.items() if not torch.equal(merged[name], before)}
    assert changed and all(name.endswith("proj.weight") for name in changed)
    base_now = {name.replace(".base_layer", ""): p for name, p in model.get_base_model().named_parameters()}
    assert all(torch.equal(base_now[name], before) for name, before in base_before.items())


def test_reference_log_probs_with_adapter_disabled_equal_the_base_model(tiny_model_dir, tiny_model, padded_batch):
    from hybridflow.models.loading import load_causal_lm

    batch = padded_batch([3, 5, 1], [4, 2, 3], 5, 4)
    base_log_probs = _log_probs(load_causal_lm(tiny_model_dir).eval(), batch)
    model = apply_lora(tiny_model, rank=4, alpha=8)
    _perturb_adapters(model)
    with adapter_disabled(model) as reference:
        reference_log_probs = _log_probs(reference, batch)
    policy_log_probs = _log_probs(model, batch)
    torch.testing.assert_close(reference_log_probs, base_log_probs, atol=0, rtol=0)
    assert (policy_log_probs - base_log_probs).abs().max() > 1e-2


def test_merged_state_dict_matches_merge_and_unload_and_leaves_the_adapter(tiny_model, padded_batch):
    batch = padded_batch([3, 5], [4, 2], 5, 4)
    model = apply_lora(tiny_model, rank=4, alpha=16)
    _perturb_adapters(model)
    policy_log_probs = _log_probs(model, batch)
    merged = merged_state_dict(model)
    exported = merge_lora(copy.deepcopy(model)).state_dict()
    assert merged.keys() == exported.keys()
    for name, tensor in exported.items():
        torch.testing.assert_close(merged[name], tensor)
    torch.testing.assert_close(_log_probs(model, batch), policy_log_probs, atol=0, rtol=0)


def test_lora_on_a_critic_trains_the_value_head_in_full(tiny_model_dir):
    critic = apply_lora(load_value_model(tiny_model_dir), rank=2, alpha=4)
    trainable = {name for name, p in critic.named_parameters() if p.requires_grad}
    assert any("score" in name and "lora_" not in name for name in trainable)
    assert "score.weight" in merged_state_dict(critic)


def test_lora_operations_refuse_a_plain_model(tiny_model):
    with pytest.raises(NotALoraModelError, match="lora_rank"):
        with adapter_disabled(tiny_model):
            pass
    with pytest.raises(ValueError, match="rank=0"):
        apply_lora(tiny_model, rank=0, alpha=1)


def _adapted_layers(model):
    return {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A." in name}


@pytest.mark.parametrize(
    "exclude, kept_plain",
    [
        (["o_proj", "down_proj"], lambda layer: layer.endswith(("o_proj", "down_proj"))),
        (r".*layers\.0\..*", lambda layer: ".layers.0." in layer),
    ],
    ids=["names", "regex"],
)
def test_exclude_modules_keeps_the_matching_layers_without_an_adapter(tiny_model_dir, exclude, kept_plain):
    from hybridflow.models.loading import load_causal_lm

    everything = _adapted_layers(apply_lora(load_causal_lm(tiny_model_dir), rank=2, alpha=4))
    kept = _adapted_layers(apply_lora(load_causal_lm(tiny_model_dir), rank=2, alpha=4, exclude_modules=exclude))
    assert len(everything) == 14  # 2 layers x q k v o gate up down
    assert kept == {layer for layer in everything if not kept_plain(layer)} and kept != everything


@pytest.mark.parametrize("exclude", [["o_proj"], r".*o_proj"], ids=["names", "regex"])
def test_exclude_modules_on_a_critic_still_trains_the_value_head_in_full(tiny_model_dir, exclude):
    critic = apply_lora(load_value_model(tiny_model_dir), rank=2, alpha=4, exclude_modules=exclude)
    adapted = _adapted_layers(critic)
    assert adapted and not any(layer.endswith(("o_proj", "score")) for layer in adapted)
    assert any("score" in name and p.requires_grad for name, p in critic.named_parameters())


def test_a_plain_model_given_lora_layers_computes_what_the_adapter_model_computes(tiny_model_dir, padded_batch):
    from hybridflow.models.loading import load_causal_lm

    batch = padded_batch([3, 5], [4, 2], 5, 4)
    trained = apply_lora(load_causal_lm(tiny_model_dir).eval(), rank=4, alpha=8)
    _perturb_adapters(trained)
    copy_model = add_lora_layers(load_causal_lm(tiny_model_dir).eval(), lora_config(trained))
    assert type(copy_model).__name__ == "Qwen2ForCausalLM"
    targets = dict(copy_model.named_parameters())
    with torch.no_grad():
        for name, tensor in trained.named_parameters():
            if ".lora_" in name:
                targets[name.removeprefix("base_model.model.")].copy_(tensor)
    torch.testing.assert_close(_log_probs(copy_model, batch), _log_probs(trained, batch), atol=0, rtol=0)
