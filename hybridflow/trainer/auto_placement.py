"""``trainer.placement=auto``: before the run's workers start, rank every layout of its roles over its devices by a
simulated step time and run the fastest (HybridFlow, arXiv 2409.19256, section 6, the auto-mapping algorithm).

The candidates are ``config/layouts.py``'s (every role together; the actor with its reference apart from the
critic and reward model; each role apart; every split of the devices) that pass the batch rules on their pools.
The cost model (``config/placement_cost.py``) is calibrated on this cluster: for each per-rank batch a candidate's
pool would carry, one Ray task with one rank's resources runs two steps of the run itself in local mode (every role
on that rank, its batch divided as the pool divides it) and reports each phase's seconds of the second; and ``k``
tasks at once time the same matrix products, for how much ranks that compute together slow each other. The ranked
plans are printed (``main_ppo ... trainer.placement=auto --plan`` prints them and stops) and the choice is written
to the run folder, so a resumed run keeps the layout its checkpoints were written under.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import pathlib
import statistics
import tempfile
import time
from typing import Callable

from hybridflow.checkpoints.manager import CheckpointManager
from hybridflow.config.layouts import Layout, candidate_layouts, colocated_layout
from hybridflow.config.placement_cost import WORKER_PHASES, PhaseTimes, step_seconds
from hybridflow.config.placement_options import placement_errors
from hybridflow.config.role_pools import devices, run_roles
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.tracking import metric_names as names

CHOICE_FILE = "placement_auto.json"
PROBE_ROUNDS = 3


def resolve_auto_placement(config: PPOTrainerConfig, start_ray: Callable[[], None]) -> PPOTrainerConfig:
    """``config`` with ``trainer.placement`` set to the layout ``auto`` chooses (or chose, for a run that resumes);
    ``start_ray()`` starts or joins the cluster the calibration runs on."""
    trainer = config.trainer
    run_dir = pathlib.Path(trainer.default_local_dir)
    saved = run_dir / CHOICE_FILE
    resumes = CheckpointManager(run_dir, trainer.resume_mode, trainer.resume_from_path).resume_dir(announce=False)
    if resumes is not None and saved.is_file():
        chosen = json.loads(saved.read_text())["chosen"]
        print(f"[hybridflow] trainer.placement=auto: {chosen}, as chosen when this run started ({saved})")
        return with_placement(config, chosen)
    layouts = runnable_layouts(config)
    if len(layouts) == 1:
        print(f"[hybridflow] trainer.placement=auto: {layouts[0].spelled()}, the one layout the batch sizes fit")
        return with_placement(config, layouts[0].spelled())
    start_ray()
    ranked = rank_layouts(config, layouts)
    for line in ranking_lines(ranked):
        print(f"[hybridflow] {line}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"chosen": ranked[0][0].spelled(), "ranked": [[layout.spelled(), est] for layout, est in ranked]}
    partial = saved.with_suffix(".tmp")  # renamed once whole: a kill mid-write leaves no half a choice
    partial.write_text(json.dumps(record, indent=1))
    partial.replace(saved)
    return with_placement(config, ranked[0][0].spelled())


def with_placement(config: PPOTrainerConfig, placement: str) -> PPOTrainerConfig:
    chosen = copy.deepcopy(config)
    chosen.trainer.placement = placement
    return chosen


def runnable_layouts(config: PPOTrainerConfig) -> list[Layout]:
    """The candidate layouts whose pools the run's batch sizes fit."""
    layouts = candidate_layouts(run_roles(config), devices(config))
    return [layout for layout in layouts if not placement_errors(with_placement(config, layout.spelled()))]


def rank_layouts(config: PPOTrainerConfig, layouts: list[Layout]) -> list[tuple[Layout, dict[str, float]]]:
    """Each layout with its simulated step (``placement_cost.step_seconds``), fastest first."""
    sizes = sorted({pool.devices for layout in layouts for pool in layout.pools})
    times = calibrate_phases(config, sizes)
    slowdown = calibrate_slowdown(config, devices(config))
    estimates = [(layout, step_seconds(layout, times, slowdown)) for layout in layouts]
    return sorted(estimates, key=lambda estimate: estimate[1]["step"])


def ranking_lines(ranked: list[tuple[Layout, dict[str, float]]]) -> list[str]:
    width = max(len(layout.spelled()) for layout, _ in ranked)
    lines = [f"trainer.placement=auto: {len(ranked)} layouts ranked by simulated step seconds"]
    for rank, (layout, seconds) in enumerate(ranked, start=1):
        stages = ", ".join(f"{stage} {value:.2f}" for stage, value in seconds.items() if stage != "step")
        chosen = "  <- chosen" if rank == 1 else ""
        lines.append(f"  {rank}. {layout.spelled():<{width}}  {seconds['step']:.2f} s ({stages}){chosen}")
    return lines


def calibrate_phases(config: PPOTrainerConfig, sizes: list[int]) -> PhaseTimes:
    """Each phase's seconds on a pool of each size in ``sizes``, alone on the cluster: two steps of the run with
    every role on the pool's ranks, the second timed."""
    by_devices, driver = {}, 0.0
    for number, size in enumerate(sorted(sizes), start=1):
        progress = f"timing two steps on {size} rank(s) ({number} of {len(sizes)})"
        print(f"[hybridflow] trainer.placement=auto: {progress}", flush=True)
        by_devices[size], outside = _calibration_step(_calibration_config(config, size))
        if size == min(sizes):
            driver = outside
    return PhaseTimes(by_devices, driver)


def _calibration_config(config: PPOTrainerConfig, size: int) -> PPOTrainerConfig:
    """Two steps of the run with every role on the first ``size`` devices, nothing validated or saved."""
    calibration = copy.deepcopy(config)
    trainer = calibration.trainer
    together = [role for role in run_roles(config) if role != "ref"]
    trainer.placement = colocated_layout(together, size).spelled()
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
