"""Remove padding: pack a padded batch's real tokens into one row, and scatter results back.

A batch arrives as a rectangle ``[B, L]`` (left-padded prompt + right-padded response). Packing keeps
only the tokens with ``attention_mask == 1`` and lays them end to end in one row ``[1, T]`` with
``position_ids`` restarting at 0 for each sample, so the model's linear layers cost ``T`` tokens instead
of ``B * L``. The model must keep the samples apart: with ``attention_mask=None``, ``use_cache=False``
and restarting ``position_ids``, transformers (>= 4.56) builds a block-diagonal causal mask for
"sdpa"/"eager" and uses variable-length kernels for "flash_attention_2". The sdpa mask is dense
``[T, T]``, so on CPU attention costs ``T**2`` rather than ``sum(len**2)``: keep ``T`` bounded with
token-budget micro-batches (``hybridflow.data.micro_batches``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedBatch:
    """The real tokens of a ``[B, L]`` batch laid end to end.

    ``input_ids`` and ``position_ids`` are ``[1, T]``; ``token_index`` ``[T]`` holds each packed token's
    flat index ``b * L + col`` in the rectangle; ``batch_size`` and ``seq_len`` are ``B`` and ``L``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    token_index: torch.Tensor
    batch_size: int
    seq_len: int

    @property
    def num_tokens(self) -> int:
        return self.token_index.numel()


def pack_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedBatch:
    """Pack ``input_ids [B, L]`` to one row of its real tokens (``attention_mask [B, L]`` is 1 on them).

    Positions count real tokens within each sample (0, 1, 2, ...), which equals the padded batch's
    ``position_ids = cumsum(attention_mask) - 1`` on every real token.
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must both be [B, L]"
        )
    batch_size, seq_len = input_ids.shape
    real = attention_mask.bool()
    positions = torch.cumsum(real.long(), dim=1) - 1
    token_index = real.flatten().nonzero(as_tuple=True)[0]
    return PackedBatch(
        input_ids=input_ids.flatten()[token_index].unsqueeze(0),
        position_ids=positions.flatten()[token_index].unsqueeze(0),
        token_index=token_index,
        batch_size=batch_size,
        seq_len=seq_len,
    )


def pack_values(values: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Take a ``[B, L, ...]`` tensor's entries at the packed tokens: ``[T, ...]``."""
    return values.flatten(0, 1)[packed.token_index]


def unpack(values: torch.Tensor, packed: PackedBatch, fill_value: float = 0.0) -> torch.Tensor:
    """Scatter per-token results ``[T, ...]`` back to the rectangle ``[B, L, ...]``; padding gets ``fill_value``.

    Differentiable: gradients flow from the rectangle back to ``values``.
    """
    if values.shape[0] != packed.num_tokens:
        raise ValueError(f"values has {values.shape[0]} rows but the packed batch has {packed.num_tokens} tokens")
    flat_shape = (packed.batch_size * packed.seq_len, *values.shape[1:])
    flat = values.new_full(flat_shape, fill_value).index_copy(0, packed.token_index, values)
    return flat.view(packed.batch_size, packed.seq_len, *values.shape[1:])
