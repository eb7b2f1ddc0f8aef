"""What the driver builds from a run plan, once: the worker classes of its roles, the collector of its mode (phases
1, 2 and 8), the phase objects of 3 to 7, and the step hooks its settings ask for.

The mode decides the collector: the hybrid engine's (:class:`~hybridflow.trainer.rollout_collection.RolloutCollector`,
or DAPO's dynamic sampling), one step ahead on a pool of its own
(:class:`~hybridflow.trainer.one_step_off.OneStepOffCollector`), fully async
(:class:`~hybridflow.trainer.fully_async_collection.FullyAsyncCollector`), or verl's V1 colocate_async
(:class:`~hybridflow.trainer.colocate_async.ColocateAsyncCollector`) and separate_async
(:class:`~hybridflow.trainer.separate_async.SeparateAsyncCollector`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from hybridflow.config.distillation_options import TEACHER_ROLE
from hybridflow.config.phases import OLD_FROM_PASS, OLD_FROM_ROLLOUT
from hybridflow.config.placement import ROLLOUT_ROLE
from hybridflow.config.plan import COLOCATE_ASYNC, FULLY_ASYNC, ONE_STEP_OFF, SEPARATE_ASYNC, RunPlan
from hybridflow.distributed import RayClassWithInitArgs
from hybridflow.rewards.judge_prompts import JudgeScoring
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.colocate_async import ColocateAsyncCollector
from hybridflow.trainer.estimator_metrics import RewardComponentMetrics, VarianceProxyMetrics
from hybridflow.trainer.fully_async_collection import FullyAsyncCollector, TrainerIdleRatio
from hybridflow.trainer.hooks import RolloutDump, StepHook
from hybridflow.trainer.one_step_off import OneStepOffCollector, RolloutWeightSync
from hybridflow.trainer.phases import (
    ActorUpdate,
    Critic,
    NoCritic,
    NoOldLogProbPass,
    NoReference,
    NoTeacher,
    OldLogProbs,
    PhaseCalls,
    ReferencePolicy,
    RolloutLogProbsAsOld,
    StepStartOldLogProbs,
    TeacherScores,
)
from hybridflow.trainer.rollout_collection import (
    DynamicSamplingCollector,
    Generation,
    GreedyBaseline,
    RolloutCollector,
    RulesBesideModelScorer,
    reward_scorer,
)
from hybridflow.trainer.separate_async import SeparateAsyncCollector
from hybridflow.trainer.step_switch import StepSwitch
from hybridflow.trainer.worker_groups import create_local_worker_groups, create_worker_groups
from hybridflow.workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker
from hybridflow.workers.judge import GenerativeJudgeWorker
from hybridflow.workers.teacher import TeacherWorker


def lands_in_flight(plan: RunPlan) -> bool:
    """Weight syncs land in the rollout pool's generation in flight (partial rollout: separate_async, or fully
    async with ``partial_rollout``)."""
    return plan.mode == SEPARATE_ASYNC or (plan.fully_async is not None and plan.fully_async.partial_rollout)


def role_classes(plan: RunPlan) -> dict[str, RayClassWithInitArgs]:
    """The worker class of each role of the plan, with its section."""
    classes = {}
    for role, parts in plan.worker_roles.items():
        if role == "actor_rollout_ref":
            classes[role] = RayClassWithInitArgs(
                ActorRolloutRefWorker,
                config=plan.actor_rollout_ref,
                role=parts,
                bypass=plan.bypass,
                distillation=plan.distillation_loss,
            )
        elif role == ROLLOUT_ROLE:
            classes[role] = RayClassWithInitArgs(
                ActorRolloutRefWorker, config=plan.actor_rollout_ref, role=parts, loads_in_flight=lands_in_flight(plan)
            )
        elif role == "ref":
            classes[role] = RayClassWithInitArgs(ActorRolloutRefWorker, config=plan.actor_rollout_ref, role=parts)
        elif role == "critic":
            classes[role] = RayClassWithInitArgs(CriticWorker, config=plan.critic)
        elif role == TEACHER_ROLE:
            teacher = plan.teacher
            models = [(model.model_path, model.dtype) for model in teacher.models]
            classes[role] = RayClassWithInitArgs(TeacherWorker, plan.actor_rollout_ref, models, teacher.topk)
        else:
            worker = GenerativeJudgeWorker if plan.reward_model.judge.enable else RewardModelWorker
            classes[role] = RayClassWithInitArgs(worker, config=plan.reward_model)
    return classes


def worker_starter(plan: RunPlan) -> Callable[..., Any]:
    """How the groups start: in this process (local mode), or as Ray actors, the rollout pool's taking its weight
    loads beside a generation in flight where partial rollout lands them there."""
    if plan.local:
        return create_local_worker_groups
    partial = lands_in_flight(plan)
    concurrent = frozenset({ROLLOUT_ROLE}) if partial else frozenset()
    return functools.partial(create_worker_groups, concurrent_roles=concurrent)


@dataclass
class StepPhases:
    """The phase objects of phases 3 to 7 the plan asks for (the absent ones do nothing)."""

    old_log_probs: OldLogProbs | StepStartOldLogProbs | RolloutLogProbsAsOld | NoOldLogProbPass
    reference: ReferencePolicy | NoReference
    teacher: TeacherScores | NoTeacher
    critic: Critic | NoCritic
    actor: ActorUpdate


def step_phases(
    plan: RunPlan, actor_rollout: Any, critic_group: Any, ref_group: Any = None, teacher_group: Any = None
) -> StepPhases:
    """The phases over the started groups; the reference's calls go to its own group where the layout gives it
    one (``ref_group``), else to the actor's; a distillation teacher's to its own pool's (``teacher_group``), whose
    calls overlap the actor's but in local mode."""
    calls = PhaseCalls(overlap=plan.overlap_pools)
    if plan.old_log_probs == OLD_FROM_PASS:
        pass_class = StepStartOldLogProbs if plan.passes_per_step > 1 else OldLogProbs
        old_log_probs = pass_class(actor_rollout, calls)
    else:
        old_log_probs = RolloutLogProbsAsOld() if plan.old_log_probs == OLD_FROM_ROLLOUT else NoOldLogProbPass()
    return StepPhases(
        old_log_probs=old_log_probs,
        reference=ReferencePolicy(ref_group or actor_rollout, calls) if plan.uses_reference else NoReference(),
        teacher=TeacherScores(teacher_group, PhaseCalls(overlap=not plan.local), plan.teacher)
        if plan.teacher
        else NoTeacher(),
        critic=Critic(critic_group, calls) if plan.uses_critic else NoCritic(),
        actor=ActorUpdate(actor_rollout, calls, plan.trainer.critic_warmup, plan.old_log_probs),
    )


