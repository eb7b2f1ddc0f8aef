"""The policy loss of rollout correction's bypass mode: the rollout's log-probs are the old ones.

With ``algorithm.rollout_correction.bypass_mode`` there is no old-log-prob pass: ``pi_old = pi_rollout``
(two policies instead of three), and each micro-batch's correction is computed inside the loss from the
current policy, ``log r = log pi_theta - log pi_rollout`` (detached), as verl's ``bypass_mode`` loss does
(``compute_policy_loss_bypass_mode``, verl PR #4511). ``loss_type``:

- ``ppo_clip``: PPO's clipped loss (``vanilla``) with ratio ``pi_theta / pi_rollout``; the ratio already
  carries the correction, so importance weights are computed for their metrics but not applied.
- ``reinforce``: ``-w * A * log pi_theta`` with the importance weights ``w``, no clipping.

Rejected tokens leave the loss's mask either way; the loss is still normalised by the counts the caller
passes (the batch's own tokens, rejected ones included, as verl's global batch counts are).

Differs from verl: ``rollout_is_batch_normalize`` divides by the mean weight of the micro-batch on this rank;
verl's mean spans the micro-batch of every data-parallel rank (an all-reduce inside the loss).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.algos.masked_stats import Count
from hybridflow.algos.policy_losses import (
    DEFAULT_CONFIG,
    PolicyLossConfig,
    compute_policy_loss_reinforce,
    compute_policy_loss_vanilla,
)
from hybridflow.algos.rollout_correction import CorrectionSettings, RolloutCorrectionError, compute_rollout_correction
from hybridflow.algos.rollout_correction_metrics import METRIC_PREFIX

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")

# Correction metrics that are means over the micro-batch's response tokens: weighted by each micro-batch's
# share of tokens they add up to the mini-batch's value. The others (max, min, std, per-sequence) do not.
TOKEN_MEAN_METRICS = tuple(
    f"{METRIC_PREFIX}{name}" for name in ("kl", "k3_kl", "chi2_token", "rollout_is_mean", "rollout_rs_masked_fraction")
)


@dataclass(frozen=True)
class BypassCorrection:
    """What the actor's loss needs in bypass mode: the correction settings and the ``loss_type``."""

    settings: CorrectionSettings
    loss_type: str = "ppo_clip"

    def __post_init__(self) -> None:
        if self.loss_type not in BYPASS_LOSS_TYPES:
            raise RolloutCorrectionError(f"loss_type={self.loss_type!r} must be one of {list(BYPASS_LOSS_TYPES)}")


def compute_bypass_policy_loss(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    bypass: BypassCorrection,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The bypass-mode loss of one micro-batch ([B, T] tensors) and its metrics.

    Metrics: the underlying loss's (``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower``) and
    :data:`TOKEN_MEAN_METRICS` of the correction. Differs from verl: verl returns every correction metric of
    each micro-batch and averages them over micro-batches; here only the token means are reported, which add
    up exactly over micro-batches and ranks (a micro-batch's max or std does not).
    """
    with torch.no_grad():
        weights, kept_mask, correction_metrics = compute_rollout_correction(
            log_prob.detach(), rollout_log_prob, response_mask, bypass.settings
        )
    common = dict(
        old_log_prob=rollout_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=kept_mask,
        config=config,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
    )
    if bypass.loss_type == "reinforce":
        loss, metrics = compute_policy_loss_reinforce(**common, rollout_is_weights=weights)
    else:
        loss, metrics = compute_policy_loss_vanilla(**common, rollout_is_weights=None)
    metrics.update({name: correction_metrics[name] for name in TOKEN_MEAN_METRICS if name in correction_metrics})
    return loss, metrics
