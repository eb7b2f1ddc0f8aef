"""The sizes a run uses, one line each, from its plan: samples per step, mini- and micro-batches per rank, tokens
per sample (the end of ``main_ppo --plan`` and of the start-up banner)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS
from hybridflow.config.batch_sizes import micro_batch_sizes
from hybridflow.config.phases import OLD_FROM_PASS
from hybridflow.config.sequence_parallel_options import data_parallel_ranks

if TYPE_CHECKING:
    from hybridflow.config.plan import RunPlan

ACTOR = "actor_rollout_ref.actor"


def sizes(plan: RunPlan) -> list[str]:
    """The sizes of ``plan``'s steps."""
    actor, world = plan.actor_rollout_ref.actor, plan.world_size
    prompts, n = plan.prompts_per_step, plan.samples_per_prompt
    samples_per_mini = actor.ppo_mini_batch_size * n
    groups = data_parallel_ranks(world, actor.ulysses_sequence_parallel_size, actor.fsdp_config.tensor_parallel_size)
    per_rank = samples_per_mini // groups
    kind = "Ulysses" if actor.ulysses_sequence_parallel_size > 1 else "tensor-parallel"
    where = f"on {world} process(es)" if groups == world else f"on each of {groups} {kind} groups"
    passes = plan.passes_per_step
    per_step = f"samples per step: {prompts * passes} prompts x {n} = {prompts * passes * n}"
    lines = [
        per_step + (f", in {passes} mini-batches trained as each arrives" if passes > 1 else ""),
        f"actor mini-batches per epoch: {prompts // actor.ppo_mini_batch_size} "
        f"({samples_per_mini} samples, {per_rank} per rank {where}), ppo_epochs={actor.ppo_epochs}",
        *_split_lines(plan),
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


def _split_lines(plan: RunPlan) -> list[str]:
    """One line per role that splits its rows with Ulysses sequence parallelism or its model by tensor
    parallelism, and one for a tensor-parallel rollout."""
    arr, lines = plan.actor_rollout_ref, []
    generation = arr.rollout.tensor_model_parallel_size
    if generation > 1:
        lines.append(
            f"rollout: tensor-parallel groups of {generation} ranks; each holds 1/{generation} of every attention "
            "and MLP weight and decodes its group's prompts with the others"
        )
    roles = {"actor": (arr.actor.ulysses_sequence_parallel_size, arr.actor.fsdp_config.tensor_parallel_size)}
    if plan.uses_reference:
        roles["reference"] = (arr.ref.ulysses_sequence_parallel_size, arr.ref.fsdp_config.tensor_parallel_size)
    if plan.uses_critic:
        critic = plan.critic
        roles["critic"] = (critic.ulysses_sequence_parallel_size, critic.model.fsdp_config.tensor_parallel_size)
    for role, (size, split) in roles.items():
        if size > 1:
            lines.append(
                f"{role}: Ulysses groups of {size} ranks; each rank holds its group's rows and runs 1/{size} of "
                "every row's columns"
            )
        if split > 1:
            lines.append(
                f"{role}: tensor-parallel groups of {split} ranks; each rank holds its group's rows and "
                f"1/{split} of every attention and MLP weight, FSDP2 shards over {plan.world_size // split} ranks"
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
