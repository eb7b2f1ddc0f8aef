"""The full PPO trainer config schema: every key ``ppo_trainer.yaml`` and the command line may set.

The worker sections come from the layers that read them (``hybridflow.workers.config``, which composes
``hybridflow.rollout.config.RolloutConfig`` and ``hybridflow.algos.PolicyLossModeConfig``); the sections only
the driver reads (``data``, ``algorithm``, ``trainer``, ``ray_kwargs``, ``custom_reward_function``) are
defined here. Key names follow verl's ``ppo_trainer.yaml`` so a verl command line ports with few edits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from hybridflow.algos.distillation import DistillationLossConfig
from hybridflow.help_fields import option, section
from hybridflow.workers.config import ActorRolloutRefConfig, CriticConfig, RewardModelConfig


@dataclass
class DataFiles:
    """The data keys the PPO and SFT trainers share."""

    train_files: Any = option("", "Training parquet file or list of files.")
    val_files: Any = option("", "Validation parquet file(s); empty disables validation.")
    shuffle: bool = option(True, "Shuffle the training rows each epoch.")
    seed: int = option(1, "Seed of the shuffle.")
    apply_chat_template_kwargs: dict = option({}, "Extra arguments of the chat template (e.g. enable_thinking: false).")


@dataclass
class DataConfig(DataFiles):
    """Prompts to train and validate on: parquet files in verl's row schema (``data``)."""

    prompt_key: str = option("prompt", "Column holding the chat messages of the prompt.")
    reward_fn_key: str = option("data_source", "Column that picks the scoring function and groups val metrics.")
    max_prompt_length: int = option(512, "Prompt tokens after the chat template; longer prompts follow `truncation`.")
    max_response_length: int = option(512, "Tokens generated per response.")
    train_batch_size: int = option(1024, "Prompts per training step (each sampled rollout.n times).")
    gen_batch_size: Optional[int] = option(
        None, "Prompts per generation batch of DAPO dynamic sampling (filter_groups); None: train_batch_size."
    )
    val_batch_size: Optional[int] = option(None, "Prompts per validation batch; None means the whole set at once.")
    filter_overlong_prompts: bool = option(False, "Drop prompts longer than max_prompt_length when loading.")
    truncation: str = option("error", "Overlong prompts: error, filter (drop), left, right or middle (cut).")
    return_raw_chat: bool = option(True, "Keep each prompt's messages as the raw_prompt column (agent loop, rewards).")
    train_max_samples: int = option(
        -1, "Use at most this many training prompts (-1: all); random with data.seed if shuffle."
    )
    val_max_samples: int = option(-1, "Use at most this many validation prompts (-1: all); the first ones.")
    validation_shuffle: bool = option(False, "Shuffle the validation prompts (with data.seed).")
    trust_remote_code: bool = option(False, "Allow tokenizer code from the model folder for the prompts.")


