"""Which phases of a PPO step a config runs, and why: the rules :func:`~hybridflow.config.plan.build_plan` applies
once. Nothing outside ``config/`` calls them; the driver reads their outcome from the run plan.

The phases, in the paper's order (arXiv 2409.19256, Figure 1), each timed as ``timing_s/<name>``: ``gen`` (1),
``reward`` (2), ``old_log_prob`` and ``ref`` (3), ``values`` (4), ``adv`` (5), ``update_critic`` (6),
``update_actor`` (7), then the weight sync that closes the step: ``update_weights`` into the hybrid engine's
rollout, or ``sync_rollout_weights`` into a rollout pool of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS
from hybridflow.config.distillation_options import distills, teacher_pool_shape, teacher_spec
from hybridflow.config.estimator_options import greedy_baseline
from hybridflow.config.exact_skips import old_log_prob_skip_blockers, skips_old_log_prob, skips_zero_signal_samples
from hybridflow.config.fully_async_options import (
    concurrent_samples,
    fully_async,
    max_required_samples,
    partial_rollout,
    step_prompts,
)
from hybridflow.config.reward_options import reward_manager_traits
from hybridflow.config.rollout_correction_options import corrects_in_driver, uses_bypass
from hybridflow.config.rollout_pool_options import one_step_off, rollout_pool_processes
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.v1_trainer_options import colocate_async, passes_per_step, separate_async

__all__ = ["Phase", "phases", "skips_zero_signal_samples", "step_prompts", "uses_critic", "uses_reference"]

# Where the old log-probs of phase 3 come from.
OLD_FROM_PASS, OLD_FROM_UPDATE, OLD_FROM_ROLLOUT = "pass", "update", "rollout"


@dataclass(frozen=True)
class Phase:
    """One phase of a step: its number in the paper's order, whether it runs, and why (or why not)."""

    number: int
    runs: bool
    why: str


def uses_critic(config: PPOTrainerConfig) -> bool:
    """A critic is built: ``critic.enable`` if set (verl), else when the estimator reads values (e.g. gae)."""
    if config.critic.enable is not None:
        return config.critic.enable
    estimator = config.algorithm.adv_estimator
    return estimator in ADV_ESTIMATORS and ADV_ESTIMATORS.traits(estimator)["needs_critic"]


def uses_reference(config: PPOTrainerConfig) -> bool:
    """A KL term (in the reward or as a loss) needs the reference policy's log-probs."""
    return config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss


def old_log_prob_source(config: PPOTrainerConfig) -> str:
    """Where phase 3's ``old_log_probs`` come from: the rollout engine (bypass mode), the update itself (an
    on-policy update), or a forward pass."""
    if uses_bypass(config):
        return OLD_FROM_ROLLOUT
    return OLD_FROM_UPDATE if skips_old_log_prob(config) else OLD_FROM_PASS


def corrects_batch(config: PPOTrainerConfig) -> bool:
    """Decoupled rollout correction in phase 5: the batch holds the engine's log-probs beside a pass's old ones
    (weights and rejection as configured; else the mismatch metrics alone)."""
    engine_log_probs = config.actor_rollout_ref.rollout.calculate_log_probs
    return engine_log_probs and not uses_bypass(config) and not skips_old_log_prob(config)


def streamed_reward(config: PPOTrainerConfig) -> bool:
    """Phase 2 scores each sample as the rollout hands it over: a manager that scores samples one by one, no reward
    model, and a rollout that hands samples over as they finish (the synchronous hybrid engine's; the other modes'
    collectors score a step's batch once it is whole)."""
    streamed_rollout = not one_step_off(config) and not colocate_async(config)
    return streamed_rollout and not config.reward_model.enable and reward_manager_traits(config)["scores_each_sample"]


