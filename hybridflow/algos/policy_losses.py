"""Policy losses, keyed by ``actor_rollout_ref.actor.policy_loss.loss_mode``: the registry, the typed options,
the shared pieces, and the clipped-ratio and plain policy-gradient losses (PPO with dual clip and DAPO bounds,
GSPO, GMPO, SAPO, CISPO, REINFORCE/GPG, DRO). ``covariance_policy_losses`` and ``divergence_policy_losses``
register into the same registry. Each loss keeps verl's formula (``verl/trainer/ppo/core_algos.py``)::

    fn(old_log_prob, log_prob, advantages, response_mask, config=PolicyLossConfig(), rollout_is_weights=None,
       global_token_count=None, global_seq_count=None) -> (loss, metrics)

``[B, T]`` tensors; ``rollout_is_weights`` multiply the per-token loss (rollout-vs-trainer correction); the
global counts make micro-batch losses add up to the mini-batch's (:mod:`hybridflow.algos.masked_stats`). The
loss is a scalar tensor, ``metrics`` the floats ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower`` (verl's
names without ``actor/``; 0 where a loss does not clip). Differs from verl: no ``loss_agg_mode`` argument
beside ``config``, whose ``loss_agg_mode`` is resolved once to ``config.aggregate``.

The trait ``zero_at_zero_advantage=True`` promises that a token whose advantage is 0 adds exactly 0 to the
loss and its gradient, and that no row's loss depends on the other rows but through the global counts: the
trainer may then leave rows whose advantages are all 0 out of the update and pass the whole batch's counts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch

from hybridflow.algos.masked_stats import (
    LOSS_AGG_MODES,
    Aggregation,
    Count,
    masked_mean,
    masked_sum,
    seq_mean_token_mean,
)
from hybridflow.errors import HybridflowError
from hybridflow.help_fields import option
from hybridflow.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry(
    "policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode", traits={"zero_at_zero_advantage": False}
)

LOG_RATIO_BOUND = 20.0
"""Log-ratios are clamped to +-20 before ``exp`` so one stale token cannot overflow the loss."""

# Losses whose clipped weight stays a valid importance weight below zero ratio: CISPO clips r to
# [1 - low, 1 + high] as a constant weight, and verl's CISPO example sets clip_ratio_low=10 for "no lower clip".
NO_LOWER_CLIP_MODES = frozenset({"cispo"})


class PolicyLossConfigError(HybridflowError, ValueError):
    """A policy-loss option has a value the loss cannot use; ``errors`` holds one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("invalid policy loss config: " + "; ".join(errors))


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
    dro_beta: float | None = option(
        None, "DRO: weight of the squared log-ratio penalty; required (> 0) for loss_mode=dro."
    )


