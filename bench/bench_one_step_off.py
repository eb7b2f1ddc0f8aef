"""The asynchronous modes (one-step-off, fully async, V1 colocate_async and separate_async) against the synchronous
hybrid engine on ``make demo``'s task, side by side.

All train the demo's recipe (``python -m hybridflow.demo``: its model, sorting prompts, 32 prompts x 8 samples,
lr schedule over ``--steps`` steps, greedy validation every ``--test_freq`` steps):

- ``sync``: the demo as shipped, every role in one process (local mode) with 2 torch threads; each step
  generates, then trains;
- ``one_step_off``: ``actor_rollout_ref.hybrid_engine=false`` on a local Ray cluster, the training pool one
  process and the rollout pool another, 2 torch threads each (the cluster is told 4 CPUs, so the two processes
  share this machine's 2 cores), bypass mode with the engine's log-probs (verl's one-step-off defaults): the
  rollout generates step k+1's samples while the actor trains on step k's;
- ``fully_async``: the same two pools with ``async_training.enable=true``: the rollout pool generates 16 prompts
  per call into a queue, a step trains on 32 of them, the weights are synced every step
  (``trigger_parameter_sync_step=1``, so save and test frequencies stay in steps), and ``staleness_threshold=0.5``
  lets at most 48 prompts start per weight version: about half of each step's samples are one version old;
- ``colocate_async``: verl's V1 mode (``trainer.v1.trainer_mode=colocate_async``, one warm-up batch) in the demo's
  one process: 64 prompt groups in flight, a step trains on the first 32 to finish and the rest go on after its
  weight sync (partial rollout); bypass mode with the engine's log-probs, as the other asynchronous modes;
- ``separate_async``: verl's V1 mode (``trainer.v1.trainer_mode=separate_async``) on the same two pools: each step's
  32 prompts in 2 mini-batches of 16 (``parameter_sync_step=2``), each trained as soon as the pool has finished it,
  their old log-probs under the step's starting weights (verl's decoupled PPO), the pool at most one batch ahead,
  one sync a step landing in the generation in flight; ``separate_async_bypass`` the same with bypass mode;
  ``separate_async_switch`` with verl's step switching at its defaults (``hybrid_rollout.enable_switch=true``: the
  training process generates the groups a step lacks at its start, when verl's decision says so);
  ``separate_async_no_warmup`` and ``separate_async_no_warmup_switch`` the same two with ``num_warmup_batches=0``
  (the pool never runs ahead, so the trainer waits for each step's samples: what switching is for);
- ``sync_bypass``: the synchronous demo with that bypass mode alone, to tell the mode's effect from bypass mode's.

Time is training seconds (the sum of ``timing_s/step``: validation and checkpoints excluded on all sides, as in
``bench_time_to_accuracy``). Per seed, the target is the synchronous run's final accuracy less ``--within``; the
training seconds at which each run's validation first reaches it, the synchronous run's included, and their ratio
(target <= 0.7 for one-step-off); with several seeds the median. (Until 2026-11-29 the ratio was over the
synchronous run's whole training time, which favoured the other side: the synchronous run reaches the target before
its end too.) Each run's whole process (start-up, validation and checkpoints included) is reported
too: wall seconds, CPU seconds of its process tree (Ray's processes included, sampled every half second), the
1-minute load average at its start and end.
Run: ``.venv/bin/python -m bench.bench_one_step_off [--seeds 0,1,2] [--steps 150] [--systems sync,fully_async]``
(about 4 minutes a run).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Iterator

import psutil

from bench.bench_time_to_accuracy import REPO_DIR, first_reaching, print_runs, validation_points, work_folder
from bench.bench_vs_trl import child_env, cpu_seconds
from hybridflow.demo import ensure_base_model

BYPASS = ["actor_rollout_ref.rollout.calculate_log_probs=true", "algorithm.rollout_correction.bypass_mode=true"]
ONE_STEP_OFF = [
    "trainer.local_mode=false",
    "trainer.cpus_per_worker=2",
    "ray_init.num_cpus=4",
    "actor_rollout_ref.hybrid_engine=false",
    *BYPASS,
]
FULLY_ASYNC = ONE_STEP_OFF + [
    "async_training.enable=true",
    "async_training.partial_rollout=false",
    "data.gen_batch_size=1",
    "async_training.trigger_parameter_sync_step=1",
    "async_training.staleness_threshold=0.5",
    "async_training.concurrent_samples_per_replica=16",
]
COLOCATE_ASYNC = ["trainer.v1.trainer_mode=colocate_async", "trainer.v1.colocate_async.num_warmup_batches=1", *BYPASS]
SEPARATE_ASYNC = [
    *ONE_STEP_OFF[:3],
    "trainer.v1.trainer_mode=separate_async",
    "trainer.v1.separate_async.num_warmup_batches=1",
    "trainer.v1.separate_async.parameter_sync_step=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
]
NO_WARMUP = [key.replace("num_warmup_batches=1", "num_warmup_batches=0") for key in SEPARATE_ASYNC]
SWITCH = "trainer.v1.separate_async.hybrid_rollout.enable_switch=true"
SYSTEMS = {
    "sync": [],
    "one_step_off": ONE_STEP_OFF,
    "fully_async": FULLY_ASYNC,
    "colocate_async": COLOCATE_ASYNC,
    "separate_async": SEPARATE_ASYNC + ["actor_rollout_ref.rollout.calculate_log_probs=true"],
    "separate_async_bypass": SEPARATE_ASYNC + BYPASS,
    "separate_async_switch": SEPARATE_ASYNC + ["actor_rollout_ref.rollout.calculate_log_probs=true", SWITCH],
    "separate_async_no_warmup": NO_WARMUP + ["actor_rollout_ref.rollout.calculate_log_probs=true"],
    "separate_async_no_warmup_switch": NO_WARMUP + ["actor_rollout_ref.rollout.calculate_log_probs=true", SWITCH],
    "sync_bypass": BYPASS,
}
POLL_S = 0.5


def run_process(command: list[str], log_path: pathlib.Path) -> dict[str, float]:
    """Run ``command`` to its end with its output in ``log_path``: wall seconds, the load average at its start and
    end, and the CPU seconds of its process tree, Ray's worker processes included (they are not children the
    command waits for, so their times are read while they live: every ``POLL_S``, the last reading per process)."""
    load_start, wall_start = os.getloadavg()[0], time.perf_counter()
    last_cpu: dict[tuple[int, float], float] = {}
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=REPO_DIR, env=child_env(2), stdout=log, stderr=subprocess.STDOUT)
        root = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                tree = []
            for member in tree:
                try:
                    last_cpu[(member.pid, member.create_time())] = cpu_seconds(member)
                except psutil.NoSuchProcess:
                    pass
            time.sleep(POLL_S)
    if process.returncode != 0:
        sys.exit(
            f"{command[2]} failed (exit {process.returncode}); its output: {log_path}\n{log_path.read_text()[-4000:]}"
        )
    return {
        "wall_s": time.perf_counter() - wall_start,
        "cpu_s": sum(last_cpu.values()),
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
    }


def run_demo(system: str, seed: int, args: argparse.Namespace, run_dir: pathlib.Path) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "hybridflow.demo",
        "--seed",
        str(seed),
        "--steps",
        str(args.steps),
        "--test_freq",
        str(args.test_freq),
        "--run_dir",
        str(run_dir / system),
        *SYSTEMS[system],
    ]
    usage = run_process(command, run_dir / f"{system}.log")
    return {"points": validation_points(run_dir / system / "metrics.jsonl"), **usage}


def compare_first_reached(sync: dict[str, Any], other: dict[str, Any], within: float) -> dict[str, Any]:
    """The target (the synchronous run's final accuracy less ``within``) and the training seconds at which each of
    the two runs first reached it: the ratio compares like with like."""
    target = sync["points"][-1]["acc"] - within
    reached, sync_reached = first_reaching(other["points"], target), first_reaching(sync["points"], target)
    ratio = reached["training_s"] / sync_reached["training_s"] if reached else float("inf")
    return {"target": target, "sync": sync_reached, "reached": reached, "ratio": ratio}


def print_comparison(system: str, comparison: dict[str, Any]) -> None:
    reached, sync = comparison["reached"], comparison["sync"]
    target = f"{100 * comparison['target']:.1f}% (the synchronous final accuracy less the margin)"
    if reached is None:
        print(f"  {system} never reached {target}")
    else:
        print(
            f"  {system} first reached {target} at step {reached['step']}, after {reached['training_s']:.0f} "
            f"training s; the synchronous run at step {sync['step']}, after {sync['training_s']:.0f} s: "
            f"{comparison['ratio']:.2f}x"
        )


def demo_bench_parser(doc: str, systems: dict[str, list[str]]) -> argparse.ArgumentParser:
    """The options of a bench over the demo's recipe: seeds, systems (the first is the baseline), steps, test
    frequency, and keeping the work folder."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    first = next(iter(systems))
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; each trains every system once")
    parser.add_argument("--systems", default=",".join(systems), help=f"comma-separated: {first}, then the others")
    parser.add_argument("--steps", type=int, default=150, help="training steps of each run (the demo's default)")
    parser.add_argument("--test_freq", type=int, default=10, help="validate every N steps")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, metrics)")
    return parser


