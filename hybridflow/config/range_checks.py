"""Numeric keys with a range outside which a run cannot mean anything (a negative learning rate, top_p > 1).

One table, checked before anything starts; each value out of range is one line naming the key, the value and
the range. Ranges follow the quantity's definition (and torch's optimizers, which refuse a negative lr). The
rollout's sampling values are checked by ``RolloutConfig.validate``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple


class Range(NamedTuple):
    key: str
    low: float | None = None
    low_inclusive: bool = True
    high: float | None = None
    high_inclusive: bool = True

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = self.low is None or (value >= self.low if self.low_inclusive else value > self.low)
        below = self.high is None or (value <= self.high if self.high_inclusive else value < self.high)
        return above and below

    def text(self) -> str:
        low = "" if self.low is None else f"{self.low:g} {'<=' if self.low_inclusive else '<'} "
        high = "" if self.high is None else f" {'<=' if self.high_inclusive else '<'} {self.high:g}"
        return f"{low}{self.key.rsplit('.', 1)[-1]}{high}"


RANGES = (
    Range("actor_rollout_ref.actor.optim.lr", low=0),
    Range("critic.optim.lr", low=0),
    Range("actor_rollout_ref.actor.optim.weight_decay", low=0),
    Range("critic.optim.weight_decay", low=0),
    Range("actor_rollout_ref.actor.optim.lr_warmup_steps_ratio", low=0, high=1),
    Range("actor_rollout_ref.actor.optim.min_lr_ratio", low=0, high=1),
    Range("actor_rollout_ref.actor.grad_clip", low=0, low_inclusive=False),
    Range("critic.grad_clip", low=0, low_inclusive=False),
    Range("actor_rollout_ref.actor.kl_loss_coef", low=0),
    Range("algorithm.kl_ctrl.kl_coef", low=0),
    Range("algorithm.gamma", low=0, high=1),
    Range("algorithm.lam", low=0, high=1),
    Range("critic.cliprange_value", low=0, low_inclusive=False),
    Range("actor_rollout_ref.actor.ppo_epochs", low=1),
    Range("critic.ppo_epochs", low=1),
    Range("actor_rollout_ref.actor.optim.eps", low=0, low_inclusive=False),
    Range("critic.optim.eps", low=0, low_inclusive=False),
    Range("critic.optim.lr_warmup_steps_ratio", low=0, high=1),
    Range("critic.optim.min_lr_ratio", low=0, high=1),
    Range("actor_rollout_ref.actor.optim.num_cycles", low=0),
    Range("critic.optim.num_cycles", low=0),
    Range("actor_rollout_ref.rollout.top_k", low=-1),  # -1 (or 0): off
    Range("actor_rollout_ref.rollout.val_kwargs.top_k", low=-1),
    Range("actor_rollout_ref.rollout.gpu_memory_utilization", low=0, low_inclusive=False, high=1),
    Range("actor_rollout_ref.rollout.multi_turn.max_tool_response_length", low=1),
    Range("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", low=1),
    Range("critic.ppo_max_token_len_per_gpu", low=1),
    Range("critic.forward_max_token_len_per_gpu", low=1),
    Range("reward_model.forward_max_token_len_per_gpu", low=1),
    Range("reward_model.max_length", low=1),
    Range("reward_model.overlong_buffer.len", low=0),
    Range("reward_model.overlong_buffer.penalty_factor", low=0),
    Range("algorithm.kl_ctrl.horizon", low=0, low_inclusive=False),  # the adaptive controller divides by it
    Range("algorithm.kl_ctrl.target_kl", low=0, low_inclusive=False),
    Range("actor_rollout_ref.nccl_timeout", low=0, low_inclusive=False),
    Range("actor_rollout_ref.actor.entropy_from_logits_chunk_size", low=1),
    Range("actor_rollout_ref.ref.entropy_from_logits_chunk_size", low=1),
    Range("critic.nccl_timeout", low=0, low_inclusive=False),
)

SFT_RANGES = (
    Range("optim.lr", low=0),
    Range("optim.weight_decay", low=0),
    Range("optim.clip_grad", low=0, low_inclusive=False),
    Range("optim.min_lr_ratio", low=0, high=1),
    Range("optim.num_cycles", low=0, low_inclusive=False),
    Range("trainer.cpus_per_worker", low=0, low_inclusive=False),
)


def range_errors(config: Any, ranges: tuple[Range, ...] = RANGES) -> list[str]:
    """One line per key of ``ranges`` whose value in ``config`` (a dataclass tree) is out of its range."""
    errors = []
    for entry in ranges:
        value = _value(config, entry.key)
        if value is not None and not entry.holds(float(value)):
            errors.append(f"{entry.key}={value} is out of range; it must satisfy {entry.text()}")
    return errors


def _value(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config
