"""What a worker finds only once it builds its model, found by the config check on the model built on the meta
device from its ``config.json`` (no weights read, no memory taken): an attention kernel transformers cannot run,
gradient checkpointing the model lacks, LoRA modules that match nothing, and a tensor-parallel split of an
architecture without the Llama-style layers. Only runs that ask for one of these build it."""

from __future__ import annotations

from typing import Any

from hybridflow.config.schema import PPOTrainerConfig

DEFAULT_ATTENTION = "sdpa"


def model_structure_errors(config: PPOTrainerConfig, uses_critic: bool) -> list[str]:
    arr = config.actor_rollout_ref
    splits = [
        key
        for key, size in (
            ("actor_rollout_ref.rollout.tensor_model_parallel_size", arr.rollout.tensor_model_parallel_size),
            ("actor_rollout_ref.actor.fsdp_config.tensor_parallel_size", arr.actor.fsdp_config.tensor_parallel_size),
        )
        if size > 1
    ]
    roles = {"actor_rollout_ref.model": (arr.model, " and ".join(splits))}
    if uses_critic:
        critic = config.critic.model
        split = "critic.model.fsdp_config.tensor_parallel_size" if critic.fsdp_config.tensor_parallel_size > 1 else ""
        roles["critic.model"] = (critic, split)
    errors = []
    for prefix, (model, split_keys) in roles.items():
        errors += _role_errors(prefix, model, model.path, split_keys)
    return errors


def sft_model_structure_errors(model: Any) -> list[str]:
    """The SFT trainer's ``model`` (from ``partial_pretrain``; FSDP2 alone splits it)."""
    return _role_errors("model", model, model.partial_pretrain, "")


def _role_errors(prefix: str, model: Any, path: str, split_keys: str) -> list[str]:
    """``model``: a role's model options, loaded from ``path``; ``split_keys``: the keys (joined) that split it,
    or empty."""
    fresh_lora = model.lora_rank > 0 and getattr(model, "lora_adapter_path", None) is None
    asks = fresh_lora or split_keys or model.enable_gradient_checkpointing
    asks = asks or model.attn_implementation != DEFAULT_ATTENTION
    if not asks:
        return []
    try:
        built = _meta_model(model, path)
    except (ValueError, ImportError) as error:  # transformers' words for a kernel it cannot run
        return [f"{prefix}.attn_implementation={model.attn_implementation!r}: {error}"]
    errors = []
    if model.enable_gradient_checkpointing and not built.supports_gradient_checkpointing:
        errors.append(
            f"{prefix}.enable_gradient_checkpointing=true, but {type(built).__name__} does not support it; set it "
            "to false"
        )
    if split_keys:
        errors += _split_errors(prefix, path, built, split_keys)
    if fresh_lora:  # last: peft wraps the layers it adapts
        errors += _lora_errors(prefix, model, built)
    return errors


def _meta_model(model: Any, path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from hybridflow.models.loading import load_model_config

    model_config = load_model_config(path, trust_remote_code=model.trust_remote_code)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(
            model_config, attn_implementation=model.attn_implementation, trust_remote_code=model.trust_remote_code
        )


def _lora_errors(prefix: str, model: Any, built: Any) -> list[str]:
    from hybridflow.models.lora import apply_lora

    exclude = getattr(model, "exclude_modules", None)  # the SFT trainer's model has no such key
    try:
        apply_lora(built, model.lora_rank, model.lora_alpha, model.target_modules, 0.0, exclude)
    except ValueError as error:  # peft's NoMatchingPeftModuleError
        return [f"{prefix}.target_modules={model.target_modules!r} with exclude_modules={exclude!r}: {error}"]
    return []


def _split_errors(prefix: str, path: str, built: Any, split_keys: str) -> list[str]:
    from hybridflow.models.tensor_parallel import TensorParallelError, split_plan

    try:
        split_plan(built, split_keys)
    except TensorParallelError as error:
        return [f"{prefix}.path={path!r}: {error}"]
    return []
