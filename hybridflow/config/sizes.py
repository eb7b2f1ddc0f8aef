"""The sizes a run uses, one line each, from its plan: samples per step, mini- and micro-batches per rank, tokens
per sample (the end of ``main_ppo --plan`` and of the start-up banner)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS
from hybridflow.config.batch_sizes import micro_batch_sizes
from hybridflow.config.phases import OLD_FROM_PASS

if TYPE_CHECKING:
    from hybridflow.config.plan import RunPlan

ACTOR = "actor_rollout_ref.actor"


def sizes(plan: RunPlan) -> list[str]:
    """The sizes of ``plan``'s steps."""
    actor, world = plan.actor_rollout_ref.actor, plan.world_size
    prompts, n = plan.prompts_per_step, plan.samples_per_prompt
    samples_per_mini = actor.ppo_mini_batch_size * n
    per_rank = samples_per_mini // world
    lines = [
        f"samples per step: {prompts} prompts x {n} = {prompts * n}",
        f"actor mini-batches per epoch: {prompts // actor.ppo_mini_batch_size} "
        f"({samples_per_mini} samples, {per_rank} per rank on {world} process(es)), ppo_epochs={actor.ppo_epochs}",
    ]
    micro = micro_batch_sizes(plan.actor_rollout_ref, plan.critic, world)[0]
    actor_micro = micro.get(f"{ACTOR}.ppo_micro_batch_size")
    if actor.use_dynamic_bsz:
        lines.append(f"actor micro-batches: by token budget {actor.ppo_max_token_len_per_gpu} per rank")
    elif actor_micro:
        lines.append(f"actor micro-batches per mini-batch per rank: {per_rank // actor_micro} of {actor_micro} samples")
    lines += _log_prob_passes(plan, micro)
    lines.append(
        f"tokens per sample: <= {plan.data.max_prompt_length} prompt + {plan.data.max_response_length} response"
    )
    estimator = plan.algorithm.adv_estimator
    if n < 2 and estimator in ADV_ESTIMATORS and "index" in ADV_ESTIMATORS.traits(estimator)["requires"]:
        # verl runs this too: a group of one sample has mean 0 and std 1, so its advantage is its score.
        lines.append(
            f"note: algorithm.adv_estimator={estimator!r} compares the samples of each prompt, but rollout.n=1: "
            "each group is one sample and its advantage is its raw score (set rollout.n>=2 for group baselines)"
        )
    return lines


def _log_prob_passes(plan: RunPlan, micro: dict[str, int | None]) -> list[str]:
    """How the old-log-prob and reference passes cut a rank's batch, where they run."""
    rollout, ref, lines = plan.actor_rollout_ref.rollout, plan.actor_rollout_ref.ref, []
    if plan.old_log_probs == OLD_FROM_PASS:
        micro_size = micro.get("actor_rollout_ref.rollout.log_prob_micro_batch_size")
        dynamic, budget = rollout.log_prob_use_dynamic_bsz, rollout.log_prob_max_token_len_per_gpu
        lines.append(_forward_batching("old-log-prob", dynamic, budget, micro_size))
    if plan.uses_reference:
        micro_size = micro.get("actor_rollout_ref.ref.log_prob_micro_batch_size")
        lines.append(
            _forward_batching("reference", ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu, micro_size)
        )
    return lines


def _forward_batching(name: str, dynamic: bool, max_token_len: int, micro: int | None) -> str:
    if dynamic:
        return f"{name} micro-batches: by token budget {max_token_len} per rank"
    if micro:
        return f"{name} micro-batches: {micro} samples per rank"
    return f"{name} micro-batches: each rank's whole batch in one forward"
