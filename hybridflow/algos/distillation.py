"""On-policy distillation's per-token losses (verl's ``distillation.distillation_loss``): the student samples, a
frozen teacher scores the student's tokens, and the student learns to match the teacher on its own samples
(Agarwal et al., arXiv:2306.13649; Thinking Machines, "On-Policy Distillation", 2025).

Two kinds of loss, picked by ``loss_mode``:

* ``forward_kl_topk``: ``KL(teacher || student)`` over the teacher's top-k tokens at each position,
  ``sum_k p_t,k (log p_t,k - log p_s,k)`` with the student's log-softmax read at the teacher's ids; clamped at 0
  (the top-k masses do not sum to 1, so the sum can go negative), as verl does.
* single-sample estimators of the reverse ``KL(student || teacher)`` at the sampled token (``k1``/``kl``,
  ``abs``, ``k2``/``mse``, ``k3``/``low_var_kl``): :mod:`hybridflow.algos.kl`'s registry, the teacher in the
  reference's place.

The per-token loss is either aggregated and backpropagated directly, or with ``use_policy_gradient`` its negation
(detached) is the advantage of a PPO clipped surrogate over the sampled tokens (the blog post's reverse-KL reward).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch
from torch.autograd.function import once_differentiable

from hybridflow.algos.kl import KL_ESTIMATORS
from hybridflow.algos.masked_stats import masked_mean
from hybridflow.algos.policy_losses import PolicyLossConfig, get_policy_loss_fn
from hybridflow.help_fields import option

TOPK_MODES = ("forward_kl_topk",)
ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


@dataclasses.dataclass
class DistillationLossConfig:
    """``distillation.distillation_loss``: verl's keys and defaults."""

    loss_mode: str = option(
        "k3", "forward_kl_topk (teacher's top-k), or a reverse-KL estimator at the sampled token: k1, k2, k3, abs."
    )
    topk: int = option(32, "Teacher log-probs kept per position for forward_kl_topk.")
    use_task_rewards: bool = option(True, "Add the PPO loss on the task's advantages to the distillation loss.")
    distillation_loss_coef: float = option(1.0, "Weight of the distillation loss when use_task_rewards.")
    loss_max_clamp: float | None = option(None, "Clamp the per-token loss to [-this, this]; null: no clamp.")
    log_prob_min_clamp: float | None = option(None, "forward_kl_topk: floor of both sides' log-probs; null: none.")
    use_policy_gradient: bool = option(
        False, "The negated per-token loss is the advantage of a clipped surrogate, instead of the loss itself."
    )
    policy_loss_mode: str = option("vanilla", "Policy loss of use_policy_gradient (verl supports vanilla only).")
    clip_ratio: float = option(0.2, "use_policy_gradient: PPO clip ratio.")
    clip_ratio_low: float = option(0.2, "use_policy_gradient: lower clip ratio.")
    clip_ratio_high: float = option(0.2, "use_policy_gradient: upper clip ratio.")

    @property
    def uses_topk(self) -> bool:
        return self.loss_mode in TOPK_MODES

    def errors(self) -> list[str]:
        """verl's checks of the section, one line each."""
        key = "distillation.distillation_loss"
        errors = []
        if self.loss_mode not in TOPK_MODES + ESTIMATOR_MODES:
            errors.append(f"{key}.loss_mode={self.loss_mode!r}: choose one of {list(TOPK_MODES + ESTIMATOR_MODES)}")
        if self.uses_topk and self.topk < 1:
            errors.append(f"{key}.topk={self.topk} must be >= 1 for loss_mode=forward_kl_topk")
        if self.policy_loss_mode != "vanilla":
            errors.append(f"{key}.policy_loss_mode={self.policy_loss_mode!r}: only vanilla is supported (as in verl)")
        if self.loss_mode in ("k1", "kl") and not self.use_policy_gradient:
            errors.append(
                f"{key}.loss_mode={self.loss_mode} needs use_policy_gradient=true: the gradient of k1 itself does not "
                "depend on the teacher (verl refuses it too); use k3 or forward_kl_topk to backpropagate the loss"
            )
        return errors


class TopK(NamedTuple):
    """Per position: the ``k`` largest log-probs ``[..., k]`` (float32) and their token ids ``[..., k]``."""

    log_probs: torch.Tensor
    ids: torch.Tensor


