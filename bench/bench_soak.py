"""Memory that neither grows nor surprises (issue 28, item 5): ``make demo``'s task trained for a set time in each
mode, the resources of every process of the run sampled as it goes.

Modes: ``local`` (every role in the driver's process, the demo as shipped), ``ray`` (the synchronous hybrid engine
on a local Ray cluster), ``one_step_off`` and ``fully_async`` (``bench_one_step_off``'s settings). Each runs
``python -m hybridflow.demo`` without validation or checkpoints (the epochs repeat) for ``--minutes``, and every
``--every`` seconds reads each process of the run's tree (the driver, Ray's own processes, each worker): resident
memory, open files, threads; and, where the run has a Ray cluster, the bytes in its object store (asked of the
raylet through Ray's internal API, the one ``ray memory --stats-only`` uses: there is no public one).

Reported per mode, from one run: the totals at every ``--report_steps``-th step reached; the resident memory's
growth per 1,000 steps, from a least-squares line over the samples after warm-up (the first quarter of the run
dropped), against the goal of under 1% of the warmed-up size; the processes whose memory grew most; the peak.
A PNG of each mode's resident memory over its steps goes to ``--out``.

Run: ``.venv/bin/python -m bench.bench_soak [--minutes 10] [--modes local,ray,one_step_off,fully_async]``
(``--minutes`` per mode; the issue's 2,000 steps took 11 minutes in local and Ray mode here, 21-24 in the two-pool
modes). ``--report soak.json`` reports a saved run again.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import pathlib
import shutil
import signal
import statistics
import subprocess
import sys
import time

import psutil

from bench.bench_one_step_off import FULLY_ASYNC, ONE_STEP_OFF
from bench.bench_time_to_accuracy import REPO_DIR
from bench.bench_vs_trl import child_env

RAY = ["trainer.local_mode=false", "trainer.cpus_per_worker=2", "ray_init.num_cpus=4"]
MODES = {"local": [], "ray": RAY, "one_step_off": ONE_STEP_OFF, "fully_async": FULLY_ASYNC}
# No validation or checkpoint in the run (the demo saves every test_freq steps), and epochs enough for any time
ENDLESS = [
    "--steps",
    "1000000",
    "--test_freq",
    "1000000",
    "trainer.val_before_train=false",
    "trainer.total_epochs=1000",
]
GOAL_PERCENT_PER_1000_STEPS = 1.0


@dataclasses.dataclass
class Sample:
    seconds: float
    step: int
    processes: dict[str, tuple[int, int, int]]  # role -> (resident bytes, open files, threads), summed
    object_store_bytes: int | None = None  # None: no Ray cluster (local mode), or not up yet

    def total(self, index: int) -> int:
        return sum(values[index] for values in self.processes.values())


def role(process: psutil.Process, root_pid: int) -> str:
    """The demo's launcher, the trainer's driver (``main_ppo``: every role's workers too in local mode), a Ray
    worker by its actor class (``ray::WorkerHost``), or the program's name (Ray's ``raylet``, ``gcs_server``)."""
    if process.pid == root_pid:
        return "demo launcher"
    if "hybridflow.trainer.main_ppo" in process.cmdline():
        return "driver"
    name = process.name()
    return name.split(".")[0] if name.startswith("ray::") else name


def read_tree(root: psutil.Process) -> dict[str, tuple[int, int, int]]:
    totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
    for process in [root, *root.children(recursive=True)]:
        try:
            with process.oneshot():
                values = (process.memory_info().rss, process.num_fds(), process.num_threads())
                key = role(process, root.pid)
        except psutil.Error:  # ended while read
            continue
        for index, value in enumerate(values):
            totals[key][index] += value
    return {key: (rss, fds, threads) for key, (rss, fds, threads) in totals.items()}


class ObjectStore:
    """The bytes in the object store of the Ray cluster started under ``root`` (found from its raylet's
    ``--gcs-address``)."""

    def __init__(self, root: psutil.Process):
        self.root, self.state = root, None

    def bytes_used(self) -> int | None:
        import grpc
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address

        if self.state is None:
            address = self.gcs_address()
            if address is None:
                return None
            self.state = get_state_from_address(address)
        try:
            return get_memory_info_reply(self.state, timeout_seconds=10).store_stats.object_store_bytes_used
        except grpc.RpcError:  # the cluster is starting or stopping
            return None

    def gcs_address(self) -> str | None:
        for process in self.root.children(recursive=True):
            try:
                if process.name() == "raylet":
                    return next(arg.split("=", 1)[1] for arg in process.cmdline() if arg.startswith("--gcs-address="))
            except (psutil.Error, StopIteration):
                continue
        return None


def steps_logged(run_dir: pathlib.Path) -> int:
    metrics = run_dir / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def soak(mode: str, minutes: float, every: float, out: pathlib.Path) -> list[Sample]:
    """Run ``mode`` for ``minutes`` and sample its process tree every ``every`` seconds."""
    run_dir = out / mode
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    command = [sys.executable, "-m", "hybridflow.demo", "--run_dir", str(run_dir), *ENDLESS, *MODES[mode]]
    with (out / f"{mode}.log").open("w") as log:
        process = subprocess.Popen(
            command, env=child_env(2), cwd=REPO_DIR, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    start, samples = time.monotonic(), []
    try:
        root = psutil.Process(process.pid)
        store = ObjectStore(root) if mode != "local" else None
        while time.monotonic() - start < minutes * 60 and process.poll() is None:
            tree, stored = read_tree(root), store.bytes_used() if store else None
            samples.append(Sample(time.monotonic() - start, steps_logged(run_dir), tree, stored))
            time.sleep(every)
    finally:
        stop(process)
    if process.returncode not in (None, 0, -signal.SIGTERM, -signal.SIGKILL):
        raise SystemExit(f"{mode}: the run stopped (exit {process.returncode}); see {out / f'{mode}.log'}")
    return samples


def stop(process: subprocess.Popen) -> None:
    """The run and everything it started (its session): SIGTERM, then SIGKILL after 20 s."""
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def growth(samples: list[Sample], window_steps: int) -> tuple[float, float]:
    """Resident bytes per 1,000 steps after warm-up, and the warmed-up size: a least-squares line through the
    median of each ``window_steps`` window (a sample lands anywhere in a step, whose phases differ by ~100 MiB, so
    single samples scatter), the first quarter of the windows dropped."""
    windows: dict[int, list[int]] = collections.defaultdict(list)
    for sample in samples:
        if sample.step > 0:
            windows[sample.step // window_steps].append(sample.total(0))
    medians = [(index * window_steps, statistics.median(values)) for index, values in sorted(windows.items())]
    warm = medians[len(medians) // 4 :]
    if len(warm) < 2:
        return float("nan"), float("nan")
    steps, rss = [step for step, _ in warm], [size for _, size in warm]
    mean_step, mean_rss = statistics.fmean(steps), statistics.fmean(rss)
    slope = sum((s - mean_step) * (r - mean_rss) for s, r in zip(steps, rss)) / sum((s - mean_step) ** 2 for s in steps)
    return 1000 * slope, mean_rss


def report(mode: str, samples: list[Sample], report_steps: int) -> str:
    lines = [f"{mode}: {samples[-1].step} steps in {samples[-1].seconds:.0f} s, {len(samples)} samples"]
    lines.append("  step  resident MiB  open files  threads  object store MiB")
    next_step = 0
    for sample in samples:
        if sample.step >= next_step:
            stored = "-" if sample.object_store_bytes is None else f"{sample.object_store_bytes / 2**20:.1f}"
            lines.append(
                f"  {sample.step:>4}  {sample.total(0) / 2**20:>12.0f}  {sample.total(1):>10}  {sample.total(2):>7}"
                f"  {stored:>16}"
            )
            next_step = (sample.step // report_steps + 1) * report_steps
    per_1000, size = growth(samples, report_steps)
    percent = 100 * per_1000 / size if size == size else float("nan")
    verdict = "meets" if percent < GOAL_PERCENT_PER_1000_STEPS else "misses"
    lines.append(
        f"  growth after warm-up: {per_1000 / 2**20:+.1f} MiB per 1,000 steps, {percent:+.2f}% of "
        f"{size / 2**20:.0f} MiB ({verdict} the goal of < {GOAL_PERCENT_PER_1000_STEPS}%)"
    )
    first, last = samples[len(samples) // 4].processes, samples[-1].processes
    grown = sorted(((last[key][0] - first.get(key, (0,))[0], key) for key in last), reverse=True)[:3]
    lines.append("  grew most: " + ", ".join(f"{key} {delta / 2**20:+.0f} MiB" for delta, key in grown))
    lines.append(f"  peak: {max(sample.total(0) for sample in samples) / 2**20:.0f} MiB resident")
    stored = [sample.object_store_bytes for sample in samples if sample.object_store_bytes is not None]
    if stored:
        lines.append(f"  object store: peak {max(stored) / 2**20:.1f} MiB, at the end {stored[-1] / 2**20:.1f} MiB")
    return "\n".join(lines)


def plot(runs: dict[str, list[Sample]], png: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for mode, samples in runs.items():
        axes.plot([s.step for s in samples], [s.total(0) / 2**20 for s in samples], label=mode)
    axes.set_xlabel("training step")
    axes.set_ylabel("resident memory of the run's processes (MiB)")
    axes.set_title("hybridflow soak: make demo's task")
    axes.legend()
    figure.tight_layout()
    figure.savefig(png, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {list(MODES)}")
    parser.add_argument("--minutes", type=float, default=10.0, help="run time per mode")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--report_steps", type=int, default=100, help="report the totals every N steps")
    parser.add_argument("--out", type=pathlib.Path, default=REPO_DIR / "outputs" / "soak")
    parser.add_argument("--report", type=pathlib.Path, help="report a soak.json again, running nothing")
    args = parser.parse_args(argv)
    if args.report:
        saved = json.loads(args.report.read_text())
        for mode, samples in saved.items():
            print(report(mode, [Sample(**sample) for sample in samples], args.report_steps))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    runs = {}
    for mode in args.modes.split(","):
        runs[mode] = soak(mode, args.minutes, args.every, args.out)
        print(report(mode, runs[mode], args.report_steps), flush=True)
    plot(runs, args.out / "soak.png")
    (args.out / "soak.json").write_text(json.dumps({m: [dataclasses.asdict(s) for s in r] for m, r in runs.items()}))
    print(f"load average at the end {os.getloadavg()[0]:.2f}; plot: {args.out / 'soak.png'}")


if __name__ == "__main__":
    main()
