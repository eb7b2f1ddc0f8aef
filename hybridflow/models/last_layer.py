"""The last decoder layer computed only where its output is read.

A log-prob forward projects to the vocabulary only at the positions that predict response tokens
(``logits_to_keep``). Every other position's last-layer output is never read, and in that layer each position
feeds the others only through its keys and values: its query projection, attention output projection and MLP
are work for nothing. With a shared prompt (``shared_prompts``) those positions are the prompt's, about half the
row on GRPO batches: in a 4-layer model this skips about a tenth of the update's matmuls. Exact: the kept
positions compute what they compute without it (same inputs, same position-wise ops).

``kept_positions_only`` runs the layer's ``q_proj``, ``o_proj`` and ``mlp`` on the kept positions alone and leaves
zeros elsewhere (a query of zeros attends uniformly; its output is then dropped by ``o_proj``'s zeros).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

# The position-wise parts of a decoder layer that only its own position reads (Llama, Qwen2/3, Mistral, Gemma).
POSITION_WISE = ("self_attn.q_proj", "self_attn.o_proj", "mlp")


def last_decoder_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The last layer of a transformers causal LM's decoder stack (through peft wrappers), or None."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        return None
    return layers[-1]


@contextmanager
def kept_positions_only(model: torch.nn.Module, keep: torch.Tensor) -> Iterator[None]:
    """Within the block, the last decoder layer's position-wise parts run at ``keep``'s True positions only.

    ``keep`` ``[rows, seq]`` bool is the ``logits_to_keep`` mask of the forward. Nothing changes for models
    whose last layer lacks those parts, or under gradient checkpointing (its recomputation in the backward
    runs after the block).
    """
    layer = last_decoder_layer(model)
    parts = [_submodule(layer, name) for name in POSITION_WISE] if layer is not None else []
    if not parts or any(part is None for part in parts) or getattr(model, "is_gradient_checkpointing", False):
        yield
        return
    flat_keep = keep.reshape(-1)
    index = flat_keep.nonzero().squeeze(1)
    for part in parts:
        part.forward = _at_positions(part.forward, index, flat_keep.numel())
    try:
        yield
    finally:
        for part in parts:
            del part.forward


def _submodule(module: torch.nn.Module, dotted: str) -> torch.nn.Module | None:
    for name in dotted.split("."):
        module = getattr(module, name, None)
        if not isinstance(module, torch.nn.Module):
            return None
    return module


def _at_positions(forward, index: torch.Tensor, positions: int):
    """``forward`` of a position-wise module applied to ``index``'s rows of its flattened input, zeros elsewhere."""

    def run(hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        flat = hidden.reshape(positions, hidden.shape[-1])
        kept = forward(flat.index_select(0, index), *args, **kwargs)
        out = kept.new_zeros(positions, kept.shape[-1]).index_copy(0, index, kept)
        return out.view(*hidden.shape[:-1], kept.shape[-1])

    return run
