"""A transformers decoder run with Ulysses sequence parallelism: each rank of a group of ``k`` runs ``1/k`` of
every row's columns (DeepSpeed-Ulysses, arXiv 2309.14509; verl's ``ulysses_sequence_parallel_size``).

The rows are those of any layout (:mod:`hybridflow.models.layouts`): padded, packed or shared prompts. Every
rank of the group holds the whole rows; :class:`SequenceSplit` pads their width to a multiple of ``k`` and
gives rank ``r`` the ``r``-th slice. The embeddings, the rotary positions (from the slice's own position ids),
the projections, the MLPs and the head run on the slice alone; inside attention, an all-to-all gives each rank
every column of ``1/k`` of the heads, attention runs over the whole row under the row's full mask, and a second
all-to-all returns the slice (:mod:`hybridflow.distributed.sequence_parallel`). ``k`` must divide the attention
heads; where it does not divide the key-value heads (grouped-query attention with few of them) each query head
gets its own copy of its key-value head before the exchange, as verl repeats them. Activations, attention's
included, shrink to about ``1/k`` per rank. Rows that are each one causal sequence (a long answer alone in its
row) need no mask; other rows carry one ``[rows, W, W]`` mask per rank, whole, made once per call (a float one,
since the attention functions would otherwise convert a boolean one anew in every layer and keep each copy).

The mask is built once per call from what the layout gave the model: a 4-D mask as it is (shared prompts), the
padded rows' causal mask over their real tokens, or, for packed rows, one causal block per sample (a sample
starts where the position ids do not continue), with sliding windows applied per layer as the columns'
distance. Padding columns added for the split see only themselves. The attention itself is the model's own
``eager`` or ``sdpa`` function, given that mask; a model loaded with a flash-attention kernel runs ``sdpa``
here (those kernels take no dense mask).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from hybridflow.distributed.sequence_parallel import (
    SequenceParallelGroup,
    gather_slices,
    heads_to_sequence,
    sequence_to_heads,
)
from hybridflow.models.sequence_parallel_recurrent import split_linear_attention

ULYSSES_ATTENTION = "hybridflow_ulysses"


@dataclass
class _Call:
    group: SequenceParallelGroup
    mask: torch.Tensor | None  # [N, 1, W, W] bool, True: may attend; None: each row causal from its first column
    width: int  # W, the padded rows' width
    device: torch.device
    attention: Callable
    additive_mask: bool  # eager attention adds a mask to its scores and applies no causal one of its own
    implementation: str  # the model's own attention implementation
    config: object  # the model's config: an id is only unique while its object lives
    layer_masks: dict = field(default_factory=dict)

    def layer_mask(self, window: int | None, dtype: torch.dtype) -> torch.Tensor | None:
        """The mask a layer with sliding ``window`` (None: none) attends under, made once per call: None where
        the attention's own causal mask serves, else additive (0 or the dtype's lowest), which the attention
        functions use as given (a boolean one sdpa would turn into a float copy per layer, each kept for the
        backward)."""
        window = window if window and window < self.width else None
        if self.mask is None and window is None and not self.additive_mask:
            return None
        if (window, dtype) not in self.layer_masks:
            columns = torch.arange(self.width, device=self.device)
            mask = self.mask if self.mask is not None else (columns[None, :] <= columns[:, None])[None, None]
            if window is not None:
                mask = mask & (columns[:, None] - columns[None, :] < window)
            additive = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
            self.layer_masks[window, dtype] = additive.masked_fill_(~mask, torch.finfo(dtype).min)
        return self.layer_masks[window, dtype]


# The last call of each model switched to Ulysses attention, by id of its config (which its layers share).
_calls: dict[int, _Call] = {}


def _ulysses_attention(module, query, key, value, attention_mask, **kwargs):
    """The attention of a decoder layer under :func:`attend_across`: ``[N, H, S, D]`` slices in, the
    layer's attention output ``[N, S, H, D]`` out."""
    call = _calls[id(module.config)]
    mask = call.layer_mask(kwargs.get("sliding_window"), query.dtype)
    group = call.group
    if key.shape[1] % group.size:
        # Fewer key-value heads than the group splits: give every query head its own copy first.
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
        module = _OneQueryPerKeyValueHead(module)
    output, _ = call.attention(
        module,
        sequence_to_heads(query, group),
        sequence_to_heads(key, group),
        sequence_to_heads(value, group),
        mask,
        **kwargs,
    )
    return heads_to_sequence(output, group), None


