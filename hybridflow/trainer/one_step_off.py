"""Phases 1, 2 and 8 of the one-step-off policy: the rollout on a pool of its own, one step ahead of training.

verl's one-step-off policy (``verl.experimental.one_step_off_policy``; AReaL, arXiv 2505.24298, for the idea):
while the actor trains on step k's samples, the rollout pool generates step k+1's. Each step, in order:

- 1 rollout: wait for the samples the pool generated during the previous step, then start the next step's
  generation (not after the last step);
- 2 reward: score this step's samples while the pool generates;
- 8 weight sync (:class:`RolloutWeightSync`): after the update, the actor's weights go into Ray's object store in
  buckets and the pool's load of them is queued behind its generation in flight, so the generation after it uses
  them (none after the last step).

Step k+1's generation therefore runs with the weights after update k-1: every sample is exactly one update stale
(step 1's and 2's come from the model folder). A checkpoint or a validation first waits for the generation in
flight and keeps its samples; a checkpoint saves them (``state_dict``), so a resumed run trains on exactly the
samples an uninterrupted one would, none twice and none lost.
"""

from __future__ import annotations

from typing import Any

from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.phases import StepTimer
from hybridflow.trainer.rollout_collection import (
    EndOfData,
    Generation,
    PendingGeneration,
    PromptSource,
    RewardScorer,
    assign_uids,
)


class RolloutWeightSync:
    """The actor's weights into a rollout pool of its own: the actor group puts them in Ray's object store in
    buckets of ``bucket_megabytes`` and the pool loads them, bucket by bucket (verl's ``sync_rollout_weights``).
    ``synced_step``: the step whose update made the weights the pool holds or is queued to load (0: the model
    folder's, as a fresh run starts; None: unknown, after resuming). ``phase``: the timing it counts as (verl's
    V1 ``separate_async`` names it ``update_weights``)."""

    def __init__(
        self, actor: Any, rollout: Any, bucket_megabytes: float, phase: str = names.PHASE_SYNC_ROLLOUT_WEIGHTS
    ):
        self.actor = actor
        self.rollout = rollout
        self.bucket_megabytes = bucket_megabytes
        self.phase = phase
        self.synced_step: int | None = 0
        self.loading: Any = None
        self.layouts = rollout.shard_layouts()[0]  # asked once, before the pool's first generation

    def __call__(self, step: int, timer: StepTimer, version: int = 0, queue: bool = False) -> None:
        """Give the pool the actor's weights after step ``step``'s update, as weight version ``version`` (fully
        async's tag of the tokens they draw). ``queue``: the load is queued behind the pool's running call and
        :meth:`wait` collects it; else it is done on return."""
        if self.synced_step == step:
            return
        with timer(self.phase):
            buckets, checksum = self.actor.share_weights(self.bucket_megabytes, self.layouts)[0]
            if queue:
                self.loading = self.rollout.load_shared_weights.submit(buckets, version, checksum)
            else:
                timer.add(names.CHECK_WEIGHT_SYNC, max(self.rollout.load_shared_weights(buckets, version, checksum)))
        self.synced_step = step

    def wait(self, timer: StepTimer) -> None:
        """The queued load, finished (its time counts as the sync's)."""
        if self.loading is not None:
            with timer(self.phase):
                timer.add(names.CHECK_WEIGHT_SYNC, max(self.loading.get()))
            self.loading = None


class OneStepOffCollector:
    """The rollout pool one step ahead (``actor_rollout_ref.hybrid_engine=false``): see the module docstring."""

    def __init__(self, generate: Generation, score: RewardScorer, sync: RolloutWeightSync, total_steps: int):
        self.generate = generate
        self.score = score
        self.sync = sync
        self.total_steps = total_steps
        self.running: PendingGeneration | None = None
        self.generated: DataProto | None = None

    def collect(self, source: PromptSource, timer: StepTimer, step: int) -> tuple[DataProto, dict[str, float]]:
        """Phases 1 and 2 of step ``step``: its samples (generated during the previous step), scored, with the next
        step's generation started meanwhile."""
        if self.running is None and self.generated is None:  # the first step (or one after the data ran out)
            self._start(source, step)
        with timer(names.PHASE_GEN):
            self._wait_generation()
        self.sync.wait(timer)
        batch, self.generated = self.generated, None
        if step < self.total_steps:
            try:
                self._start(source, step + 1)
            except EndOfData:
                pass  # the next step's collect raises it
        with timer(names.PHASE_REWARD):
            batch, _, metrics = self.score(batch)
        return batch, metrics

    def sync_weights(self, step: int, timer: StepTimer) -> dict[str, float]:
        """Phase 8: step ``step``'s update into the pool, loaded once the generation in flight is done (after the
        last step the pool generates nothing more: a validation syncs it first); no metrics besides timings."""
        if step < self.total_steps:
            self.sync(step, timer, queue=True)
        return {}

    def use_current_weights(self, step: int) -> None:
        """Before a validation: the generation in flight finishes (its samples are kept) and the pool holds the
        actor's weights after step ``step``."""
        timer = StepTimer()
        self._wait_generation()
        self.sync.wait(timer)
        self.sync(step, timer)

    def sync_before_first_step(self, step: int) -> None:
        """Before the run's first step: the pool gets the actor's weights after step ``step`` (a fresh run's pool
        holds them already)."""
        self.sync(step, StepTimer())

    def state_dict(self) -> dict[str, Any]:
        """The next step's samples, waited for (None when no generation runs: the last step, or no data)."""
        self._wait_generation()
        self.sync.wait(StepTimer())
        return {"generated": self.generated}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generated = state.get("generated")
        self.sync.synced_step = None  # the pool started from the model folder

    def _start(self, source: PromptSource, step: int) -> None:
        self.running = self.generate.start(assign_uids(source.next(), f"step{step}"))

    def _wait_generation(self) -> None:
        if self.running is not None:
            self.generated, self.running = self.generate.finish(self.running), None