def phases(config: PPOTrainerConfig) -> dict[str, Phase]:
    """Every phase of a step, in order, with whether it runs and why."""
    critic, reference = uses_critic(config), uses_reference(config)
    warmup = config.trainer.critic_warmup
    # verl's names: one-step-off's and fully async's pool syncs, else (V1 separate_async too) update_weights
    sync = "sync_rollout_weights" if one_step_off(config) and not separate_async(config) else "update_weights"
    actor_steps = f"from step {warmup + 1} (trainer.critic_warmup={warmup})" if warmup else "every step"
    return {
        "gen": Phase(1, True, _generation(config)),
        "reward": Phase(2, True, _reward(config)),
        "old_log_prob": _old_log_prob(config),
        "ref": Phase(3, reference, _reference(config, reference)),
        "teacher": Phase(3, distills(config), _teacher(config)),
        "values": Phase(4, critic, _values(config, critic)),
        "adv": Phase(5, True, _advantages(config)),
        "update_critic": Phase(6, critic, "every step" if critic else "no critic"),
        "update_actor": Phase(7, True, actor_steps),
        sync: Phase(8, True, _weight_sync(config)),
    }


def _generation(config: PPOTrainerConfig) -> str:
    rollout, algorithm = config.actor_rollout_ref.rollout, config.algorithm
    engine = f"engine {rollout.name!r}, {rollout.n} sample(s) per prompt"
    if fully_async(config):
        where = (
            f"on a rollout pool of its own ({rollout_pool_processes(config)} process(es)) generating fully async "
            f"into a queue: at most {max_required_samples(config)} prompts per weight version, "
            f"{concurrent_samples(config)} at once"
        )
    elif separate_async(config):
        settings = config.trainer.v1.separate_async
        where = (
            f"on a rollout pool of its own ({rollout_pool_processes(config)} process(es)), verl's V1 separate_async: "
            f"{1 + settings.num_warmup_batches} batch(es) of prompts at most ahead of training, each step trains "
            f"{settings.parameter_sync_step} mini-batch(es) as they finish"
        )
    elif one_step_off(config):
        where = (
            f"on a rollout pool of its own ({rollout_pool_processes(config)} process(es)) one step ahead: each "
            "step trains on samples of the weights before its previous update"
        )
    elif colocate_async(config):
        warmup = config.trainer.v1.colocate_async.num_warmup_batches
        where = (
            f"in the actor's processes (hybrid engine), verl's V1 colocate_async: {1 + warmup} batch(es) of prompts "
            "in flight, each step trains on the first groups to finish and the rest go on after its weight sync"
        )
    else:
        where = "in the actor's processes (hybrid engine)"
    extras = []
    if algorithm.filter_groups.enable:
        extras.append(
            f"DAPO dynamic sampling: batches until {config.data.train_batch_size} prompt groups vary in "
            f"{algorithm.filter_groups.metric!r}, at most {algorithm.filter_groups.max_num_gen_batches}"
        )
    if greedy_baseline(config):
        extras.append("a greedy response per prompt for the ReMax baseline")
    return "; ".join([f"{engine} {where}", *extras])


def _reward(config: PPOTrainerConfig) -> str:
    model, judge = config.reward_model.model, config.reward_model.judge
    if config.reward_model.enable and judge.enable:
        return f"a generative judge ({model.path}, engine {judge.engine}) answers each sample's judge prompt"
    if config.reward_model.enable and model.input_tokenizer:
        return (
            f"the reward model's scores ({model.path}; samples of {model.input_tokenizer} in its chat template "
            "where its tokenizer differs)"
        )
    if config.reward_model.enable:
        return f"the reward model's scores ({model.path})"
    custom = config.custom_reward_function
    source = f"{custom.name} in {custom.path}" if custom.path else "the scoring function of each row's data_source"
    how = "each sample as the rollout hands it over" if streamed_reward(config) else "the whole batch at once"
    return f"{config.reward_model.reward_manager} manager: {source}, {how}"


def _old_log_prob(config: PPOTrainerConfig) -> Phase:
    source = old_log_prob_source(config)
    if source == OLD_FROM_ROLLOUT:
        return Phase(3, False, "algorithm.rollout_correction.bypass_mode=true: the engine's log-probs are the old ones")
    if source == OLD_FROM_PASS:
        why = "; ".join(old_log_prob_skip_blockers(config) or ["actor.skip_old_log_prob=false"])
        weights = "the step's starting weights" if passes_per_step(config) > 1 else "the weights that sampled the batch"
        return Phase(3, True, f"a forward pass under {weights}: {why}")
    return Phase(3, False, "the update is on-policy (one epoch of one mini-batch): its own log-probs are the old ones")