@dataclass
class KLControlConfig:
    """The coefficient of the KL penalty in the reward (``algorithm.kl_ctrl``)."""

    type: str = option("fixed", "fixed: constant kl_coef; adaptive: Ziegler et al. (arXiv 1909.08593) controller.")
    kl_coef: float = option(0.001, "The (initial) KL coefficient.")
    horizon: int = option(10000, "Adaptive controller: samples over which the coefficient adapts.")
    target_kl: float = option(0.1, "Adaptive controller: the KL it steers towards.")


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling (arXiv 2503.14476): drop prompt groups whose samples all score the same."""

    enable: bool = option(False, "Keep only prompt groups whose `metric` varies, generating until the batch is full.")
    metric: str = option("score", "Per-sample value compared within a group: score, seq_reward or a reward extra key.")
    max_num_gen_batches: int = option(10, "Generation batches allowed per step before the run stops with an error.")


@dataclass
class RolloutCorrectionConfig:
    """The rollout engine's token probabilities vs the trainer's (``algorithm.rollout_correction``, verl's keys
    and defaults; the math is ``hybridflow.algos.rollout_correction``). Needs the engine's log-probs:
    ``actor_rollout_ref.rollout.calculate_log_probs=true``."""

    rollout_is: Optional[str] = option(
        None,
        "Importance weights pi_train/pi_rollout on the policy loss: token, sequence (product), or null (none); "
        "bypass ppo_clip only measures them.",
    )
    rollout_is_threshold: Any = option(
        2.0, "Weight bound: a number truncates the weights there (TIS); 'lower_upper' zeroes weights outside (IcePop)."
    )
    rollout_rs: Optional[str] = option(
        None,
        "Rejection: comma-separated token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3 (all must "
        "pass); rejected tokens leave response_mask. null: none.",
    )
    rollout_rs_threshold: Any = option(
        None,
        "Rejection bounds, one for all options or one per option (comma-separated): k1 takes 'lower_upper' ratio "
        "bounds (or an upper, lower = 1/upper), k2/k3 an upper bound. Required with rollout_rs.",
    )
    bypass_mode: bool = option(
        False, "Use the rollout's log-probs as old_log_probs: no old-log-prob pass; the correction runs in the loss."
    )
    loss_type: str = option(
        "ppo_clip", "Bypass mode's loss: ppo_clip (PPO clip, ratio pi_theta/pi_rollout) or reinforce (IS-weighted PG)."
    )
    rollout_is_batch_normalize: bool = option(False, "Divide the importance weights by their batch mean (mean 1).")


@dataclass
class AlgorithmConfig:
    """Advantage estimation, the KL term in the reward and the rollout correction (``algorithm``)."""

    adv_estimator: str = option("gae", "Registered advantage estimator: gae, grpo, rloo, remax, ...")
    gamma: float = option(1.0, "Discount factor.")
    lam: float = option(1.0, "GAE lambda (arXiv 1506.02438).")
    norm_adv_by_std_in_grpo: bool = option(True, "GRPO: divide by the group's std (False: Dr. GRPO, arXiv 2503.20783).")
    use_kl_in_reward: bool = option(False, "Subtract kl_ctrl coefficient * KL(actor || ref) from the token rewards.")
    kl_penalty: str = option("kl", "KL estimator of the reward penalty: kl, abs, mse, low_var_kl, full.")
    kl_ctrl: KLControlConfig = section(KLControlConfig, "KL-in-reward coefficient controller.")
    filter_groups: FilterGroupsConfig = section(FilterGroupsConfig, "DAPO dynamic sampling.")
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig, "Rollout-vs-trainer mismatch: importance weights, rejection, bypass mode."
    )
    gdpo_reward_keys: Optional[list[str]] = option(
        None,
        "GDPO (arXiv 2601.05242): keys of the scoring function's returned dict, each normalised within its group "
        "before they are added; required by adv_estimator=gdpo, read by nothing else.",
    )
    gdpo_reward_weights: Optional[list[float]] = option(
        None, "GDPO: one weight per gdpo_reward_keys entry in the sum; None means 1 each."
    )
    skip_zero_signal_samples: Optional[bool] = option(
        None,
        "Leave samples with all-zero advantages out of the log-prob and update passes (exact with one "
        "mini-batch, no critic/KL/entropy term, a zero_at_zero_advantage loss). null: where exact; true: required; "
        "false: never.",
    )


@dataclass
class RunConfig:
    """The ``trainer`` keys the PPO and SFT trainers share: run length, trackers, processes, resuming."""

    total_epochs: int = option(1, "Passes over the training data.")
    total_training_steps: Optional[int] = option(None, "Stop after this many steps; None means total_epochs passes.")
    project_name: str = option("hybridflow", "Project name in the trackers.")
    logger: Any = option(
        ["console", "jsonl"], "Trackers: a list (or one name) of console, jsonl, tensorboard, mlflow, wandb, swanlab."
    )
    nnodes: int = option(1, "Nodes of the cluster to use.")
    n_gpus_per_node: int = option(1, "Worker processes per node (one per GPU; on CPU, processes sharing the cores).")
    cpus_per_worker: float = option(1.0, "CPUs Ray reserves for each worker process (fractions allowed).")
    device: Optional[str] = option(None, "cpu or cuda; None means cuda when this machine has a GPU, else cpu.")
    resume_mode: str = option("auto", "auto: resume from the run folder's latest; disable; resume_path; or a path.")
    resume_from_path: Optional[str] = option(None, "Checkpoint folder (global_step_N) when resume_mode=resume_path.")


@dataclass
class ColocateAsyncConfig:
    """``trainer.v1.colocate_async``: generation and training on the same processes, taking turns."""

    num_warmup_batches: int = option(
        1,
        "Batches of prompts started before the first step, beyond the one each step adds: a step trains on the "
        "first train_batch_size prompt groups to finish, and the rest go on after its weight sync.",
    )


@dataclass
class HybridRolloutSwitchConfig:
    """``trainer.v1.separate_async.hybrid_rollout``: verl's step switching, the trainer's processes lent to the
    rollout while they wait for the next step's samples."""

    enable_switch: bool = option(
        False,
        "The trainer's processes get a rollout engine and, at a step's start, generate the prompt groups it lacks "
        "when verl's decision after the last step says so (too few ready, time saved over the switch's cost).",
    )
    switch_threshold_ratio: float = option(
        0.4,
        "Prompt groups ready for the next step, as a share of data.train_batch_size, that keep the trainer from "
        "lending (at least one mini-batch, at most the batch); in (0, 1].",
    )
    adaptive_switch_threshold: bool = option(
        True, "Raise the ratio after steps that waited for samples, lower it after steps that did not."
    )
    switch_threshold_step_up: float = option(0.05, "Ratio added after switch_threshold_release_steps waiting steps.")
    switch_threshold_step_down: float = option(
        0.03, "Ratio taken away after switch_threshold_release_steps steps without a wait (down to 1 / sync steps)."
    )
    switch_threshold_release_steps: int = option(
        2, "Steps in a row, waiting or not, before the ratio moves in that direction."
    )
    switch_cost_window_size: int = option(
        3, "Last switches whose cost is averaged: the trainer lends only when the time it saves exceeds it."
    )


