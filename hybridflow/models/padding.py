"""Remove padding: pack a padded batch's real tokens into rows, and scatter results back.

A batch arrives as a rectangle ``[B, L]`` (left-padded prompt + right-padded response). Packing keeps
only the tokens with ``attention_mask == 1`` and lays the samples end to end, ``position_ids``
restarting at 0 for each sample, so the model's linear layers cost the real tokens instead of ``B * L``.
The model must keep the samples apart: with ``attention_mask=None``, ``use_cache=False`` and restarting
``position_ids``, transformers (>= 4.56) builds a block-diagonal causal mask per row for "sdpa"/"eager"
and uses variable-length kernels for "flash_attention_*".

How many rows is decided per batch by ``pack_for_model``:

- a variable-length kernel (flash attention) costs ``sum(len**2)`` whatever the layout: one row;
- sdpa/eager build a dense ``[W, W]`` mask per row of width ``W`` and pay for every entry of it, so one
  row of all ``T`` tokens costs ``T**2`` (64 samples of ~63 tokens: about 2.5x the whole padded forward
  of a 4M model). There the samples are dealt into ``N`` rows, longest first onto the shortest row
  (a balanced partition), short rows padded to the longest; ``N`` is chosen to minimise the estimated
  cost ``N * W * (1 + W * pair_cost)`` (``attention_pair_cost``), and the padded rectangle runs as is
  when no packing is estimated at least ``MIN_PACKED_SAVING`` cheaper. Samples of similar length
  (prompts of 57-59 tokens with 16-token responses) thus run padded, ragged ones packed.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch

# Pack only when the estimate beats the padded rectangle by this share: the estimate tracked measured CPU
# time within about 10% (bench/bench_models.py), and the padded path needs no gather/scatter.
MIN_PACKED_SAVING = 0.05


@dataclass(frozen=True)
class PackedBatch:
    """The real tokens of a ``[B, L]`` batch laid end to end in ``N`` rows of width ``W``.

    ``input_ids`` and ``position_ids`` are ``[N, W]`` (the tail of a short row holds token 0 at
    position 0, each such slot a sequence of its own); ``token_index`` ``[T]`` holds each real token's
    flat index ``b * L + col`` in the rectangle (row-major order) and ``slot_index`` ``[T]`` the same
    token's flat index ``n * W + col`` in the packed rows; ``batch_size`` and ``seq_len`` are ``B`` and ``L``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    token_index: torch.Tensor
    slot_index: torch.Tensor
    batch_size: int
    seq_len: int

    @property
    def num_tokens(self) -> int:
        return self.token_index.numel()

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]


def balanced_rows(lengths: list[int], num_rows: int) -> list[list[int]]:
    """Deal sample indices into ``num_rows`` rows, longest sample first onto the currently shortest row.

    Graham's LPT rule: the longest row is at most 4/3 of the best possible (Graham 1969). Rows that get
    no sample are dropped.
    """
    rows: list[list[int]] = [[] for _ in range(num_rows)]
    loads = [(0, row) for row in range(num_rows)]
    for sample in sorted(range(len(lengths)), key=lambda index: -lengths[index]):
        load, row = heapq.heappop(loads)
        rows[row].append(sample)
        heapq.heappush(loads, (load + lengths[sample], row))
    return [members for members in rows if members]


def pack_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor, num_rows: int = 1) -> PackedBatch:
    """Pack ``input_ids [B, L]``'s real tokens (``attention_mask [B, L]`` is 1 on them) into rows.

    ``num_rows=1`` lays all ``T`` real tokens in one row; more rows are filled by ``balanced_rows``.
    Positions count real tokens within each sample (0, 1, 2, ...), which equals the padded batch's
    ``position_ids = cumsum(attention_mask) - 1`` on every real token.
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must both be [B, L]"
        )
    if num_rows < 1:
        raise ValueError(f"num_rows={num_rows} must be at least 1")
    lengths = attention_mask.bool().sum(dim=1).tolist()
    return pack_into_rows(input_ids, attention_mask, balanced_rows(lengths, num_rows))


def pack_into_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: list[list[int]]) -> PackedBatch:
    """Pack the samples listed in each of ``rows`` (sample indices, in order) end to end into that row."""
    batch_size, seq_len = input_ids.shape
    real = attention_mask.bool()
    lengths = real.sum(dim=1).tolist()
    row_of, start_of = [0] * batch_size, [0] * batch_size
    width = 0
    for row, members in enumerate(rows):
        start = 0
        for sample in members:
            row_of[sample], start_of[sample] = row, start
            start += lengths[sample]
        width = max(width, start)
    positions = torch.cumsum(real.long(), dim=1) - 1
    token_index = real.flatten().nonzero(as_tuple=True)[0]
    sample = token_index // seq_len
    real_positions = positions.flatten()[token_index]
    device = input_ids.device
    slot_index = (
        torch.tensor(row_of, device=device)[sample] * width + torch.tensor(start_of, device=device)[sample]
    ) + real_positions
    flat_shape = (len(rows) * width,)
    packed_ids = input_ids.new_zeros(flat_shape).index_copy(0, slot_index, input_ids.flatten()[token_index])
    packed_positions = positions.new_zeros(flat_shape).index_copy(0, slot_index, real_positions)
    return PackedBatch(
        input_ids=packed_ids.view(len(rows), width),
        position_ids=packed_positions.view(len(rows), width),
        token_index=token_index,
        slot_index=slot_index,
        batch_size=batch_size,
        seq_len=seq_len,
    )


def uses_varlen_attention(model: torch.nn.Module) -> bool:
    """Whether ``model`` attends with a variable-length kernel (flash attention), read from its config."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    return "flash" in implementation


