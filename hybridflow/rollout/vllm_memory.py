"""How much memory vLLM's CPU build gives its KV cache, read as vLLM reads it.

vLLM 0.32's CPU worker (``vllm/v1/worker/cpu_worker.py``) sizes the cache in one of two ways:

- ``engine_kwargs.vllm.kv_cache_memory_bytes`` set: that many bytes, which must fit what the NUMA node has
  available;
- unset: ``gpu_memory_utilization`` x the NUMA node's total memory (clamped to a cgroup limit), less the resident
  memory of the process once the model is loaded.

The second depends on the machine: on machines of this project's kind the node reported 3.6 to 12 GiB of the 24
GiB ``free`` shows, at different times, and a share that fits one leaves a negative cache on another. vLLM then
fails inside its worker, after loading the model. :func:`cpu_kv_cache_error` makes the same arithmetic first, so a
run is refused in one line naming both keys; :func:`kv_cache_bytes` is the size that holds a given number of
sequences, the same on every machine (what hybridflow's own vLLM runs set).
"""

from __future__ import annotations

import math
import os
import pathlib
from dataclasses import dataclass
from typing import Any

from hybridflow.models.loading import resolve_model_path
from hybridflow.rollout.config import CONFIG_PREFIX, RolloutConfig

# vLLM's CPU attention block (its platforms/cpu.py default): the cache is allocated in blocks of this many tokens.
CPU_BLOCK_TOKENS = 128
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
KV_BYTES_KEY = f"{CONFIG_PREFIX}.engine_kwargs.vllm.kv_cache_memory_bytes"
SHARE_KEY = f"{CONFIG_PREFIX}.gpu_memory_utilization"
GIB = 2**30


@dataclass(frozen=True)
class NodeMemory:
    """The NUMA node vLLM's CPU worker allocates on: its total memory and what is available now, in bytes."""

    node: int
    total: int
    available: int


def cpu_node_memory() -> NodeMemory:
    """What vLLM's CPU worker reads: the NUMA node of the first CPU this process may run on (needs vllm)."""
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list, get_memory_node_info

    node = get_allowed_cpu_list()[0].numa_node
    info = get_memory_node_info(node)
    return NodeMemory(node, info.total_memory, info.available_memory)


def kv_bytes_per_token(model_config: Any, dtype: str) -> int:
    """Keys and values of one token over every layer (each layer full attention: an upper bound where some
    layers attend within a sliding window)."""
    text = model_config.get_text_config()
    return 2 * text.num_hidden_layers * kv_width(text) * DTYPE_BYTES[dtype]


def kv_width(text_config: Any) -> int:
    """Elements of one token's keys (or values) in one layer: key/value heads x head size."""
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    kv_heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    return kv_heads * head_dim


def kv_cache_bytes(model_config: Any, dtype: str, sequences: int, max_model_len: int) -> int:
    """A KV cache that holds ``sequences`` sequences of ``max_model_len`` tokens at once, in whole CPU blocks."""
    blocks = sequences * math.ceil(max_model_len / CPU_BLOCK_TOKENS)
    return blocks * CPU_BLOCK_TOKENS * kv_bytes_per_token(model_config, dtype)


def max_model_len(config: RolloutConfig) -> int:
    return config.max_model_len or config.prompt_length + config.response_length


def weight_bytes(model_path: str | os.PathLike, dtype: str) -> int:
    """The model's weights as vLLM holds them in ``dtype``, counted from its safetensors headers (no tensor read);
    the files' size where the folder has no safetensors. A hub id is read from the local Hugging Face cache."""
    from safetensors import safe_open

    folder = pathlib.Path(resolve_model_path(model_path)).expanduser()
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        folder = pathlib.Path(snapshot_download(str(model_path), local_files_only=True))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return sum(path.stat().st_size for path in folder.glob("*.bin"))
    elements = 0
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            elements += sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())
    return elements * DTYPE_BYTES[dtype]


def resident_bytes() -> int:
    """This process's resident memory, as vLLM's worker measures it (psutil, which vllm requires)."""
    import psutil

    return psutil.Process(os.getpid()).memory_info().rss


def cpu_kv_cache_error(
    config: RolloutConfig, model_config: Any, memory: NodeMemory, process_bytes: int, sequences: int, whose: str
) -> str | None:
    """Why vLLM's CPU worker would find no room for its KV cache, in one line with the numbers and both keys to
    change; None where it finds room.

    ``process_bytes``: what the rollout's process holds before the cache (at least); ``sequences``: how many of
    ``max_model_len`` tokens the suggested explicit size holds, ``whose`` saying what they are ("room for ...").
    """
    one_sequence = kv_cache_bytes(model_config, config.dtype, 1, max_model_len(config))
    needed = one_sequence * sequences
    explicit = dict(config.engine_kwargs.get("vllm") or {}).get("kv_cache_memory_bytes")
    fix = explicit_size(needed, whose)
    node = f"NUMA node {memory.node}, where vLLM's CPU build allocates"
    if explicit is not None:
        if explicit <= memory.available:
            return None
        return (
            f"{KV_BYTES_KEY}={explicit} ({_gib(explicit)} GiB) is more than the {_gib(memory.available)} GiB "
            f"available on {node}; set {fix}, or free memory there"
        )
    share = config.gpu_memory_utilization
    requested = math.ceil(memory.total * share)
    # vLLM's conditions: the share fits what is available, and what the process holds leaves at least one sequence.
    if requested <= memory.available and requested - process_bytes >= one_sequence:
        return None
    if requested > memory.available:
        why = f"more than the {_gib(memory.available)} GiB available there"
    else:
        why = f"the rollout's process holds at least {_gib(process_bytes)} GiB before its KV cache, leaving no room"
    lowest = math.ceil(100 * (process_bytes + needed) / memory.total) / 100
    share_fix = f", or {SHARE_KEY}={lowest:.2f}" if lowest <= min(1.0, memory.available / memory.total) else ""
    return (
        f"{SHARE_KEY}={share} gives vLLM {_gib(requested)} GiB on CPU ({share} x the {_gib(memory.total)} GiB of "
        f"{node}); {why}; set +{fix}{share_fix}"
    )


def explicit_size(needed: int, whose: str) -> str:
    """The override that gives vLLM ``needed`` bytes of KV cache whatever the machine (``whose``: "room for ...")."""
    return f"{KV_BYTES_KEY}={needed} ({_gib(needed)} GiB, {whose}, on any machine)"


def _gib(size: int) -> str:
    return f"{size / GIB:.2f}"
