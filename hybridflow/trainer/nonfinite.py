"""Never train on NaN: a step whose scores, losses or gradient norms are not finite is caught where it appears.

Scores that are not finite (a reward function returning NaN or inf) would turn the advantages and the loss into
NaN: such a step trains nothing (phases 3-7 are skipped). A loss or gradient norm that is not finite makes the
worker skip that optimizer step (``workers.training``; verl's actor does the same) and report it in
``<role>/nonfinite_skip_frac``. Either way the step is flagged (``training/nonfinite_skip``), counted
(``training/nonfinite_steps``) and not checkpointed, so the newest checkpoint is one saved before; once more
than ``trainer.max_nonfinite_steps`` steps were, the run stops with one line naming what was not finite.
"""

from __future__ import annotations

import math

import torch

from hybridflow.errors import HybridflowError
from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names
from hybridflow.workers.training import NONFINITE_SKIP_FRAC

# Per role: its metric prefix, its loss and the learning-rate key of the fix.
ROLES = {
    "actor": (names.ACTOR_PREFIX, "pg_loss", "actor_rollout_ref.actor.optim.lr"),
    "critic": (names.CRITIC_PREFIX, "vf_loss", "critic.optim.lr"),
}


class NonFiniteError(HybridflowError):
    """More steps than ``trainer.max_nonfinite_steps`` had non-finite scores, losses or gradient norms."""


class NonFiniteGuard:
    """Counts the steps with non-finite values; raises :class:`NonFiniteError` past ``max_steps`` of them."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.steps = 0
        self.last_step = None  # the latest step counted

    def scores_are_finite(self, batch: DataProto, step: int) -> bool:
        """False (and the step counted) when a sample's ``token_level_scores`` hold NaN or inf."""
        bad = ~torch.isfinite(batch.batch["token_level_scores"]).all(dim=-1)
        if not bad.any():
            return True
        first = int(bad.nonzero()[0])
        source = batch.non_tensor_batch["data_source"][first] if "data_source" in batch.non_tensor_batch else "?"
        self._count(
            step,
            f"the reward of {int(bad.sum())} of {len(batch)} samples is not finite (first: sample {first}, "
            f"data_source {source!r}), so the step trained nothing",
            "make the reward function return finite numbers",
        )
        return False

    def updates_are_finite(self, metrics: dict[str, float], step: int) -> bool:
        """False (and the step counted) when a role's update had a non-finite loss or gradient norm: its
        workers skipped those optimizer steps."""
        found, fixes = [], []
        for role, (prefix, loss, lr_key) in ROLES.items():
            keys = [f"{prefix}{loss}", f"{prefix}grad_norm"]
            bad = [f"{key}={metrics[key]}" for key in keys if key in metrics and not math.isfinite(metrics[key])]
            skipped = metrics.get(f"{prefix}{NONFINITE_SKIP_FRAC}", 0.0)
            if bad or skipped:
                found.append(f"{role}: {', '.join(bad)} ({skipped:.0%} of its optimizer steps skipped)")
                lr = metrics.get(f"{prefix}lr")
                fixes.append(f"{lr_key}{'' if lr is None else f'={lr:g}'}")
        if found:
            self._count(
                step,
                f"the update was not finite, {'; '.join(found)}",
                f"lower the learning rate ({', '.join(fixes)}) or keep grad_clip on",
            )
        return not found

    def metrics(self, step: int) -> dict[str, float]:
        """The steps counted so far, and whether ``step`` is one of them."""
        return {names.NONFINITE_STEPS: self.steps, names.NONFINITE_SKIP: float(self.last_step == step)}

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]

    def _count(self, step: int, what: str, fix: str) -> None:
        if self.last_step != step:  # once per step, however many of its mini-batches (separate_async) it hits
            self.steps += 1
        self.last_step = step
        print(f"[hybridflow] warning: step {step}: {what} ({self.steps} such step(s) so far)", flush=True)
        if self.steps > self.max_steps:
            raise NonFiniteError(
                f"step {step}: {what}; that is {self.steps} step(s) with non-finite values, more than "
                f"trainer.max_nonfinite_steps={self.max_steps}: {fix} (steps with non-finite values are "
                "not checkpointed)"
            )
