"""verl's SFT config keys that hybridflow's SFT schema has no field for: each accepted, aliased, or refused.

verl has two SFT entry points: ``verl.trainer.sft_trainer`` (config ``sft_trainer_engine.yaml`` with the
groups ``model``, ``engine``, ``optim``, ``profiler``) and the older ``verl.trainer.fsdp_sft_trainer`` (config
``sft_trainer.yaml``, removed by verl PR #5382), whose layout :mod:`hybridflow.config.sft` keeps.
``verl_sft_compat.yaml`` (merged under ``sft_trainer.yaml`` by Hydra) holds every key of either that the
schema lacks, and :data:`SFT_RULES` says what each means here (first matching pattern wins;
``tests/trainer/test_verl_sft_compat.py`` checks every key has a rule): the current names of schema keys
(``model.path`` -> ``model.partial_pretrain``, ``engine.param_offload`` -> ``model.fsdp_config.param_offload``),
capabilities hybridflow lacks (Megatron and the other engines, custom dataset classes, QAT), and knobs nothing
here reads. An alias's default in the YAML is its schema key's default, so an alias left alone changes nothing.
The mechanism is :mod:`hybridflow.config.key_surface`.
"""

from __future__ import annotations

import pathlib

from hybridflow.config.key_surface import Group, Rule, Surface
from hybridflow.config.key_surface import alias as _alias
from hybridflow.config.key_surface import lacks as _lacks
from hybridflow.config.key_surface import moot as _moot
from hybridflow.config.key_surface import unread as _unread
from hybridflow.config.verl_compat import FSDP1_KNOB as FSDP_KNOB
from hybridflow.config.verl_compat import KERNELS

SFT_COMPAT_YAML = pathlib.Path(__file__).parent / "yaml" / "verl_sft_compat.yaml"

ENGINES = "a training engine other than FSDP2 (Megatron, Megatron Lite, VeOmni, TorchTitan, Automodel)"

