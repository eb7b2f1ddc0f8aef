"""Per-step metrics computed by the driver from the batch it already holds: pure functions, no I/O.

Names come from :mod:`hybridflow.tracking.metric_names` (verl's spelling). Shapes: ``responses`` and
``response_mask`` are [B, R]; ``attention_mask`` is [B, P + R]; token-level tensors are [B, R].
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names


def reduce_worker_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """One float per metric a worker group returned as (nested) lists: one entry per rank, per step.

    As verl's ``reduce_metrics``: the maximum for a name containing ``max``, the minimum for one containing
    ``min``, else the mean.
    """
    reduced = {}
    for name, value in metrics.items():
        values = np.asarray(value, dtype=np.float64)
        reduce = np.max if "max" in name else np.min if "min" in name else np.mean
        reduced[name] = float(reduce(values))
    return reduced


def sequence_lengths(batch: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
    """(prompt lengths [B], response lengths [B]) as float tensors, counted from the masks."""
    response_width = batch.batch["responses"].shape[-1]
    prompt_length = batch.batch["attention_mask"][:, :-response_width].sum(-1).float()
    response_length = batch.batch["response_mask"].sum(-1).float()
    return prompt_length, response_length


def samples_with_signal(batch: DataProto) -> torch.Tensor:
    """[B] bool: the sample's ``advantages`` are non-zero on some response token (it has a policy gradient)."""
    tensors = batch.batch
    return ((tensors["advantages"] != 0) & tensors["response_mask"].bool()).any(dim=-1)


def value_stats(group: str, values: torch.Tensor) -> dict[str, float]:
    """``<group>/mean|max|min`` of ``values``."""
    values = values.detach().float()
    if values.numel() == 0:  # e.g. no response token in the batch: NaN, as verl reports, not a crash
        return {names.stat(group, reduction): float("nan") for reduction in ("mean", "max", "min")}
    return {
        names.stat(group, "mean"): values.mean().item(),
        names.stat(group, "max"): values.max().item(),
        names.stat(group, "min"): values.min().item(),
    }