def chosen_systems(parser: argparse.ArgumentParser, args: argparse.Namespace, systems: dict) -> list[str]:
    """``--systems``, checked: the baseline first, then any of the others."""
    chosen, first = args.systems.split(","), next(iter(systems))
    if chosen[0] != first or not set(chosen) <= set(systems):
        parser.error(f"--systems={args.systems}: start with {first}, then any of {', '.join(list(systems)[1:])}")
    return chosen


def seed_runs(
    args: argparse.Namespace, systems: list[str], work_dir: pathlib.Path, run: Callable[..., dict[str, Any]]
) -> Iterator[tuple[int, dict[str, dict[str, Any]]]]:
    """Per seed of ``--seeds``, each system's ``run(system, seed, run_dir)`` one after another, in a folder of the
    seed's own."""
    for seed in [int(seed) for seed in args.seeds.split(",")]:
        run_dir = work_dir / f"seed{seed}"
        run_dir.mkdir()
        results = {}
        for system in systems:
            print(f"running {system}, seed {seed}, {args.steps} steps, load1 {os.getloadavg()[0]:.2f} ...", flush=True)
            results[system] = run(system, seed, run_dir)
        yield seed, results


def main() -> None:
    parser = demo_bench_parser(__doc__, SYSTEMS)
    parser.add_argument("--within", type=float, default=0.05, help="accuracy margin of 'reached' (0.05: 5 points)")
    args = parser.parse_args()
    systems = chosen_systems(parser, args, SYSTEMS)
    with work_folder("bench_one_step_off_", args.keep) as work_dir:
        ensure_base_model()
        ratios: dict[str, list[float]] = {system: [] for system in systems[1:]}
        runs = seed_runs(args, systems, work_dir, lambda system, seed, run_dir: run_demo(system, seed, args, run_dir))
        for seed, results in runs:
            print_runs(seed, results, width=12)
            for system in systems[1:]:
                comparison = compare_first_reached(results["sync"], results[system], args.within)
                print_comparison(system, comparison)
                ratios[system].append(comparison["ratio"])
        for system, values in ratios.items():
            print(
                f"\n== {system} training time to the synchronous final accuracy (less the margin), over the "
                f"synchronous run's time to it: median "
                f"{statistics.median(values):.2f}x over {len(values)} seed(s) "
                f"({', '.join(f'{r:.2f}x' for r in values)}; target <= 0.7x)"
            )


if __name__ == "__main__":
    main()
