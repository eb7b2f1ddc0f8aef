"""What a worker would refuse as it starts or at its first step, decided by the config check instead, so that a
run that cannot go on stops before any worker starts (the workers keep their own checks for direct callers):
dtype names, checkpoint parts, and rows longer than a dynamic micro-batch's token budget."""

from __future__ import annotations

from typing import Any

from hybridflow.checkpoints.integrity import CONTENTS
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.models.dtypes import DTYPES


def worker_start_errors(config: PPOTrainerConfig, with_critic: bool) -> list[str]:
    return (
        _dtype_errors(config, with_critic)
        + _checkpoint_part_errors(config, with_critic)
        + _token_budget_errors(config, with_critic)
    )


def _models(config: PPOTrainerConfig, with_critic: bool) -> dict[str, Any]:
    """Key prefix -> model section of every role that loads a model."""
    arr = config.actor_rollout_ref
    models = {"actor_rollout_ref.model": arr.model}
    if with_critic:
        models["critic.model"] = config.critic.model
    if config.reward_model.enable:
        models["reward_model.model"] = config.reward_model.model
    return models


def _dtype_errors(config: PPOTrainerConfig, with_critic: bool) -> list[str]:
    arr = config.actor_rollout_ref
    dtypes = {f"{prefix}.dtype": model.dtype for prefix, model in _models(config, with_critic).items()}
    fsdp = {"actor_rollout_ref.actor": arr.actor.fsdp_config, "actor_rollout_ref.ref": arr.ref.fsdp_config}
    if with_critic:
        fsdp["critic.model"] = config.critic.model.fsdp_config
    if config.reward_model.enable:
        fsdp["reward_model.model"] = config.reward_model.model.fsdp_config
    for prefix, section in fsdp.items():
        for name in ("param_dtype", "reduce_dtype"):
            dtypes[f"{prefix}.fsdp_config.mixed_precision.{name}"] = getattr(section.mixed_precision, name)
    return unknown_dtype_errors(dtypes)


def fsdp_size_errors(key: str, size: int, processes: int, what: str) -> list[str]:
    """FSDP2's hybrid sharding groups ``processes`` in meshes of ``size`` (``key``; -1 or >= processes: all of
    them), so ``size`` must divide them; ``what`` names the processes."""
    if 0 < size < processes and processes % size:
        return [f"{key}={size} does not divide the {processes} {what}; choose a divisor of {processes} or -1 (all)"]
    return []


def unknown_dtype_errors(dtypes: dict[str, Any]) -> list[str]:
    """One line per ``{key: dtype name}`` that names no dtype hybridflow loads."""
    return [
        f"{key}={value!r} is not a dtype hybridflow loads; choose one of {list(DTYPES)}"
        for key, value in dtypes.items()
        if value not in DTYPES
    ]


def _checkpoint_part_errors(config: PPOTrainerConfig, with_critic: bool) -> list[str]:
    sections = {"actor_rollout_ref.actor.checkpoint": config.actor_rollout_ref.actor.checkpoint}
    if with_critic:
        sections["critic.checkpoint"] = config.critic.checkpoint
    return [
        f"{prefix}.{key} has {unknown}; choose parts from {list(CONTENTS)}"
        for prefix, section in sections.items()
        for key in ("save_contents", "load_contents")
        if (unknown := [part for part in getattr(section, key) if part not in CONTENTS])
    ]


def _token_budget_errors(config: PPOTrainerConfig, with_critic: bool) -> list[str]:
    """With ``use_dynamic_bsz`` a micro-batch holds rows up to a token budget (``k`` times it under Ulysses); a
    row as long as the longest prompt and response together must fit in one."""
    arr, data = config.actor_rollout_ref, config.data
    row = data.max_prompt_length + data.max_response_length
    actor_k, ref_k = arr.actor.ulysses_sequence_parallel_size, arr.ref.ulysses_sequence_parallel_size
    budgets = {
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": (arr.actor.use_dynamic_bsz, arr.actor, actor_k),
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": (
            arr.rollout.log_prob_use_dynamic_bsz,
            arr.rollout,
            actor_k,
        ),
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": (arr.ref.log_prob_use_dynamic_bsz, arr.ref, ref_k),
    }
    if with_critic:
        critic = config.critic
        k = critic.ulysses_sequence_parallel_size
        budgets["critic.ppo_max_token_len_per_gpu"] = (critic.use_dynamic_bsz, critic, k)
        budgets["critic.forward_max_token_len_per_gpu"] = (critic.use_dynamic_bsz, critic, k)
    short: dict[tuple[int, int], list[str]] = {}  # keys that follow another (the yaml's interpolations) share a line
    for key, (dynamic, section, k) in budgets.items():
        budget = getattr(section, key.rsplit(".", 1)[-1])
        if dynamic and budget * max(k, 1) < row:
            short.setdefault((budget, max(k, 1)), []).append(key)
    return [
        f"{' and '.join(f'{key}={budget}' for key in keys)} (x {k} Ulysses ranks) is below the longest row, "
        f"data.max_prompt_length + data.max_response_length = {row} tokens; raise it to at least {row}"
        for (budget, k), keys in short.items()
    ]
