"""Load a worker's Hugging Face model and make it ready: LoRA, gradient checkpointing, device, FSDP2."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from transformers import AutoModelForCausalLM, PreTrainedModel

from hybridflow.models.loading import from_pretrained_or_raise, load_model_config, resolve_dtype, resolve_model_path
from hybridflow.models.lora import apply_lora, load_lora_adapter
from hybridflow.models.training_options import enable_gradient_checkpointing
from hybridflow.workers.config import FSDPConfig, ModelConfig
from hybridflow.workers.fsdp import shard_model


def load_policy_model(config: ModelConfig) -> PreTrainedModel:
    """The causal LM at ``config.path`` in ``config.dtype``, with ``override_config`` applied to its
    config before the weights are built (so e.g. ``attention_dropout`` takes effect)."""
    hf_config = load_model_config(config.path, trust_remote_code=config.trust_remote_code)
    for key, value in config.override_config.items():
        setattr(hf_config, key, value)
    return from_pretrained_or_raise(
        AutoModelForCausalLM,
        resolve_model_path(config.path),
        config=hf_config,
        dtype=resolve_dtype(config.dtype),
        attn_implementation=config.attn_implementation,
        trust_remote_code=config.trust_remote_code,
    )


def shard_for_training(
    model: PreTrainedModel,
    config: ModelConfig,
    fsdp_config: FSDPConfig,
    mesh: DeviceMesh,
    device: torch.device,
    lora_adapter_path: str | None = None,
    column_sharded: tuple[str, ...] = (),
) -> torch.nn.Module:
    """Add the LoRA adapter (loaded from ``lora_adapter_path``, else a fresh one when ``lora_rank > 0``:
    only it trains), switch on gradient checkpointing if asked, move to ``device`` and shard (``column_sharded``:
    see ``shard_model``). Returns the model to train (a PeftModel with LoRA)."""
    if lora_adapter_path is not None:
        model = load_lora_adapter(model, lora_adapter_path)
    elif config.lora_rank > 0:
        model = apply_lora(
            model, config.lora_rank, config.lora_alpha, config.target_modules, exclude_modules=config.exclude_modules
        )
    if config.enable_gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model.to(device)
    return shard_model(model, mesh, fsdp_config, column_sharded)


def shard_frozen(
    model: torch.nn.Module, fsdp_config: FSDPConfig, mesh: DeviceMesh, device: torch.device
) -> torch.nn.Module:
    """A model that only runs forward (reference policy, reward model): no gradients, eval mode, sharded."""
    model.requires_grad_(False)
    model.eval()
    model.to(device)
    return shard_model(model, mesh, fsdp_config)
