"""Saved LoRA adapter folders (peft's ``save_pretrained`` layout), read without importing peft.

A folder holds ``adapter_config.json`` (rank ``r``, ``lora_alpha``, ``target_modules``, ``exclude_modules``,
...) and the weights (``adapter_model.safetensors``). The config check reads it before anything starts, so
this module stays free of peft and transformers.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

from hybridflow.errors import HybridflowError

ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILES = ("adapter_model.safetensors", "adapter_model.bin")


class LoraAdapterError(HybridflowError, ValueError):
    """A folder given as a saved LoRA adapter is not one."""


def read_adapter_config(path: str | os.PathLike) -> dict[str, Any]:
    """The ``adapter_config.json`` of a saved peft LoRA adapter folder; raises ``LoraAdapterError`` when
    ``path`` is not one (no config, no weights, or another peft method)."""
    folder = pathlib.Path(path).expanduser()
    config_file = folder / ADAPTER_CONFIG_FILE
    if not config_file.is_file():
        raise LoraAdapterError(f"{folder} has no {ADAPTER_CONFIG_FILE}: give a folder saved by peft's save_pretrained")
    if not any((folder / name).is_file() for name in ADAPTER_WEIGHTS_FILES):
        raise LoraAdapterError(f"{folder} has no {ADAPTER_WEIGHTS_FILES[0]}: the adapter's weights are missing")
    config = json.loads(config_file.read_text())
    if config.get("peft_type") != "LORA":
        raise LoraAdapterError(f"{config_file} is a {config.get('peft_type')!r} adapter; only LoRA adapters load")
    return config
