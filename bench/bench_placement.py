"""``trainer.placement=auto`` against every layout it ranks, run side by side on a two-node cluster.

The task is ``make demo``'s with PPO's roles (``python -m hybridflow.demo --algo ppo``: 64 prompts x 4 samples, a
critic with GAE) and the KL loss, so a reference policy too: actor, reference, critic. The cluster is two nodes
started with ``ray start`` on this machine (``hybridflow/distributed/ray_start_cluster.py``), 2 CPUs each, 4 ranks in
all (``trainer.nnodes=2
trainer.n_gpus_per_node=2 trainer.cpus_per_worker=1``); on this 2-core machine the 4 ranks share its 2 cores, which
the calibration measures like any other cluster's speeds.

Per critic size (``--critic_layers``: the demo model's layers times this; a larger critic is a model of the demo's
width with more layers, its weights random, which costs the same per step as a trained one):
1. ``main_ppo ... trainer.placement=auto --plan``: the calibration, the ranked plans (each layout with its roles'
   fastest simulated splits: data, tensor or sequence parallel) with their simulated step seconds, and the choice;
   nothing trained.
2. every ranked plan run for ``--steps`` steps (its overrides: ``trainer.placement=<layout>`` and the parallel
   sizes), then the plans of the colocated layout and of the chosen one with every role under one other split (a
   tensor or sequence parallel size, the rollout's tensor parallel size with it), which auto simulated and did not
   choose; measured: the mean ``timing_s/step`` after the first ``--warmup`` steps.
3. per plan: predicted and measured seconds and their ratio, and each run's process tree: wall and CPU seconds,
   peak memory (the sum of its processes' resident memory, Ray's workers included, sampled every half second) and
   the 1-minute load average at its start and end. Then whether auto's choice is the fastest measured plan or
   within 10% of it, and the largest prediction error (the target: 25%).

Run: ``.venv/bin/python -m bench.bench_placement [--critic_layers 1,4] [--steps 6] [--keep]`` (about 10 minutes per
critic size).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

import psutil

from bench.bench_time_to_accuracy import REPO_DIR, work_folder
from bench.bench_vs_trl import child_env, cpu_seconds
from hybridflow.config.parallel_plans import GENERATION
from hybridflow.demo import ensure_base_model, overrides, parse_args, write_task
from hybridflow.distributed.ray_start_cluster import RayStartCluster
from hybridflow.trainer.auto_placement import CHOICE_FILE

POLL_S = 0.5
CLUSTER = ["trainer.local_mode=false", "trainer.nnodes=2", "trainer.n_gpus_per_node=2", "trainer.cpus_per_worker=1"]
RUN = [
    "actor_rollout_ref.actor.use_kl_loss=true",
    # Both schedules flat: a short run's cosine warm-up would be longer than the run
    "actor_rollout_ref.actor.optim.warmup_style=constant",
    "critic.optim.warmup_style=constant",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.save_freq=-1",
    "trainer.logger=[jsonl]",
]


def run_process(command: list[str], log_path: pathlib.Path, cluster: RayStartCluster) -> dict[str, float]:
    """Run ``command`` with its output in ``log_path``: wall and CPU seconds of its process tree and the cluster's
    processes, their peak resident memory (GiB, summed at each reading), and the load average at its start and end.
    The CPU seconds of the cluster's own services count too (a few seconds a run, as on any Ray cluster)."""
    load_start, wall_start = os.getloadavg()[0], time.perf_counter()
    last_cpu: dict[tuple[int, float], float] = {}
    peak = 0
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=REPO_DIR, env=child_env(1), stdout=log, stderr=subprocess.STDOUT)
        root = psutil.Process(process.pid)
        while process.poll() is None:
            resident = 0
            for member in _tree(root) + _processes(cluster.processes()):
                try:
                    last_cpu[(member.pid, member.create_time())] = cpu_seconds(member)
                    resident += member.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            peak = max(peak, resident)
            time.sleep(POLL_S)
    if process.returncode != 0:
        sys.exit(f"{' '.join(command[:3])} failed (exit {process.returncode}): {log_path.read_text()[-4000:]}")
    return {
        "wall_s": time.perf_counter() - wall_start,
        "cpu_s": sum(last_cpu.values()),
        "peak_gib": peak / 2**30,
        "load_start": load_start,
        "load_end": os.getloadavg()[0],
    }


