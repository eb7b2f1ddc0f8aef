"""KL estimators between the policy and the reference, and the KL penalty folded into the rewards.

Estimators follow Schulman's "Approximating KL Divergence" (joschu.net/blog/kl-approx.html) as verl
names them; each maps ``log_prob, ref_log_prob [B, T]`` to a per-token estimate ``[B, T]`` of
KL(pi || pi_ref) on samples from pi. One registry serves both ``algorithm.kl_penalty`` (KL in the
reward) and ``actor_rollout_ref.actor.kl_loss_type`` (KL as a loss term).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from hybridflow.algos.masked_stats import masked_mean
from hybridflow.registry import Registry

KLEstimator = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: Registry[KLEstimator] = Registry(
    "KL estimator (also picked by actor_rollout_ref.actor.kl_loss_type)", "algorithm.kl_penalty"
)

LOW_VAR_KL_BOUND = 10.0
"""k3 is clamped to [-10, 10] (and its log-ratio to [-20, 20]) so one rare token cannot dominate."""


@KL_ESTIMATORS.register("kl", "k1")
def kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k1 = ``log_prob - ref_log_prob``: unbiased, high variance, can be negative."""
    return log_prob - ref_log_prob


@KL_ESTIMATORS.register("abs")
def kl_abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """``|log_prob - ref_log_prob|``: biased, non-negative."""
    return (log_prob - ref_log_prob).abs()


@KL_ESTIMATORS.register("mse", "k2")
def kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k2 = ``0.5 * (log_prob - ref_log_prob)^2``: biased, low variance; its gradient is KL's true gradient."""
    return 0.5 * (log_prob - ref_log_prob).square()


@KL_ESTIMATORS.register("low_var_kl", "k3")
def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k3 = ``exp(ref - log_prob) - (ref - log_prob) - 1``: unbiased, non-negative, low variance.

    Differs from the blog post: the log-ratio is clamped to [-20, 20] and the result to [-10, 10]
    (verl's numerical guards), which biases the estimate only for wildly off-policy tokens.
    """
    log_ratio = torch.clamp(ref_log_prob - log_prob, -20.0, 20.0)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, -LOW_VAR_KL_BOUND, LOW_VAR_KL_BOUND)


def _straight_through(forward_estimator: KLEstimator) -> KLEstimator:
    def estimator(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
        k2 = kl_k2(log_prob, ref_log_prob)
        return k2 - k2.detach() + forward_estimator(log_prob, ref_log_prob).detach()

    estimator.__name__ = estimator.__qualname__ = f"{forward_estimator.__name__}_straight_through"
    estimator.__doc__ = (
        f"Value of ``{forward_estimator.__name__}``, gradient of k2: k1 and k3 estimate KL's value without "
        "bias but not its gradient, k2's gradient is the right one, so the ``+`` variants take each's best."
    )
    return estimator


kl_k1_straight_through = KL_ESTIMATORS.register("kl+", "k1+")(_straight_through(kl_k1))
kl_abs_straight_through = KL_ESTIMATORS.register("abs+")(_straight_through(kl_abs))
kl_k3_straight_through = KL_ESTIMATORS.register("low_var_kl+", "k3+")(_straight_through(kl_k3))
# k2's gradient already is k2's: its "+" form is k2 itself.
KL_ESTIMATORS.register("mse+", "k2+")(kl_k2)


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str = "kl") -> torch.Tensor:
    """Per-token KL estimate ``[B, T]`` of KL(pi || pi_ref) by the estimator registered as ``kind``.

    Kinds: ``kl``/``k1``, ``abs``, ``mse``/``k2``, ``low_var_kl``/``k3`` and their ``+`` straight-through
    forms (forward value of the named estimator, gradient of k2).
    """
    return KL_ESTIMATORS.get(kind)(log_prob, ref_log_prob)


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str = "kl",
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Rewards with the KL penalty (Ziegler et al., arXiv:1909.08593): ``r = score - beta * KL``.

    Args:
        token_level_scores: ``[B, T]`` reward-model / rule scores.
        old_log_probs: ``[B, T]`` log-probs of the rollout policy.
        ref_log_prob: ``[B, T]`` log-probs of the reference policy.
        response_mask: ``[B, T]``; the KL is 0 on masked positions.
        kl_coef: ``beta`` (the KL controller's current value).
        kind: KL estimator name (``algorithm.kl_penalty``).

    Returns:
        ``(token_level_rewards [B, T], metrics)`` with metrics ``reward_kl_penalty`` (mean over samples
        of each sample's mean token KL: feed it to the KL controller's ``update``) and
        ``reward_kl_penalty_coeff`` (``beta``), verl's names without the ``actor/`` prefix.
    """
    token_kl = torch.where(response_mask.bool(), kl_penalty(old_log_probs, ref_log_prob, kind), 0.0)
    token_level_rewards = token_level_scores - kl_coef * token_kl
    current_kl = masked_mean(token_kl, response_mask, dim=-1).mean()
    return token_level_rewards, {"reward_kl_penalty": float(current_kl), "reward_kl_penalty_coeff": float(kl_coef)}
