"""separate_async's step switching (``trainer.v1.separate_async.hybrid_rollout``): the trainer's processes lent to the
rollout while they would wait for the next step's samples.

verl's ``PPOTrainerSeparateAsync`` (``on_step_end``, ``on_step_begin``, ``_switch_threshold``,
``_adapt_switch_threshold``; its ``docs/advance/v1_async_trainer.md``, "Separate Async Step Switching"), on the
single controller:

- after a step's update the driver decides: the next step's threshold is clamp(round(ratio x train_batch_size),
  one mini-batch, train_batch_size) prompt groups; it lends when steps remain, the groups ready for the next step
  fall short of it by ``remaining`` > 0, and the time lending saves, remaining x (seconds the trainer waited per
  missing group) x (1 - pool processes / all processes), exceeds the mean cost of a switch there and back (either
  unknown yet: it lends);
- the next step starts by lending, unless the threshold is met by then: the actor's rollout engine gets the
  actor's weights (the hybrid engine's sync; ``timing_s/switch_to_rollout``) and generates the prompt groups still
  missing, within the staleness budget, in one call; the trainer waits for it (``timing_s/switch_wait``; the pool
  goes on meanwhile) and queues its samples (``timing_s/switch_to_trainer``). A call here runs to its end, so it
  is sized to what the threshold lacks; verl instead aborts the lent replicas' requests once the threshold is met;
- ``adaptive_switch_threshold``: after ``switch_threshold_release_steps`` steps in a row that waited for samples
  longer than verl's replay-buffer poll (2 s), the ratio rises by ``switch_threshold_step_up`` (to 1 at most);
  after as many that did not, it falls by ``switch_threshold_step_down`` (to 1 / parameter_sync_step at least).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hybridflow.tracking import metric_names as names

# verl's replay-buffer poll interval: a step that waited longer for samples counts as idle
IDLE_WAIT_SECONDS = 2.0


class StepSwitch:
    """verl's switching decision and adaptive threshold. ``settings``: ``hybrid_rollout``'s section;
    ``processes``: the trainer's and the rollout pool's process counts."""

    STATE = ("ratio", "idle_steps", "calm_steps", "wait_seconds", "wait_samples", "lend_next")

    def __init__(self, settings: Any, *, train_batch_size: int, mini_batch_size: int, processes: tuple[int, int]):
        self.settings = settings
        self.train_batch_size = train_batch_size
        self.mini_batch_size = mini_batch_size
        trainer, pool = processes
        self.pool_share = pool / (trainer + pool)
        self.ratio = settings.switch_threshold_ratio
        self.idle_steps = self.calm_steps = 0
        self.wait_seconds, self.wait_samples = 0.0, 0  # over the run: the trainer's waits and the groups it lacked
        self.step_wait_seconds, self.step_wait_samples = 0.0, 0
        self.lend_next = False
        self.to_rollout_costs: deque[float] = deque(maxlen=settings.switch_cost_window_size)
        self.to_trainer_costs: deque[float] = deque(maxlen=settings.switch_cost_window_size)

    def threshold(self) -> int:
        """Prompt groups ready for a step that keep the trainer from lending."""
        target = round(self.ratio * self.train_batch_size)
        return min(max(target, self.mini_batch_size), self.train_batch_size)

    def sampling(self, ready: int, waited_seconds: float) -> None:
        """A mini-batch was taken with ``ready`` groups there when it asked and ``waited_seconds`` of waiting."""
        self.step_wait_samples += max(0, self.mini_batch_size - ready)
        self.step_wait_seconds += waited_seconds

    def end_step(self, ready_next: int, steps_left: bool) -> dict[str, float]:
        """After a step's update: whether the next step starts by lending (``lend_next``), and verl's
        ``separate_async/switch/*`` and ``separate_async/decision/*`` metrics of the decision."""
        had_idle = self.step_wait_seconds > IDLE_WAIT_SECONDS
        if self.step_wait_samples > 0 and self.step_wait_seconds > 0:
            self.wait_seconds += self.step_wait_seconds
            self.wait_samples += self.step_wait_samples
        ratio_used = self.ratio
        if self.settings.adaptive_switch_threshold:
            self._adapt(had_idle)
        remaining = max(0, self.threshold() - ready_next)
        per_sample = self.wait_seconds / self.wait_samples if self.wait_samples else None
        cost = self._switch_cost()
        benefit = None if per_sample is None else remaining * per_sample * (1.0 - self.pool_share)
        self.lend_next = steps_left and remaining > 0 and (benefit is None or cost is None or benefit > cost)
        metrics = {
            names.SWITCH_THRESHOLD_RATIO: ratio_used,
            names.SWITCH_WAIT_SAMPLES: float(self.step_wait_samples),
            names.SWITCH_IDLE: float(had_idle),
            names.SWITCH_SAMPLEABLE: float(ready_next),
            names.SWITCH_REMAINING: float(remaining),
            names.SWITCH_SHOULD_SWITCH: float(self.lend_next),
        }
        if per_sample is not None:
            metrics[names.SWITCH_PER_SAMPLE_SECONDS] = per_sample
        if cost is not None:
            metrics[names.SWITCH_COST_SECONDS] = cost
        self.step_wait_seconds, self.step_wait_samples = 0.0, 0
        return metrics

    def switched(self, to_rollout_seconds: float, to_trainer_seconds: float) -> None:
        """A lending's measured cost, there and back."""
        self.to_rollout_costs.append(to_rollout_seconds)
        self.to_trainer_costs.append(to_trainer_seconds)

    def state_dict(self) -> dict[str, Any]:
        costs = {"to_rollout_costs": list(self.to_rollout_costs), "to_trainer_costs": list(self.to_trainer_costs)}
        return {**{name: getattr(self, name) for name in self.STATE}, **costs}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self.STATE:
            setattr(self, name, state[name])
        self.to_rollout_costs.extend(state["to_rollout_costs"])
        self.to_trainer_costs.extend(state["to_trainer_costs"])

    def _adapt(self, had_idle: bool) -> None:
        settings = self.settings
        release = settings.switch_threshold_release_steps
        if had_idle:
            self.calm_steps = 0
            self.idle_steps = min(self.idle_steps + 1, release)
            if self.idle_steps == release:
                self.ratio = min(1.0, self.ratio + settings.switch_threshold_step_up)
            return
        self.idle_steps = 0
        self.calm_steps = min(self.calm_steps + 1, release)
        if self.calm_steps == release:
            lowest = self.mini_batch_size / self.train_batch_size  # verl's 1 / parameter_sync_step
            self.ratio = max(lowest, self.ratio - settings.switch_threshold_step_down)

    def _switch_cost(self) -> float | None:
        if not self.to_rollout_costs or not self.to_trainer_costs:
            return None
        return sum(self.to_rollout_costs) / len(self.to_rollout_costs) + sum(self.to_trainer_costs) / len(
            self.to_trainer_costs
        )