def compute_data_metrics(batch: DataProto, use_critic: bool) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch.

    Scores and rewards are per-sequence sums of ``token_level_scores`` / ``token_level_rewards``;
    advantages, returns and values are taken over response tokens only. ``clip_ratio`` is the share of
    responses that hit the length limit (prompts: the share that fill the prompt window);
    ``batch/zero_signal_frac`` the share of samples whose advantages are all 0.
    """
    tensors = batch.batch
    response_mask = tensors["response_mask"].bool()
    prompt_length, response_length = sequence_lengths(batch)
    max_response_length = tensors["responses"].shape[-1]
    max_prompt_length = tensors["attention_mask"].shape[-1] - max_response_length

    metrics = {
        **value_stats(names.SCORE, tensors["token_level_scores"].sum(-1)),
        **value_stats(names.REWARDS, tensors["token_level_rewards"].sum(-1)),
        **value_stats(names.ADVANTAGES, torch.masked_select(tensors["advantages"], response_mask)),
        **value_stats(names.RETURNS, torch.masked_select(tensors["returns"], response_mask)),
        **value_stats(names.RESPONSE_LENGTH, response_length),
        names.stat(names.RESPONSE_LENGTH, names.CLIP_RATIO): (
            (response_length == max_response_length).float().mean().item()
        ),
        **value_stats(names.PROMPT_LENGTH, prompt_length),
        names.stat(names.PROMPT_LENGTH, names.CLIP_RATIO): (prompt_length == max_prompt_length).float().mean().item(),
        names.ZERO_SIGNAL_FRAC: 1.0 - samples_with_signal(batch).float().mean().item(),
    }
    if "num_turns" in batch.non_tensor_batch:  # the agent loop's rollouts
        metrics.update(value_stats(names.NUM_TURNS, torch.as_tensor(batch.non_tensor_batch["num_turns"].astype(float))))
    if use_critic:
        values = torch.masked_select(tensors["values"], response_mask)
        returns = torch.masked_select(tensors["returns"], response_mask)
        metrics.update(value_stats(names.VALUES, values))
        # Explained variance 1 - Var[G - V] / Var[G]: 1 is a perfect critic, 0 no better than a constant.
        explained = 1.0 - torch.var(returns - values) / (torch.var(returns) + 1e-5) if values.numel() else None
        metrics[names.VF_EXPLAINED_VAR] = float("nan") if explained is None else explained.item()
    return metrics


def compute_rollout_probs_diff_metrics(batch: DataProto) -> dict[str, float]:
    """How far the rollout engine's token probabilities are from the actor's, when the batch has both
    ``rollout_log_probs`` and ``old_log_probs`` [B, R] (else nothing): max, mean and (unbiased) std of
    ``|p_actor - p_rollout|`` over response tokens, and the Pearson correlation of the two (verl's
    ``calculate_debug_metrics``; arXiv 2506.13585). A weight sync that missed the last update shows here.
    """
    tensors = batch.batch
    if "rollout_log_probs" not in tensors.keys() or "old_log_probs" not in tensors.keys():
        return {}
    diff_name = names.ROLLOUT_PROBS_DIFF
    mask = tensors["response_mask"].bool()
    if not mask.any():
        undefined = [f"{diff_name}_{stat}" for stat in ("max", "mean", "std")] + [
            names.ROLLOUT_ACTOR_PROBS_PEARSON_CORR
        ]
        return {f"{diff_name}_valid": 0.0, **dict.fromkeys(undefined, math.nan)}
    actor = torch.masked_select(tensors["old_log_probs"].float().exp(), mask)
    rollout = torch.masked_select(tensors["rollout_log_probs"].float().exp(), mask)
    diff = (actor - rollout).abs()
    return {
        f"{diff_name}_valid": 1.0,
        f"{diff_name}_max": diff.max().item(),
        f"{diff_name}_mean": diff.mean().item(),
        f"{diff_name}_std": diff.std().item(),
        names.ROLLOUT_ACTOR_PROBS_PEARSON_CORR: torch.corrcoef(torch.stack([actor, rollout]))[0, 1].item(),
    }


def compute_timing_metrics(batch: DataProto, timing_s: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<phase>`` for every timed phase, plus milliseconds per token for the token-bound ones.

    Generation is normalised by response tokens; the other phases of verl's ``compute_timing_metrics`` (ref,
    values, adv, update_critic, update_actor) by all tokens, and a step without tokens reports 0.0, as verl
    does (verl PR #6675). Differs from verl: ``old_log_prob`` gets a per-token time too.
    """
    prompt_length, response_length = sequence_lengths(batch)
    num_response_tokens = response_length.sum().item()
    num_all_tokens = num_response_tokens + prompt_length.sum().item()
    tokens_of_phase = {
        names.PHASE_GEN: num_response_tokens,
        names.PHASE_OLD_LOG_PROB: num_all_tokens,
        names.PHASE_REF: num_all_tokens,
        names.PHASE_VALUES: num_all_tokens,
        names.PHASE_ADV: num_all_tokens,
        names.PHASE_UPDATE_CRITIC: num_all_tokens,
        names.PHASE_UPDATE_ACTOR: num_all_tokens,
    }
    metrics = {names.timing(phase): float(seconds) for phase, seconds in timing_s.items()}
    for phase, num_tokens in tokens_of_phase.items():
        if phase in timing_s:
            per_token = timing_s[phase] * 1000.0 / num_tokens if num_tokens > 0 else 0.0
            metrics[names.timing_per_token(phase)] = per_token
    return metrics


def count_tokens(batch: DataProto) -> int:
    """Prompt plus response tokens in the batch (padding excluded)."""
    return int(batch.batch["attention_mask"].sum().item())


def compute_throughput_metrics(batch: DataProto, step_seconds: float, num_processes: int) -> dict[str, float]:
    """Tokens in the step, seconds per step, and tokens per second per worker process."""
    num_tokens = count_tokens(batch)
    return {
        names.PERF_TOTAL_NUM_TOKENS: float(num_tokens),
        names.PERF_TIME_PER_STEP: float(step_seconds),
        names.PERF_THROUGHPUT: num_tokens / (step_seconds * num_processes) if step_seconds > 0 else 0.0,
    }


def training_flops(num_parameters: int, num_tokens: int, ppo_epochs: int) -> float:
    """FLOPs of the actor update: 6 N D per epoch (forward 2 N D, backward 4 N D; Kaplan et al.,
    arXiv 2001.08361, eq. 2.1). Differs from the paper: attention FLOPs are left out, which
    under-counts long sequences slightly."""
    return 6.0 * num_parameters * num_tokens * ppo_epochs


def compute_mfu(flops: float, seconds: float, peak_flops_per_process: float, num_processes: int) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak of all processes, in [0, 1]."""
    if seconds <= 0 or peak_flops_per_process <= 0:
        return 0.0
    return flops / (seconds * peak_flops_per_process * num_processes)


def compute_actor_mfu_metrics(
    batch: DataProto,
    update_actor_seconds: float,
    *,
    num_parameters: int,
    ppo_epochs: int,
    peak_flops_per_process: float,
    num_processes: int,
) -> dict[str, float]:
    """``perf/mfu/actor`` for this step's actor update."""
    flops = training_flops(num_parameters, count_tokens(batch), ppo_epochs)
    return {names.PERF_MFU_ACTOR: compute_mfu(flops, update_actor_seconds, peak_flops_per_process, num_processes)}