@torch.no_grad()
def topk_log_probs(logits: torch.Tensor, k: int, temperature: float = 1.0, chunk_size: int = 1024) -> TopK:
    """The top-``k`` of ``log_softmax(logits / temperature)`` per row of ``logits [..., V]``, chunk by chunk."""
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    values = flat.new_empty(flat.shape[0], k, dtype=torch.float32)
    ids = torch.empty(flat.shape[0], k, dtype=torch.long, device=flat.device)
    for start in range(0, flat.shape[0], chunk_size):
        scaled = _scaled(flat[start : start + chunk_size], temperature)
        top = torch.topk(scaled, k, dim=-1)
        values[start : start + chunk_size] = top.values - torch.logsumexp(scaled, -1, keepdim=True)
        ids[start : start + chunk_size] = top.indices
    return TopK(values.view(*logits.shape[:-1], k), ids.view(*logits.shape[:-1], k))


def log_probs_at(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024):
    """``log_softmax(logits / temperature)`` read at ``ids [..., k]``, differentiable, without a ``[N, V]``
    log-softmax kept for the backward (the per-row log-normaliser is); float32 ``[..., k]``."""
    vocab, k = logits.shape[-1], ids.shape[-1]
    out = _ChunkedGatheredLogSoftmax.apply(logits.reshape(-1, vocab), ids.reshape(-1, k), temperature, chunk_size)
    return out.view(ids.shape)


class _ChunkedGatheredLogSoftmax(torch.autograd.Function):
    """``[N, V]`` logits, ``[N, k]`` ids -> ``[N, k]`` log-probs; d/dz of ``z_i - lse(z)`` is
    ``onehot(i) - softmax(z)``, so the backward scatters the gradient at the ids and subtracts ``p * sum_k g``."""

    @staticmethod
    def forward(ctx, logits, ids, temperature, rows):
        log_normalisers = logits.new_empty(logits.shape[0], dtype=torch.float32)
        out = logits.new_empty(ids.shape, dtype=torch.float32)
        for start in range(0, logits.shape[0], rows):
            chunk = slice(start, start + rows)
            scaled = _scaled(logits[chunk], temperature)
            log_normalisers[chunk] = torch.logsumexp(scaled, -1)
            out[chunk] = scaled.gather(-1, ids[chunk]) - log_normalisers[chunk, None]
        ctx.save_for_backward(logits, ids, log_normalisers)
        ctx.temperature, ctx.rows = temperature, rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        logits, ids, log_normalisers = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.rows):
            chunk = slice(start, start + ctx.rows)
            probs = (_scaled(logits[chunk], ctx.temperature) - log_normalisers[chunk, None]).exp_()
            grad = probs.mul_(-grad_out[chunk].sum(-1, keepdim=True))
            grad.scatter_add_(-1, ids[chunk], grad_out[chunk])
            if ctx.temperature != 1.0:
                grad.div_(ctx.temperature)
            grad_logits[chunk] = grad
        return grad_logits, None, None, None


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = logits.float()
    return scaled if temperature == 1.0 else scaled / temperature


class TopKDivergence(NamedTuple):
    """``forward_kl_topk`` per position ``[B, R]``: the loss (clamped at 0), each side's mass on the teacher's
    top-k, and the diagnostics of arXiv:2604.13016 (how many of the teacher's top-k the student's top-k holds, and
    the mean of ``-p_t (log p_t - log p_s)`` over them)."""

    loss: torch.Tensor
    student_mass: torch.Tensor
    teacher_mass: torch.Tensor
    overlap_count: torch.Tensor
    overlap_token_advantage: torch.Tensor


def forward_kl_topk(
    student_log_probs: torch.Tensor,
    teacher_log_probs: torch.Tensor,
    teacher_ids: torch.Tensor,
    student_ids: torch.Tensor,
    log_prob_min_clamp: float | None = None,
) -> TopKDivergence:
    """``sum_k p_t,k (log p_t,k - log p_s,k)`` over the teacher's top-k (``[..., k]`` each; the student's
    log-probs read at ``teacher_ids``; ``student_ids`` its own top-k, for the overlap diagnostics)."""
    student_mass = student_log_probs.detach().exp().sum(-1)
    teacher_mass = teacher_log_probs.exp().sum(-1)
    if log_prob_min_clamp is not None:
        student_log_probs = student_log_probs.clamp_min(log_prob_min_clamp)
        teacher_log_probs = teacher_log_probs.clamp_min(log_prob_min_clamp)
    token_kl = teacher_log_probs.exp() * (teacher_log_probs - student_log_probs)
    overlap = (teacher_ids.unsqueeze(-1) == student_ids.unsqueeze(-2)).any(-1)
    overlap_count = overlap.sum(-1)
    overlap_sum = (-token_kl.detach() * overlap).sum(-1)
    overlap_advantage = torch.where(overlap_count > 0, overlap_sum / overlap_count.clamp_min(1), 0.0)
    return TopKDivergence(token_kl.sum(-1).clamp_min(0.0), student_mass, teacher_mass, overlap_count, overlap_advantage)


