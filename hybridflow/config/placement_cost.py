"""A PPO step's time under a layout, simulated from calibrated phase times (HybridFlow, arXiv 2409.19256, section 6:
the auto-mapping algorithm estimates each placement's step by simulating its phases on their devices).

The calibration (``trainer/auto_placement.py``) times every phase of the whole batch on a pool of each size a
candidate has, under each split of its ranks (data, tensor or sequence parallel, ``config/parallel_plans.py``),
alone on the cluster (``PhaseTimes``), and how much each rank slows when ``k`` ranks compute at once
(``slowdown``: 1 on devices of their own, more where ranks share a machine's cores). The simulation runs the step in
the driver's order: generation on the actor's pool; old log-probs, reference log-probs and values started together,
each pool working through its own calls; advantages on the driver; the critic's and the actor's updates together;
the weight sync. Pools that compute at the same time share the slowdown of their ranks together.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.layouts import Layout
from hybridflow.config.parallel_plans import GENERATION, Plan
from hybridflow.tracking import metric_names as names

# Phase names as the trainer times them (``timing_s/<name>``)
GEN, OLD, REF, VALUES = names.PHASE_GEN, names.PHASE_OLD_LOG_PROB, names.PHASE_REF, names.PHASE_VALUES
UPDATE_CRITIC, UPDATE_ACTOR, SYNC = names.PHASE_UPDATE_CRITIC, names.PHASE_UPDATE_ACTOR, names.PHASE_UPDATE_WEIGHTS
WORKER_PHASES = (GEN, SYNC, OLD, REF, VALUES, UPDATE_CRITIC, UPDATE_ACTOR)
ROLE_OF_PHASE = {OLD: "actor_rollout_ref", REF: "ref", VALUES: "critic", UPDATE_CRITIC: "critic"}
# Whose split a phase's time depends on: generation and the weight sync on the rollout's, the rest on their role's
SPLIT_OF_PHASE = {GEN: GENERATION, SYNC: GENERATION, UPDATE_ACTOR: "actor_rollout_ref", **ROLE_OF_PHASE}


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds of each worker phase of the step's batch on a pool of ``devices`` ranks alone on the cluster, per
    calibrated ``(devices, split)`` (a phase's time under the split of its owner, ``SPLIT_OF_PHASE``); ``driver``:
    the step's seconds on the driver (reward, advantages, the rest)."""

    by_pool: dict[tuple[int, str], dict[str, float]]
    driver: float

    def of(self, phase: str, devices: int, split: str) -> float:
        return self.by_pool[(devices, split)].get(phase, 0.0)


def step_seconds(plan: Plan, times: PhaseTimes, slowdown: dict[int, float]) -> dict[str, float]:
    """The step's simulated seconds and each stage's: ``generate``, ``log_probs`` (old, reference, values),
    ``updates`` (critic and actor), ``driver`` (advantages, reward and the rest) and ``step``."""
    layout = plan.layout
    pool_of = {role: index for index, pool in enumerate(layout.pools) for role in pool.roles}
    actor = pool_of["actor_rollout_ref"]

    def work(phases: list[str]) -> dict[int, float]:
        queued: dict[int, float] = {}
        for phase in phases:
            pool = pool_of.get(ROLE_OF_PHASE.get(phase, "actor_rollout_ref"), actor)
            split = plan.split(SPLIT_OF_PHASE[phase])
            queued[pool] = queued.get(pool, 0.0) + times.of(phase, layout.pools[pool].devices, split)
        return queued

    stages = {
        "generate": _shared_run(layout, work([GEN, SYNC]), slowdown),
        "log_probs": _shared_run(layout, work([OLD, REF, VALUES]), slowdown),
        "updates": _shared_run(layout, work([UPDATE_CRITIC, UPDATE_ACTOR]), slowdown),
        "driver": times.driver,
    }
    return {**stages, "step": sum(stages.values())}


def _shared_run(layout: Layout, queued: dict[int, float], slowdown: dict[int, float]) -> float:
    """Seconds until every pool has done its ``queued`` seconds (each timed on its pool alone), while the busy
    pools' ranks together slow each other: a pool of ``d`` ranks goes ``slowdown[busy] / slowdown[d]`` times
    slower than alone, its own ``d`` ranks' share being in its calibrated times already."""
    remaining = {pool: seconds for pool, seconds in queued.items() if seconds > 0}
    elapsed, most = 0.0, max(slowdown)
    while remaining:
        busy = slowdown[min(most, sum(layout.pools[pool].devices for pool in remaining))]
        factor = {pool: busy / slowdown[min(most, layout.pools[pool].devices)] for pool in remaining}
        step = min(seconds * factor[pool] for pool, seconds in remaining.items())
        elapsed += step
        remaining = {
            pool: seconds - step / factor[pool]
            for pool, seconds in remaining.items()
            if seconds - step / factor[pool] > 1e-9
        }
    return elapsed
