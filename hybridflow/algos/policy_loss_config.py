"""Options read by the policy losses, with verl's defaults, and the one function that resolves them.

The config has verl's two levels: :class:`PolicyLossModeConfig` is the ``actor.policy_loss`` section (the loss
mode and the knobs only some losses read); the clip settings every loss shares sit on the actor itself.
:class:`PolicyLossConfig` is both levels flat, as a worker hands them to a loss. A loss also accepts verl's
actor config, a dict or a DictConfig: :func:`loss_option` looks at the top level, then under
``policy_loss``, then falls back to the default.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from hybridflow.algos.config_fields import read_field
from hybridflow.algos.masked_stats import LOSS_AGG_MODES
from hybridflow.help_fields import option

_FIELD_DEFAULT = object()


class PolicyLossConfigError(ValueError):
    """A policy-loss option has a value the loss cannot use."""


@dataclass
class PolicyLossModeConfig:
    """The ``actor_rollout_ref.actor.policy_loss`` section: which loss, and the options only some losses read."""

    loss_mode: str = option("vanilla", "Registered policy loss to use (vanilla, gspo, sapo, ...).")
    tau_pos: float = option(1.0, "SAPO gate temperature for positive advantages (arXiv:2511.20347).")
    tau_neg: float = option(1.05, "SAPO gate temperature for non-positive advantages.")
    clip_cov_ratio: float = option(0.0002, "Clip-Cov: fraction of tokens whose gradient is cut (arXiv:2505.22617).")
    clip_cov_lb: float = option(1.0, "Clip-Cov: lower bound of the covariance window eligible for dropping.")
    clip_cov_ub: float = option(5.0, "Clip-Cov: upper bound of the covariance window eligible for dropping.")
    kl_cov_ratio: float = option(0.0002, "KL-Cov: fraction of highest-covariance tokens that get a KL penalty.")
    ppo_kl_coef: float = option(0.1, "KL-Cov: coefficient of |log ratio| added on the selected tokens.")
    dro_beta: float | None = option(None, "DRO: weight of the squared log-ratio penalty; required (> 0) for loss_mode=dro.")


@dataclass
class PolicyLossConfig(PolicyLossModeConfig):
    """Every option a registered policy loss reads: the mode's options plus the clip settings shared by all
    losses (verl keeps those on the actor). Defaults equal verl's ``ActorConfig``/``PolicyLossConfig``."""

    clip_ratio: float = option(0.2, "PPO clip epsilon (arXiv:1707.06347); fallback for the two bounds below.")
    clip_ratio_low: float | None = option(0.2, "Lower clip: ratio >= 1 - clip_ratio_low; None means clip_ratio.")
    clip_ratio_high: float | None = option(
        0.2, "Upper clip: ratio <= 1 + clip_ratio_high (DAPO's clip-higher, arXiv:2503.14476); None means clip_ratio."
    )
    clip_ratio_c: float = option(3.0, "Dual-clip bound for negative advantages, > 1 (arXiv:1912.09729).")
    loss_agg_mode: str = option("token-mean", "How the per-token loss becomes a scalar (hybridflow.algos.agg_loss).")
    loss_scale_factor: float | None = option(
        None, "Constant divisor of seq-mean-token-sum-norm; None means the padded response length."
    )

    def __post_init__(self) -> None:
        errors = policy_loss_config_errors(self)
        if errors:
            raise PolicyLossConfigError("invalid policy loss config: " + "; ".join(errors))


_DEFAULTS = {f.name: f.default for f in fields(PolicyLossConfig)}


def loss_option(config: Any, name: str, default: Any = _FIELD_DEFAULT) -> Any:
    """Option ``name`` from ``config`` (top level, then ``config.policy_loss``), else the default.

    ``default`` overrides :class:`PolicyLossConfig`'s default (used for ``None``-means-fallback fields).
    """
    value = read_field(config, name)
    if value is None:
        value = read_field(read_field(config, "policy_loss"), name)
    if value is None:
        value = _DEFAULTS[name] if default is _FIELD_DEFAULT else default
    return value


def clip_bounds(config: Any) -> tuple[float, float]:
    """``(clip_ratio_low, clip_ratio_high)``, each falling back to ``clip_ratio`` when unset."""
    clip_ratio = float(loss_option(config, "clip_ratio"))
    low = float(loss_option(config, "clip_ratio_low", default=clip_ratio))
    high = float(loss_option(config, "clip_ratio_high", default=clip_ratio))
    return low, high


# Losses whose clipped weight stays a valid importance weight below zero ratio: CISPO clips r to
# [1 - low, 1 + high] as a constant weight, and verl's CISPO example sets clip_ratio_low=10 for "no lower clip".
NO_LOWER_CLIP_MODES = frozenset({"cispo"})


def policy_loss_config_errors(config: Any) -> list[str]:
    """Every problem with the options of ``config`` (empty when it is usable), for one combined error."""
    errors = []
    low, high = clip_bounds(config)
    if loss_option(config, "loss_mode") in NO_LOWER_CLIP_MODES:
        if low <= 0:
            errors.append(f"clip_ratio_low={low} must be > 0 (a value >= 1 means no lower clip)")
    elif not 0 < low <= 1:
        errors.append(f"clip_ratio_low={low} must be in (0, 1]")
    if high <= 0:
        errors.append(f"clip_ratio_high={high} must be > 0")
    clip_ratio_c = float(loss_option(config, "clip_ratio_c"))
    if clip_ratio_c <= 1:
        errors.append(f"clip_ratio_c={clip_ratio_c} must be > 1 (dual-clip bound, arXiv:1912.09729)")
    for name in ("tau_pos", "tau_neg", "clip_cov_ratio", "kl_cov_ratio"):
        if float(loss_option(config, name)) <= 0:
            errors.append(f"{name}={loss_option(config, name)} must be > 0")
    dro_beta = loss_option(config, "dro_beta")
    if loss_option(config, "loss_mode") == "dro" and (dro_beta is None or dro_beta <= 0):
        errors.append(f"dro_beta={dro_beta} must be > 0 for loss_mode=dro")
    mode = loss_option(config, "loss_agg_mode")
    if mode not in LOSS_AGG_MODES:
        errors.append(f"loss_agg_mode={mode!r} must be one of [{', '.join(LOSS_AGG_MODES.names())}]")
    return errors
