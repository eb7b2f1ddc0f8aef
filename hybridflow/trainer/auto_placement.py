"""``trainer.placement=auto``: before the run's workers start, rank every plan of its roles over its devices by a
simulated step time and run the fastest (HybridFlow, arXiv 2409.19256, section 6, the auto-mapping algorithm).

A plan is a layout (``config/layouts.py``: every role together; the actor with its reference apart from the critic
and reward model; each role apart; every split of the devices) and each role's split of its pool's ranks (data,
tensor or sequence parallel, and the rollout's tensor parallel size: ``config/parallel_plans.py``); the splits a
role can run on its pool are those the config rules accept. The cost model (``config/placement_cost.py``) is
calibrated on this cluster: for each pool size and split a candidate has, two steps of the run itself with every
role on a pool of that size, each role under that split where it can take it, report each phase's seconds of the
second; and ``k`` tasks at once time the same matrix products, for how much ranks that compute together slow each
other. As in the paper, each layout takes its roles' fastest simulated splits; the layouts are then ranked and
printed (``main_ppo ... trainer.placement=auto --plan`` prints them and stops), and the choice is written to the
run folder, so a resumed run keeps the plan its checkpoints were written under.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import pathlib
import statistics
import tempfile
import time
from typing import Any, Callable

from hybridflow.checkpoints.manager import CheckpointManager
from hybridflow.config.layouts import Layout, candidate_layouts, colocated_layout
from hybridflow.config.parallel_plans import (
    DATA_PARALLEL,
    GENERATION,
    SPLIT_KEYS,
    Plan,
    generation_splits_of,
    splits_of,
    with_overrides,
)
from hybridflow.config.phases import uses_reference
from hybridflow.config.placement_cost import WORKER_PHASES, PhaseTimes, step_seconds
from hybridflow.config.role_pools import devices, run_roles
from hybridflow.config.rules import semantic_errors
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.tracking import metric_names as names

CHOICE_FILE = "placement_auto.json"
PROBE_ROUNDS = 3
# Per owner of a split (a role key or the rollout's), its splits each pool size of a layout allows
Options = dict[str, list[str]]


def resolve_auto_placement(config: PPOTrainerConfig, start_ray: Callable[[], None]) -> PPOTrainerConfig:
    """``config`` with ``trainer.placement`` and the parallel sizes set to the plan ``auto`` chooses (or chose, for a
    run that resumes); ``start_ray()`` starts or joins the cluster the calibration runs on."""
    trainer = config.trainer
    run_dir = pathlib.Path(trainer.default_local_dir)
    saved = run_dir / CHOICE_FILE
    resumes = CheckpointManager(run_dir, trainer.resume_mode, trainer.resume_from_path).resume_dir(announce=False)
    if resumes is not None and saved.is_file():
        chosen = json.loads(saved.read_text())["chosen"]
        print(f"[hybridflow] trainer.placement=auto: {chosen['plan']}, as chosen when this run started ({saved})")
        return with_overrides(config, chosen["overrides"])
    owners = split_owners(config)
    options = runnable_options(config, owners)
    plans = [plan for layout, layout_options in options.items() for plan in layout_plans(layout, layout_options)]
    if len(plans) == 1:
        print(f"[hybridflow] trainer.placement=auto: {plans[0].spelled()}, the one plan the config rules allow")
        return with_overrides(config, plans[0].overrides(owners))
    start_ray()
    times, slowdown = calibrate(config, options)
    estimates = [(plan, step_seconds(plan, times, slowdown)) for plan in plans]
    simulated = sorted(estimates, key=lambda estimate: estimate[1]["step"])
    ranked = best_per_layout(config, simulated, owners)
    for line in ranking_lines(ranked, len(simulated)):
        print(f"[hybridflow] {line}", flush=True)
    entries = [_entry(plan, seconds, owners) for plan, seconds in ranked]
    record = {
        "chosen": entries[0],
        "ranked": entries,
        "plans": [_entry(plan, seconds, owners) for plan, seconds in simulated],
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    partial = saved.with_suffix(".tmp")  # renamed once whole: a kill mid-write leaves no half a choice
    partial.write_text(json.dumps(record, indent=1))
    partial.replace(saved)
    return with_overrides(config, entries[0]["overrides"])


def split_owners(config: PPOTrainerConfig) -> list[str]:
    """Whose splits a plan sets: the run's roles that have split keys (the reference wherever the run has one,
    apart or in the actor's processes) and the rollout."""
    roles = run_roles(config) + (["ref"] if uses_reference(config) and "ref" not in run_roles(config) else [])
    return [role for role in roles if role in SPLIT_KEYS] + [GENERATION]


