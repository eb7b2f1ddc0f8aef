"""Which rows a training rank computes: its own chunk, or with Ulysses sequence parallelism its group's.

The driver hands every rank an equal chunk of a batch (``Dispatch.DP_COMPUTE_PROTO``). With
``ulysses_sequence_parallel_size=k`` the ``k`` ranks of a group first gather their chunks, so each holds the
group's rows and runs ``1/k`` of every row's columns (:mod:`hybridflow.models.sequence_parallel`); each rank
then returns the outputs of its own chunk. This is verl's arrangement (its Ulysses sharding manager): the
groups are the data-parallel ranks, so mini- and micro-batch sizes per rank count ``world / k`` ranks, and a
row's ``k`` copies count it ``k`` times in the loss counts summed over all ranks. Differs from verl: an update's
mini-batches take every chunk's rows step by step (:meth:`RowGroup.gather`), so a run with Ulysses takes the
optimizer steps of the same run without it, not those of a different split of its rows
(``tests/trainer/test_sequence_parallel_runs.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from hybridflow.distributed.sequence_parallel import SequenceParallelGroup, gather_objects, sequence_parallel_group
from hybridflow.protocol import DataProto
from hybridflow.workers.config import micro_batch_size_per_rank
from hybridflow.workers.training import LossCounts, MicroBatching


@dataclass(frozen=True)
class RowGroup:
    """This rank's rows: ``sequence_parallel`` None computes the rank's own chunk (``k = 1``)."""

    sequence_parallel: SequenceParallelGroup | None
    data_parallel_size: int
    data_parallel_rank: int

    @property
    def size(self) -> int:
        """Ranks that compute the same rows (``k``)."""
        return 1 if self.sequence_parallel is None else self.sequence_parallel.size

    def gather(self, data: DataProto, rows_per_step: int | None = None) -> DataProto:
        """The rows this rank computes: ``data`` itself, or its group's chunks in rank order.

        With ``rows_per_step`` (a chunk's rows per optimizer step) the group's rows are ordered step by step
        instead: each mini-batch holds the next ``rows_per_step`` rows of every chunk, the rows the group's ``k``
        ranks would train together without Ulysses, so the two layouts take the same optimizer steps.
        """
        if self.sequence_parallel is None:
            return data
        gathered = DataProto.concat(gather_objects(data, self.sequence_parallel))
        if rows_per_step is None:
            return gathered
        chunk = len(data)
        order = [
            rank * chunk + row
            for start in range(0, chunk, rows_per_step)
            for rank in range(self.size)
            for row in range(start, min(start + rows_per_step, chunk))
        ]
        return gathered[torch.tensor(order, dtype=torch.long)]

    def own(self, outputs: dict[str, torch.Tensor], chunk: int) -> dict[str, torch.Tensor]:
        """This rank's ``chunk`` rows of outputs computed for :meth:`gather`'s rows."""
        if self.sequence_parallel is None:
            return outputs
        start = self.sequence_parallel.rank * chunk
        return {name: value[start : start + chunk] for name, value in outputs.items()}

    def micro_batching(
        self, per_gpu: int | None, global_size: int | None, use_dynamic_bsz: bool, max_token_len: int, key: str
    ) -> MicroBatching:
        """Micro-batches of the rows this rank computes: verl's per-rank size, or its deprecated global form over
        the data-parallel ranks; a token budget ``k`` times ``max_token_len`` (each row runs 1/k here), as in
        verl."""
        size = micro_batch_size_per_rank(per_gpu, global_size, self.data_parallel_size, key)
        return MicroBatching(size, use_dynamic_bsz, max_token_len * self.size)

    def counts(self, counts: LossCounts | None) -> LossCounts | None:
        """Loss counts of the batch as the ranks count it: each row ``k`` times (the driver counts it once)."""
        if counts is None or self.size == 1:
            return counts
        return replace(
            counts,
            global_token_count=counts.global_token_count * self.size,
            global_seq_count=counts.global_seq_count * self.size,
        )


def row_group(ulysses_sequence_parallel_size: int, device: torch.device) -> RowGroup:
    """This rank's :class:`RowGroup` for ``ulysses_sequence_parallel_size`` (every rank must call it)."""
    if ulysses_sequence_parallel_size <= 1:
        return RowGroup(None, dist.get_world_size(), dist.get_rank())
    group = sequence_parallel_group(ulysses_sequence_parallel_size, device)
    return RowGroup(group, group.data_parallel_size, group.data_parallel_rank)
