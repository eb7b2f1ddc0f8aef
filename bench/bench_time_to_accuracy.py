"""Time to accuracy on ``make demo``'s task, hybridflow vs TRL's ``GRPOTrainer``, side by side in one run.

Both systems train the demo's base model (``examples/tiny_base_model``) on the demo's sorting parquet with
the demo's settings: 32 prompts x 8 samples per step, 16 new tokens, temperature 1, no KL, token-mean loss,
group-std advantages, clip 0.2, grad clip 1, AdamW (0.9, 0.99) without weight decay, lr 3e-4 after 10
warm-up steps with cosine decay to a tenth, ``--steps`` steps. hybridflow runs as ``python -m hybridflow.demo``
(local mode); TRL as ``bench/trl_demo_side.py``. Both validate greedily on the demo's 200 held-out prompts
before training and every ``--test_freq`` steps, scored by the same rule (``acc`` of the sorting score).

Time is training seconds: the wall time of the steps alone (hybridflow's ``timing_s/step``; TRL's steps
timed by a callback that stops its clock while validating), so neither side pays for its validation or
checkpoints. Per seed, the target is TRL's final accuracy less ``--within``: the training seconds at which each
side's validation first reaches it, and their ratio (target <= 0.5); with several seeds, the median ratio. (Until
2026-12-02 the ratio was over TRL's whole training time, which favoured hybridflow: TRL reaches its final
accuracy before its last step too.) ``--hybridflow_steps`` gives hybridflow a different run length with the same recipe
(its cosine schedule then spans its own run). Each side's whole process (start-up, validation, checkpoints
included) is reported too: wall seconds, CPU seconds of its process tree, and the 1-minute load average at its
start and end.
Run: ``.venv/bin/python -m bench.bench_time_to_accuracy [--seeds 0,1,2] [--steps 150]`` (TRL takes about
4 s a step here, so about 12 minutes per seed; needs ``pip install -c constraints.txt 'hybridflow[bench]'``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import pathlib
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

from bench.bench_vs_trl import child_env
from hybridflow.demo import BASE_MODEL, NUM_TRAIN, ensure_base_model, write_task

REPO_DIR = pathlib.Path(__file__).resolve().parent.parent
VAL_KEY = "val-core/sorting/acc/mean@1"


@contextlib.contextmanager
def work_folder(prefix: str, keep: bool) -> Iterator[pathlib.Path]:
    """A fresh temporary folder for a benchmark's runs, removed at the end unless ``keep``."""
    work_dir = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work_dir
    finally:
        if keep:
            print(f"work folder kept: {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_process(command: list[str], threads: int, log_path: pathlib.Path) -> dict[str, float]:
    """Run ``command`` to its end with its output in ``log_path``; its wall and process-tree CPU seconds."""
    load_start, cpu_start, wall_start = os.getloadavg()[0], children_cpu_seconds(), time.perf_counter()
    with log_path.open("w") as log:
        completed = subprocess.run(command, cwd=REPO_DIR, env=child_env(threads), stdout=log, stderr=subprocess.STDOUT)
    usage = {
        "wall_s": time.perf_counter() - wall_start,
        "cpu_s": children_cpu_seconds() - cpu_start,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
    }
    if completed.returncode != 0:
        sys.exit(
            f"{command[2]} failed (exit {completed.returncode}); its output: {log_path}\n{log_path.read_text()[-4000:]}"
        )
    return usage


def run_hybridflow(seed: int, args: argparse.Namespace, run_dir: pathlib.Path) -> dict[str, Any]:
    steps = args.hybridflow_steps or args.steps
    epochs = -(-steps // (NUM_TRAIN // 32))  # the demo's 5,000 prompts make 156 steps of 32
    command = [
        sys.executable,
        "-m",
        "hybridflow.demo",
        "--seed",
        str(seed),
        "--steps",
        str(steps),
        "--test_freq",
        str(args.test_freq),
        "--run_dir",
        str(run_dir / "demo"),
        f"trainer.total_epochs={epochs}",
    ]
    usage = run_process(command, args.threads, run_dir / "hybridflow.log")
    return {"points": validation_points(run_dir / "demo" / "metrics.jsonl"), **usage}


def validation_points(metrics_path: pathlib.Path) -> list[dict[str, float]]:
    """A demo run's validations: step, training seconds so far (the sum of ``timing_s/step``) and accuracy."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()]
    training_s, points = 0.0, []
    for row in sorted(rows, key=lambda row: row["step"]):
        training_s += row.get("timing_s/step", 0.0)
        if VAL_KEY in row:
            points.append({"step": row["step"], "training_s": training_s, "acc": row[VAL_KEY]})
    return points


def run_trl(seed: int, args: argparse.Namespace, run_dir: pathlib.Path, data: dict[str, str]) -> dict[str, Any]:
    spec = {
        **data,
        "model_dir": str(BASE_MODEL),
        "seed": seed,
        "steps": args.steps,
        "test_freq": args.test_freq,
        "threads": args.threads,
        "prompts_per_step": 32,
        "samples_per_prompt": 8,
        "max_new_tokens": 16,
        "lr": 3e-4,
        "lr_warmup_steps": 10,
        "min_lr_ratio": 0.1,
        "trl_output_dir": str(run_dir / "trl"),
    }
    spec_path, out_path = run_dir / "trl_spec.json", run_dir / "trl_result.json"
    spec_path.write_text(json.dumps(spec))
    usage = run_process(
        [sys.executable, "-m", "bench.trl_demo_side", str(spec_path), str(out_path)], args.threads, run_dir / "trl.log"
    )
    return {**json.loads(out_path.read_text()), **usage}


def first_reaching(points: list[dict[str, float]], accuracy: float) -> dict[str, float] | None:
    return next((point for point in points if point["acc"] >= accuracy), None)


def compare(trl: dict[str, Any], ours: dict[str, Any], within: float) -> dict[str, Any]:
    """The target (TRL's final accuracy less ``within``) and when each system first reached it, in training
    seconds: the ratio compares like with like."""
    final = trl["points"][-1]
    target = final["acc"] - within
    reached, trl_first = first_reaching(ours["points"], target), first_reaching(trl["points"], target)
    return {
        "target": target,
        "trl_s": final["training_s"],
        "trl_first": trl_first,
        "ours": reached,
        "ratio": reached["training_s"] / trl_first["training_s"] if reached else float("inf"),
    }


def print_runs(seed: int, results: dict[str, dict[str, Any]], width: int = 10) -> None:
    """Each system's accuracy curve, training seconds and whole-process usage for one seed."""
    print(f"\n== seed {seed}")
    for system, result in results.items():
        curve = " ".join(f"{point['step']}:{100 * point['acc']:.1f}" for point in result["points"])
        last = result["points"][-1]
        print(f"  {system:<{width}} accuracy % by step: {curve}")
        print(
            f"  {'':<{width}} {last['training_s']:.0f} training s for {last['step']} steps "
            f"({last['training_s'] / max(last['step'], 1):.2f} s/step); whole process {result['wall_s']:.0f} s wall, "
            f"{result['cpu_s']:.0f} CPU s, load1 {result['load_start']:.2f} -> {result['load_end']:.2f}"
        )


def print_seed(seed: int, results: dict[str, dict[str, Any]], comparison: dict[str, Any]) -> None:
    print_runs(seed, results)
    trl_first, ours = comparison["trl_first"], comparison["ours"]
    print(
        f"  target {100 * comparison['target']:.1f}% (TRL's final accuracy less the margin), first reached by TRL at "
        f"step {trl_first['step']}, after {trl_first['training_s']:.0f} training s (of {comparison['trl_s']:.0f})"
    )
    if ours is None:
        print("  hybridflow never reached it")
    else:
        print(
            f"  hybridflow first reached it at step {ours['step']}, after {ours['training_s']:.0f} training s: "
            f"{comparison['ratio']:.2f}x TRL's time to it (target <= 0.5x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0", help="comma-separated seeds; each trains both systems once")
    parser.add_argument("--steps", type=int, default=150, help="training steps of each run (the demo's default)")
    parser.add_argument(
        "--hybridflow_steps",
        type=int,
        default=None,
        help="hybridflow's run length (default --steps): the same recipe, its lr schedule spanning "
        "its own run, for a time budget rather than a step count",
    )
    parser.add_argument("--test_freq", type=int, default=10, help="validate every N steps")
    parser.add_argument(
        "--within", type=float, default=0.0, help="the target is TRL's final accuracy less this (0.05: 5 points)"
    )
    parser.add_argument("--threads", type=int, default=2, help="OMP/torch threads of each system's process")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, metrics)")
    args = parser.parse_args()
    if importlib.util.find_spec("trl") is None:
        sys.exit("TRL is not installed: pip install -c constraints.txt 'hybridflow[bench]'")
    if args.threads != 2:
        sys.exit("--threads: the demo's workers use 2 threads (trainer.cpus_per_worker=2); only 2 is comparable")
    with work_folder("bench_tta_", args.keep) as work_dir:
        ensure_base_model()
        train, val = write_task(work_dir / "data")
        data = {"train_file": str(train), "val_file": str(val)}
        ratios = []
        for seed in [int(seed) for seed in args.seeds.split(",")]:
            run_dir = work_dir / f"seed{seed}"
            run_dir.mkdir()
            results = {}
            for system in ("trl", "hybridflow"):
                steps = args.steps if system == "trl" else args.hybridflow_steps or args.steps
                print(f"running {system}, seed {seed}, {steps} steps, load1 {os.getloadavg()[0]:.2f} ...", flush=True)
                results[system] = (
                    run_trl(seed, args, run_dir, data) if system == "trl" else run_hybridflow(seed, args, run_dir)
                )
            comparison = compare(results["trl"], results["hybridflow"], args.within)
            print_seed(seed, results, comparison)
            ratios.append(comparison["ratio"])
        print(
            "\n== hybridflow's training time to TRL's final accuracy (less the margin), over TRL's: "
            f"median {statistics.median(ratios):.2f}x "
            f"over {len(ratios)} seed(s) ({', '.join(f'{ratio:.2f}x' for ratio in ratios)}; target <= 0.5x)"
        )


if __name__ == "__main__":
    main()
