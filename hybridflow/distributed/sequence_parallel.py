"""Ulysses sequence parallelism's groups and exchanges (DeepSpeed-Ulysses, arXiv 2309.14509; verl's
``ulysses_sequence_parallel_size``).

The ``k`` ranks of a sequence-parallel group hold the same rows, each a ``1/k`` slice of every row's columns.
Around attention two all-to-alls swap the split: :func:`sequence_to_heads` gives each rank every column of
``1/k`` of the heads, :func:`heads_to_sequence` takes it back. Everything else in a decoder layer is
position-wise and runs on the slice. Consecutive ranks form a group (``0..k-1``, ``k..2k-1``, ...), as in verl.

The exchanges are torch's differentiable functional collectives; gloo runs them (all-to-all and the
reduce-scatter that an all-gather's backward needs), so the same code serves CPU and GPU groups.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional
from torch.distributed.device_mesh import init_device_mesh

from hybridflow.distributed.rank_groups import MeshGroup


class SequenceParallelGroup(MeshGroup):
    """A :class:`MeshGroup` whose ``k`` ranks each hold a ``1/k`` slice of every row's columns: ``rank`` says
    which slice."""


def sequence_parallel_group(size: int, device: torch.device) -> SequenceParallelGroup:
    """The group of ``size`` consecutive ranks this rank belongs to; every rank of the world must call it.

    The caller's config check guarantees ``size`` divides the world size; a direct caller gets a ValueError.
    """
    world_size = dist.get_world_size()
    if size < 1 or world_size % size:
        raise ValueError(f"ulysses_sequence_parallel_size={size} must divide the group's world size {world_size}")
    mesh = init_device_mesh(device.type, (world_size // size, size), mesh_dim_names=("dp", "sp"))
    return SequenceParallelGroup.of(mesh, "sp")


def sequence_to_heads(states: torch.Tensor, group: SequenceParallelGroup) -> torch.Tensor:
    """``[N, H, S, D]`` (all heads, this rank's ``S`` columns) -> ``[N, H/k, k*S, D]`` (this rank's heads, every
    column in order). Differentiable."""
    rows, heads, columns, dim = states.shape
    k = group.size
    # Split the heads into k chunks, chunk j to rank j; rank i's chunk arrives i-th: the column slices in order.
    outgoing = states.reshape(rows, k, heads // k, columns, dim).transpose(0, 1).contiguous()
    incoming = functional.all_to_all_single_autograd(outgoing, None, None, group.group)
    incoming = incoming.view(k, rows, heads // k, columns, dim)
    return incoming.permute(1, 2, 0, 3, 4).reshape(rows, heads // k, k * columns, dim)


def heads_to_sequence(states: torch.Tensor, group: SequenceParallelGroup) -> torch.Tensor:
    """``[N, k*S, H/k, D]`` (every column, this rank's heads: an attention output) -> ``[N, S, H, D]`` (this
    rank's columns, all heads). Differentiable."""
    rows, all_columns, heads, dim = states.shape
    k = group.size
    columns = all_columns // k
    outgoing = states.reshape(rows, k, columns, heads, dim).transpose(0, 1).contiguous()
    incoming = functional.all_to_all_single_autograd(outgoing, None, None, group.group)
    incoming = incoming.view(k, rows, columns, heads, dim)
    return incoming.permute(1, 2, 0, 3, 4).reshape(rows, columns, k * heads, dim)


def gather_slices(values: torch.Tensor, group: SequenceParallelGroup) -> torch.Tensor:
    """Every rank's ``values`` (the same shape on each) concatenated along dim 0 in rank order.

    The backward sums the gradients of all ranks (a reduce-scatter). The ranks of a group compute the same
    loss from the gathered values, so each rank's gradient is ``k`` times its slice's share: the ``k`` copies
    of a row count it ``k`` times in the loss's denominators too (the counts are summed over every rank), and
    the two factors cancel in the gradient FSDP averages over all ranks.
    """
    return functional.all_gather_single_autograd(values.contiguous(), 0, group.group)
