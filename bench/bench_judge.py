"""Learning from a judge against learning from the rule, on ``make demo``'s task, side by side.

Both train the demo's recipe (``python -m hybridflow.demo``: its base model, sorting prompts, 32 prompts x 8
samples, ``--steps`` steps, greedy validation scored by the sorting rule every ``--test_freq`` steps), one process
each with 2 torch threads, one after the other per seed:

- ``rule``: the demo as shipped, each sample scored by the sorting rule (1 right, 0 wrong);
- ``judge``: ``--reward judge``, each sample scored only by the tiny judge of ``examples/tiny_judge`` (a learned
  reward model, its raw score placed on the last response token); the rule never scores a training sample.

Time is training seconds (the sum of ``timing_s/step``: validation and checkpoints excluded, as in
``bench_time_to_accuracy``), the judge's forward passes included. Per seed: the training seconds at which each
run's validation first reaches the rule run's final accuracy less ``--within``, the judge's over the rule's (target
<= 2x, issue 31), and the same for ``--accuracy`` (the demo's 90%). (Until 2026-11-29 the ratio was over the rule
run's whole training time, which favoured the judge.)
Run: ``.venv/bin/python -m bench.bench_judge [--seeds 0,1,2] [--steps 150]`` (about 4 minutes a seed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

from bench.bench_one_step_off import compare_first_reached, run_process
from bench.bench_time_to_accuracy import first_reaching, print_runs, validation_points, work_folder
from hybridflow.demo import JUDGE_MODEL, ensure_base_model, ensure_model


def run_demo(reward: str, seed: int, args: argparse.Namespace, run_dir) -> dict[str, Any]:
    command = [sys.executable, "-m", "hybridflow.demo", "--reward", reward, "--seed", str(seed)]
    command += ["--steps", str(args.steps), "--test_freq", str(args.test_freq), "--run_dir", str(run_dir / reward)]
    usage = run_process(command, run_dir / f"{reward}.log")
    return {"points": validation_points(run_dir / reward / "metrics.jsonl"), **usage}


def at(reached: dict[str, float] | None) -> str:
    return f"step {reached['step']}, {reached['training_s']:.0f} s" if reached else "never"


def time_to(points: list[dict[str, float]], accuracy: float) -> str:
    return at(first_reaching(points, accuracy))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; each trains both rewards once")
    parser.add_argument("--steps", type=int, default=150, help="training steps of each run (the demo's default)")
    parser.add_argument("--test_freq", type=int, default=10, help="validate every N steps")
    parser.add_argument("--within", type=float, default=0.05, help="accuracy margin of 'reached' (0.05: 5 points)")
    parser.add_argument("--accuracy", type=float, default=0.9, help="a fixed accuracy to time both runs to")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, metrics)")
    args = parser.parse_args()
    with work_folder("bench_judge_", args.keep) as work_dir:
        ensure_base_model()
        ensure_model(JUDGE_MODEL, "judge")
        ratios = []
        for seed in [int(seed) for seed in args.seeds.split(",")]:
            run_dir = work_dir / f"seed{seed}"
            run_dir.mkdir()
            results = {}
            for reward in ("rule", "judge"):
                print(
                    f"running {reward}, seed {seed}, {args.steps} steps, load1 {os.getloadavg()[0]:.2f} ...", flush=True
                )
                results[reward] = run_demo(reward, seed, args, run_dir)
            print_runs(seed, results, width=6)
            comparison = compare_first_reached(results["rule"], results["judge"], args.within)
            print(
                f"  the rule run's final accuracy less {100 * args.within:.0f} points, "
                f"{100 * comparison['target']:.1f}%: the rule run reached it at {at(comparison['sync'])}, the judge "
                f"run at {at(comparison['reached'])}: {comparison['ratio']:.2f}x (target <= 2x)"
            )
            print(
                f"  {100 * args.accuracy:.0f}% reached: rule at {time_to(results['rule']['points'], args.accuracy)}, "
                f"judge at {time_to(results['judge']['points'], args.accuracy)}"
            )
            ratios.append(comparison["ratio"])
        print(
            f"\n== judge's training time to the rule run's final accuracy (less the margin), over the rule run's: "
            f"median "
            f"{statistics.median(ratios):.2f}x over {len(ratios)} seed(s) "
            f"({', '.join(f'{r:.2f}x' for r in ratios)}; target <= 2x)"
        )


if __name__ == "__main__":
    main()