def validation_scorer(plan: RunPlan, score: Any, reward_manager: Any, data_sources: list[str]) -> Any:
    """Validation's scorer: training's. With a reward model (or judge), as in verl, its scores are validation's
    ``reward``; where the rules can score every validation ``data_source``, their extras (``acc``, ...) are added
    beside them, so ``val-core`` stays each source's rule."""
    if not plan.reward_model.enable:
        return score
    unknown = reward_manager.unscored_sources(data_sources)
    if not unknown:
        return RulesBesideModelScorer(reward_manager, score)
    print(f"[hybridflow] validation is scored by the reward model alone: no rule scores data_source {unknown}")
    return score


def collector(plan: RunPlan, groups: dict[str, Any], tokenizer: Any, reward_manager: Any) -> Any:
    """Phases 1, 2 and 8 of the plan's mode."""
    rollout = plan.actor_rollout_ref.rollout
    meta = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    if lands_in_flight(plan):
        meta["record_weight_versions"] = True
    actor, rollout_group = groups["actor_rollout_ref"], groups.get(ROLLOUT_ROLE, groups["actor_rollout_ref"])
    generate = Generation(rollout_group, meta, seed=rollout.seed, n=rollout.n, val_n=rollout.val_kwargs.n)
    judge = plan.reward_model.judge
    judge_scoring = JudgeScoring(tokenizer, judge, plan.data.reward_fn_key) if judge.enable else None
    score = reward_scorer(reward_manager, groups.get("reward_model"), plan.streamed_reward, judge_scoring)
    if plan.mode == FULLY_ASYNC:
        settings = plan.fully_async
        return FullyAsyncCollector(
            generate,
            score,
            RolloutWeightSync(actor, rollout_group, plan.bucket_megabytes),
            required=settings.required,
            max_required=settings.max_required,
            concurrent=settings.concurrent,
            steps_per_sync=settings.steps_per_sync,
            total_steps=plan.total_training_steps,
            partial_rollout=settings.partial_rollout,
        )
    if plan.mode == SEPARATE_ASYNC:
        sync = RolloutWeightSync(actor, rollout_group, plan.bucket_megabytes, phase=names.PHASE_UPDATE_WEIGHTS)
        return separate_async_collector(plan, generate, score, sync, actor)
    if plan.mode == ONE_STEP_OFF:
        sync = RolloutWeightSync(actor, rollout_group, plan.bucket_megabytes)
        return OneStepOffCollector(generate, score, sync, plan.total_training_steps)
    if plan.mode == COLOCATE_ASYNC:
        return colocate_async_collector(plan, generate, score)
    baseline = GreedyBaseline() if plan.greedy_baseline else None
    if not plan.dynamic_sampling:
        return RolloutCollector(generate, score, baseline)
    filter_groups = plan.algorithm.filter_groups
    return DynamicSamplingCollector(
        generate,
        score,
        baseline,
        train_batch_size=plan.data.train_batch_size,
        metric=filter_groups.metric,
        max_num_gen_batches=filter_groups.max_num_gen_batches,
    )


