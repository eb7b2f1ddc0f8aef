"""The config check's peak-memory estimate against the measured peak (issue 28, item 5).

Each case is ``python -m hybridflow.demo`` with a few overrides; the estimate is the start-up line
``memory per process of ...`` (``hybridflow/config/memory_estimate.py``), the measured peak is the high-water
resident memory (``getrusage``) of the process the estimate is for:

- ``demo``: ``make demo`` as shipped (GRPO, local mode: one process), its whole run;
- ``demo_ppo``: the demo's PPO (actor, critic, reference-free GAE), local mode;
- ``demo_ray``: the demo on a Ray cluster, one worker process (its peak is the actor's
  ``perf/max_resident_memory_gb``, logged after every update; the run's end, a checkpoint, may add to it);
- ``large``: a ~100M-parameter Qwen2 of the demo's vocabulary (hidden 1024, 8 layers), untrained, for a few steps
  with every sample trained (``algorithm.skip_zero_signal_samples=false``, its rewards being mostly 0): its weights,
  gradients, Adam moments and the rollout's copy (~1.8 GiB) outweigh the runtime.

The goal: each estimate within 25% of its measured peak. Run:
``.venv/bin/python -m bench.bench_memory_estimate [--cases demo,demo_ppo,demo_ray,large]``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

from bench.bench_soak import RAY
from bench.bench_time_to_accuracy import REPO_DIR
from bench.bench_vs_trl import child_env

GIB = 2**30
GOAL = 0.25
ESTIMATE = re.compile(r"memory per process of (.+?) \((\d+)\): ~([\d.]+) GiB at its peak")
LARGE = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4)
LARGE_RUN = [
    "--steps",
    "4",
    "--test_freq",
    "1000",
    "trainer.val_before_train=false",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=0",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.rollout.n=4",
    "algorithm.skip_zero_signal_samples=false",
]
CASES = {"demo": [], "demo_ppo": ["--algo", "ppo"], "demo_ray": RAY, "large": LARGE_RUN}


def run_case(name: str, out: pathlib.Path) -> dict:
    run_dir = out / name
    args = list(CASES[name])
    if name == "large":
        args.append(f"actor_rollout_ref.model.path={large_model(out)}")
    command = [sys.executable, "-m", "hybridflow.demo", "--run_dir", str(run_dir), *args]
    start = time.monotonic()
    with (out / f"{name}.log").open("w") as log:
        process = subprocess.Popen(command, env=child_env(2), cwd=REPO_DIR, stdout=log, stderr=subprocess.STDOUT)
        # The demo's launcher waits for main_ppo, so its rusage's maximum is main_ppo's (or its own, smaller)
        _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise SystemExit(f"{name}: the run failed (status {status}); see {out / f'{name}.log'}")
    pool, processes, estimate = ESTIMATE.search((out / f"{name}.log").read_text()).groups()
    if name == "demo_ray":
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        measured = max(row.get("perf/max_resident_memory_gb", 0.0) for row in rows)
    else:
        measured = (usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024) / GIB
    return {
        "case": name,
        "process": f"{pool} ({processes})",
        "estimate_gib": float(estimate),
        "measured_gib": measured,
        "error": float(estimate) / measured - 1,
        "seconds": time.monotonic() - start,
    }


def large_model(out: pathlib.Path) -> pathlib.Path:
    """The large case's model, with the demo base model's tokenizer and chat template."""
    from hybridflow.demo import ensure_base_model
    from hybridflow.models.tiny import build_tiny_model

    folder = out / "large_model"
    if not (folder / "config.json").exists():
        build_tiny_model(folder, seed=0, intermediate_size=2816, **LARGE)
    base = ensure_base_model()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name).write_bytes((base / name).read_bytes())
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="bench_memory_"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"{'case':<9} {'process':<40} {'estimate GiB':>12} {'measured GiB':>12} {'error':>7}  verdict")
    results = []
    for name in args.cases.split(","):
        result = run_case(name, out)
        results.append(result)
        verdict = "meets" if abs(result["error"]) <= GOAL else "misses"
        print(
            f"{name:<9} {result['process']:<40} {result['estimate_gib']:>12.2f} {result['measured_gib']:>12.2f} "
            f"{100 * result['error']:>+6.0f}%  {verdict} the goal (within {100 * GOAL:.0f}%), "
            f"{result['seconds']:.0f} s",
            flush=True,
        )
    (out / "memory_estimate.json").write_text(json.dumps(results, indent=1))
    print(f"load average at the end {os.getloadavg()[0]:.2f}; results: {out / 'memory_estimate.json'}")


if __name__ == "__main__":
    main()
