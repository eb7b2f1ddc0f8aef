"""When the trainer may skip work without changing the update: the rules, read once at start-up.

Two shortcuts, each on by default where it is exact and switched by one config key (null: where exact;
true: required, a config error where it is not exact; false: never):

- ``actor_rollout_ref.actor.skip_old_log_prob``: phase 3's separate old-log-prob forward is skipped
  when the update is on-policy (one epoch of one mini-batch): the actor's weights have not moved since
  they sampled the batch, so its own log-probs, detached, are the old ones (ratio exactly 1). (Rollout
  correction's bypass mode has no such pass at all: the rollout's log-probs are the old ones.)
- ``algorithm.skip_zero_signal_samples``: samples whose advantages are all 0 (GRPO groups that all
  scored the same, ...) skip phases 3 and 7 when their only effect on the update is the loss's
  denominator, which the actor then takes from the whole batch.

Each ``*_blockers`` function returns one phrase per reason the shortcut is not exact (none: it is).
"""

from __future__ import annotations

from hybridflow.algos.advantage_registry import ADV_ESTIMATORS
from hybridflow.algos.policy_losses import POLICY_LOSSES
from hybridflow.config.fully_async_options import fully_async, step_prompts
from hybridflow.config.rollout_correction_options import KEY as ROLLOUT_CORRECTION_KEY
from hybridflow.config.rollout_correction_options import corrects_in_driver, uses_bypass
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.v1_trainer_options import passes_per_step

SKIP_OLD_LOG_PROB_KEY = "actor_rollout_ref.actor.skip_old_log_prob"
SKIP_ZERO_SIGNAL_KEY = "algorithm.skip_zero_signal_samples"


def _several_optimizer_steps(config: PPOTrainerConfig) -> list[str]:
    actor = config.actor_rollout_ref.actor
    if actor.ppo_mini_batch_size >= step_prompts(config):
        return []
    if fully_async(config):
        return [
            f"async_training.require_batches={config.async_training.require_batches} takes several optimizer "
            "steps per batch"
        ]
    return [
        f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} < "
        f"data.train_batch_size={config.data.train_batch_size} takes several optimizer steps per batch"
    ]


def _log_prob_pass_readers(config: PPOTrainerConfig) -> list[str]:
    """What reads the old-log-prob pass's outputs for every sample before the update."""
    readers = []
    estimator = config.algorithm.adv_estimator
    requires = ADV_ESTIMATORS.traits(estimator)["requires"] if estimator in ADV_ESTIMATORS else frozenset()
    read = requires & {"old_log_probs", "sum_pi_squared"}
    if read:
        readers.append(f"algorithm.adv_estimator={estimator} reads {' and '.join(sorted(read))} of every sample")
    if config.actor_rollout_ref.actor.calculate_sum_pi_squared:
        readers.append(
            "actor_rollout_ref.actor.calculate_sum_pi_squared=true takes sum_pi_squared of every sample from that pass"
        )
    if corrects_in_driver(config):
        readers.append(
            f"{ROLLOUT_CORRECTION_KEY} (rollout_is/rollout_rs) weighs and masks every sample by old_log_probs"
        )
    return readers


def old_log_prob_skip_blockers(config: PPOTrainerConfig) -> list[str]:
    """Why the old log-probs can differ from the update's own (the update is not exactly on-policy)."""
    blockers = _several_optimizer_steps(config)
    if passes_per_step(config) > 1:
        blockers.append(
            f"trainer.v1.separate_async.parameter_sync_step={passes_per_step(config)} trains several mini-batches "
            "against the step's starting weights"
        )
    epochs = config.actor_rollout_ref.actor.ppo_epochs
    if epochs != 1:
        blockers.append(f"actor_rollout_ref.actor.ppo_epochs={epochs} reuses the batch after an optimizer step")
    if config.algorithm.use_kl_in_reward:
        blockers.append("algorithm.use_kl_in_reward=true reads old_log_probs before the update")
    if uses_bypass(config):
        blockers.append(f"{ROLLOUT_CORRECTION_KEY}.bypass_mode=true takes the rollout's log-probs as the old ones")
    return blockers + _log_prob_pass_readers(config)


def zero_signal_skip_blockers(config: PPOTrainerConfig) -> list[str]:
    """Why a sample with all-zero advantages can still change the update (beyond the loss denominator)."""
    algorithm, actor = config.algorithm, config.actor_rollout_ref.actor
    blockers = _several_optimizer_steps(config)
    if algorithm.adv_estimator in ADV_ESTIMATORS and ADV_ESTIMATORS.traits(algorithm.adv_estimator)["needs_critic"]:
        blockers.append(f"algorithm.adv_estimator={algorithm.adv_estimator} trains a critic on every sample")
    if algorithm.use_kl_in_reward:
        blockers.append("algorithm.use_kl_in_reward=true gives every sample a KL reward")
    blockers += _log_prob_pass_readers(config)
    if uses_bypass(config):
        blockers.append(f"{ROLLOUT_CORRECTION_KEY}.bypass_mode=true corrects the loss of every sample")
    elif config.actor_rollout_ref.rollout.calculate_log_probs and not skips_old_log_prob(config):
        blockers.append(
            "actor_rollout_ref.rollout.calculate_log_probs=true compares every sample's old_log_probs with the "
            "rollout's before the advantages (training/rollout_probs_diff_*)"
        )
    if actor.use_kl_loss:
        blockers.append("actor_rollout_ref.actor.use_kl_loss=true adds a KL loss on every sample")
    if config.distillation.enabled:
        blockers.append("distillation.enabled=true gives every sample a distillation loss")
    if actor.entropy_coeff != 0:
        blockers.append(f"actor_rollout_ref.actor.entropy_coeff={actor.entropy_coeff} adds an entropy bonus per sample")
    loss_mode = actor.policy_loss.loss_mode
    if loss_mode in POLICY_LOSSES and not POLICY_LOSSES.traits(loss_mode)["zero_at_zero_advantage"]:
        blockers.append(
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode} is not registered zero_at_zero_advantage "
            "(a zero-advantage sample changes the other samples' loss)"
        )
    return blockers


def skips_old_log_prob(config: PPOTrainerConfig) -> bool:
    """Phase 3's old-log-prob forward is skipped (the setting allows it and it is exact)."""
    setting = config.actor_rollout_ref.actor.skip_old_log_prob
    return setting is not False and not old_log_prob_skip_blockers(config)


def skips_zero_signal_samples(config: PPOTrainerConfig) -> bool:
    """Samples with all-zero advantages leave the step after phase 5 (the setting allows it and it is exact)."""
    setting = config.algorithm.skip_zero_signal_samples
    return setting is not False and not zero_signal_skip_blockers(config)


def forced_skip_errors(config: PPOTrainerConfig) -> list[str]:
    """One config error per shortcut set to true where it is not exact."""
    checks = (
        (SKIP_OLD_LOG_PROB_KEY, config.actor_rollout_ref.actor.skip_old_log_prob, old_log_prob_skip_blockers),
        (SKIP_ZERO_SIGNAL_KEY, config.algorithm.skip_zero_signal_samples, zero_signal_skip_blockers),
    )
    errors = []
    for key, setting, blockers_of in checks:
        blockers = blockers_of(config) if setting is True else []
        if blockers:
            errors.append(
                f"{key}=true is not exact here: {'; '.join(blockers)}; set it to null (skip only where exact) or false"
            )
    return errors