@dataclass
class SeparateAsyncConfig:
    """``trainer.v1.separate_async``: a rollout pool of its own, fed one mini-batch of training at a time."""

    num_warmup_batches: int = option(
        1,
        "Batches of prompts the rollout pool may run ahead of training, beyond the one each step adds "
        "(verl adds them before the first step).",
    )
    parameter_sync_step: int = option(
        4,
        "Mini-batches (one optimizer step each) per step, and so per weight sync into the rollout pool; "
        "data.train_batch_size must equal it times actor_rollout_ref.actor.ppo_mini_batch_size.",
    )
    hybrid_rollout: HybridRolloutSwitchConfig = section(
        HybridRolloutSwitchConfig, "Step switching: the trainer's processes lent to the rollout between steps."
    )


@dataclass
class OffPolicySamplerConfig:
    """``trainer.v1.sampler``: how many weight versions a prompt group may span before it is trained on."""

    max_off_policy_threshold: Optional[int] = option(
        8, "Span of a prompt group, at most: the step that trains it less the step that started it, plus 1; null: any."
    )
    max_off_policy_strategy: str = option(
        "drop",
        "drop: a finished group past the threshold is dropped and a new prompt replaces it; wait: a step waits "
        "for every unfinished group that reached it.",
    )


@dataclass
class TrainerV1Config:
    """verl's V1 trainer modes (``trainer.v1``)."""

    trainer_mode: str = option(
        "sync",
        "sync: generate, then train; colocate_async: the same processes, with partial rollout across steps; "
        "separate_async: a rollout pool of its own (rollout.nnodes x rollout.n_gpus_per_node) generating while "
        "the actor trains mini-batch by mini-batch, with partial rollout across weight syncs (verl's V1 modes).",
    )
    colocate_async: ColocateAsyncConfig = section(ColocateAsyncConfig, "colocate_async's warm-up.")
    separate_async: SeparateAsyncConfig = section(SeparateAsyncConfig, "separate_async's warm-up and sync period.")
    sampler: OffPolicySamplerConfig = section(OffPolicySamplerConfig, "The asynchronous modes' staleness limit.")


@dataclass
class TrainerConfig(RunConfig):
    """The run: length, placement, logging, validation and checkpoints (``trainer``)."""

    balance_batch: bool = option(
        True,
        "Reorder each step's samples so every data-parallel rank gets about the same number of tokens; a prompt's "
        "samples stay on one rank unless use_prefix_grouper is false for the actor and the critic.",
    )
    experiment_name: str = option("ppo", "Run name in the trackers.")
    log_val_generations: int = option(
        0, "Validation samples (input, output, score) logged as a table to every tracker at each validation."
    )
    placement: str = option(
        "colocated",
        "colocated: every role in one process per device; split: one pool per role; a layout such as "
        "actor+ref:2/critic:2 (pools of roles:devices); auto: the layout and parallel sizes whose simulated step is "
        "fastest.",
    )
    local_mode: bool = option(
        False,
        "Run every role in this process without Ray (one process: nnodes=1, n_gpus_per_node=1): breakpoints stop "
        "inside workers and a run starts in seconds.",
    )
    save_freq: int = option(-1, "Save a checkpoint every N steps (and at the end); -1 never.")
    test_freq: int = option(-1, "Validate every N steps (and at the end); -1 never.")
    val_before_train: bool = option(True, "Validate before the first step of a fresh run.")
    val_only: bool = option(False, "Validate once and exit.")
    critic_warmup: int = option(0, "Train only the critic for the first N steps; the actor's update starts at N+1.")
    max_nonfinite_steps: int = option(
        3,
        "Steps whose scores, loss or gradient norm are NaN/inf are skipped and never checkpointed; more than this "
        "many stop the run (0: the first).",
    )
    default_local_dir: str = option("checkpoints/hybridflow/ppo", "The run folder: checkpoints, metrics.jsonl, dumps.")
    max_actor_ckpt_to_keep: Optional[int] = option(
        None, "Keep only the newest N actor checkpoints (global_step_*/actor); None or 0 keeps all."
    )
    max_critic_ckpt_to_keep: Optional[int] = option(
        None, "Keep only the newest N critic checkpoints (global_step_*/critic); None or 0 keeps all."
    )
    rollout_data_dir: Optional[str] = option(None, "Dump prompt, response and score of each sample as jsonl here.")
    rollout_dump_freq: int = option(1, "Dump rollouts every N steps (when rollout_data_dir is set).")
    validation_data_dir: Optional[str] = option(
        None, "Dump each validation's samples (input, output, ground truth, score) as <dir>/<step>.jsonl."
    )
    peak_flops_per_device: Optional[float] = option(
        None, "Peak FLOP/s of one worker for perf/mfu/actor; None measures a matmul on CPU, skips MFU on GPU."
    )
    v1: TrainerV1Config = section(TrainerV1Config, "verl's V1 trainer modes: sync, colocate_async or separate_async.")


