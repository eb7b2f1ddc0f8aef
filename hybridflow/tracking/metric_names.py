"""Every metric name the PPO driver logs, in one place, spelled as verl spells them.

Dashboards built for verl read hybridflow runs unchanged. Workers return un-prefixed dicts
(``pg_loss``, ``vf_loss``); the driver adds :data:`ACTOR_PREFIX` / :data:`CRITIC_PREFIX`. Statistics
over a batch are ``<group>/mean``, ``<group>/max``, ``<group>/min`` (see :func:`stat`).
"""

from __future__ import annotations

from hybridflow.algos.rollout_correction_metrics import METRIC_PREFIX as ROLLOUT_CORRECTION_METRIC_PREFIX

ACTOR_PREFIX = "actor/"
CRITIC_PREFIX = "critic/"

# Groups reduced to mean/max/min over the batch (sequence sums for scores and rewards,
# response tokens for advantages, returns and values).
SCORE = "critic/score"
REWARDS = "critic/rewards"
ADVANTAGES = "critic/advantages"
RETURNS = "critic/returns"
VALUES = "critic/values"
VF_EXPLAINED_VAR = "critic/vf_explained_var"
RESPONSE_LENGTH = "response_length"
PROMPT_LENGTH = "prompt_length"
CLIP_RATIO = "clip_ratio"
# Assistant plus tool turns per sample of a multi-turn rollout (verl's num_turns/{mean,max,min}).
NUM_TURNS = "num_turns"

# Share of the batch's samples whose advantages are 0 on every response token (no policy gradient; e.g.
# GRPO groups that all scored the same). With algorithm.skip_zero_signal_samples they skip the update.
ZERO_SIGNAL_FRAC = "batch/zero_signal_frac"

# Real tokens per data-parallel rank before and after trainer.balance_batch, as verl logs them:
# ``global_seqlen/{min,max,minmax_diff}`` before, ``global_seqlen/{balanced_min,balanced_max}`` after, and the mean.
GLOBAL_SEQLEN = "global_seqlen"

# KL in the reward (Ziegler et al., arXiv 1909.08593): the measured KL and the controller's coefficient.
KL_IN_REWARD = "actor/reward_kl_penalty"
KL_COEF_IN_REWARD = "actor/reward_kl_penalty_coeff"

# Per-phase wall time; the suffixes are the phase names used by the driver's timer.
TIMING_PREFIX = "timing_s/"
TIMING_PER_TOKEN_PREFIX = "timing_per_token_ms/"
PHASE_GEN = "gen"
PHASE_REWARD = "reward"
PHASE_OLD_LOG_PROB = "old_log_prob"
PHASE_REF = "ref"
PHASE_TEACHER = "teacher"
PHASE_VALUES = "values"
PHASE_ADV = "adv"
PHASE_UPDATE_CRITIC = "update_critic"
PHASE_UPDATE_ACTOR = "update_actor"
PHASE_UPDATE_WEIGHTS = "update_weights"
# actor_rollout_ref.hybrid_engine=false (verl's one-step-off names): ``gen`` is then the wait for the generation
# started a step earlier, and the weights travel to the rollout pool in ``sync_rollout_weights``.
PHASE_SYNC_ROLLOUT_WEIGHTS = "sync_rollout_weights"
# The checks that the engine serves the weights sent (rollout.weight_sync_check_freq): part of update_weights,
# sync_rollout_weights and gen (a wake is checked too), reported on its own for its cost.
CHECK_WEIGHT_SYNC = "check_weight_sync"
PHASE_STEP = "step"
# separate_async's step switching (verl's names): the actor's engine getting the weights and starting the lent
# call, the trainer's wait for it, and the return of its samples to training.
PHASE_SWITCH_TO_ROLLOUT = "switch_to_rollout"
PHASE_SWITCH_WAIT = "switch_wait"
PHASE_SWITCH_TO_TRAINER = "switch_to_trainer"
PHASE_TESTING = "testing"

