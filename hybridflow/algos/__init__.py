"""Pure tensor math of RL post-training: advantage estimators, policy/value/entropy losses, KL estimators
and controllers, loss aggregation, masked statistics. No Ray, no models, no I/O.

Importing this package registers every built-in estimator and loss, so each is reachable by the string
the config names: ``algorithm.adv_estimator``, ``actor_rollout_ref.actor.policy_loss.loss_mode``,
``actor_rollout_ref.actor.loss_agg_mode``, ``algorithm.kl_penalty`` / ``actor_rollout_ref.actor.kl_loss_type``
and ``algorithm.kl_ctrl.type``. Functions keep verl's names and contracts (``verl/trainer/ppo/core_algos.py``).
"""

from hybridflow.algos import (  # noqa: F401
    advantages,
    covariance_policy_losses,
    divergence_policy_losses,
    gdpo,
    group_advantages,
    optimal_token_baseline,
    policy_losses,
)
from hybridflow.algos.advantage_registry import ADV_ESTIMATORS, ESTIMATOR_INPUTS, get_adv_estimator_fn, register_adv_est
from hybridflow.algos.advantages import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
)
from hybridflow.algos.covariance_policy_losses import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from hybridflow.algos.divergence_policy_losses import compute_policy_loss_dppo_kl, compute_policy_loss_dppo_tv
from hybridflow.algos.gdpo import compute_gdpo_outcome_advantage
from hybridflow.algos.group_advantages import (
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from hybridflow.algos.group_stats import group_ids_from_index, group_mean_std
from hybridflow.algos.kl import KL_ESTIMATORS, apply_kl_penalty, kl_penalty
from hybridflow.algos.kl_controllers import (
    KL_CONTROLLERS,
    AdaptiveKLController,
    FixedKLController,
    KLControllerConfigError,
    get_kl_controller,
)
from hybridflow.algos.masked_stats import (
    LOSS_AGG_MODES,
    MaskedStatisticsError,
    agg_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from hybridflow.algos.optimal_token_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from hybridflow.algos.policy_losses import (
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossConfigError,
    PolicyLossModeConfig,
    compute_policy_loss_cispo,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gspo,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
    register_policy_loss,
)
from hybridflow.algos.rollout_correction import (
    CorrectionSettings,
    RejectionBound,
    RolloutCorrectionError,
    WeightBounds,
    compute_importance_weights,
    compute_rejection_mask,
    compute_rollout_correction,
)
from hybridflow.algos.rollout_correction_loss import BypassCorrection, compute_bypass_policy_loss
from hybridflow.algos.value_loss import compute_entropy_loss, compute_value_loss, entropy_from_logits

__all__ = [
    "ADV_ESTIMATORS",
    "ESTIMATOR_INPUTS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "BypassCorrection",
    "CorrectionSettings",
    "FixedKLController",
    "KLControllerConfigError",
    "MaskedStatisticsError",
    "PolicyLossConfig",
    "PolicyLossConfigError",
    "PolicyLossModeConfig",
    "RejectionBound",
    "RolloutCorrectionError",
    "WeightBounds",
    "agg_loss",
    "apply_kl_penalty",
    "compute_bypass_policy_loss",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_importance_weights",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rejection_mask",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_rollout_correction",
    "compute_value_loss",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "group_ids_from_index",
    "group_mean_std",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "register_policy_loss",
]
