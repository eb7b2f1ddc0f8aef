"""The LoRA keys checked together before anything starts (verl's FSDP LoRA keys, arXiv:2106.09685).

``actor_rollout_ref.model``: ``lora_rank`` > 0 trains a fresh adapter; ``lora_adapter_path`` trains on from a
saved one, whose ``adapter_config.json`` then sets rank, alpha and modules (verl loads it with peft's
``PeftModel.from_pretrained`` and its own keys do not apply). Here a key left at its default defers to the
adapter and a key set to another value than the adapter's is an error, never silently overridden.
``lora.merge`` picks the weight sync: adapter tensors alone (needs an engine that applies adapters) or the
adapter merged into full weights; left null, adapter tensors (both engines, ``hf`` and ``vllm``, apply
adapters). Keys that only mean something with LoRA are refused without it.
"""

from __future__ import annotations

from typing import Any

from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.models.adapter_files import LoraAdapterError, read_adapter_config
from hybridflow.workers.config import ModelConfig

MODEL = "actor_rollout_ref.model"
DEFAULTS = ModelConfig()
_LORA_ON = f"set {MODEL}.lora_rank > 0 (or {MODEL}.lora_adapter_path)"


def lora_errors(config: PPOTrainerConfig, uses_critic: bool) -> list[str]:
    """One line per LoRA key of the policy (and of the critic, when there is one) that cannot run."""
    model = config.actor_rollout_ref.model
    errors = _rank_errors(MODEL, model)
    if not model.uses_lora:
        without = {"exclude_modules": model.exclude_modules is not None, "lora.merge": model.lora.merge is not None}
        errors += [
            f"{MODEL}.{key} is set but LoRA is off; {_LORA_ON} or remove it"
            for key, is_set in without.items()
            if is_set
        ]
    if uses_critic:
        critic = config.critic.model
        errors += _rank_errors("critic.model", critic)
        if critic.lora_rank <= 0 and critic.exclude_modules is not None:
            errors.append("critic.model.exclude_modules is set but critic.model.lora_rank=0; set a rank or remove it")
    return errors


def _rank_errors(prefix: str, model: ModelConfig) -> list[str]:
    if model.lora_rank < 0:
        return [f"{prefix}.lora_rank={model.lora_rank} is negative; use 0 (no LoRA) or a positive rank"]
    return []


def adapter_errors(model: Any) -> list[str]:
    """The saved adapter (``lora_adapter_path``, if set) must exist on this machine, and keys set away from their
    defaults must agree with it."""
    if model.lora_adapter_path is None:
        return []
    key = f"{MODEL}.lora_adapter_path"
    try:
        adapter = read_adapter_config(model.lora_adapter_path)
    except LoraAdapterError as error:
        return [f"{key}={model.lora_adapter_path!r}: {error}"]
    saved = {
        "lora_rank": adapter.get("r"),
        "lora_alpha": adapter.get("lora_alpha"),
        "target_modules": adapter.get("target_modules"),
        "exclude_modules": adapter.get("exclude_modules"),
    }
    return [
        f"{MODEL}.{name}={getattr(model, name)!r} differs from the adapter's {value!r} ({key} sets it); "
        f"leave {name} at its default or set it to the adapter's value"
        for name, value in saved.items()
        if getattr(model, name) != getattr(DEFAULTS, name) and _as_set(getattr(model, name)) != _as_set(value)
    ]


def _as_set(modules: Any) -> Any:
    # peft saves a list of module names in any order; a regex string stays as it is.
    return frozenset(modules) if isinstance(modules, (list, tuple, set)) else modules