def colocate_async_collector(plan: RunPlan, generate: Generation, score: Any) -> ColocateAsyncCollector:
    v1, rollout = plan.trainer.v1, plan.actor_rollout_ref.rollout
    return ColocateAsyncCollector(
        generate,
        score,
        train_batch_size=plan.data.train_batch_size,
        warmup_batches=v1.colocate_async.num_warmup_batches,
        threshold=v1.sampler.max_off_policy_threshold,
        strategy=v1.sampler.max_off_policy_strategy,
        total_steps=plan.total_training_steps,
        response_length=rollout.response_length,
        with_log_probs=rollout.calculate_log_probs,
    )


def separate_async_collector(
    plan: RunPlan, generate: Generation, score: Any, sync: RolloutWeightSync, actor: Any
) -> SeparateAsyncCollector:
    v1 = plan.trainer.v1
    switch = None
    if v1.separate_async.hybrid_rollout.enable_switch:
        pools = plan.resources
        pool_processes = pools.pools[pools.role_pool[ROLLOUT_ROLE]].world_size
        switch = StepSwitch(
            v1.separate_async.hybrid_rollout,
            train_batch_size=plan.data.train_batch_size,
            mini_batch_size=plan.prompts_per_step,
            processes=(plan.world_size, pool_processes),
        )
    return SeparateAsyncCollector(
        generate,
        score,
        sync,
        mini_batch_size=plan.prompts_per_step,
        train_batch_size=plan.data.train_batch_size,
        warmup_batches=v1.separate_async.num_warmup_batches,
        threshold=v1.sampler.max_off_policy_threshold,
        strategy=v1.sampler.max_off_policy_strategy,
        total_steps=plan.total_training_steps,
        switch=switch,
        actor=actor if switch else None,
    )


def step_hooks(plan: RunPlan, tokenizer: Any) -> list[StepHook]:
    """The extras the plan's settings ask for after each step: rollout dumps, estimator metrics, idle ratio."""
    trainer, hooks = plan.trainer, []
    if trainer.rollout_data_dir:
        hooks.append(RolloutDump(trainer.rollout_data_dir, trainer.rollout_dump_freq, tokenizer))
    if plan.algorithm.gdpo_reward_keys:
        hooks.append(RewardComponentMetrics(plan.algorithm.gdpo_reward_keys))
    if plan.actor_rollout_ref.actor.calculate_sum_pi_squared:
        hooks.append(VarianceProxyMetrics())
    if plan.mode == FULLY_ASYNC:
        hooks.append(TrainerIdleRatio())
    return hooks
