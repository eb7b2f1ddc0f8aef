"""How one rank's share of a batch is cut for training and inference: mini-batches, micro-batches, counts.

Every rank gets an equal chunk of the batch (``Dispatch.DP_COMPUTE_PROTO``). An update runs ``epochs``
passes over the chunk in mini-batches (one optimizer step each), each cut into micro-batches (one
forward/backward each). FSDP2 gathers parameters collectively in every forward, so all ranks must run the
same number of micro-batches: with token budgets the count is agreed over the group first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from hybridflow.data.micro_batches import restore_order, split_by_token_budget
from hybridflow.protocol import DataProto
from hybridflow.workers.config import WorkerConfigError


@dataclass(frozen=True)
class MicroBatching:
    """Micro-batches of ``micro_batch_size`` rows, or (``use_dynamic_bsz``) of at most ``max_token_len``
    real tokens. ``micro_batch_size=None`` without a token budget runs the whole mini-batch at once."""

    micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    max_token_len: int = 16384


@dataclass(frozen=True)
class LossCounts:
    """Loss tokens and sequences of a whole mini-batch over all ranks: the denominators of ``agg_loss``."""

    global_token_count: float
    global_seq_count: float


def mini_batch_size_per_rank(ppo_mini_batch_size: int, rollout_n: int, world_size: int, key: str) -> int:
    """verl's convention: ``ppo_mini_batch_size`` counts prompts; a rank's mini-batch holds
    ``ppo_mini_batch_size * rollout_n / world_size`` samples."""
    samples = ppo_mini_batch_size * rollout_n
    if ppo_mini_batch_size < 1 or samples % world_size:
        raise WorkerConfigError(
            f"{key}={ppo_mini_batch_size} (x rollout.n={rollout_n} = {samples} samples) must be a positive "
            f"multiple of the group's {world_size} ranks; change {key}"
        )
    return samples // world_size


def iter_mini_batches(
    data: DataProto, mini_batch_size: int, epochs: int, shuffle: bool, generator: torch.Generator
) -> Iterator[DataProto]:
    """``epochs`` passes over ``data`` in mini-batches of ``mini_batch_size`` rows (the last may be
    shorter); with ``shuffle`` each pass uses a fresh permutation drawn from ``generator``."""
    for _ in range(epochs):
        epoch_data = data[torch.randperm(len(data), generator=generator)] if shuffle else data
        yield from epoch_data.split(mini_batch_size)


def _agreed_max(value: int, device: torch.device) -> int:
    count = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def split_micro_batches(
    data: DataProto, batching: MicroBatching, device: torch.device
) -> tuple[list[DataProto], list[list[int]] | None]:
    """Cut ``data`` into micro-batches; returns them and, for token budgets, the row indices each holds
    (for :func:`restore_order`), else None (micro-batches are consecutive rows)."""
    if batching.use_dynamic_bsz:
        micro_batches, indices = split_by_token_budget(data, batching.max_token_len)
        count = _agreed_max(len(micro_batches), device)
        if count != len(micro_batches):
            micro_batches, indices = split_by_token_budget(data, batching.max_token_len, min_num_micro_batches=count)
        return micro_batches, indices
    if batching.micro_batch_size is None:
        return [data], None
    return data.split(batching.micro_batch_size), None


def _count_tensor(response_mask: torch.Tensor) -> torch.Tensor:
    return torch.stack([response_mask.sum(), (response_mask.sum(dim=-1) > 0).sum()]).to(torch.float64)


def local_loss_counts(response_mask: torch.Tensor) -> LossCounts:
    """Masked tokens and non-empty sequences of ``response_mask [B, R]`` in this process only."""
    local = _count_tensor(response_mask)
    return LossCounts(global_token_count=float(local[0]), global_seq_count=float(local[1]))


def loss_counts(response_mask: torch.Tensor) -> LossCounts:
    """Masked tokens and non-empty sequences of ``response_mask [B, R]``, summed over the group."""
    summed = _count_tensor(response_mask)
    dist.all_reduce(summed)
    return LossCounts(global_token_count=float(summed[0]), global_seq_count=float(summed[1]))


def all_reduce_sums(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Sum each value over the group (every rank must pass the same keys)."""
    if not values:
        return {}
    keys = sorted(values)
    packed = torch.tensor([values[key] for key in keys], dtype=torch.float64, device=device)
    dist.all_reduce(packed)
    return dict(zip(keys, packed.tolist()))


def run_in_micro_batches(
    data: DataProto,
    batching: MicroBatching,
    device: torch.device,
    forward: Callable[[DataProto], torch.Tensor | tuple[torch.Tensor, ...]],
) -> tuple[torch.Tensor, ...]:
    """``forward`` on every micro-batch (no gradients), outputs joined in ``data``'s row order.

    ``forward`` returns one ``[b, ...]`` tensor or a tuple of them; the result is always a tuple.
    """
    micro_batches, indices = split_micro_batches(data, batching, device)
    outputs = []
    with torch.no_grad():
        for micro_batch in micro_batches:
            result = forward(micro_batch.to(device))
            outputs.append(result if isinstance(result, tuple) else (result,))
    joined = []
    for parts in zip(*outputs):
        if indices is None:
            joined.append(torch.cat(parts))
        else:
            joined.append(restore_order(parts, indices))
    return tuple(joined)
