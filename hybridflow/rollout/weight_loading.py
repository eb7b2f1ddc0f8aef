"""Copy named tensors into a model in place, one at a time (the hybrid engine's weight sync, arXiv 2409.19256 §5).

The caller streams ``(name, tensor)`` pairs, e.g. each FSDP2 parameter gathered with ``DTensor.full_tensor()``;
each is copied into the matching parameter and can be freed before the next arrives, so at most one extra
parameter-sized tensor is alive: never a second state dict. A tensor-parallel model's parameters (DTensors)
take their own shard only: resharded from a DTensor source (``distributed/resharding.py``, every rank receiving
just what it lacks), sliced from a whole tensor, or copied as they come where they are the rank's slice already
(a split rollout pool's buckets, :func:`shard_buckets`).

Names are matched after removing wrapper segments that FSDP, torch.compile, activation checkpointing, DDP and
PEFT insert (``_fsdp_wrapped_module.``, ``_orig_mod.``, ``_checkpoint_wrapped_module.``, ``module.``,
``base_model.model.``), with or without the leading ``model.``. Tied weights (``lm_head.weight`` sharing
``model.embed_tokens.weight``) answer to either name.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.distributed.tensor import DTensor, Shard

from hybridflow.distributed.resharding import reshard_into, shard_box
from hybridflow.errors import HybridflowError
from hybridflow.models.tensor_parallel import split_dimension

_WRAPPER_SEGMENTS = ("_fsdp_wrapped_module.", "_orig_mod.", "_checkpoint_wrapped_module.")
_WRAPPER_PREFIXES = ("module.", "base_model.model.")


class WeightNameError(KeyError):
    """A streamed tensor's name matches no parameter or buffer of the rollout model."""

    def __str__(self) -> str:
        return str(self.args[0])


class IncompleteSyncError(HybridflowError, RuntimeError):
    """A rollout model that freed its weights while asleep was sent only some of them."""


class WeightShapeError(ValueError):
    """A streamed tensor's shape differs from the rollout model's parameter of the same name."""


def model_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer by name, tied weights under each of their names."""
    tensors = dict(model.named_buffers(remove_duplicate=False))
    tensors.update(model.named_parameters(remove_duplicate=False))
    return tensors


def canonical_name(name: str, targets: dict[str, torch.Tensor]) -> str:
    """The name in ``targets`` that ``name`` refers to, or raise ``WeightNameError``."""
    stripped = name
    for segment in _WRAPPER_SEGMENTS:
        stripped = stripped.replace(segment, "")
    for prefix in _WRAPPER_PREFIXES:
        if stripped.startswith(prefix):
            stripped = stripped[len(prefix) :]
    candidates = (stripped, f"model.{stripped}", stripped.removeprefix("model."))
    for candidate in candidates:
        if candidate in targets:
            return candidate
    examples = ", ".join(sorted(targets)[:4])
    raise WeightNameError(
        f"weight {name!r} matches no parameter of the rollout model (names look like {examples}, ...)"
    )


@torch.no_grad()
def load_weights_in_place(model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[str]:
    """Copy each tensor into the model's own storage; returns the canonical names loaded, in order.

    DTensors are gathered here with ``full_tensor()`` one at a time, if the caller has not done it already, or
    resharded into a tensor-parallel model's DTensors.
    """
    targets = model_tensors(model)
    loaded = []
    for name, tensor in named_tensors:
        target_name = canonical_name(name, targets)
        target = targets[target_name]
        if target.shape != tensor.shape and not _is_own_slice(tensor, target):
            raise WeightShapeError(
                f"weight {name!r} has shape {tuple(tensor.shape)} but the rollout model's {target_name!r} has "
                f"{tuple(target.shape)}; the actor and rollout models must have the same architecture"
            )
        if target.shape != tensor.shape:  # this rank's slice already (a split rollout pool's bucket)
            target.to_local().copy_(tensor)
        elif isinstance(target, DTensor):
            reshard_into(tensor, target)
        else:
            target.copy_(tensor.full_tensor() if isinstance(tensor, DTensor) else tensor)
        loaded.append(target_name)
        del tensor  # freed before the stream makes the next one
    return loaded


def _is_own_slice(tensor: torch.Tensor, target: torch.Tensor) -> bool:
    return isinstance(target, DTensor) and not isinstance(tensor, DTensor) and tensor.shape == target.to_local().shape


def weight_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], megabytes: float
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The stream cut into lists of at least ``megabytes`` (the last may be smaller), each yielded once full, so
    one bucket is held at a time (verl's ``update_weights_bucket_megabytes``)."""
    return map(operator.itemgetter(1), shard_buckets(named_tensors, megabytes, 1))


def shard_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    megabytes: float,
    shards: int,
    slices: Callable[[str, torch.Tensor], list[Any]] | None = None,
) -> Iterator[tuple[int, list[tuple[str, Any]]]]:
    """``(shard, bucket)``: :func:`weight_buckets` for each of the ``shards`` ranks of a generation model split
    that many ways, of that rank's slices, so that a rank of a split rollout receives only its own. ``slices``
    cuts a weight into each rank's piece (anything with ``nbytes``); by default the ``hf`` engine's split
    (:func:`generation_slices`)."""
    buckets: list[list[tuple[str, Any]]] = [[] for _ in range(shards)]
    sizes, limit = [0] * shards, megabytes * 2**20
    for name, tensor in named_tensors:
        pieces = slices(name, tensor) if slices is not None else generation_slices(name, tensor, shards)
        for shard, piece in enumerate(pieces):
            buckets[shard].append((name, piece))
            sizes[shard] += piece.nbytes
            if sizes[shard] >= limit:
                yield shard, buckets[shard]
                buckets[shard], sizes[shard] = [], 0
    for shard, bucket in enumerate(buckets):
        if bucket:
            yield shard, bucket


def generation_slices(name: str, tensor: torch.Tensor, shards: int) -> list[torch.Tensor]:
    """The slice of the whole weight ``tensor`` that each of ``shards`` ranks of a split generation model holds
    (DTensor's chunks along ``split_dimension``), each a copy so that a bucket holds no more; the tensor itself
    for each rank where it stays whole."""
    dim = split_dimension(name) if shards > 1 else None
    if dim is None:
        return [tensor] * shards
    shape, placements = tuple(tensor.shape), [Shard(dim)]
    boxes = [shard_box(shape, (shards,), placements, (shard,)) for shard in range(shards)]
    return [tensor[tuple(slice(start, stop) for start, stop in box)].clone() for box in boxes]