# Throughput and hardware utilisation.
PERF_TOTAL_NUM_TOKENS = "perf/total_num_tokens"
PERF_TIME_PER_STEP = "perf/time_per_step"
PERF_THROUGHPUT = "perf/throughput"
PERF_MFU_ACTOR = "perf/mfu/actor"
# Memory after each actor update, as verl logs it (GPU: torch's allocator peaks; the machine's used memory), and
# the actor process's peak resident memory, which the config check's estimate is measured against.
PERF_MAX_MEMORY_ALLOCATED = "perf/max_memory_allocated_gb"
PERF_MAX_MEMORY_RESERVED = "perf/max_memory_reserved_gb"
PERF_CPU_MEMORY_USED = "perf/cpu_memory_used_gb"
PERF_MAX_RESIDENT_MEMORY = "perf/max_resident_memory_gb"
PERF_MEMORY = (PERF_MAX_MEMORY_ALLOCATED, PERF_MAX_MEMORY_RESERVED, PERF_CPU_MEMORY_USED, PERF_MAX_RESIDENT_MEMORY)

# Rollout engine vs actor on the same tokens (verl's debug metrics): |exp(old_log_probs) - exp(rollout_log_probs)|
# over response tokens, reduced to ``<group>_max``/``_mean``/``_std``; ``_valid`` is 0 when no token was compared.
ROLLOUT_PROBS_DIFF = "training/rollout_probs_diff"
ROLLOUT_ACTOR_PROBS_PEARSON_CORR = "training/rollout_actor_probs_pearson_corr"

# Rollout correction (algorithm.rollout_correction), named by hybridflow.algos.rollout_correction as verl names
# them: ``rollout_corr/rollout_is_*`` (importance weights), ``rollout_corr/rollout_rs_*`` (rejection) and the
# mismatch ``rollout_corr/kl``, ``k3_kl``, ``*_ppl``, ``log_ppl_*``, ``ppl_ratio``, ``chi2_token``, ``chi2_seq``.
# In bypass mode the actor reports the token means among them (with its update metrics, unprefixed).
ROLLOUT_CORR_PREFIX = ROLLOUT_CORRECTION_METRIC_PREFIX

# Where the run is.
GLOBAL_STEP = "training/global_step"
EPOCH = "training/epoch"
# Non-finite values (hybridflow.trainer.nonfinite): ``training/nonfinite_skip`` is 1 for a step whose scores, loss or
# gradient norm were NaN/inf (scores: the step trained nothing; loss or gradient norm: the optimizer steps of
# ``actor/nonfinite_skip_frac`` / ``critic/nonfinite_skip_frac`` were skipped); ``training/nonfinite_steps``
# counts such steps so far. Neither is checkpointed.
NONFINITE_SKIP = "training/nonfinite_skip"
NONFINITE_STEPS = "training/nonfinite_steps"

# DAPO dynamic sampling (arXiv 2503.14476): generation batches spent and groups kept for this step.
NUM_GEN_BATCHES = "train/num_gen_batches"
NUM_KEPT_GROUPS = "train/num_kept_groups"

# Fully async training (async_training), verl's names: prompt groups trained on that came from weights older than
# the trainer's current version (so far) and the same in samples, the trainer's weight version (syncs so far),
# prompts the rollout started (so far), and the share of the step the trainer waited for samples.
FULLY_ASYNC_STALE_SAMPLES = "fully_async/count/stale_samples_processed"
FULLY_ASYNC_STALE_TRAJECTORIES = "fully_async/count/stale_trajectory_processed"
FULLY_ASYNC_PARAM_VERSION = "fully_async/count/current_param_version"
FULLY_ASYNC_GENERATED_SAMPLES = "fully_async/count/total_generated_samples"
FULLY_ASYNC_TRAINER_IDLE_RATIO = "fully_async/trainer/idle_ratio"
# With partial rollout, of the step's samples: how many were drawn by more than one weight version, their share,
# and the most versions apart a sample's first and last tokens are.
FULLY_ASYNC_PARTIAL_SAMPLES = "fully_async/partial/total_partial_num"
FULLY_ASYNC_PARTIAL_RATIO = "fully_async/partial/partial_ratio"
FULLY_ASYNC_MAX_PARTIAL_SPAN = "fully_async/partial/max_partial_span"

