"""Resharding a weight from its training layout into its generation layout: each rank receives only the part
of its generation shard it does not hold (HybridFlow's 3D-HybridEngine, arXiv 2409.19256 §5.4).

A layout is a DTensor's (mesh, placements): every rank of the mesh holds one box (a range per dimension) of
the global tensor. :func:`reshard_into` computes every rank's training box and generation box, sends each rank
the intersection of its own training box with the other's generation box, and writes what arrives into this
rank's generation shard, in one ``all_to_all_single`` per weight over the default group. When the generation
groups are formed so that a rank's training shard lies inside its generation shard (the paper's grouping, see
``models/tensor_parallel.py``), a rank receives ``gen_shard - train_shard`` bytes: the paper's
``(tp - t_g p_g) / (t_g p_g t p) M`` for the whole model, against ``(tp - 1) / (tp) M`` for gathering every
weight whole first (its HybridFlow-V). Extra memory: one weight's send and receive buffers.

Placements handled: ``Shard(d)``, ``Replicate()`` and the ``_StridedShard`` FSDP2 puts over a tensor-parallel
split (training in (t, d)); a replicated box is sent by one holder only (the receiver itself when it is one).
"""

from __future__ import annotations

import functools
import itertools
import math
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

Box = tuple[tuple[int, int], ...]

# The boxes of tensors on sub-meshes, gathered at their first resharding (their layouts never change).
_gathered: dict[int, dict[int, Box]] = {}


@dataclass
class Traffic:
    """Bytes this rank sent to and received from other ranks (its own pieces are copied in place, not sent)."""

    sent: int = 0
    received: int = 0

    def add(self, other: "Traffic") -> None:
        self.sent += other.sent
        self.received += other.received


def shard_box(shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements, coordinate: tuple[int, ...]) -> Box:
    """The box of the global ``shape`` held at mesh ``coordinate``: DTensor's (and FSDP2's) ``torch.chunk``
    sharding, mesh dimensions applied in order, except that a ``_StridedShard`` (FSDP2 over a tensor-parallel
    split: its chunks are taken within the split's) applies after the plain shards of its dimension."""
    order = sorted(range(len(placements)), key=lambda dim: isinstance(placements[dim], _StridedShard))
    ranges = [[0, size] for size in shape]
    for mesh_dim in order:
        placement, size, index = placements[mesh_dim], mesh_shape[mesh_dim], coordinate[mesh_dim]
        if isinstance(placement, Replicate):
            continue
        if isinstance(placement, _StridedShard):
            _check_strided(placement, mesh_dim, mesh_shape, placements)
        elif not isinstance(placement, Shard) or type(placement) is not Shard:
            raise TypeError(f"resharding handles Shard, _StridedShard and Replicate placements, not {placement!r}")
        start, stop = ranges[placement.dim]
        chunk = math.ceil((stop - start) / size) if stop > start else 0
        ranges[placement.dim] = [min(start + index * chunk, stop), min(start + (index + 1) * chunk, stop)]
    return tuple((start, stop) for start, stop in ranges)


def _check_strided(placement: _StridedShard, mesh_dim: int, mesh_shape: tuple[int, ...], placements) -> None:
    later = [
        mesh_shape[dim]
        for dim in range(mesh_dim + 1, len(placements))
        if type(placements[dim]) is Shard and placements[dim].dim == placement.dim
    ]
    if placement.split_factor != math.prod(later):
        raise TypeError(f"resharding handles a _StridedShard split by the later mesh dimensions only, not {placements}")


def own_box(tensor: DTensor) -> Box:
    """The box this rank holds."""
    mesh = tensor.device_mesh
    check_rank_order(mesh.mesh)
    return shard_box(tuple(tensor.shape), tuple(mesh.mesh.shape), tensor.placements, tuple(mesh.get_coordinate()))


def check_rank_order(ranks: torch.Tensor) -> None:
    """Boxes follow mesh coordinates, but torch shards by each sub-group's (sorted) rank: they agree only where
    the ranks increase along every mesh dimension (``init_device_mesh`` meshes do)."""
    if any(bool((ranks.diff(dim=dim) <= 0).any()) for dim in range(ranks.ndim) if ranks.shape[dim] > 1):
        raise ValueError(f"resharding needs a mesh whose ranks increase along every dimension, not {ranks.tolist()}")