class _OneQueryPerKeyValueHead:
    """An attention module seen by the attention functions with one query head per key-value head."""

    num_key_value_groups = 1

    def __init__(self, module: torch.nn.Module):
        self._module = module

    def __getattr__(self, name: str):
        return getattr(self._module, name)


AttentionInterface.register(ULYSSES_ATTENTION, _ulysses_attention)


def _own_attention(model: torch.nn.Module, implementation: str) -> tuple[Callable, bool]:
    """The function the model's layers would call with a dense mask, and whether it adds the mask."""
    if implementation == "eager":
        decoder_layer = next(module for module in model.modules() if hasattr(module, "self_attn"))
        return _modeling_module(decoder_layer).eager_attention_forward, True
    return sdpa_attention_forward, False


def _modeling_module(module: torch.nn.Module):
    """The module that defines ``module``'s model class (FSDP2 gives a sharded layer a class of torch's own)."""
    defining = next(cls for cls in type(module).__mro__ if not cls.__module__.startswith("torch."))
    return sys.modules[defining.__module__]


def attend_across(
    model: torch.nn.Module, group: SequenceParallelGroup, mask: torch.Tensor | None, width: int, device: torch.device
) -> None:
    """From now on ``model``'s attention layers exchange their slices over ``group`` and attend under ``mask``
    (``[N, 1, W, W]`` bool over the whole rows of ``width`` columns; None: each row causal from its first
    column); the model builds no mask of its own.

    The switch stays until the next call replaces the mask: gradient checkpointing recomputes the layers in the
    backward, after the forward has returned, and must attend as the forward did. A model switched once always
    runs this way, which is what its part does (every pass of a Ulysses role is split).
    """
    config = model.config
    previous = _calls.get(id(config))
    implementation = previous.implementation if previous and previous.config is config else config._attn_implementation
    attention, additive = _own_attention(model, implementation)
    _calls[id(config)] = _Call(group, mask, width, device, attention, additive, implementation, config)
    config._attn_implementation = ULYSSES_ATTENTION


def is_causal_per_row(attention_mask: torch.Tensor | None, position_ids: torch.Tensor) -> bool:
    """Whether each row is one sequence from its first column, without padding: plain causal attention, which
    needs no mask (the split's padding columns come last, so no real token sees them)."""
    if attention_mask is None:
        return bool((position_ids[:, 1:] == position_ids[:, :-1] + 1).all())
    return attention_mask.dim() == 2 and bool(attention_mask.bool().all())


def full_attention_mask(
    attention_mask: torch.Tensor | None, position_ids: torch.Tensor, width: int | None = None
) -> torch.Tensor:
    """``[N, 1, width, width]`` bool: which columns each column attends to, as the model computes rows alone.

    ``attention_mask`` is the layout's: ``[N, 1, W, W]`` (used as it is), ``[N, W]`` (padded rows: causal over
    the real tokens) or None (packed rows: causal within each sample, a sample starting where ``position_ids``
    do not continue). Columns past ``W`` up to ``width`` (the split's padding) and padding queries attend to
    themselves only, which keeps every softmax finite and changes no real token.
    """
    rows, columns = position_ids.shape
    width = width or columns
    arange = torch.arange(columns, device=position_ids.device)
    if attention_mask is not None and attention_mask.dim() == 4:
        mask = attention_mask.bool()
    elif attention_mask is not None:
        causal = arange[None, :] <= arange[:, None]
        mask = (causal[None] & attention_mask.bool()[:, None, :])[:, None]
    else:
        starts = torch.ones_like(position_ids, dtype=torch.bool)
        starts[:, 1:] = position_ids[:, 1:] != position_ids[:, :-1] + 1
        sample = starts.cumsum(dim=1)
        causal = arange[None, :] <= arange[:, None]
        mask = (causal[None] & (sample[:, :, None] == sample[:, None, :]))[:, None]
    full = torch.zeros(rows, 1, width, width, dtype=torch.bool, device=position_ids.device)
    full[..., :columns, :columns] = mask
    return full | torch.eye(width, dtype=torch.bool, device=position_ids.device)


