"""The run plan: the shape of a PPO run, decided once from the checked config.

:func:`build_plan` turns a checked :class:`~hybridflow.config.schema.PPOTrainerConfig` (``config/load.py``) and
the size of the training set into a frozen :class:`RunPlan`: the mode (synchronous with the hybrid engine, one
step off, fully async; in Ray or in one local process), the pools and the role each runs, which phases of a step
run and why, the batch sizes and the run's length, and the sections each component reads as given (the actor's
with its learning-rate schedule sized to the run). The driver, the workers and the engines read the plan; none
re-derives the shape of the run from the config. :func:`describe` is what ``main_ppo --plan`` prints.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from hybridflow.algos.distillation import DistillationLossConfig
from hybridflow.algos.rollout_correction import CorrectionSettings
from hybridflow.algos.rollout_correction_loss import BypassCorrection
from hybridflow.config import phases as phase_rules
from hybridflow.config.distillation_options import (
    TEACHER_ROLE,
    TeacherSpec,
    distills,
    teacher_pool_shape,
    teacher_server_notes,
    teacher_spec,
)
from hybridflow.config.environment import slow_dtype_notes
from hybridflow.config.fully_async_options import (
    concurrent_samples,
    fully_async,
    max_required_samples,
    partial_rollout,
    required_samples,
    steps_per_version,
)
from hybridflow.config.fully_async_options import training_steps as fully_async_training_steps
from hybridflow.config.layouts import Layout
from hybridflow.config.load import ConfigError
from hybridflow.config.memory_estimate import ProcessEstimate, estimate, memory_errors, runtime_bytes
from hybridflow.config.phases import Phase
from hybridflow.config.placement import (
    ROLLOUT_ROLE,
    ResourcePlan,
    layout_resource_plan,
    make_resource_plan,
    with_own_pools,
)
from hybridflow.config.profiler_options import ProfilePlan, profile_plan
from hybridflow.config.resume_checks import resume_keys
from hybridflow.config.reward_options import num_workers_notes
from hybridflow.config.role_pools import placement_layout
from hybridflow.config.rollout_correction_options import bypass_correction, correction_settings
from hybridflow.config.rollout_pool_options import one_step_off
from hybridflow.config.schema import (
    AlgorithmConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    PPOTrainerConfig,
    RayKwargsConfig,
    TrainerConfig,
)
from hybridflow.config.sizes import sizes
from hybridflow.config.v1_trainer_options import colocate_async, lends_trainer, passes_per_step, separate_async
from hybridflow.workers.config import ActorRolloutRefConfig, CriticConfig, RewardModelConfig, warmup_steps

SYNC, ONE_STEP_OFF, FULLY_ASYNC = "synchronous", "one-step-off", "fully async"
COLOCATE_ASYNC, SEPARATE_ASYNC = "colocate async", "separate async"


@dataclass(frozen=True)
class AsyncPlan:
    """Fully async training's budget (``config/fully_async_options.py``): prompt groups per step, prompts the pool
    may start per weight version, per generation call, steps between weight syncs, and partial rollout. verl's V1
    ``separate_async`` keeps its own (``trainer/separate_async.py``)."""

    required: int
    max_required: int
    concurrent: int
    steps_per_sync: int
    partial_rollout: bool


@dataclass(frozen=True)
class RunPlan:
    """What a run is. ``phases`` names every phase of a step in order (``timing_s/<name>``); ``config_record`` is
    the checked config as plain values, which the trackers record as the run's config; ``notes`` what the start-up
    banner adds about this machine."""

    mode: str
    local: bool
    resources: ResourcePlan
    worker_roles: dict[str, str]
    world_size: int
    phases: dict[str, Phase]
    uses_critic: bool
    uses_reference: bool
    kl_in_reward: bool
    old_log_probs: str
    skip_zero_signal: bool
    balance_by_prompt: bool  # trainer.balance_batch keeps a prompt's samples on one rank (they may share it)
    bypass: BypassCorrection | None
    correction: CorrectionSettings | None
    greedy_baseline: bool
    dynamic_sampling: bool
    overlap_pools: bool
    streamed_reward: bool
    prompts_per_step: int  # each pass of phases 3 to 7: a step's, or with separate_async a mini-batch's
    passes_per_step: int
    prompts_per_generation: int
    samples_per_prompt: int
    total_training_steps: int
    steps_per_version: int
    fully_async: AsyncPlan | None
    profile: ProfilePlan | None  # torch.profiler's step ranges and traced groups (``config/profiler_options.py``)
    resume_keys: dict[str, Any]
    config_record: dict[str, Any]
    notes: tuple[str, ...]
    # The sections each component reads as given.
    data: DataConfig
    algorithm: AlgorithmConfig
    trainer: TrainerConfig
    actor_rollout_ref: ActorRolloutRefConfig
    critic: CriticConfig
    reward_model: RewardModelConfig
    custom_reward_function: CustomRewardFunctionConfig
    ray_kwargs: RayKwargsConfig
    bucket_megabytes: float
    # Each pool's process at its peak (``config/memory_estimate.py``); None where a model folder is not here.
    memory: tuple[ProcessEstimate, ...] | None = None
    # On-policy distillation: the teacher role's model, and the actor's loss (None: no distillation)
    teacher: TeacherSpec | None = None
    distillation_loss: DistillationLossConfig | None = None


def _mode(config: PPOTrainerConfig) -> str:
    if fully_async(config):
        return FULLY_ASYNC
    if separate_async(config):
        return SEPARATE_ASYNC
    if one_step_off(config):
        return ONE_STEP_OFF
    return COLOCATE_ASYNC if colocate_async(config) else SYNC


def build_plan(config: PPOTrainerConfig, train_prompts: int) -> RunPlan:
    """The plan of ``config`` (checked) for a training set of ``train_prompts`` prompts; raises
    :class:`ConfigError` for what only the run's length decides (a cosine schedule no longer than its warm-up) and
    for processes whose estimated peak memory does not fit this machine (``config/memory_estimate.py``)."""
    one_at_a_time = fully_async(config) or separate_async(config)
    prompts_per_generation = 1 if one_at_a_time else config.data.gen_batch_size or config.data.train_batch_size
    prompts_per_batch = config.data.train_batch_size if separate_async(config) else prompts_per_generation
    steps = _training_steps(config, train_prompts // prompts_per_batch)
    uses_critic = phase_rules.uses_critic(config)
    if errors := schedule_errors(config, steps * passes_per_step(config), uses_critic):
        raise ConfigError(errors)
    plan = RunPlan(
        **_layout(config),
        **_step_shape(config),
        prompts_per_step=phase_rules.step_prompts(config),
        passes_per_step=passes_per_step(config),
        prompts_per_generation=prompts_per_generation,
        samples_per_prompt=config.actor_rollout_ref.rollout.n,
        total_training_steps=steps,
        steps_per_version=steps_per_version(config),
        fully_async=_async_plan(config) if fully_async(config) else None,
        profile=profile_plan(config),
        resume_keys=resume_keys(config, uses_critic),
        config_record=dataclasses.asdict(config),
        notes=tuple(slow_dtype_notes(config, uses_critic) + num_workers_notes(config) + teacher_server_notes(config)),
        teacher=teacher_spec(config) if distills(config) else None,
        distillation_loss=copy.deepcopy(config.distillation.distillation_loss) if distills(config) else None,
        **_sections(config, steps * passes_per_step(config)),
    )
    own_bytes = runtime_bytes()
    memory = estimate(plan, own_bytes)
    if memory and (errors := memory_errors(plan, memory, own_bytes)):
        raise ConfigError(errors)
    return dataclasses.replace(plan, memory=memory)


def _layout(config: PPOTrainerConfig) -> dict[str, Any]:
    """The mode, the pools and the roles each runs, and whether the critic's (or reference's) calls overlap the
    actor's. ``auto`` not yet resolved to a layout (``trainer/auto_placement.py``) plans as ``colocated``."""
    trainer = config.trainer
    layout = placement_layout(config)
    worker_roles = _worker_roles(
        config,
        phase_rules.uses_critic(config),
        phase_rules.uses_reference(config),
        layout is not None and layout.ref_apart,
    )
    resources = _resources(config, layout, list(worker_roles))
    arr_timeout = config.actor_rollout_ref.nccl_timeout
    resources = resources.with_collective_timeouts(
        {
            "actor_rollout_ref": arr_timeout,
            "ref": arr_timeout,
            ROLLOUT_ROLE: arr_timeout,
            TEACHER_ROLE: arr_timeout,
            "critic": config.critic.nccl_timeout,
        }
    )
    actor_pool = resources.role_pool["actor_rollout_ref"]
    return {
        "mode": _mode(config),
        "local": trainer.local_mode,
        "resources": resources,
        "worker_roles": worker_roles,
        # The actor's data-parallel ranks
        "world_size": resources.pools[actor_pool].world_size,
        # On a pool of its own the critic (or reference) computes and trains while the actor does; in local mode
        # every pool is this process, so its calls run one after another
        "overlap_pools": any(resources.role_pool.get(role, actor_pool) != actor_pool for role in ("critic", "ref"))
        and not trainer.local_mode,
    }