# verl's V1 trainers (trainer.v1.trainer_mode=colocate_async), ``/mean|max|min`` over the step's samples: the
# weight versions that drew each one, how many versions behind the trainer its last and its first tokens are; and
# the finished prompt groups dropped as older than max_off_policy_threshold, with their ages (``/mean|max|min``).
OFF_POLICY_SPANS = "training/off_policy/trajectory_spans"
OFF_POLICY_STALENESS = "training/off_policy/trajectory_staleness"
OFF_POLICY_STALENESS_WORST = "training/off_policy/trajectory_staleness_worst"
OFF_POLICY_EVICTED = "training/off_policy/evicted_samples"
OFF_POLICY_EVICTED_STALENESS = "training/off_policy/evicted_samples_staleness"

# separate_async's step switching, decided after each step's update (verl's ``separate_async/switch|decision/*``).
SWITCH_THRESHOLD_RATIO = "separate_async/switch/threshold_ratio"
SWITCH_WAIT_SAMPLES = "separate_async/switch/wait_samples"
SWITCH_IDLE = "separate_async/switch/idle"
SWITCH_SAMPLEABLE = "separate_async/decision/sampleable_count"
SWITCH_REMAINING = "separate_async/decision/remaining"
SWITCH_SHOULD_SWITCH = "separate_async/decision/should_switch_to_rollout"
SWITCH_PER_SAMPLE_SECONDS = "separate_async/decision/per_sample_time_seconds"
SWITCH_COST_SECONDS = "separate_async/decision/effective_switch_cost_seconds"

# GDPO (arXiv 2601.05242): ``gdpo/<key>/mean|std|max|min`` of each reward component in algorithm.gdpo_reward_keys.
GDPO_PREFIX = "gdpo/"

# Gradient-variance proxies from sum_pi_squared (actor.calculate_sum_pi_squared), verl's names.
VARIANCE_PROXY_SIGNAL = "variance_proxy/proxy1_signal_strength"
VARIANCE_PROXY_TOTAL_POWER = "variance_proxy/proxy2_total_power"
VARIANCE_PROXY_NOISE = "variance_proxy/proxy3_pure_noise"
VARIANCE_PROXY_EXPECTED_A_SQUARED = "variance_proxy/expected_a_squared"
VARIANCE_PROXY_EXPECTED_W = "variance_proxy/expected_w"

# Validation metrics are named by hybridflow.rewards.process_validation_metrics, as verl names them:
# ``val-core/<data_source>/<metric>/mean@<n>`` for the headline numbers, ``val-aux/...`` for the rest.
VAL_CORE_PREFIX = "val-core/"


def stat(group: str, reduction: str) -> str:
    """``stat(SCORE, "mean") == "critic/score/mean"``."""
    return f"{group}/{reduction}"


def timing(phase: str) -> str:
    """``timing("gen") == "timing_s/gen"``."""
    return f"{TIMING_PREFIX}{phase}"


def timing_per_token(phase: str) -> str:
    """``timing_per_token("gen") == "timing_per_token_ms/gen"``."""
    return f"{TIMING_PER_TOKEN_PREFIX}{phase}"


def with_prefix(prefix: str, metrics: dict) -> dict:
    """Prefix every key of a worker's un-prefixed metrics dict (``pg_loss`` -> ``actor/pg_loss``); a name that
    has its own section already (``rollout_corr/kl``) keeps it."""
    return {name if "/" in name else f"{prefix}{name}": value for name, value in metrics.items()}


def is_timing(name: str) -> bool:
    """True for wall-clock metrics, which differ between otherwise identical runs."""
    return name.startswith((TIMING_PREFIX, TIMING_PER_TOKEN_PREFIX, "perf/")) or name == FULLY_ASYNC_TRAINER_IDLE_RATIO