@dataclass
class RolloutPoolConfig:
    """The rollout's own pool when ``actor_rollout_ref.hybrid_engine=false`` or with ``separate_async``
    (``rollout``, verl's one-step-off keys)."""

    nnodes: int = option(1, "Nodes of the rollout pool.")
    n_gpus_per_node: int = option(
        1, "Rollout worker processes per node (one per GPU; on CPU, processes sharing the cores)."
    )
    total_rollout_steps: Optional[int] = option(
        None,
        "Fully async: prompts the rollout generates in all (None: every epoch's); steps = this / required samples.",
    )


@dataclass
class AsyncTrainingConfig:
    """Fully async training (``async_training``, verl's fully_async_policy keys): a bounded stream of samples."""

    enable: bool = option(False, "Train fully async: the rollout pool keeps generating while the actor trains.")
    staleness_threshold: float = option(
        0.1, "Samples generated per weight version, at most (1 + this) x trigger_parameter_sync_step x required."
    )
    trigger_parameter_sync_step: int = option(4, "Training steps between weight syncs into the rollout pool.")
    require_batches: int = option(1, "ppo_mini_batch_size prompt groups per training step, in mini-batches.")
    partial_rollout: bool = option(
        True, "In-flight samples continue with new weights after a sync (only with staleness_threshold > 0)."
    )
    use_trainer_do_validate: bool = option(False, "Validate on the training pool instead of the rollout pool.")
    use_dynamic_resource_scheduling: bool = option(False, "Lend training GPUs to the rollout between updates.")
    dynamic_schedule_policy: str = option("default", "Dynamic scheduling: the policy's registered name.")
    dynamic_schedule_deactivate_ratio: float = option(
        0.3, "Dynamic scheduling: share of a step's samples before lending back."
    )
    dynamic_schedule_enable_rebalance: bool = option(
        True, "Dynamic scheduling: move in-flight requests to lent replicas."
    )
    concurrent_samples_per_replica: int = option(16, "Prompts one rollout replica generates at once, at most.")


@dataclass
class RayInitConfig:
    """Starting or joining Ray (``ray_kwargs.ray_init``; the older ``ray_init.*`` keys are aliases)."""

    address: Optional[str] = option(None, "Join this cluster (also read from RAY_ADDRESS); None starts a local one.")
    num_cpus: Optional[int] = option(None, "CPUs of a local cluster; None means every core.")
    num_gpus: Optional[int] = option(None, "GPUs of a local cluster; None means Ray's detection.")
    object_store_memory: int = option(1 << 30, "Object store bytes of a local cluster.")
    temp_dir: Optional[str] = option(None, "Ray's session folder; None makes a fresh one.")
    runtime_env: dict = option(
        {"py_executable": None}, "Ray runtime_env of the job (env_vars, py_executable, ...), merged with hybridflow's."
    )


@dataclass
class RayKwargsConfig:
    """Ray settings (``ray_kwargs``), verl 0.9's layout."""

    ray_init: RayInitConfig = section(RayInitConfig, "Arguments of ray.init.")
    timeline_json_file: Optional[str] = option(
        None, "Write Ray's task timeline (chrome://tracing JSON) here at the end."
    )


@dataclass
class CustomRewardFunctionConfig:
    """A user scoring function from a Python file (``custom_reward_function``)."""

    path: Optional[str] = option(None, "Python file defining the function; None uses the data_source registry.")
    name: str = option("compute_score", "Function name: (data_source, solution_str, ground_truth, extra_info).")
    reward_kwargs: dict = option({}, "Extra keyword arguments bound to the function.")