def runnable_options(config: PPOTrainerConfig, owners: list[str]) -> dict[Layout, Options]:
    """Per candidate layout the config rules accept with every role data parallel, each owner's splits the rules
    accept on its pool (the others data parallel)."""
    runnable = {}
    for layout in candidate_layouts(run_roles(config), devices(config)):
        if not _plan_errors(config, Plan(layout), owners):
            runnable[layout] = _owner_options(config, layout, owners)
    return runnable


def _owner_options(config: PPOTrainerConfig, layout: Layout, owners: list[str]) -> Options:
    options = {}
    for owner in owners:
        splits = (generation_splits_of if owner == GENERATION else splits_of)(Plan(layout).devices_of(owner))
        options[owner] = [
            split
            for split in splits
            if split == DATA_PARALLEL or not _plan_errors(config, Plan(layout, ((owner, split),)), owners)
        ]
    return options


def _plan_errors(config: PPOTrainerConfig, plan: Plan, owners: list[str]) -> list[str]:
    return semantic_errors(with_overrides(config, plan.overrides(owners)))


def layout_plans(layout: Layout, options: Options) -> list[Plan]:
    """Every combination of the owners' splits on ``layout``."""
    return [Plan(layout, tuple(zip(options, splits))) for splits in itertools.product(*options.values())]


def best_per_layout(
    config: PPOTrainerConfig, simulated: list[tuple[Plan, dict[str, float]]], owners: list[str]
) -> list[tuple[Plan, dict[str, float]]]:
    """Each layout's fastest simulated plan the rules accept whole (its splits were checked one at a time), fastest
    layout first."""
    best: dict[Layout, tuple[Plan, dict[str, float]]] = {}
    for plan, seconds in simulated:
        if plan.layout not in best and not _plan_errors(config, plan, owners):
            best[plan.layout] = (plan, seconds)
    return list(best.values())


def _entry(plan: Plan, seconds: dict[str, float], owners: list[str]) -> dict[str, Any]:
    splits = {owner: plan.split(owner) for owner in owners}
    overrides = plan.overrides(owners)
    return {
        "plan": plan.spelled(),
        "layout": plan.layout.spelled(),
        "splits": splits,
        "overrides": overrides,
        "seconds": seconds,
    }


def ranking_lines(ranked: list[tuple[Plan, dict[str, float]]], simulated: int) -> list[str]:
    width = max(len(plan.spelled()) for plan, _ in ranked)
    lines = [
        f"trainer.placement=auto: {len(ranked)} layouts ranked by simulated step seconds, each with its fastest "
        f"splits of {simulated} plans simulated"
    ]
    for rank, (plan, seconds) in enumerate(ranked, start=1):
        stages = ", ".join(f"{stage} {value:.2f}" for stage, value in seconds.items() if stage != "step")
        chosen = "  <- chosen" if rank == 1 else ""
        lines.append(f"  {rank}. {plan.spelled():<{width}}  {seconds['step']:.2f} s ({stages}){chosen}")
    return lines


def calibrate(config: PPOTrainerConfig, options: dict[Layout, Options]) -> tuple[PhaseTimes, dict[int, float]]:
    """The phase times of every pool size and split the layouts' options hold, and the slowdown of ``k`` ranks
    computing at once."""
    needed = sorted(
        {
            (Plan(layout).devices_of(owner), split)
            for layout, layout_options in options.items()
            for owner, splits in layout_options.items()
            for split in splits
        },
        key=lambda pool: (pool[0], pool[1] != DATA_PARALLEL, pool[1]),
    )
    return calibrate_phases(config, needed), calibrate_slowdown(config, devices(config))