@dataclass(frozen=True)
class PolicyLossConfig:
    """Every option a policy loss reads, checked once (all problems in one :class:`PolicyLossConfigError`): the
    ``policy_loss`` section's fields (:class:`PolicyLossModeConfig`'s names and defaults) and the actor's clip
    and aggregation keys. The clip bounds are resolved (:meth:`resolve`); ``aggregate`` is ``loss_agg_mode``'s
    registered aggregation."""

    loss_mode: str = "vanilla"
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: float | None = None
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = None
    aggregate: Aggregation = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        errors = self._errors()
        if errors:
            raise PolicyLossConfigError(errors)
        object.__setattr__(self, "aggregate", LOSS_AGG_MODES.get(self.loss_agg_mode))

    @classmethod
    def resolve(
        cls,
        policy_loss: PolicyLossModeConfig,
        clip_ratio: float,
        clip_ratio_low: float | None,
        clip_ratio_high: float | None,
        clip_ratio_c: float,
        loss_agg_mode: str,
        loss_scale_factor: float | None,
    ) -> "PolicyLossConfig":
        """The actor's keys (verl's two levels: ``policy_loss`` and the clip keys beside it) as one config; an
        unset ``clip_ratio_low`` / ``clip_ratio_high`` means ``clip_ratio``."""
        return cls(
            **dataclasses.asdict(policy_loss),
            clip_ratio_low=clip_ratio if clip_ratio_low is None else clip_ratio_low,
            clip_ratio_high=clip_ratio if clip_ratio_high is None else clip_ratio_high,
            clip_ratio_c=clip_ratio_c,
            loss_agg_mode=loss_agg_mode,
            loss_scale_factor=loss_scale_factor,
        )

    def _errors(self) -> list[str]:
        low, high = self.clip_ratio_low, self.clip_ratio_high
        errors = []
        if self.loss_mode in NO_LOWER_CLIP_MODES:
            if low <= 0:
                errors.append(f"clip_ratio_low={low} must be > 0 (a value >= 1 means no lower clip)")
        elif not 0 < low <= 1:
            errors.append(f"clip_ratio_low={low} must be in (0, 1]")
        if high <= 0:
            errors.append(f"clip_ratio_high={high} must be > 0")
        if self.clip_ratio_c <= 1:
            errors.append(f"clip_ratio_c={self.clip_ratio_c} must be > 1 (dual-clip bound, arXiv:1912.09729)")
        for name in ("tau_pos", "tau_neg", "clip_cov_ratio", "kl_cov_ratio"):
            if getattr(self, name) <= 0:
                errors.append(f"{name}={getattr(self, name)} must be > 0")
        if self.loss_mode == "dro" and (self.dro_beta is None or self.dro_beta <= 0):
            errors.append(f"dro_beta={self.dro_beta} must be > 0 for loss_mode=dro")
        if self.loss_agg_mode not in LOSS_AGG_MODES:
            errors.append(f"loss_agg_mode={self.loss_agg_mode!r} must be one of [{', '.join(LOSS_AGG_MODES.names())}]")
        return errors


DEFAULT_CONFIG = PolicyLossConfig()