@dataclass
class GlobalProfilerConfig:
    """Which steps the roles' profilers trace, with which tool, and where (``global_profiler``)."""

    tool: Optional[str] = option(None, "Profiler of every role: torch (torch.profiler); None: off.")
    steps: Any = option(None, "Training steps to trace (counted from 1), e.g. [1, 2, 5]; None: none.")
    profile_continuous_steps: bool = option(
        False, "One trace per run of consecutive steps ([1, 2] together) instead of one per step."
    )
    save_path: str = option(
        "outputs/profile", "Folder of the traces, <role>_step<N>[-<M>]_rank<R>.json (chrome trace JSON)."
    )


# verl's teacher inference servers' settings (``distillation.teacher_models.*.inference``) at verl's defaults; name,
# dtype, prompt_length, response_length and temperature follow the rollout's (the YAML interpolates them; None here).
TEACHER_FOLLOWS_ROLLOUT = ("name", "dtype", "prompt_length", "response_length", "temperature")
TEACHER_SERVER = {
    "gpu_memory_utilization": 0.5,
    "enforce_eager": True,
    "cudagraph_capture_sizes": None,
    "free_cache_engine": True,
    "data_parallel_size": 1,
    "expert_parallel_size": 1,
    "tensor_model_parallel_size": 2,
    "max_num_batched_tokens": 8192,
    "max_model_len": None,
    "max_num_seqs": 1024,
    "load_format": "auto",
    "engine_kwargs": {},
    "limit_images": None,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "disable_log_stats": True,
    "skip_tokenizer_init": True,
}


@dataclass
class DistillationConfig:
    """On-policy distillation (``distillation``, verl's keys): a frozen teacher scores the student's own samples,
    and the actor's loss pulls the student towards it (``algos/distillation.py``)."""

    enabled: bool = option(False, "Distill from distillation.teacher_models.teacher_model on the student's samples.")
    distillation_loss: DistillationLossConfig = section(DistillationLossConfig, "The per-token loss and its weight.")
    n_gpus_per_node: int = option(8, "Teacher worker processes per node of the teacher's pool (on CPU, processes).")
    nnodes: int = option(0, "Nodes of the teacher's pool; at least 1 when enabled.")
    teacher_models: dict = option(
        {
            "teacher_model": {
                "key": None,
                "model_path": None,
                "num_replicas": 0,
                "inference": {**dict.fromkeys(TEACHER_FOLLOWS_ROLLOUT), **TEACHER_SERVER},
            }
        },
        "The teacher: teacher_model.model_path (a folder sharing the student's tokenizer); inference.dtype its "
        "weights' dtype (default the rollout's); the other inference.* keys size verl's teacher servers. Several "
        "(verl's MOPD): entries of other names, each with the key of its rows.",
    )
    teacher_key: str = option(
        "data_source", "Per-row field (data_source or ability) whose value picks a teacher when there are several."
    )


@dataclass
class PPOTrainerConfig:
    """Everything ``python -m hybridflow.trainer.main_ppo`` reads."""

    data: DataConfig = section(DataConfig, "Training and validation prompts.")
    actor_rollout_ref: ActorRolloutRefConfig = section(ActorRolloutRefConfig, "Policy model: actor, rollout, ref.")
    critic: CriticConfig = section(CriticConfig, "Value model (built only when the estimator needs values).")
    reward_model: RewardModelConfig = section(RewardModelConfig, "Learned reward model and the reward manager.")
    custom_reward_function: CustomRewardFunctionConfig = section(CustomRewardFunctionConfig, "User scoring function.")
    algorithm: AlgorithmConfig = section(AlgorithmConfig, "Advantage estimator and KL in reward.")
    trainer: TrainerConfig = section(TrainerConfig, "Run length, placement, logging, checkpoints.")
    rollout: RolloutPoolConfig = section(
        RolloutPoolConfig,
        "The rollout's own pool (actor_rollout_ref.hybrid_engine=false, or trainer.v1.trainer_mode=separate_async).",
    )
    async_training: AsyncTrainingConfig = section(
        AsyncTrainingConfig, "Fully async training (async_training.enable=true)."
    )
    ray_kwargs: RayKwargsConfig = section(RayKwargsConfig, "Ray cluster.")
    global_profiler: GlobalProfilerConfig = section(GlobalProfilerConfig, "torch.profiler traces of chosen steps.")
    distillation: DistillationConfig = section(DistillationConfig, "On-policy distillation from a frozen teacher.")
