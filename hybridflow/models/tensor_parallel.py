"""A tensor-parallel model: Megatron's column-then-row split (arXiv 1909.08053 §3), as vLLM shards a decoder for
generation and torchtitan for training, with torch's tensor-parallel styles over one dimension of a device mesh.

Each of the ``k`` ranks of a group holds ``1/k`` of every attention head's projections (q, k, v split by
output rows, o by input columns) and of the MLP (gate and up by rows, down by columns), so a decoder layer
costs two all-reduces; the embedding and the output head are split by vocabulary rows (one all-reduce, one
all-gather of the logits). Attention runs on the rank's own heads unchanged: the Hugging Face attention
modules reshape with ``-1`` heads. The norms stay whole on every rank.

Training (``fsdp_config.tensor_parallel_size``, ``workers/fsdp.py``) splits the same layers over the ``tp``
groups of :func:`training_mesh` and FSDP2 chunks each split over ``dp``; torch's styles carry the gradients back
through the splits.

Both meshes are strided within a node, so that rank ``r`` of a node holds the node's chunk ``r`` of every split
weight in training (the training split's slice first, FSDP's chunk within it) and a generation shard that
contains it, for every pair of layouts: the grouping of HybridFlow's 3D-HybridEngine (arXiv 2409.19256 §5.4),
which ``distributed/resharding.py`` turns into a weight sync with no redundant copy.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hybridflow.errors import HybridflowError

# Linear layers split by output rows, and by input columns, in the decoders transformers ships.
COLUMN_SPLIT = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_SPLIT = ("o_proj", "down_proj")
# Norms applied to each head of q and k (Qwen3, Gemma 3): a rank normalises its own heads, so its gradient of the
# norm's weight covers only them. As a DTensor replicated over the group, held by heads (dimension 2 of the
# [rows, seq, heads, head_dim] input), the weight's gradient is summed over the group's heads.
HEAD_NORMS = ("q_norm", "k_norm")
HEAD_DIMENSION = 2
# The input embedding and the output head, split by vocabulary rows, under their names in those decoders.
VOCABULARY_SPLIT = ("embed_tokens", "lm_head")


def split_dimension(name: str) -> int | None:
    """The dimension along which a split model (:func:`split_plan`) divides the weight ``name`` (a Hugging Face
    parameter name), or None where every rank holds it whole."""
    module, _, kind = name.rpartition(".")
    leaf = module.rpartition(".")[2]
    if leaf in COLUMN_SPLIT or leaf in VOCABULARY_SPLIT:
        return 0
    if leaf in ROW_SPLIT and kind == "weight":
        return 1
    return None


class TensorParallelError(HybridflowError, ValueError):
    """The model cannot be split ``k`` ways (heads not divisible, or an architecture without the usual layers)."""


def head_errors(model_config: Any, size: int, key: str) -> list[str]:
    """One line per head count that ``size`` does not divide (each rank holds whole heads)."""
    text_config = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    errors = []
    for name in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(text_config, name, None)
        if heads is not None and heads % size:
            divisors = [d for d in range(1, heads + 1) if heads % d == 0]
            errors.append(f"{key}={size} does not divide the model's {heads} {name}; choose one of {divisors}")
    return errors


def generation_mesh(size: int, device_type: str, node_size: int | None = None) -> DeviceMesh:
    """The ``(tp, dp)`` mesh over the default group: within each node of ``node_size`` consecutive ranks (default:
    one node of all), groups of ``size`` ranks strided by ``node_size / size``. Every rank calls it.

    Strided, so that FSDP's chunk ``r`` (rank ``r``'s training shard) lies inside rank ``r``'s generation shard when
    the world is one node: the 3D-HybridEngine's grouping (arXiv 2409.19256 §5.4). Within a node, so that the
    per-layer all-reduces never cross the network (across nodes a rank then also receives part of what it trains).
    """
    world = dist.get_world_size()
    node_size = node_size or world
    sizes: list[int | None] = [None] * world
    dist.all_gather_object(sizes, node_size)
    if len(set(sizes)) > 1:
        raise TensorParallelError(
            f"the ranks sit on nodes of different sizes ({sizes}); a tensor-parallel rollout needs as many ranks on "
            "every node"
        )
    if size < 1 or node_size % size or world % node_size:
        raise TensorParallelError(
            f"tensor_model_parallel_size={size} must divide the {node_size} ranks of a node (world size {world})"
        )
    stride = node_size // size
    groups = [
        [node + offset + j * stride for j in range(size)]
        for node in range(0, world, node_size)
        for offset in range(stride)
    ]
    # Each group's and each column's ranks increase, so every sub-group's rank order is its mesh order.
    return DeviceMesh(device_type, torch.tensor(groups).T.contiguous(), mesh_dim_names=("tp", "dp"))


def training_mesh(size: int, device_type: str, node_size: int | None = None) -> DeviceMesh:
    """The ``(dp, tp)`` mesh of FSDP2 x TP training over the default group: within each node of ``node_size``
    consecutive ranks (default: one node of all), groups of ``size`` ranks strided by ``node_size / size``, so
    that rank ``r`` holds chunk ``r`` of the node's (:mod:`module docstring <hybridflow.models.tensor_parallel>`)
    and the per-layer all-reduces stay on the node. Every rank calls it; ``size`` divides ``node_size``."""
    world = dist.get_world_size()
    node_size = node_size or world
    if size < 1 or node_size % size or world % node_size:
        raise TensorParallelError(
            f"fsdp_config.tensor_parallel_size={size} must divide the {node_size} ranks of a node (world size {world})"
        )
    per_node = node_size // size
    rows = [
        [node + j * per_node + i for j in range(size)] for node in range(0, world, node_size) for i in range(per_node)
    ]
    # Rows and columns increase, so every sub-group's rank order is its mesh order.
    return DeviceMesh(device_type, torch.tensor(rows), mesh_dim_names=("dp", "tp"))


def is_training_split(mesh: DeviceMesh) -> bool:
    """Whether ``mesh`` is a :func:`training_mesh` (a model split over ``tp``, FSDP2 over ``dp``)."""
    return mesh.mesh_dim_names == ("dp", "tp")


def split_plan(model: torch.nn.Module, key: str, training: bool = False) -> dict[str, ParallelStyle]:
    """Module name -> tensor-parallel style for every split layer of a transformers causal LM (or of its value
    model, whose one-output head stays whole); ``key`` is named in the refusal of another architecture. In
    ``training``, the per-head norms too (``HEAD_NORMS``): generation computes the same with them whole."""
    names = {id(module): name for name, module in model.named_modules()}
    plan: dict[str, ParallelStyle] = {}
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, torch.nn.Linear) and leaf in COLUMN_SPLIT:
            plan[name] = ColwiseParallel()
        elif isinstance(module, torch.nn.Linear) and leaf in ROW_SPLIT:
            plan[name] = RowwiseParallel()
        elif training and leaf in HEAD_NORMS:
            plan[name] = SequenceParallel(sequence_dim=HEAD_DIMENSION, use_local_output=True)
    if not any(name.endswith("o_proj") for name in plan):
        raise TensorParallelError(
            f"{type(model).__name__} has no q/k/v/o_proj and gate/up/down_proj layers to split; tensor parallelism "
            "supports the Llama-style decoders (Llama, Qwen2/3, Qwen3 MoE, Mistral, Gemma 3, Seed-OSS); "
            f"set {key}=1"
        )
    plan[names[id(model.get_input_embeddings())]] = RowwiseParallel(
        input_layouts=Replicate(), output_layouts=Replicate()
    )
    head = model.get_output_embeddings()
    if head is not None:
        plan[names[id(head)]] = ColwiseParallel(output_layouts=Replicate())
    return plan


def split_model(model: torch.nn.Module, mesh: DeviceMesh, key: str, training: bool = False) -> torch.nn.Module:
    """Split ``model`` in place over the 1-D ``mesh`` (:func:`split_plan`); tied input and output embeddings stay
    one parameter."""
    errors = head_errors(model.config, mesh.size(), key)
    if errors:
        raise TensorParallelError("; ".join(errors))
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    tied = head is not None and head.weight is embeddings.weight
    parallelize_module(model, mesh, split_plan(model, key, training))
    if tied:
        head.weight = embeddings.weight  # both split by vocabulary rows: one shard serves both
    return model


def shard_for_generation(model: torch.nn.Module, mesh: DeviceMesh) -> torch.nn.Module:
    """Split ``model`` in place over ``mesh["tp"]``."""
    return split_model(model, mesh["tp"], "actor_rollout_ref.rollout.tensor_model_parallel_size")
