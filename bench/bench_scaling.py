"""GRPO at the sizes users train: hybridflow vs TRL's ``GRPOTrainer`` over a grid of model sizes x answer lengths,
side by side in one run (issue 27).

Each grid point is ``bench_vs_trl``'s matched setting (16 prompts x 4 samples, one optimizer step a step, fp32 or
bf16 rows, hybridflow in local mode, each system in its own process with ``--threads`` torch threads, the systems
alternating) with the model and the answer length changed: Qwen2-shaped random models of ~4M, ~30M and ~100M
parameters, and answers decoded to exactly 16, 128 or 512 tokens on both sides (``rollout.ignore_eos`` here,
an end-of-sequence id no logit gives in TRL), so both generate the same work whatever the untrained model
samples; both train on each answer up to its first EOS (TRL's mask and hybridflow's), as a run whose generation
stopped there would. TRL's update then computes the batch padded to its longest answer, hybridflow's the real
tokens.

Per point and side: wall s/step and CPU-seconds/step (medians over the measured steps), peak resident memory of
the side's process, generated tokens/s; the update's achieved FLOP/s (6 x parameters x the step's tokens, prompt
and answer, over the update's seconds: hybridflow's ``update_actor`` phase, TRL's time after generate-and-score)
against this CPU's matmul peak (the same work on both sides: the FLOPs of every sample's whole sequence, so
hybridflow's shared prompts, computed once per group, and its packed answers can read above 100%), and the
generation's seconds against its bound: per decoded token the larger of reading every weight once at the
measured memory bandwidth and the batch's matmuls at the peak, plus the prompts' prefill at the peak. The matmul
peak (square matmuls of 2048) and the bandwidth (a 512 MiB copy) are measured in the same run, with the same
threads. A point whose run fails (out of memory, say) is reported as such.

Both sides run the update in micro-batches of ``--micro-batch`` samples (default 8, TRL's default
``per_device_train_batch_size``; 0: the whole batch at once): the whole batch's activations cost both sides about
3x the memory and 20-40% more time at 30M x 128 tokens.

Run: ``.venv/bin/python -m bench.bench_scaling [--models 4M,30M,100M] [--lengths 16,128,512]
[--precisions fp32,bf16] [--steps 3] [--long-steps 1] [--plot docs/images/scaling.png]``; points of 512 tokens or
100M parameters measure ``--long-steps`` steps (after one warm-up step).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from bench.bench_vs_trl import (
    PRECISIONS,
    SYSTEMS,
    check_micro_batch,
    checked_precisions,
    child_env,
    launch,
    prepare_inputs,
    summarize,
)

MODELS = {
    "4M": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
           "intermediate_size": 1024},
    "30M": {"hidden_size": 512, "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4,
            "intermediate_size": 2048},
    "100M": {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 8,
             "intermediate_size": 3072},
}  # fmt: skip
LENGTHS = (16, 128, 512)
LONG_LENGTH, LONG_MODEL = 512, "100M"
PEAKS_SCRIPT = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
def best(run, repeats=5):
    times = []
    for _ in range(repeats):
        start = time.perf_counter(); run(); times.append(time.perf_counter() - start)
    return min(times)
n, out = 2048, {}
for name in sys.argv[2].split(","):
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    out[name] = 2 * n**3 / best(lambda: a @ b) / 1e9
source = torch.ones(2**27)  # 512 MiB of float32
target = torch.empty_like(source)
target.copy_(source)
out["bandwidth_gb_s"] = 2 * source.numel() * 4 / best(lambda: target.copy_(source)) / 1e9
print(json.dumps(out))
"""


def measure_peaks(threads: int, precisions: list[str]) -> dict[str, float]:
    """GFLOP/s of matmuls in each of ``precisions`` and the copy bandwidth (GB/s, read + write), in a process like
    the sides'. Only the precisions the grid runs: on a CPU without native bf16 its matmuls take minutes."""
    done = subprocess.run(
        [sys.executable, "-c", PEAKS_SCRIPT, str(threads), ",".join(precisions)],
        env=child_env(threads),
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.splitlines()[-1])