def _resources(config: PPOTrainerConfig, layout: Layout | None, roles: list[str]) -> ResourcePlan:
    """The pools of ``roles``: a named placement's or ``layout``'s, and the pools of their own (the rollout's, a
    distillation teacher's)."""
    trainer = config.trainer
    pool_options = {"use_gpu": trainer.device == "cuda", "cpus_per_process": trainer.cpus_per_worker}
    own_pools = {
        ROLLOUT_ROLE: (config.rollout.nnodes, config.rollout.n_gpus_per_node),
        TEACHER_ROLE: teacher_pool_shape(config),
    }
    if layout is None:
        return make_resource_plan(
            "colocated" if trainer.placement == "auto" else trainer.placement,
            roles,
            nnodes=trainer.nnodes,
            processes_per_node=trainer.n_gpus_per_node,
            own_pools=own_pools,
            **pool_options,
        )
    resources = layout_resource_plan(layout, processes_per_node=trainer.n_gpus_per_node, **pool_options)
    # A layout spells out the training pools; the teacher's pool is its own either way
    return with_own_pools(resources, roles, {TEACHER_ROLE: own_pools[TEACHER_ROLE]}, **pool_options)


def _step_shape(config: PPOTrainerConfig) -> dict[str, Any]:
    """Which phases run and how (``config/phases.py``)."""
    return {
        "phases": phase_rules.phases(config),
        "uses_critic": phase_rules.uses_critic(config),
        "uses_reference": phase_rules.uses_reference(config),
        "kl_in_reward": config.algorithm.use_kl_in_reward,
        "old_log_probs": phase_rules.old_log_prob_source(config),
        "skip_zero_signal": phase_rules.skips_zero_signal_samples(config),
        "balance_by_prompt": config.actor_rollout_ref.actor.use_prefix_grouper is not False
        or (phase_rules.uses_critic(config) and config.critic.use_prefix_grouper is not False),
        "bypass": bypass_correction(config),
        "correction": correction_settings(config) if phase_rules.corrects_batch(config) else None,
        "greedy_baseline": phase_rules.greedy_baseline(config),
        "dynamic_sampling": config.algorithm.filter_groups.enable,
        "streamed_reward": phase_rules.streamed_reward(config),
    }