@dataclass(frozen=True)
class SequenceSplit:
    """Rows of ``width`` columns padded to ``k * columns`` and cut into ``k`` slices; this rank holds slice
    ``group.rank``."""

    group: SequenceParallelGroup
    width: int

    @property
    def columns(self) -> int:
        return math.ceil(self.width / self.group.size)

    @property
    def padded_width(self) -> int:
        return self.columns * self.group.size

    def local(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's columns of ``full`` ``[N, width, ...]`` (zeros in the padding)."""
        pad = self.padded_width - self.width
        if pad:
            padding = full.new_zeros(full.shape[0], pad, *full.shape[2:])
            full = torch.cat([full, padding], dim=1)
        start = self.group.rank * self.columns
        return full[:, start : start + self.columns]

    def gather_columns(self, local: torch.Tensor) -> torch.Tensor:
        """Every rank's ``[N, columns, ...]`` output joined into ``[N, width, ...]``; differentiable
        (:func:`~hybridflow.distributed.sequence_parallel.gather_slices`)."""
        gathered = gather_slices(local.transpose(0, 1), self.group)
        return gathered.transpose(0, 1)[:, : self.width]

    def owners(self, keep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For each True position of ``keep`` ``[N, width]`` in row-major order: the rank whose slice holds it,
        and its index among that rank's True positions (also row-major)."""
        owner = keep.nonzero()[:, 1] // self.columns
        return owner, _index_within(owner, self.group.size)

    def run(
        self,
        model: torch.nn.Module,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **model_kwargs,
    ):
        """``model`` on this rank's slice of the rows, attending as over the whole rows (linear attention too,
        :mod:`~hybridflow.models.sequence_parallel_recurrent`); ``model_kwargs`` (e.g. a ``logits_to_keep`` mask)
        must already be this rank's slice."""
        width = self.padded_width
        causal = is_causal_per_row(attention_mask, position_ids)
        mask = None if causal else full_attention_mask(attention_mask, position_ids, width)
        attend_across(model, self.group, mask, width, input_ids.device)
        padded_rows = attention_mask is not None and attention_mask.dim() == 2
        split_linear_attention(model, self.group, self.local(attention_mask) if padded_rows else None)
        return model(
            input_ids=self.local(input_ids),
            position_ids=self.local(position_ids),
            attention_mask=None,
            use_cache=False,
            **model_kwargs,
        )


def gather_predictions(local: torch.Tensor, owner: torch.Tensor, group: SequenceParallelGroup) -> torch.Tensor:
    """``[P]`` values in order, from each rank's ``local`` values of the predictions it owns (``owner`` ``[P]``:
    the rank of each; a rank's values in the predictions' order). Differentiable; the backward sums the ranks'
    gradients (:func:`~hybridflow.distributed.sequence_parallel.gather_slices`)."""
    counts = torch.bincount(owner, minlength=group.size)
    most = int(counts.max()) if owner.numel() else 0
    padded = torch.cat([local, local.new_zeros(most - local.shape[0], *local.shape[1:])])
    gathered = gather_slices(padded, group)
    return gathered[owner * most + _index_within(owner, group.size)]


def _index_within(owner: torch.Tensor, size: int) -> torch.Tensor:
    """For each entry, how many earlier entries have the same owner."""
    one_hot = torch.nn.functional.one_hot(owner, size)
    return (one_hot.cumsum(dim=0) - 1).gather(1, owner[:, None]).squeeze(1)
