"""Rollout configuration: the ``actor_rollout_ref.rollout`` section, with verl's key names.

Every field carries a help string (``field(metadata={"help": ...})``). ``RolloutConfig.from_dict`` builds the
nested dataclasses from a plain (Hydra/OmegaConf-resolved) dict and rejects unknown keys; ``validate()`` collects
every problem and raises once with all of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

CONFIG_PREFIX = "actor_rollout_ref.rollout"


class RolloutConfigError(ValueError):
    """One or more rollout config values are invalid; the message lists each key, its value and the fix."""


def _help(text: str, default: Any = None, factory: Any = None) -> Any:
    if factory is not None:
        return field(default_factory=factory, metadata={"help": text})
    return field(default=default, metadata={"help": text})


@dataclass
class SamplingParams:
    """How one request is decoded. Built from ``RolloutConfig`` (or ``val_kwargs``) by ``RolloutConfig.sampling``."""

    max_new_tokens: int = _help("Most tokens to generate for this request (the EOS counts).", 64)
    temperature: float = _help("Softmax temperature; ignored when do_sample is False.", 1.0)
    top_p: float = _help("Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p.", 1.0)
    top_k: int = _help("Keep only the k most likely tokens; -1 (or 0) turns it off.", -1)
    do_sample: bool = _help("Sample (True) or take the argmax (False, greedy).", True)
    stop: list[str] = _help("Strings that end the sequence once generated (kept in the output).", factory=list)
    stop_token_ids: list[int] = _help("Token ids that end the sequence, besides the EOS (kept).", factory=list)
    seed: int | None = _help("Seed of this request's own random generator; None draws one from the OS.", None)

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0.0


@dataclass
class ValKwargs:
    """Overrides used for validation generation (``meta_info['validate'] = True``)."""

    n: int = _help("Samples per prompt during validation.", 1)
    temperature: float = _help("Validation temperature.", 0.0)
    top_p: float = _help("Validation nucleus threshold.", 1.0)
    top_k: int = _help("Validation top-k (-1 = off).", -1)
    do_sample: bool = _help("Sample during validation (False = greedy).", False)


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts with tools (the agent loop)."""

    enable: bool = _help("Run rollouts through the agent loop (tool calls, several assistant turns).", False)
    max_assistant_turns: int | None = _help("Most assistant turns per sample; None = bounded by length only.", None)
    max_user_turns: int | None = _help("Most tool-response turns per sample; None = bounded by length only.", None)
    tool_config_path: str | None = _help("YAML file listing the tools (see hybridflow/rollout/tools/registry.py).")
    max_parallel_calls: int = _help("Tool calls of one assistant turn that run at the same time.", 1)
    max_tool_response_length: int = _help("Characters of a tool's output kept in the tool message.", 512)
    format: str = _help("Tool-call format parsed from the model output (see rollout/tool_parser.py).", "hermes")


@dataclass
class RolloutConfig:
    """``actor_rollout_ref.rollout``: which engine generates, and how."""

    name: str = _help("Rollout engine: 'hf' (CPU/GPU, transformers) or 'vllm' (pip install 'hybridflow[vllm]').", "hf")
    n: int = _help("Samples per prompt (GRPO group size).", 1)
    temperature: float = _help("Sampling temperature for training rollouts.", 1.0)
    top_p: float = _help("Nucleus sampling threshold for training rollouts.", 1.0)
    top_k: int = _help("Top-k for training rollouts; -1 = off.", -1)
    do_sample: bool = _help("Sample during training rollouts (False = greedy).", True)
    prompt_length: int = _help("Longest prompt in tokens (the data loader pads/truncates to it).", 512)
    response_length: int = _help("Longest response in tokens; outputs are right-padded to exactly this length.", 512)
    stop: list[str] = _help("Stop strings: generation of a sample ends once its text contains one.", factory=list)
    stop_token_ids: list[int] = _help("Extra token ids that end a sample (besides the tokenizer's EOS).", factory=list)
    calculate_log_probs: bool = _help("Return 'rollout_log_probs' [B*n, R] from the engine.", False)
    seed: int = _help("Base seed; call k of generate_sequences uses seed+k, so a rerun repeats the samples.", 0)
    dtype: str = _help("Weights dtype of the generation model: float32, bfloat16 or float16.", "float32")
    max_num_seqs: int = _help("'hf' engine: most sequences decoding together in one batched forward.", 256)
    max_batch_tokens: int = _help("'hf' engine: most (padded) prompt tokens prefilled in one forward.", 8192)
    free_cache_engine: bool = _help("Call sleep() after each rollout so training gets the memory back.", True)
    gpu_memory_utilization: float = _help("'vllm' engine: fraction of GPU memory it may take.", 0.5)
    tensor_model_parallel_size: int = _help("'vllm' engine: tensor-parallel size.", 1)
    val_kwargs: ValKwargs = _help("Sampling overrides for validation.", factory=ValKwargs)
    multi_turn: MultiTurnConfig = _help("Agent loop: multi-turn generation with tools.", factory=MultiTurnConfig)

    @classmethod
    def from_dict(cls, values: Mapping | None) -> "RolloutConfig":
        """Build from a nested mapping: a dict or an OmegaConf ``cfg.actor_rollout_ref.rollout``."""
        return _build(cls, dict(values or {}), CONFIG_PREFIX)

    def validate(self) -> "RolloutConfig":
        """Check every value; raise ``RolloutConfigError`` listing all problems at once."""
        errors = []
        p = CONFIG_PREFIX
        for key in ("n", "response_length", "prompt_length", "max_num_seqs", "max_batch_tokens"):
            if getattr(self, key) < 1:
                errors.append(f"{p}.{key}={getattr(self, key)} must be >= 1")
        if self.val_kwargs.n < 1:
            errors.append(f"{p}.val_kwargs.n={self.val_kwargs.n} must be >= 1")
        for scope, obj in ((p, self), (f"{p}.val_kwargs", self.val_kwargs)):
            if not 0.0 < obj.top_p <= 1.0:
                errors.append(f"{scope}.top_p={obj.top_p} must be in (0, 1]; use 1.0 to turn it off")
            if obj.temperature < 0:
                errors.append(f"{scope}.temperature={obj.temperature} must be >= 0 (0 = greedy)")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            errors.append(f"{p}.dtype={self.dtype!r}; choose float32, bfloat16 or float16")
        turns = self.multi_turn
        for key in ("max_assistant_turns", "max_user_turns"):
            value = getattr(turns, key)
            if value is not None and value < 1:
                errors.append(f"{p}.multi_turn.{key}={value} must be >= 1 or null")
        if turns.max_parallel_calls < 1:
            errors.append(f"{p}.multi_turn.max_parallel_calls={turns.max_parallel_calls} must be >= 1")
        if errors:
            raise RolloutConfigError("invalid rollout config:\n  " + "\n  ".join(errors))
        return self

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
        raise RolloutConfigError(
            f"unknown key(s) {[f'{scope}.{k}' for k in unknown]}; valid keys are {sorted(known)}"
        )
    kwargs = {}
    for name, value in values.items():
        default = known[name].default_factory() if callable(known[name].default_factory) else None
        if is_dataclass(default) and isinstance(value, Mapping):
            value = _build(type(default), dict(value), f"{scope}.{name}")
        elif isinstance(value, Sequence) and not isinstance(value, str):
            value = list(value)
        kwargs[name] = value
    return cls(**kwargs)
