"""Never train on NaN: a step whose scores, losses or gradient norms are not finite is caught where it appears.

Scores that are not finite (a reward function returning NaN or inf) would turn the advantages and the loss into
NaN: such a step trains nothing (phases 3-7 are skipped). A loss or gradient norm that is not finite makes the
worker skip that optimizer step (``workers.training``; verl's actor does the same); the driver sees it in the
step's metrics. Either way the step is counted (``training/nonfinite_steps``), and once more than
``trainer.max_nonfinite_steps`` steps were, the run stops with one line naming what was not finite, before
that step is checkpointed: the newest checkpoint is one saved before.
"""

from __future__ import annotations

import math

import torch

from hybridflow.errors import HybridflowError
from hybridflow.protocol import DataProto
from hybridflow.trainer import metric_names as names

UPDATE_METRICS = (
    f"{names.ACTOR_PREFIX}pg_loss", f"{names.ACTOR_PREFIX}grad_norm",
    f"{names.CRITIC_PREFIX}vf_loss", f"{names.CRITIC_PREFIX}grad_norm",
)


class NonFiniteError(HybridflowError):
    """More steps than ``trainer.max_nonfinite_steps`` had non-finite scores, losses or gradient norms."""


class NonFiniteGuard:
    """Counts the steps with non-finite values; raises :class:`NonFiniteError` past ``max_steps`` of them."""

    def __init__(self, max_steps: int):
        self.max_steps = max_steps
        self.steps = 0

    def scores_are_finite(self, batch: DataProto, step: int) -> bool:
        """False (and the step counted) when a sample's ``token_level_scores`` hold NaN or inf."""
        bad = ~torch.isfinite(batch.batch["token_level_scores"]).all(dim=-1)
        if not bad.any():
            return True
        first = int(bad.nonzero()[0])
        source = batch.non_tensor_batch["data_source"][first] if "data_source" in batch.non_tensor_batch else "?"
        self._count(
            step, f"the reward of {int(bad.sum())} of {len(batch)} samples is not finite (first: sample {first}, "
            f"data_source {source!r}), so the step trained nothing",
            "make the reward function return finite numbers",
        )
        return False

    def check_updates(self, metrics: dict[str, float], step: int) -> None:
        """Counts the step when the update's loss or gradient norm (its workers skipped those steps) is not finite."""
        bad = [key for key in UPDATE_METRICS if key in metrics and not math.isfinite(metrics[key])]
        if bad:
            self._count(
                step, f"{', '.join(f'{key}={metrics[key]}' for key in bad)}: the workers skipped those optimizer steps",
                "lower the learning rate (actor_rollout_ref.actor.optim.lr / critic.optim.lr) or keep grad_clip on",
            )

    def metrics(self) -> dict[str, float]:
        return {names.NONFINITE_STEPS: self.steps}

    def state_dict(self) -> dict[str, int]:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps = state["steps"]

    def _count(self, step: int, what: str, fix: str) -> None:
        self.steps += 1
        print(f"[hybridflow] warning: step {step}: {what} ({self.steps} such step(s) so far)", flush=True)
        if self.steps > self.max_steps:
            raise NonFiniteError(
                f"step {step}: {what}; that is {self.steps} step(s) with non-finite values, more than "
                f"trainer.max_nonfinite_steps={self.max_steps}: {fix} (the newest checkpoint predates this step)"
            )