def attention_pair_cost(config) -> float:
    """FLOPs of one (query, key) pair in a dense-masked attention layer, per FLOP of one token's linear layers.

    Linear layers per token: q/o projections ``2 * H * heads * head_dim``, k/v ``2 * H * kv_heads * head_dim``
    and a gated MLP ``3 * H * intermediate``; a pair costs ``2 * heads * head_dim`` (scores and values).
    Layers, embeddings and the vocabulary projection are the same in every layout and cancel out.
    """
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    linear = 2 * hidden * (heads + kv_heads) * head_dim + 3 * hidden * intermediate
    return 2 * heads * head_dim / linear


def layout_cost(num_rows: int, width: int, pair_cost: float) -> float:
    """Estimated cost of running ``[num_rows, width]`` with a dense mask, in token-linear-layer units."""
    return num_rows * width * (1 + width * pair_cost)


def cheapest_rows(lengths: list[int], padded_width: int, pair_cost: float) -> list[list[int]] | None:
    """The ``balanced_rows`` layout of lowest ``layout_cost``, or None unless it beats ``[B, padded_width]``
    by ``MIN_PACKED_SAVING``.

    Branch and bound over the row count ``N``: no layout is narrower than the longest sample nor than
    ``ceil(T / N)``, so the search walks away from ``N = ceil(T / longest)`` until that bound loses.
    """
    total, longest = sum(lengths), max(lengths, default=0)
    if total == 0:
        return None
    best_rows = None
    best_cost = (1 - MIN_PACKED_SAVING) * layout_cost(len(lengths), padded_width, pair_cost)
    start = math.ceil(total / longest)
    for direction in (range(start, len(lengths) + 1), range(start - 1, 0, -1)):
        for num_rows in direction:
            bound = layout_cost(num_rows, max(longest, math.ceil(total / num_rows)), pair_cost)
            if bound >= best_cost:
                break
            rows = balanced_rows(lengths, num_rows)
            width = max(sum(lengths[sample] for sample in members) for members in rows)
            cost = layout_cost(len(rows), width, pair_cost)
            if cost < best_cost:
                best_rows, best_cost = rows, cost
    return best_rows


def pack_for_model(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedBatch | None:
    """The packing cheapest for ``model``'s attention kernel, or None to run the padded rectangle.

    Flash attention: one row. Otherwise the ``cheapest_rows`` layout for the model's ``attention_pair_cost``.
    """
    if uses_varlen_attention(model):
        return pack_padded(input_ids, attention_mask)
    lengths = attention_mask.bool().sum(dim=1).tolist()
    rows = cheapest_rows(lengths, input_ids.shape[1], attention_pair_cost(model.config))
    return None if rows is None else pack_into_rows(input_ids, attention_mask, rows)


def pack_values(values: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Take a ``[B, L, ...]`` tensor's entries at the packed tokens: ``[T, ...]``."""
    return values.flatten(0, 1)[packed.token_index]


def packed_outputs(outputs: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Take the model's ``[N, W, ...]`` outputs at the real tokens: ``[T, ...]``, aligned with ``pack_values``."""
    return outputs.flatten(0, 1)[packed.slot_index]


def unpack(values: torch.Tensor, packed: PackedBatch, fill_value: float = 0.0) -> torch.Tensor:
    """Scatter per-token results ``[T, ...]`` back to the rectangle ``[B, L, ...]``; padding gets ``fill_value``.

    Differentiable: gradients flow from the rectangle back to ``values``.
    """
    if values.shape[0] != packed.num_tokens:
        raise ValueError(f"values has {values.shape[0]} rows but the packed batch has {packed.num_tokens} tokens")
    flat_shape = (packed.batch_size * packed.seq_len, *values.shape[1:])
    flat = values.new_full(flat_shape, fill_value).index_copy(0, packed.token_index, values)
    return flat.view(packed.batch_size, packed.seq_len, *values.shape[1:])
