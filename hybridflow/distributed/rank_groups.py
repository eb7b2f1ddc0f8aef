"""Sub-groups of ranks that compute the same rows together: Ulysses' sequence-parallel groups and a
tensor-parallel model's groups are both a :class:`MeshGroup`, cut from a 2-D device mesh."""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class MeshGroup:
    """One rank's place in a layout of ``data_parallel_size`` groups of ``size`` ranks each.

    ``rank`` is the position in the group, ``data_parallel_rank`` the group's index (which rows it holds).
    """

    group: dist.ProcessGroup
    size: int
    rank: int
    data_parallel_size: int
    data_parallel_rank: int

    @classmethod
    def of(cls, mesh: DeviceMesh, inner: str):
        """This rank's group along the ``inner`` dimension of the 2-D ``(dp, inner)`` ``mesh``."""
        return cls(
            group=mesh.get_group(inner),
            size=mesh[inner].size(),
            rank=mesh.get_local_rank(inner),
            data_parallel_size=mesh["dp"].size(),
            data_parallel_rank=mesh.get_local_rank("dp"),
        )


def gather_objects(value: object, group: MeshGroup) -> list:
    """Every rank's ``value`` (any picklable object), in rank order."""
    gathered: list = [None] * group.size
    dist.all_gather_object(gathered, value, group=group.group)
    return gathered
