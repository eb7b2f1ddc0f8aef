"""``algorithm.rollout_correction``: what a run does with it, and its config rules, checked before anything starts.

Two modes, as in verl (``ray_trainer.py``): *decoupled* (``bypass_mode=false``) keeps the old-log-prob pass
and the driver corrects the batch from ``old_log_probs`` and the engine's ``rollout_log_probs`` (importance
weights and rejection when ``rollout_is``/``rollout_rs`` are set; the mismatch metrics whenever both
log-probs are there); *bypass* takes the rollout's log-probs as the old ones, so there is no pass, and the
actor's loss corrects each micro-batch (``hybridflow.algos.rollout_correction_loss``).

Differs from verl: verl's ``rollout.calculate_log_probs`` defaults to true and its decoupled correction is
silently skipped without the engine's log-probs; here any correction without them is a config error. verl's
bypass mode replaces ``policy_loss.loss_mode`` with its own loss; here a ``loss_mode`` other than ``vanilla``
is an error, and so are settings that nothing would read (``loss_type`` outside bypass mode, a threshold
without its ``rollout_is``/``rollout_rs``, batch normalisation without weights).
"""

from __future__ import annotations

from hybridflow.algos.rollout_correction import CorrectionSettings, RolloutCorrectionError
from hybridflow.algos.rollout_correction_loss import BYPASS_LOSS_TYPES, BypassCorrection
from hybridflow.config.schema import PPOTrainerConfig

KEY = "algorithm.rollout_correction"
CALCULATE_LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs"
DEFAULT_IS_THRESHOLD = 2.0  # verl's default, present in every verl config whether or not weights are used


def correction_settings(config: PPOTrainerConfig) -> CorrectionSettings:
    """The parsed settings; raises ``RolloutCorrectionError`` (see :func:`rollout_correction_errors`)."""
    section = config.algorithm.rollout_correction
    return CorrectionSettings.from_keys(
        section.rollout_is,
        section.rollout_is_threshold,
        section.rollout_is_batch_normalize,
        section.rollout_rs,
        section.rollout_rs_threshold,
    )


def uses_bypass(config: PPOTrainerConfig) -> bool:
    """The rollout's log-probs are the old ones: no old-log-prob pass."""
    return config.algorithm.rollout_correction.bypass_mode


def corrects_in_driver(config: PPOTrainerConfig) -> bool:
    """Decoupled mode with weights or rejection: the driver reads every sample's ``old_log_probs``."""
    section = config.algorithm.rollout_correction
    return not section.bypass_mode and (section.rollout_is is not None or section.rollout_rs is not None)


def bypass_correction(config: PPOTrainerConfig) -> BypassCorrection | None:
    """What the actor's loss needs in bypass mode; None in decoupled mode."""
    if not uses_bypass(config):
        return None
    return BypassCorrection(correction_settings(config), config.algorithm.rollout_correction.loss_type)


def _unread_setting_errors(config: PPOTrainerConfig) -> list[str]:
    section = config.algorithm.rollout_correction
    errors = []
    if section.loss_type != "ppo_clip" and not section.bypass_mode:
        errors.append(
            f"{KEY}.loss_type={section.loss_type!r} is read only in bypass mode; "
            f"set {KEY}.bypass_mode=true or remove it"
        )
    if section.rollout_is is None and section.rollout_is_threshold not in (None, DEFAULT_IS_THRESHOLD):
        errors.append(f"{KEY}.rollout_is_threshold is read only with {KEY}.rollout_is; set rollout_is or remove it")
    if section.rollout_rs_threshold is not None and section.rollout_rs is None:
        errors.append(f"{KEY}.rollout_rs_threshold is read only with {KEY}.rollout_rs; set rollout_rs or remove it")
    if section.rollout_is_batch_normalize and section.rollout_is is None:
        errors.append(
            f"{KEY}.rollout_is_batch_normalize=true normalises importance weights, but {KEY}.rollout_is is null; "
            "set rollout_is=token or sequence, or remove it"
        )
    return errors


def rollout_correction_errors(config: PPOTrainerConfig) -> list[str]:
    """One line per problem with ``algorithm.rollout_correction``, naming the key and the fix."""
    section = config.algorithm.rollout_correction
    try:
        correction_settings(config)
        errors = []
    except RolloutCorrectionError as error:
        errors = [f"{KEY}.{error}"]
    if section.loss_type not in BYPASS_LOSS_TYPES:
        errors.append(f"{KEY}.loss_type={section.loss_type!r} is not one of [{', '.join(BYPASS_LOSS_TYPES)}]")
    errors += _unread_setting_errors(config)
    wants = [f"{name}={getattr(section, name)!r}" for name in ("rollout_is", "rollout_rs") if getattr(section, name)]
    wants += ["bypass_mode=true"] if section.bypass_mode else []
    if wants and not config.actor_rollout_ref.rollout.calculate_log_probs:
        errors.append(
            f"{KEY}.{' and '.join(wants)} needs the rollout engine's token log-probs; set {CALCULATE_LOG_PROBS}=true"
        )
    loss_mode = config.actor_rollout_ref.actor.policy_loss.loss_mode
    if section.bypass_mode and loss_mode != "vanilla":
        errors.append(
            f"{KEY}.bypass_mode=true trains with its loss_type ({section.loss_type}), not "
            f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode!r}; set loss_mode=vanilla"
        )
    return errors