def rank_boxes(tensor: DTensor) -> dict[int, Box]:
    """Every rank of the default group -> the box of ``tensor`` it holds. A tensor on a mesh of fewer ranks (a
    tensor-parallel group's) has its other groups' boxes gathered once, a collective then."""
    if id(tensor) in _gathered:
        return _gathered[id(tensor)]
    ranks = tensor.device_mesh.mesh
    check_rank_order(ranks)
    if ranks.numel() < dist.get_world_size():
        boxes: list[Box | None] = [None] * dist.get_world_size()
        dist.all_gather_object(boxes, own_box(tensor))
        _gathered[id(tensor)] = dict(enumerate(boxes))
        weakref.finalize(tensor, _gathered.pop, id(tensor), None)
        return _gathered[id(tensor)]
    return {
        int(ranks[coordinate]): shard_box(tuple(tensor.shape), tuple(ranks.shape), tensor.placements, coordinate)
        for coordinate in _coordinates(tuple(ranks.shape))
    }


def reshard_into(source: torch.Tensor, target: DTensor) -> Traffic:
    """Write ``source`` (a DTensor in any layout over the default group's ranks, or the whole tensor) into this
    rank's shard of ``target``. Every rank of the default group calls it together for a DTensor source."""
    local = target.to_local()
    if not isinstance(source, DTensor):
        local.copy_(source[_slices(own_box(target))])
        return Traffic()
    if tuple(source.shape) != tuple(target.shape):
        raise ValueError(f"resharding a {tuple(source.shape)} weight into a {tuple(target.shape)} one")
    return reshard_to_boxes(source, local, rank_boxes(target))


def reshard_to_boxes(source: DTensor, local: torch.Tensor, targets: dict[int, Box]) -> Traffic:
    """Write the box ``targets[rank]`` of ``source`` (a DTensor over the default group's ranks) into ``local``
    (shaped as that box), each rank receiving only what it does not hold. Every rank of the default group calls
    it together, with the same ``targets``: every rank's box of the global tensor."""
    sources = rank_boxes(source)
    world, me = dist.get_world_size(), dist.get_rank()
    own_target = targets[me]
    plan = _exchange_plan(tuple(sorted(sources.items())), tuple(sorted(targets.items())))
    mine = source.to_local()
    own = plan[me][me]
    if own:  # its own part: copied in place, not through the exchange's buffers
        local[_slices(own, origin=own_target)] = mine[_slices(own, origin=sources[me])]
    plan = [[None if s == r else box for r, box in enumerate(row)] for s, row in enumerate(plan)]
    if not any(box for row in plan for box in row):
        return Traffic()
    outgoing = [_piece(mine, sources[me], box).to(local.dtype).reshape(-1) for box in plan[me] if box]
    send_sizes = [_volume(box) for box in plan[me]]
    receive_sizes = [_volume(plan[peer][me]) for peer in range(world)]
    incoming = local.new_empty(sum(receive_sizes))
    send = torch.cat(outgoing) if outgoing else local.new_empty(0)
    dist.all_to_all_single(incoming, send, receive_sizes, send_sizes)
    offset = 0
    for peer, size in enumerate(receive_sizes):
        if size:
            box = plan[peer][me]
            shape = tuple(stop - start for start, stop in box)
            local[_slices(box, origin=own_target)] = incoming[offset : offset + size].view(shape)
            offset += size
    element = local.element_size()
    return Traffic(sent=element * sum(send_sizes), received=element * sum(receive_sizes))


@functools.lru_cache(maxsize=4096)
def _exchange_plan(sources: tuple, targets: tuple) -> list[list[Box | None]]:
    """``plan[s][r]``: the box rank ``s`` sends rank ``r`` (None: nothing). Per distinct source box overlapping
    a receiver's target box, one holder sends: the receiver itself when it holds the box, otherwise a holder
    picked by the receiver's rank, to spread the load. Cached: a weight's layouts never change."""
    source_boxes, target_boxes = dict(sources), dict(targets)
    world = len(source_boxes)
    holders: dict[Box, list[int]] = {}
    for rank, box in sorted(source_boxes.items()):
        holders.setdefault(box, []).append(rank)
    plan: list[list[Box | None]] = [[None] * world for _ in range(world)]
    for receiver in range(world):
        for box, ranks in holders.items():
            overlap = _intersect(box, target_boxes[receiver])
            if overlap:
                plan[receiver if receiver in ranks else ranks[receiver % len(ranks)]][receiver] = overlap
    return plan


def _intersect(a: Box, b: Box) -> Box | None:
    box = tuple((max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b))
    return box if all(start < stop for start, stop in box) else None


def _volume(box: Box | None) -> int:
    return 0 if box is None else math.prod(stop - start for start, stop in box)


def _slices(box: Box, origin: Box | None = None) -> tuple[slice, ...]:
    offsets = [0] * len(box) if origin is None else [start for start, _ in origin]
    return tuple(slice(start - offset, stop - offset) for (start, stop), offset in zip(box, offsets))


def _piece(local: torch.Tensor, held: Box, box: Box) -> torch.Tensor:
    return local[_slices(box, origin=held)].contiguous()


def _coordinates(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    return list(itertools.product(*(range(size) for size in shape)))
