"""Exact checksums of weights, which prove that a weight sync took (a sync that silently does not take: verl
#7495, TRL #6797, OpenRLHF #1349).

A checksum is the sum, as integers, of the bit patterns of every element cast to the engine's dtype. An integer
sum is exact and does not depend on the order of its terms, so it adds up over any split of the weights: FSDP's
shards, a tensor-parallel engine's shards, buckets. Any changed element changes it (barring an exact
cancellation), and the cast makes the sender's sum equal the one over what the engine stores.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

_BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


# Elements cast and summed at a time: the cast and the int64 sum allocate this many, not the whole tensor's,
# in 64 KiB, under glibc's default 128 KiB threshold for fresh mmaps (which fault in every page of every chunk).
_CHUNK = 1 << 13


def tensor_checksum(tensor: torch.Tensor, dtype: torch.dtype) -> int:
    """The sum of the bit patterns of ``tensor``'s elements cast to ``dtype`` (a plain tensor)."""
    flat = tensor.detach().reshape(-1)
    bits = _BITS[dtype]
    return sum(int(chunk.to(dtype).view(bits).sum(dtype=torch.int64)) for chunk in flat.split(_CHUNK))


def _counted_here(tensor: torch.Tensor, first_rank: int | None) -> bool:
    """Whether this rank adds ``tensor``, one of the parts the ranks of a group hold together, whose lowest
    global rank is ``first_rank`` (None: this rank holds every tensor whole). A DTensor adds its local shard
    unless it is a replica: of a replicated mesh dimension only the first coordinate adds it, and of copies on
    several meshes (FSDP2 over one dimension of a 2-D layout) only the one on the mesh that holds
    ``first_rank``. A plain tensor, whole on every rank, is added by ``first_rank`` alone."""
    if first_rank is None:
        return True
    if not isinstance(tensor, DTensor):
        return dist.get_rank() == first_rank
    mesh = tensor.device_mesh
    if first_rank not in mesh.mesh.flatten().tolist():
        return False
    coordinate = mesh.get_coordinate()
    return all(index == 0 for index, placement in zip(coordinate, tensor.placements) if placement.is_replicate())


def part_checksum(tensors: Iterable[torch.Tensor], dtype: torch.dtype, first_rank: int | None = None) -> int:
    """This rank's part of the checksum of the whole tensors that ``tensors`` are this rank's parts of (see
    :func:`_counted_here` for ``first_rank``)."""
    return sum(
        tensor_checksum(tensor.to_local() if isinstance(tensor, DTensor) else tensor, dtype)
        for tensor in tensors
        if _counted_here(tensor, first_rank)
    )


def group_checksum(
    tensors: Iterable[torch.Tensor], dtype: torch.dtype, group: dist.ProcessGroup | None, device: torch.device
) -> int:
    """The checksum of the whole tensors the ranks of ``group`` hold parts of together (a collective over
    ``group``, whose backend works on ``device``); ``group`` None: this rank holds them whole."""
    if group is None:
        return part_checksum(tensors, dtype)
    first_rank = min(dist.get_process_group_ranks(group))
    return reduced(part_checksum(tensors, dtype, first_rank), group, device)


def reduced(part: int, group: dist.ProcessGroup | None, device: torch.device) -> int:
    """``part`` summed over the ranks of ``group`` (``None``: the default group)."""
    total = torch.tensor([part], dtype=torch.int64, device=device)
    dist.all_reduce(total, group=group)
    return int(total)


class ChecksummedWeights:
    """``(name, tensor)`` pairs passed through unchanged while ``part`` adds up this rank's part of their
    checksum (``first_rank``: as :func:`part_checksum`)."""

    def __init__(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, first_rank: int | None = None
    ):
        self._named_tensors = named_tensors
        self.dtype = dtype
        self.first_rank = first_rank
        self.part = 0

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in self._named_tensors:
            self.part += part_checksum([tensor], self.dtype, self.first_rank)
            yield name, tensor