def _sections(config: PPOTrainerConfig, updates: int) -> dict[str, Any]:
    """Copies of the sections the components read as given; the learning-rate schedules span ``updates`` (each
    step's, or with separate_async each mini-batch's, as verl sizes them)."""
    copied = ("data", "algorithm", "trainer", "reward_model", "custom_reward_function", "ray_kwargs")
    return {
        **{name: copy.deepcopy(getattr(config, name)) for name in copied},
        "actor_rollout_ref": _with_run_length(config.actor_rollout_ref, updates, "actor"),
        "critic": _with_run_length(config.critic, updates, None),
        "bucket_megabytes": config.actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes,
    }


def schedule_errors(config: PPOTrainerConfig, steps: int, uses_critic: bool) -> list[str]:
    """A cosine learning-rate schedule whose warm-up is not shorter than its length (``steps`` where its
    ``total_training_steps`` is -1): it would have nothing left to decay over (the worker's schedule refuses it)."""
    optims = {"actor_rollout_ref.actor.optim": config.actor_rollout_ref.actor.optim}
    if uses_critic:
        optims["critic.optim"] = config.critic.optim
    errors = []
    for key, optim in optims.items():
        total = optim.total_training_steps if optim.total_training_steps >= 0 else steps
        warmup = warmup_steps(dataclasses.replace(optim, total_training_steps=total))
        if optim.warmup_style == "cosine" and total <= warmup and steps > 0:
            errors.append(
                f"{key}.warmup_style='cosine' over {total} steps leaves nothing after its {warmup} warm-up steps; "
                f"lower {key}.lr_warmup_steps (or lr_warmup_steps_ratio) or train longer"
            )
    return errors


