"""Ulysses over Qwen3-Next's linear attention (a gated delta rule, arXiv 2412.06464), as over attention: an
all-to-all gives each rank of the group every column of ``1/k`` of the layer's heads, the causal convolution and
the rule run over the whole row for those heads, and a second all-to-all returns the rank's slice of the columns
(DeepSpeed-Ulysses, arXiv 2309.14509).

The rule's state is per value head and its convolution per channel, so a rank holding whole rows of some heads
computes them exactly as one rank would; nothing passes from one rank's columns to the next. verl splits the
sequence instead (context parallelism with flash-linear-attention's kernels, each rank's final state handed to
the next), which needs those GPU kernels. The exchanged tensors are the layer's input projections, grouped by key
head as Qwen3-Next lays them out, so ``k`` must divide ``linear_num_key_heads``.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hybridflow.distributed.sequence_parallel import SequenceParallelGroup, heads_to_sequence, sequence_to_heads

# The model types whose linear-attention layers split this way (the layout of ``in_proj_qkvz`` by key head).
SPLIT_MODEL_TYPES = ("qwen3_next",)


@dataclass(frozen=True)
class _Split:
    group: SequenceParallelGroup
    padding: torch.Tensor | None  # [N, S] this rank's columns, 0 where padding; None: no padding
    config: object  # the model's config: an id is only unique while its object lives


# The last split of each model, by id of its config (which its layers share), as for attention.
_splits: dict[int, _Split] = {}


def split_linear_attention(model: torch.nn.Module, group: SequenceParallelGroup, padding: torch.Tensor | None) -> None:
    """From now on ``model``'s linear-attention layers run their heads across ``group``; ``padding``: this rank's
    columns of the rows' ``[N, W]`` mask, whose zeros the layers zero first (as transformers does, so that left
    padding adds nothing to the state). Like the attention switch, it stays for the backward's recomputation."""
    config = model.config
    previous = _splits.get(id(config))
    if previous is None or previous.config is not config:  # the model's layers are switched once
        for module in model.modules():
            if hasattr(module, "in_proj_qkvz"):
                module.forward = functools.partial(_forward_across, module, id(config))
    _splits[id(config)] = _Split(group, padding, config)


def _forward_across(
    module: torch.nn.Module, config_id: int, hidden_states: torch.Tensor, cache=None, attention_mask=None, **_
):
    """The layer's forward for this rank's ``[N, S, hidden]`` slice. Under Ulysses the model runs with no cache and
    no mask of its own (the split's ``padding`` serves); the other keywords are attention's."""
    if cache is not None or attention_mask is not None:
        raise RuntimeError("a linear-attention layer split across ranks takes neither a cache nor a mask of its own")
    split = _splits[config_id]
    group, kernels = split.group, sys.modules[type(module).__module__]
    hidden_states = kernels.apply_mask_to_padding_states(hidden_states, split.padding)
    heads = _LocalHeads(module, group.size)
    query, key, value, z, b, a = type(module).fix_query_key_value_ordering(
        heads,
        _columns_to_heads(module.in_proj_qkvz(hidden_states), module.num_k_heads, group),
        _columns_to_heads(module.in_proj_ba(hidden_states), module.num_k_heads, group),
    )
    mixed = torch.cat([query.flatten(2), key.flatten(2), value.flatten(2)], dim=-1).transpose(1, 2)
    channels = heads.conv_channels(group.rank)
    bias = module.conv1d.bias[channels] if module.conv1d.bias is not None else None
    mixed = kernels.causal_conv1d_fn(mixed, module.conv1d.weight.squeeze(1)[channels], bias, module.activation)
    local_key_dim, local_value_dim = heads.num_k_heads * heads.head_k_dim, heads.num_v_heads * heads.head_v_dim
    query, key, value = torch.split(mixed.transpose(1, 2), [local_key_dim, local_key_dim, local_value_dim], dim=-1)
    rows, columns = query.shape[:2]
    value_heads = slice(group.rank * heads.num_v_heads, (group.rank + 1) * heads.num_v_heads)
    # As transformers computes the decay: in float32, whatever the model's dtype.
    g = -module.A_log[value_heads].float().exp() * F.softplus(a.float() + module.dt_bias[value_heads])
    output, _ = kernels.torch_chunk_gated_delta_rule(
        query.reshape(rows, columns, -1, heads.head_k_dim),
        key.reshape(rows, columns, -1, heads.head_k_dim),
        value.reshape(rows, columns, -1, heads.head_v_dim),
        g=g,
        beta=b.sigmoid(),
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=True,
    )
    output = module.norm(output.reshape(-1, heads.head_v_dim), z.reshape(-1, heads.head_v_dim))
    output = heads_to_sequence(output.view(rows, columns, heads.num_v_heads, heads.head_v_dim), group)
    return module.out_proj(output.flatten(2))


def _columns_to_heads(projected: torch.Tensor, num_key_heads: int, group: SequenceParallelGroup) -> torch.Tensor:
    """``[N, S, num_key_heads * D]`` (this rank's columns, every key head's group of channels) -> ``[N, k*S,
    num_key_heads/k * D]`` (every column, this rank's key heads)."""
    rows, columns, _ = projected.shape
    by_head = projected.view(rows, columns, num_key_heads, -1).transpose(1, 2)
    return sequence_to_heads(by_head, group).transpose(1, 2).flatten(2)


class _LocalHeads:
    """The layer seen with ``1/k`` of its key and value heads: what ``fix_query_key_value_ordering`` reads."""

    def __init__(self, module: torch.nn.Module, size: int):
        self._module = module
        self.num_k_heads = module.num_k_heads // size
        self.num_v_heads = module.num_v_heads // size

    def __getattr__(self, name: str):
        return getattr(self._module, name)

    def conv_channels(self, rank: int) -> torch.Tensor:
        """The convolution's channels of this rank's heads: its queries, keys and values among all heads'."""
        key_dim, value_dim = self.num_k_heads * self.head_k_dim, self.num_v_heads * self.head_v_dim
        starts = (rank * key_dim, self.key_dim + rank * key_dim, 2 * self.key_dim + rank * value_dim)
        widths = (key_dim, key_dim, value_dim)
        device = self._module.conv1d.weight.device
        return torch.cat([torch.arange(start, start + width, device=device) for start, width in zip(starts, widths)])
