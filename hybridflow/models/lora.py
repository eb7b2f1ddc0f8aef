"""LoRA adapters through ``peft`` (Hu et al., arXiv:2106.09685), with the base model as reference policy.

Only the adapter weights train. The reference policy is the same module with the adapter switched off
(``adapter_disabled``), so no second copy of the base weights is kept for KL terms. For export or
for loading into a rollout engine, ``merged_state_dict`` gives ``W + (alpha / r) * B @ A`` under the
base model's parameter names without touching the trained model; ``merge_lora`` folds the adapter in
for good. An adapter saved by peft (``adapter_config.json`` + weights) can be trained further
(``load_lora_adapter``, verl's ``lora_adapter_path``), and ``add_lora_layers`` gives another copy of the
model (a rollout engine's) the same adapter structure, so only adapter tensors need copying into it.
"""

from __future__ import annotations

import contextlib
import copy
import os
import pathlib
import re
from typing import Iterator

import torch
from peft import LoraConfig, PeftModel, get_peft_model, inject_adapter_in_model
from peft.tuners.lora import LoraLayer

from hybridflow.models.adapter_files import read_adapter_config

# The adapter's A matrices start random (B at 0), drawn from this seed: two runs of one config train alike (a run
# killed and resumed is compared with an uninterrupted one so).
LORA_INIT_SEED = 0


class NotALoraModelError(TypeError):
    """A LoRA operation was asked of a model that has no adapter."""


def apply_lora(
    model: torch.nn.Module,
    rank: int,
    alpha: float,
    target_modules: str | list[str] = "all-linear",
    dropout: float = 0.0,
    exclude_modules: str | list[str] | None = None,
) -> PeftModel:
    """Wrap ``model`` with a LoRA adapter of ``rank`` and ``alpha`` on ``target_modules``; freeze the rest.

    "all-linear" adapts every linear layer except the output projection. ``exclude_modules`` (peft's
    meaning, as in verl: a regex matched against the full module name, or a list of names matched
    exactly or as a name suffix) keeps matching modules without an adapter. A model with a scalar
    ``score`` head (critic, reward model) trains that head in full.
    """
    if rank <= 0:
        raise ValueError(f"lora rank={rank} must be a positive integer (0 means no LoRA: do not call apply_lora)")
    is_causal_lm = model.get_output_embeddings() is not None
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=target_modules,
        lora_dropout=dropout,
        bias="none",
        task_type="CAUSAL_LM" if is_causal_lm else "TOKEN_CLS",
        # The scalar head trains in full (peft's modules_to_save), so it must not also get an adapter.
        exclude_modules=exclude_modules if is_causal_lm else _also_exclude(exclude_modules, "score"),
    )
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(LORA_INIT_SEED)
        return get_peft_model(model, config)


def _also_exclude(exclude_modules: str | list[str] | None, name: str) -> str | list[str]:
    if exclude_modules is None:
        return [name]
    if isinstance(exclude_modules, str):  # a regex, matched against the whole module name
        return rf"(?:{exclude_modules})|(?:.*\.)?{re.escape(name)}"
    return [*exclude_modules, name]


def load_lora_adapter(model: torch.nn.Module, path: str | os.PathLike) -> PeftModel:
    """``model`` with the saved LoRA adapter at ``path``, trainable (everything else frozen)."""
    read_adapter_config(path)
    return PeftModel.from_pretrained(model, str(pathlib.Path(path).expanduser()), is_trainable=True)


def lora_config(model: torch.nn.Module) -> LoraConfig:
    """The LoRA config of a model's (single, "default") adapter."""
    _require_lora(model)
    return model.peft_config["default"]


def add_lora_layers(model: torch.nn.Module, config: LoraConfig) -> torch.nn.Module:
    """Give a plain model (in place) LoRA layers of ``config`` with peft's names, to be filled by copying a
    trained adapter's tensors; the model keeps its class and forward. Returns ``model``."""
    return inject_adapter_in_model(copy.deepcopy(config), model)


def is_lora_weight(name: str) -> bool:
    """A peft adapter tensor (``...lora_A.default.weight``, ``...lora_B...``) rather than a base weight."""
    return ".lora_" in name


def is_lora_model(model: torch.nn.Module) -> bool:
    return isinstance(model, PeftModel)


@contextlib.contextmanager
def adapter_disabled(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """Inside the block the model computes the base (reference) policy; the adapter is back afterwards."""
    _require_lora(model)
    with model.disable_adapter():
        yield model


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with each adapted weight replaced by ``W + delta``; keys as in the base.

    The model is left as it is (no in-place merge, so no rounding drift from merge/unmerge cycles).
    """
    _require_lora(model)
    base = model.get_base_model()
    merged = {
        _base_name(name): tensor.detach()
        for name, tensor in base.state_dict().items()
        if ".lora_" not in name and ".original_module." not in name
    }
    for module_name, module in base.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                key = f"{module_name}.weight"
                merged[key] = merged[key] + module.get_delta_weight(adapter).detach()
    return merged


def _base_name(name: str) -> str:
    # peft renames an adapted layer's weight to ``.base_layer.`` and a fully trained head to
    # ``.modules_to_save.<adapter>.``; the base model knows both by the plain name.
    return re.sub(r"\.modules_to_save\.[^.]+\.", ".", name.replace(".base_layer.", "."))


def merge_lora(model: torch.nn.Module) -> torch.nn.Module:
    """Fold the adapter into the base weights and return the plain base model (for export)."""
    _require_lora(model)
    return model.merge_and_unload()


def _require_lora(model: torch.nn.Module) -> None:
    if not is_lora_model(model):
        raise NotALoraModelError(
            f"{type(model).__name__} has no LoRA adapter: set the model's lora_rank > 0 to use one"
        )
