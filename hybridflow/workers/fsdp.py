"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the workers' models, and gathering full weights.

Each decoder layer becomes one FSDP unit (its parameters are all-gathered just before it runs and freed
after), then the root takes the rest (embeddings, final norm, head). ``fsdp_size`` below the world size
gives hybrid sharding: shards within groups of ``fsdp_size`` ranks, replicas across them. FSDP2 works on
CPU with gloo (FSDP1 does not), so the same code runs a laptop and a GPU node.

``tensor_parallel_size`` t > 1 gives the 2-D layout (FSDP2 x TP, as torchtitan builds it): a ``(dp, tp)`` mesh,
groups of t ranks splitting every attention and MLP weight (``models/tensor_parallel.py``; strided within a node,
unlike torchtitan's consecutive groups, so that the weight sync into a split rollout sends no redundant bytes),
FSDP2 sharding each split over the ``dp`` ranks. A group's ranks compute the same rows (``training.RowGroup``).

Gradients are averaged over the ``dp`` ranks by the reduce-scatter (and the all-reduce across replicas), so a
loss normalised by global counts is multiplied by the world size before ``backward`` (see training.py; with
t > 1 the counts count each row t times, once per rank of its group).
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Iterator

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from hybridflow.models.loading import resolve_dtype
from hybridflow.models.lora import is_lora_model, is_lora_weight
from hybridflow.models.tensor_parallel import is_training_split, split_model, training_mesh
from hybridflow.workers.config import FSDPConfig, WorkerConfigError


def build_device_mesh(fsdp_size: int, device: torch.device, tensor_parallel_size: int = 1) -> DeviceMesh:
    """A 1-D mesh over all ranks, a 2-D (replicate, shard) mesh when ``0 < fsdp_size < world_size``, or with
    ``tensor_parallel_size`` t > 1 the ``(dp, tp)`` mesh of ``models/tensor_parallel.training_mesh``."""
    world_size = dist.get_world_size()
    if tensor_parallel_size > 1:
        if 0 < fsdp_size < world_size // tensor_parallel_size:
            raise WorkerConfigError(
                f"fsdp_config.fsdp_size={fsdp_size} with fsdp_config.tensor_parallel_size={tensor_parallel_size}: "
                "leave fsdp_size at -1"
            )
        node_size = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or None  # a worker's ranks on its node
        return training_mesh(tensor_parallel_size, device.type, node_size)
    if fsdp_size <= 0 or fsdp_size >= world_size:
        return init_device_mesh(device.type, (world_size,), mesh_dim_names=("fsdp",))
    if world_size % fsdp_size:
        raise WorkerConfigError(
            f"fsdp_config.fsdp_size={fsdp_size} must divide the group's world size {world_size}; "
            f"use a divisor of {world_size} or -1 for all ranks"
        )
    return init_device_mesh(device.type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def mixed_precision_policy(config: FSDPConfig) -> MixedPrecisionPolicy:
    """Parameters cast to ``param_dtype`` for compute; gradients reduced in ``reduce_dtype``."""
    precision = config.mixed_precision
    return MixedPrecisionPolicy(
        param_dtype=resolve_dtype(precision.param_dtype), reduce_dtype=resolve_dtype(precision.reduce_dtype)
    )


def _layer_class_names(model: torch.nn.Module) -> set[str]:
    """Class names of the decoder layers, from the Hugging Face model's ``_no_split_modules``."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return set(names)
    return set()


def shard_model(
    model: torch.nn.Module, mesh: DeviceMesh, config: FSDPConfig, column_sharded: tuple[str, ...] = ()
) -> torch.nn.Module:
    """Apply ``fully_shard`` to every decoder layer, then to the root; returns the (same) model.

    The model must be on its compute device. A model without ``_no_split_modules`` is one FSDP unit. The weights
    of the linear layers named in ``column_sharded`` are split by input columns (dim 1) instead of rows: a
    tensor-parallel rollout splits them so, and each rank's training shard then lies inside its generation shard.
    On a ``(dp, tp)`` mesh the model is split over ``tp`` first and FSDP2 shards each split over ``dp``.
    """
    if is_training_split(mesh):
        split_model(model, mesh["tp"], "fsdp_config.tensor_parallel_size", training=True)
        mesh = mesh["dp"]
    columns = {
        id(module.weight)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in column_sharded
    }
    options = {
        "mesh": mesh,
        "mp_policy": mixed_precision_policy(config),
        "reshard_after_forward": config.reshard_after_forward,
        "shard_placement_fn": lambda param: Shard(1) if id(param) in columns else None,
    }
    layer_names = _layer_class_names(model)
    for module in model.modules():
        if type(module).__name__ in layer_names:
            fully_shard(module, **options)
    fully_shard(model, **options)
    return model


def iter_full_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor)`` per parameter, gathered one at a time, in ``named_parameters`` order.

    Every rank must consume the iterator to the end in step (each gather is a collective). Tied
    parameters appear once, under their first name. Only one full parameter is alive at a time when the
    consumer copies it somewhere and drops it.
    """
    for name, param in model.named_parameters():
        yield name, _full(param)


def _full(param: torch.Tensor) -> torch.Tensor:
    return (param.full_tensor() if isinstance(param, DTensor) else param).detach()


def iter_hf_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(Hugging Face name, full tensor)`` per weight of the plain model; a LoRA model yields merged
    weights ``W + (alpha / r) * B @ A`` under the base names (arXiv:2106.09685, eq. 3).

    Gathers one weight (plus its two adapter matrices) at a time; every rank must consume it in step.
    """
    if not is_lora_model(model):
        yield from iter_full_parameters(model)
        return
    from peft.tuners.lora import LoraLayer
    from peft.utils import transpose

    base = model.get_base_model()
    lora_layers = {name: module for name, module in base.named_modules() if isinstance(module, LoraLayer)}
    for name, param in base.named_parameters():
        if is_lora_weight(name) or ".original_module." in name:
            continue
        weight = _full(param)
        layer = lora_layers.get(name.removesuffix(".base_layer.weight"))
        if layer is not None and name.endswith(".base_layer.weight"):
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    delta = _full(layer.lora_B[adapter].weight) @ _full(layer.lora_A[adapter].weight)
                    weight = weight + transpose(delta, layer.fan_in_fan_out) * layer.scaling[adapter]
        yield _hf_name(name), weight


def iter_lora_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``(peft name, full tensor)`` per LoRA adapter tensor (``lora_A``/``lora_B``), gathered one at a time.

    What a rollout model holding the same adapter structure needs after an update: the base weights never
    change. Every rank must consume it in step.
    """
    for name, param in model.named_parameters():
        if is_lora_weight(name):
            yield name, _full(param)


def _hf_name(peft_name: str) -> str:
    # peft renames an adapted layer's weight ``.base_layer.`` and a fully trained head ``.modules_to_save.<a>.``.
    return re.sub(r"\.modules_to_save\.[^.]+\.", ".", peft_name.replace(".base_layer.", "."))


def move_model(model: torch.nn.Module, device: torch.device) -> None:
    """Move the sharded parameters and gradients to ``device``: parameter offload between calls."""
    # A module left unsharded (e.g. with reshard_after_forward=False) holds plain tensors that FSDP2
    # cannot move as shards: reshard everything first.
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    model.to(device)


@contextlib.contextmanager
def parameters_on(model: torch.nn.Module, device: torch.device, offload: bool) -> Iterator[None]:
    """With ``offload``, the parameters visit ``device`` for the block and go back to CPU after it."""
    if offload:
        move_model(model, device)
    try:
        yield
    finally:
        if offload:
            move_model(model, torch.device("cpu"))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move the optimizer's moment tensors to ``device``: optimizer offload between updates.

    Adam's ``step`` counters stay where they are: on CPU for the foreach kernel, on the parameters' device for
    the fused one (which reads them there; seen on CUDA, ``tests/gpu``).
    """
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device, non_blocking=True)
