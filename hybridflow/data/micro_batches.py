"""Token-budget micro-batches ("dynamic batch size"): split by tokens, not by a fixed number of rows.

A mini-batch is cut into as few micro-batches as hold at most ``max_token_len`` real tokens each, with
the tokens spread evenly over them, so every forward pass does about the same work and none runs out of
memory. Rows are regrouped to balance the load; ``restore_order`` puts per-row outputs back in the
original order.

Loss scaling, so that accumulating micro-batch gradients gives the full mini-batch gradient: compute
each micro-batch's loss with the mini-batch's totals as denominators (``loss_denominators`` gives them;
pass them to ``hybridflow.algos.masked_stats`` as ``global_token_count``/``global_seq_count``) and sum
the micro-batch losses without further weights. For a token-mean loss this weighs micro-batch ``i`` by
its share of loss tokens, ``n_i / N``, so ``sum_i (n_i / N) * mean_i = sum of all token losses / N``.
"""

from __future__ import annotations

import heapq
import math
from typing import Sequence

import torch

from hybridflow.errors import HybridflowError
from hybridflow.protocol import DataProto


class TokenBudgetError(HybridflowError, ValueError):
    """A micro-batch token budget that the batch cannot be split to fit."""


def sequence_lengths(batch: DataProto, mask_key: str = "attention_mask") -> list[int]:
    """Real tokens per row: the row sums of ``batch.batch[mask_key]``."""
    return batch.batch[mask_key].sum(dim=-1).tolist()


def balanced_partition(lengths: Sequence[int], num_parts: int) -> list[list[int]]:
    """Split row indices into ``num_parts`` non-empty groups with near-equal total length.

    Longest processing time first (Graham 1969): rows from longest to shortest, each into the group
    with the smallest total so far; the largest group is within 4/3 of the optimum. Each group's
    indices are ascending, and groups are ordered by their first index.
    """
    if not 0 < num_parts <= len(lengths):
        raise TokenBudgetError(f"cannot split {len(lengths)} rows into {num_parts} non-empty micro-batches")
    order = sorted(range(len(lengths)), key=lambda row: (-lengths[row], row))
    # Seed every group with one of the longest rows, so that none stays empty even with empty rows.
    groups = [[row] for row in order[:num_parts]]
    heap = [(lengths[row], part) for part, row in enumerate(order[:num_parts])]
    heapq.heapify(heap)
    for row in order[num_parts:]:
        total, part = heapq.heappop(heap)
        groups[part].append(row)
        heapq.heappush(heap, (total + lengths[row], part))
    return sorted((sorted(group) for group in groups), key=lambda group: group[0])


def split_by_token_budget(
    batch: DataProto, max_token_len: int, min_num_micro_batches: int = 1, mask_key: str = "attention_mask"
) -> tuple[list[DataProto], list[list[int]]]:
    """Split ``batch`` into balanced micro-batches of at most ``max_token_len`` real tokens each.

    Uses the fewest micro-batches that fit (at least ``min_num_micro_batches``, e.g. to give every
    data-parallel rank the same count). Returns the micro-batches and, for each, the row indices of
    ``batch`` it holds (for ``restore_order``). Raises TokenBudgetError if one row alone exceeds the
    budget.
    """
    lengths = sequence_lengths(batch, mask_key)
    longest = max(lengths, default=0)
    if longest > max_token_len:
        raise TokenBudgetError(
            f"a row has {longest} tokens but the micro-batch budget max_token_len={max_token_len}: raise the "
            f"budget (e.g. ppo_max_token_len_per_gpu) to at least the prompt + response length"
        )
    num_parts = max(math.ceil(sum(lengths) / max_token_len), min_num_micro_batches, 1)
    while True:
        groups = balanced_partition(lengths, num_parts)
        if max(sum(lengths[row] for row in group) for group in groups) <= max_token_len:
            break
        num_parts += 1
    return [batch[group] for group in groups], groups


def restore_order(
    outputs: Sequence[torch.Tensor] | Sequence[DataProto], indices: Sequence[Sequence[int]]
) -> torch.Tensor | DataProto:
    """Join per-micro-batch outputs (tensors with rows first, or DataProtos) in the original row order."""
    flat = torch.tensor([row for group in indices for row in group], dtype=torch.long)
    inverse = torch.argsort(flat)
    if all(isinstance(output, DataProto) for output in outputs):
        return DataProto.concat(list(outputs)).reorder(inverse)
    joined = torch.cat(list(outputs))
    return joined[inverse.to(joined.device)]


def loss_denominators(batch: DataProto, mask_key: str = "response_mask") -> dict[str, int]:
    """The mini-batch's loss tokens and sequences (with at least one loss token), as agg_loss takes them."""
    mask = batch.batch[mask_key]
    return {"global_token_count": int(mask.sum().item()), "global_seq_count": int((mask.sum(dim=-1) > 0).sum().item())}
