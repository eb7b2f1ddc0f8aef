"""Gradient checkpointing and torch.compile change speed and memory, not results."""

import pytest
import torch

from hybridflow.models.log_probs import forward_log_probs
from hybridflow.models.lora import apply_lora
from hybridflow.models.training_options import apply_training_options, compile_model, enable_gradient_checkpointing


def _gradients(model, batch):
    input_ids, attention_mask, position_ids, response_mask = batch
    model.zero_grad()
    log_probs, _ = forward_log_probs(model, input_ids, attention_mask, position_ids, 4)
    (log_probs * response_mask).sum().backward()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model, padded_batch):
    batch = padded_batch([3, 5, 2], [4, 2, 3], 5, 4)
    tiny_model.train()
    expected = _gradients(tiny_model, batch)
    apply_training_options(tiny_model, gradient_checkpointing=True)
    assert tiny_model.is_gradient_checkpointing and not tiny_model.config.use_cache
    for got, want in zip(_gradients(tiny_model, batch), expected):
        torch.testing.assert_close(got, want)


def test_gradient_checkpointing_refused_by_a_model_without_support():
    with pytest.raises(ValueError, match="enable_gradient_checkpointing=False"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))


def test_compiled_model_keeps_names_and_results_across_lengths(tiny_model, padded_batch):
    short = padded_batch([3, 5], [4, 2], 5, 4)
    long = padded_batch([7, 2, 4], [4, 4, 1], 7, 4, seed=1)
    with torch.no_grad():
        expected = [forward_log_probs(tiny_model, *batch[:3], 4)[0] for batch in (short, long)]
    names = list(tiny_model.state_dict())
    # The "eager" backend runs dynamo's tracing without code generation, to keep the test fast.
    compiled = compile_model(tiny_model, backend="eager")
    assert compiled is tiny_model and list(compiled.state_dict()) == names
    with torch.no_grad():
        for batch, want in zip((short, long), expected):
            torch.testing.assert_close(forward_log_probs(compiled, *batch[:3], 4)[0], want, atol=1e-6, rtol=0)


def test_gradient_checkpointing_with_lora_gives_the_same_adapter_gradients(tiny_model, padded_batch):
    batch = padded_batch([3, 5, 2], [4, 2, 3], 5, 4)
    model = apply_lora(tiny_model, rank=4, alpha=8)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.01)
    expected = [g for g, p in zip(_gradients(model, batch), model.parameters()) if p.requires_grad]
    enable_gradient_checkpointing(model)
    got = [g for g, p in zip(_gradients(model, batch), model.parameters()) if p.requires_grad]
    assert len(got) == len(expected) > 0
    for got_grad, want in zip(got, expected):
        torch.testing.assert_close(got_grad, want)
