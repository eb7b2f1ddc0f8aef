"""On-policy distillation against GRPO on ``make demo``'s task, from the same base model, side by side (issue 29).

1. The teacher: the demo itself (GRPO, ``--teacher_steps`` steps, seed ``--teacher_seed``), its best validated
   checkpoint merged into a Hugging Face folder (``python -m hybridflow.model_merger merge``). It is trained once per
   bench run, outside the timed comparison.
2. Per seed, from the demo's base model with the demo's recipe (its data, 32 prompts x 8 samples, lr schedule over
   ``--steps`` steps, greedy validation every ``--test_freq``, one process):

   - ``grpo``: the demo as shipped, learning from the sorting rule's reward;
   - ``opd``: verl's OPD scripts' loss (``examples/on_policy_distillation_trainer``): ``k1`` of the teacher's
     log-prob as each token's reward (``use_policy_gradient``), the task reward unused (``use_task_rewards=false``),
     ``loss_max_clamp=10``, ``log_prob_min_clamp=-10``; the teacher on a pool of its own (in the demo's local mode, in
     the same process);
   - ``opd_n1``: the same with one sample per prompt (verl's OPD scripts' ``rollout.n=1``): a per-token signal needs
     no group to compare against, so a step generates, scores and trains an eighth of the samples;
   - ``opd_topk``: ``forward_kl_topk`` over the teacher's top 16 tokens, backpropagated (supervised), no task reward.

Time is training seconds (the sum of ``timing_s/step``, the teacher's forward included; validation and checkpoints
excluded). Per seed: the training seconds at which each run's validation first reaches ``--target`` (default 0.9,
the demo's goal), and each distillation run's over GRPO's. Each run's whole process is reported too (wall, CPU
seconds of its process tree, load average).
Run: ``.venv/bin/python -m bench.bench_distillation [--seeds 0,1,2] [--steps 150] [--systems grpo,opd,opd_n1]``
(about 2 minutes a run on a quiet 2-core machine, and the teacher's).
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import subprocess
import sys
from typing import Any

from bench.bench_one_step_off import chosen_systems, demo_bench_parser, run_process, seed_runs
from bench.bench_time_to_accuracy import first_reaching, print_runs, validation_points, work_folder
from hybridflow.demo import ensure_base_model

TEACHER_KEY = "distillation.teacher_models.teacher_model.model_path"
DISTILLATION = ["distillation.enabled=true", "distillation.nnodes=1", "distillation.n_gpus_per_node=1"]
LOSS = "distillation.distillation_loss"
OPD_LOSS = [
    f"{LOSS}.loss_mode=k1",
    f"{LOSS}.use_policy_gradient=true",
    f"{LOSS}.use_task_rewards=false",
    f"{LOSS}.loss_max_clamp=10.0",
    f"{LOSS}.log_prob_min_clamp=-10.0",
]
SYSTEMS = {
    "grpo": [],
    "opd": DISTILLATION + OPD_LOSS,
    "opd_n1": DISTILLATION + OPD_LOSS + ["actor_rollout_ref.rollout.n=1"],
    "opd_topk": DISTILLATION
    + [f"{LOSS}.loss_mode=forward_kl_topk", f"{LOSS}.topk=16", f"{LOSS}.use_task_rewards=false"],
}
ACCURACY = "val-core/sorting/acc/mean@1"


def demo_command(run_dir: pathlib.Path, seed: int, steps: int, test_freq: int, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hybridflow.demo",
        *("--seed", str(seed), "--steps", str(steps), "--test_freq", str(test_freq), "--run_dir", str(run_dir)),
        *overrides,
    ]


def train_teacher(args: argparse.Namespace, work_dir: pathlib.Path) -> pathlib.Path:
    """The demo trained ``--teacher_steps`` steps; its best validated checkpoint as a Hugging Face folder."""
    run_dir = work_dir / "teacher_run"
    print(f"training the teacher: the demo, seed {args.teacher_seed}, {args.teacher_steps} steps ...", flush=True)
    run_process(demo_command(run_dir, args.teacher_seed, args.teacher_steps, 10), work_dir / "teacher.log")
    validated = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    scores = {row["step"]: row[ACCURACY] for row in validated if ACCURACY in row and row["step"] > 0}
    saved = {step: score for step, score in scores.items() if (run_dir / f"global_step_{step}" / "actor").is_dir()}
    best = max(saved, key=lambda step: (saved[step], step))
    print(f"the teacher: step {best}, validation accuracy {100 * saved[best]:.1f}%", flush=True)
    teacher = work_dir / "teacher"
    merge = [sys.executable, "-m", "hybridflow.model_merger", "merge"]
    subprocess.run(
        [*merge, "--local_dir", str(run_dir / f"global_step_{best}" / "actor"), "--target_dir", str(teacher)],
        check=True,
        capture_output=True,
    )
    return teacher


def run_system(system: str, seed: int, run_dir: pathlib.Path, args: argparse.Namespace, teacher: pathlib.Path):
    overrides = SYSTEMS[system] + ([f"{TEACHER_KEY}={teacher}"] if system != "grpo" else [])
    command = demo_command(run_dir / system, seed, args.steps, args.test_freq, *overrides)
    usage = run_process(command, run_dir / f"{system}.log")
    return {"points": validation_points(run_dir / system / "metrics.jsonl"), **usage}


def print_targets(results: dict[str, dict[str, Any]], target: float) -> dict[str, float]:
    """When each run first reached ``target``; each distillation run's time over GRPO's (inf: never)."""
    reached = {system: first_reaching(result["points"], target) for system, result in results.items()}
    for system, point in reached.items():
        where = "never" if point is None else f"at step {point['step']}, after {point['training_s']:.0f} training s"
        print(f"  {system} first reached {100 * target:.0f}% {where}")
    grpo = reached["grpo"]
    ratios = {}
    for system in list(results)[1:]:
        point = reached[system]
        ratios[system] = point["training_s"] / grpo["training_s"] if point and grpo else float("inf")
        print(f"  {system}: {ratios[system]:.2f}x GRPO's training time to {100 * target:.0f}%")
    return ratios


def main() -> None:
    parser = demo_bench_parser(__doc__, SYSTEMS)
    parser.add_argument("--target", type=float, default=0.9, help="validation accuracy to reach (the demo's goal)")
    parser.add_argument("--teacher_steps", type=int, default=150, help="the teacher's training steps")
    parser.add_argument("--teacher_seed", type=int, default=7, help="the teacher's seed (not a student's)")
    parser.add_argument("--teacher", type=pathlib.Path, help="a teacher folder made before: skip training one")
    args = parser.parse_args()
    systems = chosen_systems(parser, args, SYSTEMS)
    with work_folder("bench_distillation_", args.keep) as work_dir:
        ensure_base_model()
        teacher = args.teacher or train_teacher(args, work_dir)
        ratios: dict[str, list[float]] = {system: [] for system in systems[1:]}
        run = functools.partial(run_system, args=args, teacher=teacher)
        for seed, results in seed_runs(args, systems, work_dir, run):
            print_runs(seed, results, width=9)
            for system, ratio in print_targets(results, args.target).items():
                ratios[system].append(ratio)
        for system, values in ratios.items():
            each = ", ".join(f"{ratio:.2f}x" for ratio in values)
            print(
                f"\n== {system}: training time to {100 * args.target:.0f}% over GRPO's, median "
                f"{statistics.median(values):.2f}x over {len(values)} seed(s) ({each})"
            )


if __name__ == "__main__":
    main()