def point_spec(work_dir: pathlib.Path, args: argparse.Namespace, model: str, length: int) -> dict[str, Any]:
    long = length >= LONG_LENGTH or model == LONG_MODEL
    steps = args.long_steps if long else args.steps
    point_args = argparse.Namespace(**{**vars(args), "steps": steps, "warmup": 1, "override": []})
    return prepare_inputs(work_dir, point_args, MODELS[model], length, fixed_lengths=True)


def work_rates(spec: dict[str, Any], summary: dict[str, Any], system: str, peaks: dict[str, float]) -> dict:
    """The update's GFLOP/s and share of the matmul peak; the generation's seconds over its bound."""
    params, samples = spec["num_parameters"], spec["prompts_per_step"] * spec["samples_per_prompt"]
    length, prompt = spec["max_new_tokens"], spec["mean_prompt_length"]
    phases = summary["phases"]
    update_s = phases.get("update_actor") if system == "hybridflow" else phases.get("rest_of_step")
    generate_s = phases.get("gen") if system == "hybridflow" else phases.get("generate")
    peak = peaks[summary["precision"]] * 1e9
    weight_bytes = params * (2 if summary["precision"] == "bf16" else 4)
    per_token = max(weight_bytes / (peaks["bandwidth_gb_s"] * 1e9), 2 * params * samples / peak)
    bound_s = length * per_token + 2 * params * spec["prompts_per_step"] * prompt / peak
    update_flops = 6 * params * samples * (prompt + length)
    return {
        "update_gflops": update_flops / update_s / 1e9 if update_s else None,
        "update_peak_pct": 100 * update_flops / update_s / peak if update_s else None,
        "generate_s": generate_s,
        "generate_bound_s": bound_s,
    }


def run_point(work_dir: pathlib.Path, args, model: str, length: int, precision: str, peaks) -> dict[str, Any]:
    """Both systems at one point, alternating ``--repeats`` times; the medians of their summaries."""
    spec = point_spec(work_dir, args, model, length)
    runs: dict[str, list[dict[str, Any]]] = {system: [] for system in SYSTEMS}
    for repeat in range(args.repeats):
        for system in SYSTEMS if repeat % 2 == 0 else reversed(SYSTEMS):
            try:
                result = launch(system, {**spec, "precision": precision}, work_dir / f"{precision}_{system}{repeat}")
            except SystemExit as failure:
                return {"model": model, "length": length, "precision": precision, "failed": f"{system}: {failure}"}
            summary = {**summarize(result, 1), "precision": precision}
            runs[system].append({**summary, **work_rates(spec, summary, system, peaks)})
    point = {"model": model, "length": length, "precision": precision, "parameters": spec["num_parameters"]}
    for system, summaries in runs.items():
        point[system] = {key: _median([s[key] for s in summaries]) for key in summaries[0] if key != "phases"}
    return point


def _median(values: list) -> Any:
    numbers = [value for value in values if isinstance(value, (int, float))]
    return statistics.median(numbers) if len(numbers) == len(values) else values[0]


def print_header(peaks: dict[str, float], started: str, micro_batch: int | None) -> None:
    matmul_peaks = ", ".join(f"{peaks[name]:.0f} GFLOP/s {name}" for name in PRECISIONS if name in peaks)
    print(
        f"\n{started}, {os.cpu_count()} CPUs; matmul peak {matmul_peaks}; copy bandwidth "
        f"{peaks['bandwidth_gb_s']:.1f} GB/s; update micro-batch {micro_batch or 'whole batch'}; "
        "steps: measured steps per side, after 1 warm-up"
    )
    print(
        "| model | answer | dtype | TRL s/step | ours s/step | wall x | CPU x | peak GiB TRL / ours | tokens/s ours | "
        "update % of peak TRL / ours | generation / bound TRL / ours | steps | load1 |"
    )
    print("|---" * 13 + "|", flush=True)


