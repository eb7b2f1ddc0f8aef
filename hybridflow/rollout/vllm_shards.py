"""Feeding a vLLM engine split ``k`` ways from the actor's shards: each rank receives only the part of every weight
its own vLLM shard needs (HybridFlow's 3D-HybridEngine, arXiv 2409.19256 §5.4), never the whole weight.

vLLM's loaders take a weight in checkpoint format (whole) and keep their rank's slice: q, k, v, gate and up by
output rows, o and down by input columns, the embedding and the output head by vocabulary rows (padded to a
multiple of 64 before the split), the rest whole. :class:`VLLMShards` writes that slice, resharded from the
actor's DTensor (``distributed/resharding.py``), into an uninitialised tensor of the whole weight's shape, which
the loader then narrows to the same slice: the rest is never written (on CPU its pages are never touched).

vLLM forms its tensor-parallel groups of ``k`` consecutive ranks, unlike the strided groups of the ``hf`` engine
(``models/tensor_parallel.py``): where every rank is in one group, or the actor trains in the same split, a rank's
training shard lies inside its vLLM shard and nothing of a split weight moves; otherwise it receives its vLLM
shard's missing part, at most ``1/k`` of the model.

A split vLLM on a rollout pool of its own gets the same boxes from the actor's gathered weights: the sender cuts
each weight into every vLLM rank's box (:func:`pool_slices`, a :class:`WeightSlice` each), so a pool rank is sent
its ``1/k``, and the rank widens it back into an unwritten tensor of the whole shape for its loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from hybridflow.distributed.resharding import Box, Traffic, reshard_to_boxes
from hybridflow.models.tensor_parallel import VOCABULARY_SPLIT, split_dimension


@dataclass(frozen=True)
class ShardLayout:
    """One rank's place in vLLM's split: its index in its tensor-parallel group, the group's size, and the
    vocabulary rows (start, stop) of each vocabulary-split module, by module name."""

    tp_rank: int
    tp_size: int
    vocab_rows: dict[str, tuple[int, int]]

    def box(self, name: str, shape: tuple[int, ...]) -> Box:
        """The box of the weight ``name`` (a Hugging Face name) that this rank's vLLM loader keeps."""
        box = [(0, size) for size in shape]
        module, dim = name.rpartition(".")[0], split_dimension(name)
        if module in self.vocab_rows:
            box[0] = self.vocab_rows[module]
        elif dim is not None and module.rpartition(".")[2] not in VOCABULARY_SPLIT:  # vLLM's rows, or whole
            part = shape[dim] // self.tp_size
            box[dim] = (self.tp_rank * part, (self.tp_rank + 1) * part)
        return tuple(box)


@dataclass(frozen=True)
class WeightSlice:
    """The ``box`` of a whole weight of ``shape``: what one rank of a split vLLM on a rollout pool loads."""

    tensor: torch.Tensor
    shape: tuple[int, ...]
    box: Box

    @property
    def nbytes(self) -> int:
        return self.tensor.nbytes

    def placeholder(self) -> torch.Tensor:
        """An uninitialised tensor of the whole shape holding the slice in its box, which vLLM's loader narrows
        to the same box (the rest is never written, nor read)."""
        whole = torch.empty(self.shape, dtype=self.tensor.dtype, device=self.tensor.device)
        whole[tuple(slice(start, stop) for start, stop in self.box)] = self.tensor
        return whole


def pool_slices(layouts: list[ShardLayout]) -> Callable[[str, torch.Tensor], list[torch.Tensor | WeightSlice]]:
    """For a rollout pool's vLLM split ``len(layouts)`` ways (``layouts[r]``: tensor-parallel rank r's), what each
    rank is sent of a whole weight: its box as a :class:`WeightSlice`, or the weight itself where it stays whole."""

    def slices(name: str, tensor: torch.Tensor) -> list[torch.Tensor | WeightSlice]:
        shape, pieces = tuple(tensor.shape), []
        for layout in layouts:
            box = layout.box(name, shape)
            whole = all(start == 0 and stop == size for (start, stop), size in zip(box, shape))
            view = tensor[tuple(slice(start, stop) for start, stop in box)]
            pieces.append(tensor if whole else WeightSlice(view.clone(), shape, box))
        return pieces

    return slices


def read_layout(worker: Any) -> ShardLayout:
    """Runs on vLLM's worker (``LLM.collective_rpc``): its tensor-parallel place and vocabulary slices."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    vocab_rows = {
        name: (module.shard_indices.org_vocab_start_index, module.shard_indices.org_vocab_end_index)
        for name, module in worker.model_runner.model.named_modules()
        if isinstance(module, VocabParallelEmbedding)
    }
    return ShardLayout(get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size(), vocab_rows)


class VLLMShards:
    """Every rank's :class:`ShardLayout` (gathered once over the default group), and the bytes moved so far."""

    def __init__(self, own: ShardLayout):
        layouts: list[ShardLayout | None] = [None] * dist.get_world_size()
        dist.all_gather_object(layouts, own)
        self.layouts: list[ShardLayout] = layouts  # type: ignore[assignment]
        self.own = own
        self.traffic = Traffic()

    @property
    def by_tensor_parallel_rank(self) -> list[ShardLayout]:
        """One layout per place in a tensor-parallel group (every group splits alike), in group order."""
        return sorted({layout.tp_rank: layout for layout in self.layouts}.values(), key=lambda layout: layout.tp_rank)

    def checkpoint_tensors(
        self, named_tensors: Iterable[tuple[str, torch.Tensor | WeightSlice]]
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor of the whole weight's shape)``, holding this rank's vLLM slice of each DTensor or
        :class:`WeightSlice` (whole tensors pass as they are). Every rank consumes it in step: each DTensor is
        one collective."""
        for name, tensor in named_tensors:
            if isinstance(tensor, WeightSlice):
                yield name, tensor.placeholder()
                continue
            if not isinstance(tensor, DTensor):
                yield name, tensor
                continue
            shape = tuple(tensor.shape)
            boxes = {rank: layout.box(name, shape) for rank, layout in enumerate(self.layouts)}
            own = boxes[dist.get_rank()]
            placeholder = torch.empty(shape, dtype=tensor.dtype, device=tensor.device)
            view = placeholder[tuple(slice(start, stop) for start, stop in own)]
            self.traffic.add(reshard_to_boxes(tensor, view, boxes))
            yield name, placeholder