def register_policy_loss(
    name: str, *aliases: str, zero_at_zero_advantage: bool = False
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under ``name`` (verl's ``register_policy_loss``).

    ``zero_at_zero_advantage``: the loss keeps the promise in the module docstring (zero loss and gradient
    on zero-advantage tokens, rows independent but for the global counts). Leave it False when unsure.
    """
    return POLICY_LOSSES.register(name, *aliases, zero_at_zero_advantage=zero_at_zero_advantage)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered as ``name``; an unknown name raises listing every registered one."""
    return POLICY_LOSSES.get(name)


def aggregate_policy_loss(
    pg_losses: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig,
    rollout_is_weights: torch.Tensor | None,
    global_token_count: Count,
    global_seq_count: Count,
    aggregate: Aggregation | None = None,
) -> torch.Tensor:
    """Apply the optional importance-sampling weights, then ``config.aggregate`` (or ``aggregate``, for a loss
    that fixes its own) with the config's ``loss_scale_factor``."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return (aggregate or config.aggregate)(
        pg_losses,
        response_mask,
        global_token_count=global_token_count,
        global_seq_count=global_seq_count,
        loss_scale_factor=config.loss_scale_factor,
    )


def ppo_kl(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``log pi_old - log pi`` over the masked tokens (k1 estimate of KL(old || new))."""
    return masked_mean(-log_ratio.detach(), response_mask)


def fraction(condition: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Share of masked tokens where ``condition`` holds."""
    return masked_mean(condition.detach().float(), response_mask)


def loss_metrics(
    pg_clipfrac: torch.Tensor | float, ppo_kl_value: torch.Tensor | float, pg_clipfrac_lower: torch.Tensor | float
) -> dict[str, float]:
    """The metrics dict every policy loss returns, as Python floats."""
    return {
        "pg_clipfrac": float(pg_clipfrac),
        "ppo_kl": float(ppo_kl_value),
        "pg_clipfrac_lower": float(pg_clipfrac_lower),
    }


def clamped_log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """``log_prob - old_log_prob`` clamped to +-:data:`LOG_RATIO_BOUND`."""
    return (log_prob - old_log_prob).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


@register_policy_loss("vanilla", zero_at_zero_advantage=True)
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (Schulman et al., arXiv:1707.06347, eq. 7) with dual clip and asymmetric bounds.

    ``r = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    ``L = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))`` (DAPO's clip-higher when the
    bounds differ, arXiv:2503.14476); for ``A < 0`` also ``L = min(L, -A clip_ratio_c)`` (dual-clip
    PPO, Ye et al., arXiv:1912.09729). Config: ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``,
    ``clip_ratio_c``, ``loss_scale_factor``. Metrics: ``pg_clipfrac`` (share of tokens where the clip
    binds), ``pg_clipfrac_lower`` (share where the dual clip binds), ``ppo_kl``.

    Differs from the paper: the log-ratio is clamped to [-20, 20] before ``exp`` (numerical guard).
    """
    low, high, clip_ratio_c = config.clip_ratio_low, config.clip_ratio_high, config.clip_ratio_c
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    clip_max = torch.maximum(unclipped, clipped)
    dual_bound = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(dual_bound, clip_max), clip_max)
    loss = aggregate_policy_loss(
        pg_losses, response_mask, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(
        fraction(clipped > unclipped, response_mask),
        ppo_kl(log_ratio, response_mask),
        fraction((clip_max > dual_bound) & negative, response_mask),
    )


@register_policy_loss("gspo", zero_at_zero_advantage=True)
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al., arXiv:2507.18071): PPO clipping on the sequence-level ratio.

    ``s_i = exp(mean_t log(pi / pi_old))`` over the sequence's masked tokens; per token the ratio is
    ``sg[s_i] * pi / sg[pi]`` (log-clamped at 10), which has the value ``s_i`` and GSPO's token gradient.
    Always aggregated with ``seq-mean-token-mean`` whatever ``config.loss_agg_mode`` says (as in verl).
    """
    low, high = config.clip_ratio_low, config.clip_ratio_high
    log_ratio = log_prob - old_log_prob
    tokens_per_seq = response_mask.to(log_ratio.dtype).sum(dim=-1).clamp_min(1)
    seq_log_ratio = masked_sum(log_ratio, response_mask, dim=-1) / tokens_per_seq
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(token_log_ratio.clamp(max=10.0))
    unclipped = -advantages * seq_ratio
    clipped = -advantages * torch.clamp(seq_ratio, 1 - low, 1 + high)
    pg_losses = torch.maximum(unclipped, clipped)
    loss = aggregate_policy_loss(
        pg_losses,
        response_mask,
        config,
        rollout_is_weights,
        global_token_count,
        global_seq_count,
        aggregate=seq_mean_token_mean,
    )
    return loss, loss_metrics(fraction(clipped > unclipped, response_mask), ppo_kl(log_ratio, response_mask), 0.0)


@register_policy_loss("geo_mean", zero_at_zero_advantage=True)
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GMPO (Zhao et al., arXiv:2507.20673): the geometric mean of token ratios, clipped per token.

    Token log-ratios are clipped to ``[-clip_ratio_low, clip_ratio_high]`` on the side the advantage's
    sign makes harmful; the sequence ratio is ``exp(mean_t clipped log-ratio)`` and the loss per
    sequence ``-mean_t(A) * ratio``. Importance weights enter as their per-sequence geometric mean.
    Sequences are averaged (``global_seq_count`` if given, else the rows of the batch) whatever
    ``loss_agg_mode`` says, as in verl. ``pg_clipfrac`` counts clipped tokens with ``A > 0``,
    ``pg_clipfrac_lower`` those with ``A < 0``.
    """
    low, high = config.clip_ratio_low, config.clip_ratio_high
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    log_ratio_clamped = torch.clamp(log_ratio, -low, high)
    clipped_log_ratio = sign * torch.minimum(sign * log_ratio, sign * log_ratio_clamped)
    tokens_per_seq = response_mask.to(log_ratio.dtype).sum(dim=-1)
    seq_ratio = torch.exp(masked_sum(clipped_log_ratio, response_mask, dim=-1) / (tokens_per_seq + 1e-8))
    seq_advantage = masked_sum(advantages, response_mask, dim=-1) / (tokens_per_seq + 1e-8)
    seq_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        log_weights = torch.log(rollout_is_weights + 1e-10)
        seq_losses = seq_losses * torch.exp(masked_sum(log_weights, response_mask, dim=-1) / (tokens_per_seq + 1e-8))
    loss = seq_losses.sum() / (seq_losses.shape[0] if global_seq_count is None else global_seq_count)
    was_clipped = log_ratio != log_ratio_clamped
    return loss, loss_metrics(
        fraction(was_clipped & (advantages > 0), response_mask),
        ppo_kl(log_ratio, response_mask),
        fraction(was_clipped & (advantages < 0), response_mask),
    )


@register_policy_loss("sapo", zero_at_zero_advantage=True)
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO (Gao et al., arXiv:2511.20347): a smooth sigmoid gate instead of a hard clip.

    ``L = -A * (4 / tau) * sigmoid(tau (r - 1))`` with ``tau = tau_pos`` where ``A > 0`` and ``tau_neg``
    elsewhere; the gate's slope is 1 at ``r = 1`` and decays as the ratio drifts. Always aggregated with
    ``seq-mean-token-mean`` whatever ``config.loss_agg_mode`` says (as in verl).
    """
    tau_pos, tau_neg = config.tau_pos, config.tau_neg
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gate * advantages
    loss = aggregate_policy_loss(
        pg_losses,
        response_mask,
        config,
        rollout_is_weights,
        global_token_count,
        global_seq_count,
        aggregate=seq_mean_token_mean,
    )
    return loss, loss_metrics(0.0, ppo_kl(log_ratio, response_mask), 0.0)


@register_policy_loss("cispo", zero_at_zero_advantage=True)
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax, arXiv:2506.13585): clip the importance weight, keep every token's gradient.

    ``L = -sg[clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)] * A * log_prob``: the clipped ratio is a
    constant weight, so clipped tokens still contribute a REINFORCE gradient. ``pg_clipfrac`` is the
    share of tokens whose ratio was clipped.
    """
    low, high = config.clip_ratio_low, config.clip_ratio_high
    log_ratio = clamped_log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - low, 1 + high).detach()
    pg_losses = -clipped_ratio * advantages * log_prob
    loss = aggregate_policy_loss(
        pg_losses, response_mask, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(fraction(ratio != clipped_ratio, response_mask), ppo_kl(log_ratio, response_mask), 0.0)


@register_policy_loss("reinforce", "gpg", zero_at_zero_advantage=True)
def compute_policy_loss_reinforce(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE (Williams, 1992) with optional importance weights: ``L = -w * A * log_prob``.

    Registered as ``reinforce`` and as ``gpg`` (GPG's policy loss is the same plain policy gradient,
    Chu et al., arXiv:2504.02546). ``old_log_prob`` only feeds the ``ppo_kl`` metric; off-policy
    correction comes from ``rollout_is_weights``.
    """
    pg_losses = -advantages * log_prob
    loss = aggregate_policy_loss(
        pg_losses, response_mask, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(0.0, ppo_kl(log_prob - old_log_prob, response_mask), 0.0)


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    config: PolicyLossConfig = DEFAULT_CONFIG,
    rollout_is_weights: torch.Tensor | None = None,
    global_token_count: Count = None,
    global_seq_count: Count = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Reward Optimization's loss with a quadratic log-ratio penalty (verl's ``dro`` loss mode).

    ``L = -(A log_prob - beta/2 (log_prob - old_log_prob)^2)`` per token, ``beta = policy_loss.dro_beta > 0``:
    a REINFORCE term kept near the sampling policy by a squared log-ratio instead of a clip. Metrics:
    ``ppo_kl``; no clipping, so both clip fractions are 0.
    """
    beta = config.dro_beta
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    loss = aggregate_policy_loss(
        pg_losses, response_mask, config, rollout_is_weights, global_token_count, global_seq_count
    )
    return loss, loss_metrics(0.0, ppo_kl(log_ratio, response_mask), 0.0)