def _training_steps(config: PPOTrainerConfig, batches_per_epoch: int) -> int:
    """0 for a validation-only run; fully async counts prompts (``fully_async_options``); else
    ``trainer.total_training_steps``, or every epoch's batches."""
    trainer = config.trainer
    if trainer.val_only:
        return 0
    if fully_async(config):
        return fully_async_training_steps(config, batches_per_epoch)
    return trainer.total_training_steps or batches_per_epoch * trainer.total_epochs


def _worker_roles(config: PPOTrainerConfig, uses_critic: bool, uses_reference: bool, ref_apart: bool) -> dict[str, str]:
    """Each role the run starts and the part mix its workers play (``ActorRolloutRefWorker``'s role string). With
    the hybrid engine the actor's workers generate; with a pool of its own the rollout is a role of its own, and
    so is the reference where the layout places it apart (and the actor's generate too with separate_async's step
    switching)."""
    rollout_part = "" if one_step_off(config) and not lends_trainer(config) else "_rollout"
    fused_ref = uses_reference and not ref_apart
    roles = {"actor_rollout_ref": f"actor{rollout_part}_ref" if fused_ref else f"actor{rollout_part}"}
    if uses_reference and ref_apart:
        roles["ref"] = "ref"
    if one_step_off(config):
        roles[ROLLOUT_ROLE] = "rollout"
    if uses_critic:
        roles["critic"] = "critic"
    if config.reward_model.enable:
        roles["reward_model"] = "reward_model"
    if distills(config):
        roles[TEACHER_ROLE] = TEACHER_ROLE
    return roles


def _async_plan(config: PPOTrainerConfig) -> AsyncPlan:
    return AsyncPlan(
        required=required_samples(config),
        max_required=max_required_samples(config),
        concurrent=concurrent_samples(config),
        steps_per_sync=steps_per_version(config),
        partial_rollout=partial_rollout(config),
    )


def _with_run_length(section: Any, steps: int, optim_owner: str | None) -> Any:
    """A copy of ``section`` whose learning-rate schedule spans ``steps`` when its ``total_training_steps`` is -1."""
    section = copy.deepcopy(section)
    optim = (getattr(section, optim_owner) if optim_owner else section).optim
    if optim.total_training_steps < 0:
        optim.total_training_steps = steps
    return section


def describe(plan: RunPlan) -> list[str]:
    """The plan in lines: mode, pools, each phase and why, sizes (``main_ppo --plan`` and the start-up banner)."""
    where = "one process (trainer.local_mode=true)" if plan.local else "Ray"
    lines = [f"mode: {plan.mode}, in {where}; {plan.total_training_steps} training steps"]
    for pool_name, pool in plan.resources.pools.items():
        roles = ", ".join(f"{role} ({plan.worker_roles[role]})" for role in plan.resources.roles_in(pool_name))
        lines.append(
            f"pool {pool_name}: {pool.world_size} process(es) on {len(pool.process_on_nodes)} node(s): {roles}"
        )
    lines.append("phases of a step:")
    width = max(len(name) for name in plan.phases)
    for name, phase in plan.phases.items():
        lines.append(f"  {phase.number} {name:<{width}}  {'runs' if phase.runs else 'skipped'}: {phase.why}")
    memory = [process.describe() for process in plan.memory or ()]
    profile = [f"profile: {plan.profile.describe()}"] if plan.profile else []
    return lines + sizes(plan) + memory + profile + [f"note: {note}" for note in plan.notes]