def print_row(point: dict[str, Any]) -> None:
    head = f"| {point['model']} | {point['length']} | {point['precision']} "
    if "failed" in point:
        print(head + f"| did not run: {point['failed'][:80]} |" + " |" * 10, flush=True)
        return
    trl, ours = point["trl"], point["hybridflow"]
    print(
        head + f"| {trl['s_per_step']:.1f} | {ours['s_per_step']:.1f} "
        f"| {trl['s_per_step'] / ours['s_per_step']:.2f} | {trl['cpu_s_per_step'] / ours['cpu_s_per_step']:.2f} "
        f"| {trl['peak_rss_gib']:.2f} / {ours['peak_rss_gib']:.2f} | {ours['tokens_per_s']:.0f} "
        f"| {_pct(trl['update_peak_pct'])} / {_pct(ours['update_peak_pct'])} "
        f"| {_ratio(trl)} / {_ratio(ours)} | {ours['steps_measured']} "
        f"| {ours['load_start']:.1f}-{ours['load_end']:.1f} |",
        flush=True,
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _ratio(side: dict[str, Any]) -> str:
    return "-" if not side["generate_s"] else f"{side['generate_s'] / side['generate_bound_s']:.1f}x"


def plot(points: list[dict[str, Any]], path: pathlib.Path) -> None:
    """Wall and CPU ratios (TRL / hybridflow) over the grid, one panel per precision and ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    precisions = sorted({point["precision"] for point in points})
    models = [model for model in MODELS if any(point["model"] == model for point in points)]
    lengths = sorted({point["length"] for point in points})
    figure, axes = plt.subplots(len(precisions), 2, figsize=(9, 3.6 * len(precisions)), squeeze=False)
    for row, precision in enumerate(precisions):
        for column, (label, key) in enumerate((("wall", "s_per_step"), ("CPU-seconds", "cpu_s_per_step"))):
            grid = [[float("nan")] * len(lengths) for _ in models]
            for point in points:
                if point["precision"] == precision and "failed" not in point:
                    ratio = point["trl"][key] / point["hybridflow"][key]
                    grid[models.index(point["model"])][lengths.index(point["length"])] = ratio
            axis = axes[row][column]
            axis.imshow(grid, cmap="RdYlGn", vmin=1, vmax=3)
            for i, values in enumerate(grid):
                for j, value in enumerate(values):
                    axis.text(j, i, "-" if value != value else f"{value:.2f}x", ha="center", va="center")
            axis.set_xticks(range(len(lengths)), [f"{length} tokens" for length in lengths])
            axis.set_yticks(range(len(models)), models)
            axis.set_title(f"{precision}: TRL / hybridflow, {label} (goal >= 2x)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {list(MODELS)}")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="answer lengths, comma-separated")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--steps", type=int, default=3, help="measured steps of a point (after 1 warm-up step)")
    parser.add_argument("--long-steps", type=int, default=1, help=f"measured steps at {LONG_LENGTH} tokens or 100M")
    parser.add_argument("--repeats", type=int, default=1, help="alternate the systems this many times per point")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--micro-batch",
        type=int,
        default=8,
        help="samples per forward and backward of the update, on both sides (0: the whole batch at once)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plot", type=pathlib.Path, help="write the ratios' PNG here")
    parser.add_argument("--json", type=pathlib.Path, help="write every point's numbers here")
    args = parser.parse_args()
    args.reward, args.ray, args.micro_batch = "dense", False, args.micro_batch or None
    check_micro_batch(args.micro_batch)
    unknown = [model for model in args.models.split(",") if model not in MODELS]
    if unknown:
        sys.exit(f"--models: {unknown} unknown; choose from {list(MODELS)}")
    precisions = checked_precisions(args.precisions)
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    peaks = measure_peaks(args.threads, precisions)
    print_header(peaks, started, args.micro_batch)
    work_dir = pathlib.Path(tempfile.mkdtemp(prefix="bench_scaling_"))
    points = []
    try:
        for model in args.models.split(","):
            for length in map(int, args.lengths.split(",")):
                for precision in precisions:
                    point_dir = work_dir / f"{model}_{length}"
                    shutil.rmtree(point_dir, ignore_errors=True)
                    point_dir.mkdir()
                    points.append(run_point(point_dir, args, model, length, precision, peaks))
                    print_row(points[-1])
                    if args.json:  # after every point: a long grid cut short keeps what it measured
                        args.json.write_text(json.dumps({"peaks": peaks, "started": started, "points": points}))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    if args.plot:
        plot(points, args.plot)


if __name__ == "__main__":
    main()
