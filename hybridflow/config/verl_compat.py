"""verl's config keys that hybridflow has no field for: each one accepted, aliased, or refused in one line.

A verl launch script passes keys from verl's whole generated ``ppo_trainer`` config. ``verl_compat.yaml``
(merged under ``ppo_trainer.yaml`` by Hydra) holds every such key that the schema
(:mod:`hybridflow.config.schema`) lacks, with verl's default, and :data:`RULES` says what each means
here (first matching pattern wins; ``tests/trainer/test_verl_compat.py`` checks every key has a rule):
aliases (``ray_init.num_cpus`` -> ``ray_kwargs.ray_init.num_cpus``), capabilities hybridflow lacks (Megatron,
NPU, ...) and knobs that change nothing here (fused kernels), each with why. The mechanism is
:mod:`hybridflow.config.key_surface`.
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from hybridflow.config.key_surface import (
    ALIAS,
    LACKS,
    UNREAD,
    CompatReport,
    Rule,
    Surface,
    flatten,
    unread_engine_options,
)
from hybridflow.config.key_surface import alias as _alias
from hybridflow.config.key_surface import lacks as _lacks
from hybridflow.config.key_surface import moot as _moot
from hybridflow.config.key_surface import unread as _unread

__all__ = [
    "ALIAS",
    "COMPAT_YAML",
    "LACKS",
    "PPO_SURFACE",
    "RULES",
    "UNREAD",
    "CompatReport",
    "Rule",
    "compat_defaults",
    "compat_key",
    "flatten",
    "lacks_lines",
    "rule_for",
    "schema_yaml_defaults",
    "split_compat",
    "unread_engine_options",
]

COMPAT_YAML = pathlib.Path(__file__).parent / "yaml" / "verl_compat.yaml"

ACTOR, REF, ULYSSES = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "ulysses_sequence_parallel_size"
KERNELS = "fused/Liger/tiled kernels are not used: hybridflow runs the model's own transformers modules (same math)"
FSDP1_KNOB = "an FSDP1/verl-engine tuning knob; hybridflow's FSDP2 engine has no such setting (same math)"
VLLM_SERVER = "verl's async rollout-server infrastructure; hybridflow's engines run inside the actor workers"
MULTIMODAL = "image, video and audio inputs (hybridflow trains text-only models on text prompts)"
SAME_MATH = "a speed or memory knob whose results are the same"
TRANSFER_QUEUE = (
    "verl's data plane between its components (its V1 trainer modes use it); hybridflow's driver hands batches to "
    "its worker groups as DataProto through Ray's object store: the same samples, the same math"
)
# verl's data.image_key, video_key and audio_key defaults: a prompt file with such a column has inputs nothing reads.
MULTIMODAL_COLUMNS = {
    column: f"{MULTIMODAL}, which hybridflow does not have; drop the column"
    for column in ("images", "videos", "audios")
}


RULES: tuple[Rule, ...] = (
    _lacks(
        "model_engine",
        "the Megatron, VeOmni and TorchTitan training engines (model_engine=dp is FSDP2; for FSDP2 x TP set "
        "actor_rollout_ref.actor.fsdp_config.tensor_parallel_size)",
        "dp",
        decisive=True,
    ),
    # Other names of schema keys.
    _alias("ray_init.*", "ray_kwargs.ray_init.*"),
    _alias("reward.reward_manager.name", "reward_model.reward_manager"),
    _alias("reward.num_workers", "reward_model.num_workers"),
    _alias("reward.reward_manager.source", "reward_model.reward_manager_source"),
    _alias("reward.reward_manager.module.path", "reward_model.reward_manager_module_path"),
    _alias("reward.reward_kwargs*", "reward_model.reward_kwargs*"),
    _alias("reward.custom_reward_function.path", "custom_reward_function.path"),
    _alias("reward.custom_reward_function.name", "custom_reward_function.name"),
    _alias("reward.custom_reward_function.reward_kwargs", "custom_reward_function.reward_kwargs"),
    _alias("reward.reward_model.enable", "reward_model.enable"),
    _alias("reward.reward_model.model_path", "reward_model.model.path"),
    _alias("actor_rollout_ref.actor.tau_pos", "actor_rollout_ref.actor.policy_loss.tau_pos"),
    _alias("actor_rollout_ref.actor.tau_neg", "actor_rollout_ref.actor.policy_loss.tau_neg"),
    _alias("actor_rollout_ref.actor.use_remove_padding", "actor_rollout_ref.model.use_remove_padding"),
    _alias("actor_rollout_ref.actor.optim.clip_grad", "actor_rollout_ref.actor.grad_clip"),
    _alias("actor_rollout_ref.actor.optim.lr_scheduler_type", "actor_rollout_ref.actor.optim.warmup_style"),
    _alias("actor_rollout_ref.actor.data_loader_seed", "actor_rollout_ref.actor.seed"),
    _alias("critic.optim.clip_grad", "critic.grad_clip"),
    _alias("critic.optim.lr_scheduler_type", "critic.optim.warmup_style"),
    _alias("critic.data_loader_seed", "critic.seed"),
    _alias("critic.fsdp.param_offload", "critic.model.fsdp_config.param_offload"),
    _alias("critic.fsdp.optimizer_offload", "critic.model.fsdp_config.optimizer_offload"),
    _alias("critic.fsdp.reshard_after_forward", "critic.model.fsdp_config.reshard_after_forward"),
    _alias("critic.fsdp.fsdp_size", "critic.model.fsdp_config.fsdp_size"),
    # verl's engine reads the FSDP section's copy of the Ulysses size, its legacy workers the role's.
    _alias(f"{ACTOR}.fsdp_config.{ULYSSES}", f"{ACTOR}.{ULYSSES}"),
    _alias(f"{REF}.fsdp_config.{ULYSSES}", f"{REF}.{ULYSSES}"),
    _alias(f"critic.fsdp.{ULYSSES}", f"critic.{ULYSSES}"),
    # Capabilities hybridflow does not have: refused when chosen.
    _lacks("*._target_", "verl's class targets (_target_): hybridflow picks implementations by registered name"),
    _lacks(
        "*strategy",
        "a training engine other than FSDP (Megatron, VeOmni, TorchTitan, fsdp_turbo; strategy=fsdp or fsdp2 is FSDP2)",
        "fsdp",
        "fsdp2",
        decisive=True,
    ),
    _lacks("*.optim.optimizer", "optimizers other than AdamW"),
    _lacks("*.optim.optimizer_impl", "optimizers other than torch.optim's AdamW"),
    _lacks(
        "*.optim.override_optimizer_config", "optimizer config overrides (AdamW takes lr, betas, eps, weight_decay)"
    ),
    _lacks("*qat.enable", "quantization-aware training (QAT)"),
    _lacks("*mtp.enable*", "multi-token prediction (MTP) heads"),
    _lacks("*router_replay.mode", "MoE router replay"),
    _lacks(
        "actor_rollout_ref.rollout.nnodes",
        "verl's standalone rollout inside the synchronous trainer (nnodes > 0); a rollout pool of its own is "
        "actor_rollout_ref.hybrid_engine=false or trainer.v1.trainer_mode=separate_async, sized by the top-level "
        "rollout.nnodes",
        # separate_async's standalone pool: the top-level rollout.* take these (standalone_pool_keys)
        served_with=("trainer.v1.trainer_mode", "separate_async"),
    ),
    _lacks("actor_rollout_ref.rollout.over_sample_rate", "over-sampled rollouts that abort the slowest samples"),
    _lacks("actor_rollout_ref.rollout.disaggregation.enabled", "prefill/decode disaggregation"),
    _lacks("actor_rollout_ref.rollout.agent.agent_loop_config_path", "agent loops defined in a config file"),
    _lacks("actor_rollout_ref.rollout.agent.custom_async_server.*", "custom async rollout servers"),
    _lacks(
        "actor_rollout_ref.rollout.agent.default_agent_loop",
        "agent loops chosen by name (the tool-calling loop is actor_rollout_ref.rollout.multi_turn.enable=true)",
    ),
    _lacks("actor_rollout_ref.rollout.trace.backend", "rollout tracing backends (weave, mlflow traces)"),
    _lacks("actor_rollout_ref.rollout.prometheus.enable", "the rollout servers' Prometheus metrics"),
    _lacks("actor_rollout_ref.rollout.multi_turn.function_tool_path", "tools defined as Python functions by path"),
    _lacks("*.lora.rank", "verl's model.lora block (Megatron LoRA); set model.lora_rank, lora_alpha, target_modules"),
    _lacks("data.custom_cls.path", "custom dataset classes"),
    _lacks(
        "*sandbox_fusion.url",
        "the Sandbox Fusion code-execution service (a judge server of your own: reward_model.reward_manager=remote)",
    ),
    _lacks("reward_model.reward_loop_*", "custom reward-loop classes"),
    _lacks("algorithm.use_pf_ppo", "PF-PPO policy filtration"),
    _unread("transfer_queue.enable", TRANSFER_QUEUE),
    _lacks("skip.*.enable", "verl's rollout skip/dump (use trainer.rollout_data_dir to dump rollouts)"),
    _lacks("trainer.default_hdfs_dir", "copying checkpoints to HDFS"),
    _lacks("trainer.esi_redundant_time", "extra checkpoint saves before an elastic instance expires (ESI)"),
    _lacks("trainer.del_local_ckpt_after_load", "deleting local checkpoints after loading them"),
    _lacks("trainer.v1.sampler.custom_sampler.path", "custom replay-buffer samplers"),
    _lacks("trainer.v1.sampler.sampler_kwargs", "custom replay-buffer samplers"),
    _lacks("data.image_*", MULTIMODAL),
    _lacks("data.video_key", MULTIMODAL),
    _lacks("data.audio_key", MULTIMODAL),
    _lacks("data.mm_processor_kwargs", MULTIMODAL),
    _lacks("data.return_multi_modal_inputs", MULTIMODAL),
    _lacks("actor_rollout_ref.actor.freeze_vision_tower", MULTIMODAL),
    _lacks("data.function_tool_path", "tools defined as Python functions by path"),
    _lacks(
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        "weight-sync transports other than verl's default (naive: hybridflow's engines load the actor's weights in "
        "process, a rollout pool of its own through Ray's object store)",
    ),
    _lacks("actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module", "custom weight-sync transports"),
    _lacks("actor_rollout_ref.rollout.enable_rollout_routing_replay", "MoE router replay"),
    _lacks(
        "actor_rollout_ref.rollout.quantization_config_file",
        "rollout quantization from a config file (the vllm engine takes rollout.quantization)",
    ),
    _lacks(
        "actor_rollout_ref.rollout.moe_load_balance_metrics_interval", "the rollout servers' MoE load-balance metrics"
    ),
    _lacks(
        "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side",
        "choosing the side tool responses are cut on",
    ),
    _lacks("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template", "sglang's inference chat template"),
    _lacks("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts", "sglang's repeated multi-turn rollouts"),
    _lacks("*.optim.zero_indexed_step", "a learning-rate schedule counted from step 1 (zero_indexed_step=false)"),
    _lacks("*hf_config_path", "a model config.json from somewhere other than the model's folder (hf_config_path)"),
    _lacks("*fsdp*.dtype", "the verl engine's compute dtype key (set fsdp_config.mixed_precision.param_dtype)"),
    _alias(f"{ACTOR}.fsdp_config.model_dtype", "actor_rollout_ref.model.dtype"),
    _alias("critic.fsdp.model_dtype", "critic.model.dtype"),
    _lacks(
        f"{REF}.fsdp_config.model_dtype",
        "a reference model in a dtype of its own (it follows the actor's)",
        same_as=f"{ACTOR}.fsdp_config.model_dtype",
    ),
    _lacks("critic.model.lora_adapter_path", "starting the critic from a saved LoRA adapter"),
    _lacks("*external_lib", "importing extra model-code modules (external_lib)"),
    # Accepted and listed at start-up when set, each with why it changes nothing here: a knob of speed or memory
    # whose results are the same, one only read with a capability refused above, or one that follows a schema key.
    _unread("*mixed_precision.buffer_dtype", "FSDP2's mixed precision has no buffer dtype: buffers keep the model's"),
    _unread("*use_fused_kernels", KERNELS),
    _unread("*fused_kernel_options.*", KERNELS),
    _unread("*use_liger", KERNELS),
    _unread("*tiled_mlp.*", KERNELS),
    _moot("*.turbo_config.*", "strategy=fsdp_turbo"),
    _unread("*fsdp*.wrap_policy.*", FSDP1_KNOB),
    _unread("*fsdp*.offload_policy", FSDP1_KNOB),
    _unread("*fsdp*.forward_prefetch", FSDP1_KNOB),
    _unread("*fsdp*.use_orig_params", FSDP1_KNOB),
    _unread("*fsdp*.pad_to_length*", FSDP1_KNOB),
    _unread("*pad_to_length", FSDP1_KNOB),
    _unread("*fsdp*.forward_only", "the verl engine's inference-only switch; each role here knows whether it trains"),
    _unread("*fsdp*.seed", "the verl engine's seed; hybridflow seeds from the role's seed and data.seed"),
    _unread("*fsdp*.full_determinism", "deterministic-kernel flags of the verl engine: " + SAME_MATH),
    _unread("*fsdp*.entropy_*", "the verl engine's copy of the role's entropy memory knobs: " + SAME_MATH),
    _unread("*fsdp*.use_torch_compile", "the verl engine's copy of use_torch_compile: " + SAME_MATH),
    _moot("*qat.*", "qat.enable"),
    _moot("*mtp.*", "mtp.enable"),
    _moot("*mtp", "mtp.enable"),
    _moot("*router_replay.*", "router_replay.mode"),
    _moot("*.lora.*", "model.lora.rank (verl's Megatron LoRA block; hybridflow reads model.lora_rank)"),
    _unread("*.rollout_n", "follows actor_rollout_ref.rollout.n"),
    _unread("*checkpoint.async_save", "the same files are saved, synchronously (atomically, then renamed)"),
    _unread(
        "*checkpoint.strict", "checkpoints load strictly: one that does not match stops the run, none loads in part"
    ),
    _unread("*enable_activation_offload", "activations kept on the device instead of offloaded: " + SAME_MATH),
    _unread("*use_shm", "models and data load from disk, not shared memory: " + SAME_MATH),
    _unread("actor_rollout_ref.actor.calculate_entropy", "entropy is computed when entropy_coeff != 0 and for metrics"),
    _unread("actor_rollout_ref.rollout.mode", VLLM_SERVER),
    _unread("actor_rollout_ref.rollout.skip_tokenizer_init", "the vllm engine decodes text (stop strings, tools)"),
    _unread("actor_rollout_ref.rollout.full_determinism", "the hf engine is deterministic given its per-sample seeds"),
    _unread("actor_rollout_ref.rollout.layered_summon", "weights are synced tensor by tensor already: " + SAME_MATH),
    _unread(
        "actor_rollout_ref.rollout.multi_stage_wake_up", "weights are synced tensor by tensor already: " + SAME_MATH
    ),
    _unread(
        "*entropy_checkpointing",
        "the chunked entropy's own backward keeps only per-row statistics, which is what entropy checkpointing saves",
    ),
    _unread("actor_rollout_ref.rollout.agent.*", VLLM_SERVER),
    _moot("actor_rollout_ref.rollout.checkpoint_engine.*", "a checkpoint_engine.backend other than naive"),
    _moot("actor_rollout_ref.rollout.trace.*", "rollout.trace.backend"),
    _moot("actor_rollout_ref.rollout.prometheus.*", "rollout.prometheus.enable"),
    _moot("actor_rollout_ref.rollout.disaggregation.*", "rollout.disaggregation.enabled"),
    _unread(
        "actor_rollout_ref.rollout.n_gpus_per_node",
        "the rollout runs in the actor's processes, or with "
        "actor_rollout_ref.hybrid_engine=false on a pool sized by the top-level rollout.nnodes/n_gpus_per_node",
    ),
    _unread(
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode",
        "a check of sglang's incremental tokenization; hybridflow's agent loop tokenizes each turn once",
    ),
    _moot("actor_rollout_ref.rollout.qat", "qat.enable"),
    _unread("data.dataloader_num_workers", "prompts are loaded in the driver from memory; no loader workers"),
    _moot("data.custom_cls.*", "data.custom_cls.path"),
    _unread("data.tool_config_path", "follows actor_rollout_ref.rollout.multi_turn.tool_config_path"),
    _unread("data.tokenizer", "the tokenizer is actor_rollout_ref.model.tokenizer_path"),
    _unread(
        "data.return_raw_input_ids",
        "no component here reads raw_prompt_ids (a reward model with its own tokenizer re-tokenizes raw_prompt)",
    ),
    _unread("data.return_full_prompt", "no component here reads full_prompts"),
    _unread("data.filter_overlong_prompts_workers", "prompts are tokenized in one batched call of the fast tokenizer"),
    _unread("reward.reward_manager.module.name", "verl too takes the class name from reward.reward_manager.name"),
    _unread(
        "*reward_model.rollout.*",
        "a discriminative reward model runs its forward in its own FSDP workers here, so the engine verl serves it "
        "with changes no score (a generative judge: reward_model.judge.engine)",
    ),
    _unread("reward.reward_model.*", "a reward model is placed like the other roles (trainer.placement)"),
    _unread("reward_model.*", "a reward model is placed like the other roles (trainer.placement)"),
    _moot("*sandbox_fusion.*", "sandbox_fusion.url"),
    _moot("algorithm.pf_ppo.*", "algorithm.use_pf_ppo"),
    _unread("algorithm.filter_groups.max_inflight_gen_batches", "generation batches run one at a time: " + SAME_MATH),
    _unread("transfer_queue.*", "TransferQueue's storage and metrics settings: " + TRANSFER_QUEUE),
    _moot("skip.*", "skip.*.enable"),
    # torch.profiler is served (global_profiler and each role's profiler section); what it does not do, refused.
    _lacks("*profiler.tool", "a profiler tool per role (global_profiler.tool sets every role's)"),
    _lacks("*profiler.save_path", "a trace folder per role (global_profiler.save_path holds every role's traces)"),
    _lacks("*finish_hook_cmd", "a command run after the last profiled step (finish_hook_cmd)"),
    _moot("*finish_hook_*", "finish_hook_cmd"),
    _unread("*relocate_results", "each process writes its trace to global_profiler.save_path itself: nothing to move"),
    _lacks("*profiler.tool_config.torch.schedule.*", "a torch.profiler schedule over the update's mini-batches"),
    _lacks("*profiler.tool_config.torch.profile_token_*", "a rollout trace of a window of response tokens"),
    _moot("*profiler.tool_config.*", "a profiler tool other than torch"),
    _moot("global_profiler.global_tool_config.*", "a global_profiler.tool other than torch"),
    _unread("trainer.use_v1", "hybridflow has one trainer; trainer.v1.trainer_mode picks its mode either way"),
    _moot("trainer.v1.sampler.custom_sampler.*", "trainer.v1.sampler.custom_sampler.path"),
    _unread("trainer.v1.sync", "verl's sync trainer mode has no settings"),
    _unread(
        "trainer.v1.sampler.sync_refill_failed_groups",
        "a failed generation stops a hybridflow run, so no prompt group is left without samples to replace",
    ),
    _unread("trainer.ray_wait_register_center_timeout", VLLM_SERVER),
)


# Values of schema keys that choose something hybridflow does not have.
UNAVAILABLE_CHOICES = {
    ("trainer.device", "npu"): "Ascend NPU support (trainer.device=cuda or cpu)",
    ("actor_rollout_ref.rollout.name", "sglang"): "an SGLang rollout engine (rollout.name=vllm on GPU, or hf)",
    ("actor_rollout_ref.rollout.name", "trtllm"): "a TensorRT-LLM rollout engine (rollout.name=vllm on GPU, or hf)",
    **{
        ("global_profiler.tool", tool): f"the {tool} profiler (global_profiler.tool=torch is torch.profiler)"
        for tool in ("nsys", "npu", "torch_memory", "precision_debugger")
    },
}


PPO_SURFACE = Surface(COMPAT_YAML, COMPAT_YAML.with_name("ppo_trainer.yaml"), RULES, tuple(UNAVAILABLE_CHOICES.items()))


def rule_for(key: str) -> Rule | None:
    return PPO_SURFACE.rule_for(key)


def compat_defaults() -> dict[str, Any]:
    return PPO_SURFACE.compat_defaults


def schema_yaml_defaults() -> dict[str, Any]:
    return PPO_SURFACE.schema_defaults


def split_compat(config: DictConfig) -> tuple[DictConfig, CompatReport]:
    return PPO_SURFACE.split(standalone_pool_keys(config))


def standalone_pool_keys(config: DictConfig) -> DictConfig:
    """verl's V1 ``separate_async`` sizes its standalone rollout pool with ``actor_rollout_ref.rollout.nnodes`` (> 0)
    and ``n_gpus_per_node``; hybridflow's pool keys are the top-level ``rollout.nnodes`` and ``n_gpus_per_node``,
    which take their values (a copy of ``config``; ``config`` itself where there is nothing to move)."""
    section = "actor_rollout_ref.rollout"
    nnodes = OmegaConf.select(config, f"{section}.nnodes", default=0)
    if OmegaConf.select(config, "trainer.v1.trainer_mode") != "separate_async" or not nnodes:
        return config
    processes = OmegaConf.select(config, f"{section}.n_gpus_per_node")
    moved = copy.deepcopy(config)
    with open_dict(moved):
        for key in ("nnodes", "n_gpus_per_node"):
            moved.actor_rollout_ref.rollout.pop(key, None)
        moved.rollout.nnodes, moved.rollout.n_gpus_per_node = nnodes, processes
    return moved


def lacks_lines(values: dict[str, Any]) -> list[str]:
    return PPO_SURFACE.lacks_lines(values)


def compat_key(dotted: str) -> str | None:
    return PPO_SURFACE.compat_key(dotted)