SFT_RULES: tuple[Rule, ...] = (
    # Current and older names of schema keys.
    _alias("model.path", "model.partial_pretrain"),
    _alias("model.use_remove_padding", "use_remove_padding"),
    _alias("model.fsdp_config.model_dtype", "model.dtype"),
    _alias("model.fsdp_config.offload_params", "model.fsdp_config.param_offload"),
    _alias("engine.model_dtype", "model.dtype"),
    _alias("engine.dtype", "model.fsdp_config.mixed_precision.param_dtype"),
    _alias("engine.param_offload", "model.fsdp_config.param_offload"),
    _alias("engine.optimizer_offload", "model.fsdp_config.optimizer_offload"),
    _alias("engine.reshard_after_forward", "model.fsdp_config.reshard_after_forward"),
    _alias("engine.fsdp_size", "model.fsdp_config.fsdp_size"),
    _alias("data.messages_key", "data.multiturn.messages_key"),
    _alias("data.tools_key", "data.multiturn.tools_key"),
    _alias("data.enable_thinking_key", "data.multiturn.enable_thinking_key"),
    _alias("data.enable_thinking_default", "data.multiturn.enable_thinking_default"),
    _alias("data.chat_template", "model.custom_chat_template"),
    _alias("optim.lr_warmup_steps_ratio", "optim.warmup_steps_ratio"),
    _alias("optim.lr_scheduler_type", "optim.lr_scheduler"),
    _alias("optim.warmup_style", "optim.lr_scheduler"),
    _alias("trainer.checkpoint.*", "checkpoint.*"),
    _alias("trainer.seed", "data.seed"),
    # Capabilities hybridflow does not have: refused when chosen.
    _lacks("*._target_", "verl's class targets (_target_): hybridflow picks implementations by registered name"),
    _lacks("engine.strategy", ENGINES, "fsdp", "fsdp2", decisive=True),
    _lacks("model.strategy", ENGINES, "fsdp", "fsdp2", decisive=True),
    _lacks("optim.optimizer", "optimizers other than AdamW"),
    _lacks("optim.optimizer_impl", "optimizers other than torch.optim's AdamW"),
    _lacks("optim.override_optimizer_config", "optimizer config overrides (AdamW takes lr, betas, weight_decay)"),
    _lacks("engine.qat.enable", "quantization-aware training (QAT)"),
    _lacks("model.mtp.enable*", "multi-token prediction (MTP) heads"),
    _lacks(
        "model.lora.rank", "verl's model.lora block (Megatron LoRA); set model.lora_rank, lora_alpha, target_modules"
    ),
    _lacks("model.exclude_modules", "LoRA exclude_modules (adapters go on every target_modules match)"),
    _lacks("model.lora_adapter_path", "starting LoRA from a saved adapter (lora_adapter_path)"),
    _lacks("model.external_lib", "importing extra model-code modules (external_lib)"),
    _lacks("data.custom_cls.path", "custom dataset classes"),
    _lacks("trainer.default_hdfs_dir", "copying checkpoints to HDFS"),
    _lacks("model.hf_config_path", "a model config.json from somewhere other than the model's folder (hf_config_path)"),
    _lacks("optim.zero_indexed_step", "a learning-rate schedule counted from step 1 (zero_indexed_step=false)"),
    _lacks("profiler.enable", "profiling the SFT trainer (main_ppo profiles with global_profiler)"),
    _lacks("trainer.profile_interval", "profiling the SFT trainer (main_ppo profiles with global_profiler)"),
    # Knobs nothing here reads: accepted, listed at start-up when set.
    _unread(
        "*ulysses_sequence_parallel_size",
        "main_sft runs whole sequences on each rank: Ulysses sequence parallelism serves main_ppo's actor, reference "
        "and critic (same math)",
    ),
    _unread("model.use_liger", KERNELS),
    _unread("model.use_fused_kernels", KERNELS),
    _unread("model.fused_kernel_options.*", KERNELS),
    _unread("model.tiled_mlp.*", KERNELS),
    _unread("model.enable_activation_offload", "activation offload is not implemented (GPU memory knob)"),
    _unread(
        "model.fsdp_config.cpu_offload",
        "FSDP1's switch for offload_params; FSDP2 offload is model.fsdp_config.param_offload",
    ),
    _unread("model.fsdp_config.wrap_policy.*", FSDP_KNOB),
    _moot("model.mtp.*", "model.mtp.enable"),
    _moot("model.lora.*", "model.lora.rank (verl's Megatron LoRA block; hybridflow reads model.lora_rank)"),
    _unread("*use_shm", "models and data load from disk, not shared memory"),
    _unread("engine.wrap_policy.*", FSDP_KNOB),
    _unread("engine.offload_policy", FSDP_KNOB),
    _unread("engine.forward_prefetch", FSDP_KNOB),
    _unread("engine.use_orig_params", FSDP_KNOB),
    _unread("engine.pad_to_length*", FSDP_KNOB),
    _unread("engine.seed", FSDP_KNOB),
    _unread("engine.full_determinism", FSDP_KNOB),
    _unread("engine.forward_only", "the verl engine's inference-only switch; the SFT worker trains"),
    _unread("engine.entropy_*", "SFT computes no entropy"),
    _unread("engine.use_torch_compile", "torch.compile is not applied to the model (same math)"),
    _moot("engine.qat.*", "engine.qat.enable"),
    _moot("engine.turbo_config.*", "engine.strategy=fsdp_turbo"),
    _unread("optim.total_training_steps", "the schedule spans trainer.total_training_steps (or the epochs' steps)"),
    _unread(
        "data.micro_batch_size", "verl's deprecated global micro-batch size; data.micro_batch_size_per_gpu is read"
    ),
    _unread("data.num_workers", "examples are tokenized once at load time; batches need no loader workers"),
    _unread("data.balance_dp_token", "each rank gets an equal number of examples, not of tokens (same math)"),
    _unread(
        "data.ignore_input_ids_mismatch",
        "each conversation's prefixes are rendered whole, so there is no "
        "per-turn mismatch to ignore; a template whose prefixes are unstable is refused at load",
    ),
    _moot("data.custom_cls.*", "data.custom_cls.path"),
    _moot("profiler.*", "profiler.enable"),
    _unread("trainer.balance_batch", "each rank gets an equal number of examples, not of tokens (same math)"),
)

# Values of schema keys that choose something hybridflow does not have.
SFT_UNAVAILABLE_CHOICES = {("trainer.device", "npu"): "Ascend NPU support (trainer.device=cuda or cpu)"}

# verl's config groups: its FSDP choices are what sft_trainer.yaml holds; any other is another engine.
SFT_GROUPS = (
    Group("engine", ("fsdp",), ENGINES),
    Group("optim", ("fsdp",), ENGINES),
    Group("model", ("hf_model",), "model configs other than Hugging Face models (hf_model)"),
    Group("profiler", ("profiler",), "profiler configs (verl's profiler hooks)"),
)

SFT_SURFACE = Surface(
    SFT_COMPAT_YAML,
    SFT_COMPAT_YAML.with_name("sft_trainer.yaml"),
    SFT_RULES,
    tuple(SFT_UNAVAILABLE_CHOICES.items()),
    SFT_GROUPS,
)
