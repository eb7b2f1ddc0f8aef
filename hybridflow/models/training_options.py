"""Speed and memory switches for a model that trains: gradient checkpointing and torch.compile."""

from __future__ import annotations

import torch


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass instead of storing them.

    Uses the non-reentrant checkpoint, which works with frozen inputs (LoRA) and FSDP2. Turns the KV
    cache off, which training never uses.
    """
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"{type(model).__name__} does not support gradient checkpointing: set enable_gradient_checkpointing=False"
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False


def compile_model(model: torch.nn.Module, backend: str = "inductor", dynamic: bool = True) -> torch.nn.Module:
    """Compile ``model``'s forward in place with torch.compile and return it.

    In place (``nn.Module.compile``), so parameter names and the state dict keep their names and the
    model can still be sharded or wrapped. ``dynamic`` avoids a recompile for every new sequence length.
    """
    model.compile(backend=backend, dynamic=dynamic)
    return model


def apply_training_options(
    model: torch.nn.Module, gradient_checkpointing: bool = False, use_torch_compile: bool = False
) -> torch.nn.Module:
    """Apply the config's ``enable_gradient_checkpointing`` and ``use_torch_compile`` switches."""
    if gradient_checkpointing:
        enable_gradient_checkpointing(model)
    if use_torch_compile:
        compile_model(model)
    return model