def calibrate_phases(config: PPOTrainerConfig, pools: list[tuple[int, str]]) -> PhaseTimes:
    """Each phase's seconds on a pool of each ``(size, split)`` in ``pools``, alone on the cluster: two steps of
    the run with every role on the pool's ranks, the second timed."""
    owners = split_owners(config)
    together = [role for role in run_roles(config) if role != "ref"]
    layouts = {size: colocated_layout(together, size) for size, _ in pools}
    options = {size: _owner_options(config, layout, owners) for size, layout in layouts.items()}
    by_pool, driver = {}, 0.0
    for number, (size, split) in enumerate(pools, start=1):
        progress = f"timing two steps on {size} rank(s), {split} ({number} of {len(pools)})"
        print(f"[hybridflow] trainer.placement=auto: {progress}", flush=True)
        splits = tuple((owner, split) for owner in owners if split in options[size][owner])
        calibration = _calibration_config(config, Plan(layouts[size], splits).overrides(owners))
        by_pool[(size, split)], outside = _calibration_step(calibration)
        if (size, split) == pools[0]:
            driver = outside
    return PhaseTimes(by_pool, driver)


def _calibration_config(config: PPOTrainerConfig, plan_overrides: list[str]) -> PPOTrainerConfig:
    """Two steps of the run under the plan ``plan_overrides`` spells (every role on one pool, each under one
    split where the rules let it take it), nothing validated or saved."""
    calibration = with_overrides(config, plan_overrides)
    trainer = calibration.trainer
    trainer.total_training_steps, trainer.val_before_train, trainer.test_freq, trainer.save_freq = 2, False, -1, -1
    trainer.logger, trainer.resume_mode = ["jsonl"], "disable"
    for optim in (calibration.actor_rollout_ref.actor.optim, calibration.critic.optim):
        optim.warmup_style = "constant"  # a schedule longer than two steps costs the same per step
    return calibration


def _calibration_step(config: PPOTrainerConfig) -> tuple[dict[str, float], float]:
    """The second step's worker phases in seconds, and its seconds outside them."""
    from hybridflow.tracking.trackers import read_metrics
    from hybridflow.trainer.main_ppo import run_ppo

    with tempfile.TemporaryDirectory() as run_dir:
        config.trainer.default_local_dir = run_dir
        with contextlib.redirect_stdout(io.StringIO()):
            run_ppo(config)
        last = read_metrics(run_dir)[-1]
    phases = {phase: last.get(names.timing(phase), 0.0) for phase in WORKER_PHASES}
    return phases, last[names.timing(names.PHASE_STEP)] - sum(phases.values())


def calibrate_slowdown(config: PPOTrainerConfig, most: int) -> dict[int, float]:
    """For ``k`` = 1 to ``most`` ranks computing at once, how many times longer each takes than one alone."""
    import ray

    probe = ray.remote(**_rank_resources(config))(_probe)
    threads = max(1, int(config.trainer.cpus_per_worker))
    ray.get([probe.remote(0.0, threads) for _ in range(most)])  # the processes started, torch imported
    seconds = {}
    for k in range(1, most + 1):
        rounds = []
        for _ in range(PROBE_ROUNDS):  # the median of a few rounds: one round can meet a burst of other work
            start_at = time.time() + 0.3
            rounds.append(statistics.mean(ray.get([probe.remote(start_at, threads) for _ in range(k)])))
        seconds[k] = statistics.median(rounds)
    return {k: max(1.0, value / seconds[1]) for k, value in seconds.items()}


def _probe(start_at: float, threads: int) -> float:
    """Seconds for a fixed amount of matrix products on ``threads`` threads, as a worker of the run computes,
    started at ``start_at`` (0: only start the process)."""
    import torch

    if not start_at:
        return 0.0
    torch.set_num_threads(threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    left = torch.randn(384, 384, device=device)
    while time.time() < start_at:
        time.sleep(0.005)
    began = time.perf_counter()
    for _ in range(400):
        left = torch.tanh(left @ left)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - began


def _rank_resources(config: PPOTrainerConfig) -> dict[str, float]:
    trainer = config.trainer
    return {"num_cpus": trainer.cpus_per_worker, "num_gpus": 1.0 if trainer.device == "cuda" else 0.0}