def reverse_kl_estimate(student_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, mode: str) -> torch.Tensor:
    """A single-sample estimate of ``KL(student || teacher)`` at the sampled token (``[B, R]`` each)."""
    return KL_ESTIMATORS.get(mode)(student_log_prob, teacher_log_prob)


def topk_metrics(divergence: TopKDivergence, response_mask: torch.Tensor, k: int) -> dict[str, float]:
    """verl's ``distillation/*`` diagnostics of ``forward_kl_topk``, means over the response tokens."""
    mask = response_mask.bool()
    overlapping = mask & (divergence.overlap_count > 0)
    advantage = divergence.overlap_token_advantage[overlapping].mean() if overlapping.any() else 0.0
    return {
        "distillation/student_mass": float(masked_mean(divergence.student_mass, response_mask)),
        "distillation/teacher_mass": float(masked_mean(divergence.teacher_mass, response_mask)),
        "distillation/overlap_ratio": float(masked_mean(divergence.overlap_count.float(), response_mask)) / k,
        "distillation/overlap_token_advantage": float(advantage),
    }


def policy_loss_config(settings: DistillationLossConfig, actor_config: PolicyLossConfig) -> PolicyLossConfig:
    """``use_policy_gradient``'s surrogate: vanilla PPO with the section's clip bounds and the actor's aggregation."""
    return PolicyLossConfig(
        clip_ratio_low=settings.clip_ratio_low,
        clip_ratio_high=settings.clip_ratio_high,
        loss_agg_mode=actor_config.loss_agg_mode,
        loss_scale_factor=actor_config.loss_scale_factor,
    )


def distillation_loss(
    settings: DistillationLossConfig,
    pg_config: PolicyLossConfig,
    student: DistillationInputs,
    teacher_log_probs: torch.Tensor,
    teacher_ids: torch.Tensor | None,
    response_mask: torch.Tensor,
    counts: dict,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The aggregated distillation loss of a micro-batch and its metrics (means over its response tokens, but
    ``distillation/loss``), as verl's ``distillation_loss``; ``counts``: the loss's global token/sequence counts."""
    if settings.uses_topk:
        divergence = forward_kl_topk(
            student.topk_log_probs, teacher_log_probs, teacher_ids, student.topk_ids, settings.log_prob_min_clamp
        )
        per_token, metrics = divergence.loss, topk_metrics(divergence, response_mask, settings.topk)
    else:
        per_token = reverse_kl_estimate(student.log_probs, teacher_log_probs, settings.loss_mode)
        # k1 can be negative: its mean absolute value is the readable size
        metrics = {"distillation/abs_loss": float(masked_mean(per_token.detach().abs(), response_mask))}
    if settings.loss_max_clamp is not None:
        per_token = per_token.clamp(-settings.loss_max_clamp, settings.loss_max_clamp)
    if not settings.use_policy_gradient:
        return pg_config.aggregate(per_token, response_mask, **counts), metrics
    # The negated loss as each token's advantage (the reverse KL as a reward, Thinking Machines' OPD)
    loss, pg_metrics = get_policy_loss_fn("vanilla")(
        old_log_prob=student.old_log_probs,
        log_prob=student.log_probs,
        advantages=-per_token.detach(),
        response_mask=response_mask,
        config=pg_config,
        rollout_is_weights=rollout_is_weights,
        **counts,
    )
    return loss, {**metrics, **{f"distillation/{name}": value for name, value in pg_metrics.items()}}


class DistillationInputs(NamedTuple):
    """The student's side of a micro-batch: log-probs of the sampled tokens ``[B, R]`` (with gradient), their old
    values (the surrogate's ratio), and for ``forward_kl_topk`` its log-probs at the teacher's ids and its own top-k
    ids ``[B, R, k]``."""

    log_probs: torch.Tensor
    old_log_probs: torch.Tensor
    topk_log_probs: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None