def _tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _processes(pids: list[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    return found


def bigger_critic(base: pathlib.Path, layers_times: int, out: pathlib.Path) -> pathlib.Path:
    """The base model's config with ``layers_times`` its layers, randomly initialized, and its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(base)
    config.num_hidden_layers *= layers_times
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types * layers_times
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for path in base.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "chat_template")):
            shutil.copy(path, out / path.name)
    return out


def main_ppo(arguments: list[str], work: pathlib.Path, log_name: str, cluster: RayStartCluster) -> dict[str, float]:
    command = [sys.executable, "-m", "hybridflow.trainer.main_ppo", *arguments]
    return run_process(command, work / log_name, cluster)


def measured_step(run_dir: pathlib.Path, warmup: int) -> float:
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return statistics.mean(record["timing_s/step"] for record in steps[warmup:])


def bench_critic(
    base_args: list[str], critic: pathlib.Path, work: pathlib.Path, args: Any, cluster: RayStartCluster
) -> list[dict]:
    """Auto's ranking, then every ranked plan run, and the other splits of the colocated layout and of the chosen
    one; a row per plan."""
    common = base_args + [f"critic.model.path={critic}", f"trainer.total_training_steps={args.steps}"]
    plan_dir = work / "auto"
    auto = ["trainer.placement=auto", f"trainer.default_local_dir={plan_dir}", "--plan"]
    usage = main_ppo(common + auto, work, "auto.log", cluster)
    print(f"  auto ranked the plans in {usage['wall_s']:.0f} s (calibration included)", flush=True)
    record = json.loads((plan_dir / CHOICE_FILE).read_text())
    runs = [(str(rank), entry) for rank, entry in enumerate(record["ranked"], start=1)]
    runs += [("-", entry) for entry in other_splits(record)]
    rows = []
    for number, (rank, entry) in enumerate(runs, start=1):
        run_dir = work / f"plan{number}"
        print(f"  running {entry['plan']} for {args.steps} steps, load1 {os.getloadavg()[0]:.2f} ...", flush=True)
        usage = main_ppo(
            common + entry["overrides"] + [f"trainer.default_local_dir={run_dir}"], work, f"{number}.log", cluster
        )
        measured = measured_step(run_dir, args.warmup)
        rows.append({"plan": entry["plan"], "rank": rank, "predicted": entry["seconds"]["step"], "measured": measured})
        rows[-1].update(usage)
    return rows


def other_splits(record: dict) -> list[dict]:
    """The simulated plans of the colocated layout and of the chosen one in which each role takes one split where
    its pool offers it (data parallel where not; the rollout that tensor parallel size, else data parallel), per
    split offered, not ranked already."""
    colocated = next(entry["layout"] for entry in record["ranked"] if "/" not in entry["layout"])
    ranked = [entry["overrides"] for entry in record["ranked"]]
    picked = []
    for layout in dict.fromkeys([record["ranked"][0]["layout"], colocated]):
        plans = [entry for entry in record["plans"] if entry["layout"] == layout]
        offered = {owner: {entry["splits"][owner] for entry in plans} for owner in plans[0]["splits"]}
        for split in sorted(set().union(*offered.values()) - {"dp"}):
            wanted = {owner: split if _takes(owner, split, splits) else "dp" for owner, splits in offered.items()}
            picked += [entry for entry in plans if entry["splits"] == wanted and entry["overrides"] not in ranked]
    return picked


def _takes(owner: str, split: str, offered: set[str]) -> bool:
    return split in offered and (owner != GENERATION or split.startswith("tp"))


def print_rows(rows: list[dict]) -> None:
    fastest = min(row["measured"] for row in rows)
    width = max(len(row["plan"]) for row in rows) + 2
    print(
        f"  {'plan':<{width}}{'auto rank':>10}{'predicted s':>13}{'measured s':>12}{'pred/meas':>11}{'vs fastest':>12}"
        f"{'wall s':>8}{'CPU s':>8}{'peak GiB':>10}{'load1':>12}"
    )
    for row in rows:
        print(
            f"  {row['plan']:<{width}}{row['rank']:>10}{row['predicted']:>13.2f}{row['measured']:>12.2f}"
            f"{row['predicted'] / row['measured']:>11.2f}{row['measured'] / fastest:>12.2f}{row['wall_s']:>8.0f}"
            f"{row['cpu_s']:>8.0f}{row['peak_gib']:>10.2f}{row['load_start']:>6.1f}-{row['load_end']:.1f}"
        )
    chosen = rows[0]
    error = max(abs(row["predicted"] / row["measured"] - 1) for row in rows)
    print(
        f"  auto chose {chosen['plan']}: measured {chosen['measured']:.2f} s, {chosen['measured'] / fastest:.2f}x "
        f"the fastest measured (target <= 1.10); largest prediction error {100 * error:.0f}% (target <= 25%)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--critic_layers", default="1,4", help="comma-separated: the critic's layers over the actor's")
    parser.add_argument("--steps", type=int, default=6, help="training steps of each layout's run")
    parser.add_argument("--warmup", type=int, default=2, help="first steps left out of the measured mean")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, metrics)")
    args = parser.parse_args()
    with work_folder("bench_placement_", args.keep) as work:
        base = ensure_base_model()
        train, val = write_task(work / "data")
        demo = parse_args(["--algo", "ppo", "--steps", str(args.steps), "--test_freq", "-1", "--run_dir", str(work)])
        cluster = RayStartCluster(cpus_per_node=2)
        try:
            cluster.start_head()
            cluster.start_worker_node()
            base_args = overrides(demo, base, train, val) + CLUSTER + RUN + [f"ray_init.address={cluster.address}"]
            chosen = {}
            for layers in [int(value) for value in args.critic_layers.split(",")]:
                critic = base if layers == 1 else bigger_critic(base, layers, work / f"critic_x{layers}")
                print(f"\n== critic with {layers}x the actor's layers ({critic})", flush=True)
                (work / f"x{layers}").mkdir()
                rows = bench_critic(base_args, critic, work / f"x{layers}", args, cluster)
                print_rows(rows)
                chosen[layers] = rows[0]["plan"]
            print(f"\nauto's choice per critic size: {chosen}")
        finally:
            cluster.stop()


if __name__ == "__main__":
    main()