def _teacher(config: PPOTrainerConfig) -> str:
    if not distills(config):
        return "no distillation (distillation.enabled is false)"
    spec, loss = teacher_spec(config), config.distillation.distillation_loss
    scored = f"its top-{spec.topk} log-probs" if spec.topk else "the sampled token's log-prob"
    nodes, per_node = teacher_pool_shape(config)
    if spec.route_by is None:
        teachers = f"the teacher {spec.models[0].model_path}"
    else:
        routes = ", ".join(f"{model.key!r}: {model.model_path}" for model in spec.models)
        teachers = f"the teacher its {spec.route_by} names ({routes})"
    return (
        f"{teachers} ({nodes} x {per_node} process(es) of its own) scores every response token: "
        f"{scored}, for the actor's {loss.loss_mode} loss"
        + (" as a reward (use_policy_gradient)" if loss.use_policy_gradient else "")
        + ("" if loss.use_task_rewards else "; the task's advantages train nothing (use_task_rewards=false)")
    )


def _reference(config: PPOTrainerConfig, reference: bool) -> str:
    if not reference:
        return "no KL term (actor.use_kl_loss and algorithm.use_kl_in_reward are false)"
    terms = [
        name
        for name, on in (
            ("the KL loss (actor.use_kl_loss)", config.actor_rollout_ref.actor.use_kl_loss),
            ("the KL penalty in the reward", config.algorithm.use_kl_in_reward),
        )
        if on
    ]
    model = (
        "the actor's model with its LoRA adapter off" if config.actor_rollout_ref.model.uses_lora else "a frozen copy"
    )
    return f"{' and '.join(terms)}, from {model}"


def _values(config: PPOTrainerConfig, critic: bool) -> str:
    estimator = config.algorithm.adv_estimator
    if not critic:
        return f"no critic: algorithm.adv_estimator={estimator} reads no values"
    return "critic.enable=true" if config.critic.enable else f"algorithm.adv_estimator={estimator} reads critic values"


def _advantages(config: PPOTrainerConfig) -> str:
    parts = [f"algorithm.adv_estimator={config.algorithm.adv_estimator}"]
    if config.algorithm.use_kl_in_reward:
        parts.append(f"after the KL penalty in the reward ({config.algorithm.kl_ctrl.type} coefficient)")
    if corrects_batch(config):
        weighs = corrects_in_driver(config)
        parts.append("after the rollout correction" + (" (weights, rejection)" if weighs else " (its metrics)"))
    if skips_zero_signal_samples(config):
        parts.append(
            "first, on the scores alone: the samples whose advantages are all 0 skip 3 to 7 (exact here: "
            "they count only in the loss's denominator)"
        )
    return ", ".join(parts)


def _weight_sync(config: PPOTrainerConfig) -> str:
    if not one_step_off(config):
        rollout = config.actor_rollout_ref.rollout
        if rollout.tensor_model_parallel_size > 1 and not config.actor_rollout_ref.model.uses_lora:
            return "the actor's shards into its split rollout engine, each rank receiving only what its shard lacks"
        return "the actor's weights into its rollout engine, one gathered parameter at a time"
    buckets = config.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes
    to_pool = f"the actor's weights into the rollout pool in buckets of {buckets} MB"
    if config.actor_rollout_ref.rollout.tensor_model_parallel_size > 1:
        to_pool += " (each split rank's own slices)"
    if separate_async(config):
        return f"{to_pool} after each step's last mini-batch, landing in the generation in flight (partial rollout)"
    if not fully_async(config):
        return f"{to_pool} after each update; the next generation starts with them"
    every = config.async_training.trigger_parameter_sync_step
    landing = ", landing in the generation in flight (partial rollout)" if partial_rollout(config) else ""
    return f"{to_pool} every {every} step(s){landing}"
