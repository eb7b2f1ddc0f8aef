"""GRPO step throughput, hybridflow vs TRL's ``GRPOTrainer``, measured side by side in one run.

Both systems train the same ~4M-parameter Qwen2 (``build_tiny_model`` with hidden 256, 4 layers,
intermediate 1024) on the same synthetic arithmetic prompts (one parquet file; TRL reads its rows as a
``datasets.Dataset`` with chat-message prompts), scored by the same function: by default
``bench/dense_reward.py``, under which every prompt group carries signal (``--reward task``: the task's
own 0/1 score, under which most groups of an untrained model carry none). Matched settings: 16 prompts x 4
samples per step, at most 16 new tokens, temperature 1.0, no reference model or KL, one optimiser step per
step (one mini-batch, one epoch; the whole batch in one micro-batch, or ``--micro-batch`` samples per forward and
backward on both sides: TRL's ``per_device_train_batch_size`` with gradient accumulation, hybridflow's
``ppo_micro_batch_size_per_gpu``), token-mean loss, group-std advantages, lr 1e-6 constant, grad clip 1.0.

Two rows (``--precisions``): ``fp32`` (both in fp32), and ``bf16``: TRL with ``bf16=True`` (bf16 autocast
over fp32 weights), hybridflow with FSDP2 mixed precision ``param_dtype=bfloat16`` over fp32 master weights
and optimizer state, and a bf16 rollout engine.

Each system runs in its own process with ``OMP_NUM_THREADS=--threads`` and ``OMP_WAIT_POLICY=PASSIVE``.
TRL trains in that one process with ``--threads`` torch threads. hybridflow runs ``main_ppo``'s driver in
that process with ``trainer.local_mode=true`` (its workers in the same process, as TRL, with
``trainer.cpus_per_worker=--threads`` torch threads), or with ``--ray`` over one Ray worker process given
those threads, on a local Ray cluster of ``--threads`` CPUs.

Per system: the median wall seconds of a step over the steps after ``--warmup`` (start-up such as Ray
init and model loading is never inside a step), samples/s and generated tokens/s over those steps, CPU
seconds per step of the whole process tree (with ``--ray``: driver, Ray worker and Ray's own daemons;
the main process's share on its own line), the share of zero-signal prompt groups (all samples scored
the same, so their advantages are 0), and the 1-minute load average when the measured steps start and end.
Phase times come from TRL (``model.generate``; generate + score) and from hybridflow's ``timing_s/*`` metrics.
With ``--repeats``, the systems alternate within each row, and the median ratios over the repeats are printed per
row.
Run: ``.venv/bin/python -m bench.bench_vs_trl [--steps 12] [--repeats 3] [--precisions fp32,bf16] [--ray]``
(needs ``pip install -c constraints.txt 'hybridflow[bench]'`` for TRL).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

REPO_DIR = pathlib.Path(__file__).resolve().parent.parent
MODEL_SIZE = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 1024,
}
PROMPTS_PER_STEP, SAMPLES_PER_PROMPT, MAX_NEW_TOKENS = 16, 4, 16
SYSTEMS = ("trl", "hybridflow")
PRECISIONS = ("fp32", "bf16")
REWARDS = ("dense", "task")


def precision_overrides(precision: str) -> list[str]:
    """hybridflow's keys for a row: fp32 throughout, or bf16 compute over fp32 weights and a bf16 rollout."""
    if precision == "fp32":
        return [
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=float32",
            "actor_rollout_ref.rollout.dtype=float32",
        ]
    return [
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bfloat16",
        "actor_rollout_ref.rollout.dtype=bfloat16",
    ]


def placement_overrides(spec: dict[str, Any]) -> list[str]:
    """The driver's workers in its own process, or (``--ray``) one Ray worker on a local cluster."""
    if not spec["ray"]:
        return ["trainer.local_mode=true"]
    return [f"ray_init.num_cpus={spec['threads']}", f"ray_init.temp_dir={spec['ray_temp_dir']}"]


def cpu_seconds(process: psutil.Process) -> float:
    try:
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return times.user + times.system


def process_tree_cpu_seconds() -> tuple[float, float]:
    """User + system CPU seconds of this process and of it plus all its live descendants."""
    root = psutil.Process()
    own = cpu_seconds(root)
    return own, own + sum(cpu_seconds(child) for child in root.children(recursive=True))


class StepRecorder:
    """Wall clock, process-tree CPU seconds and 1-minute load average at the start and at each step end."""

    def __init__(self) -> None:
        self.start_mark: dict[str, Any] | None = None
        self.marks: list[dict[str, Any]] = []

    @staticmethod
    def _now() -> dict[str, Any]:
        own_cpu, tree_cpu = process_tree_cpu_seconds()
        return {"wall": time.perf_counter(), "cpu": tree_cpu, "own_cpu": own_cpu, "load1": os.getloadavg()[0]}

    def start(self) -> None:
        self.start_mark = self._now()

    def mark(self, **extra: Any) -> None:
        self.marks.append({**self._now(), **extra})


# ------------------------------------------------------------------------------------ hybridflow side
def hybridflow_overrides(spec: dict[str, Any]) -> list[str]:
    """``main_ppo`` command-line overrides matching the TRL settings (see the module docstring)."""
    return [
        f"data.train_files={spec['train_file']}",
        "data.val_files=null",
        f"data.train_batch_size={PROMPTS_PER_STEP}",
        f"data.max_prompt_length={spec['max_prompt_length']}",
        f"data.max_response_length={spec['max_new_tokens']}",
        f"data.seed={spec['seed']}",
        f"actor_rollout_ref.model.path={spec['model_dir']}",
        "actor_rollout_ref.model.dtype=float32",
        *precision_overrides(spec["precision"]),
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS_PER_STEP}",
        "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.actor.clip_ratio={spec['clip_ratio']}",
        f"actor_rollout_ref.actor.grad_clip={spec['grad_clip']}",
        f"actor_rollout_ref.actor.optim.lr={spec['lr']}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.warmup_style=constant",
        f"actor_rollout_ref.rollout.n={SAMPLES_PER_PROMPT}",
        f"actor_rollout_ref.rollout.temperature={spec['temperature']}",
        "actor_rollout_ref.rollout.top_p=1.0",
        "actor_rollout_ref.rollout.top_k=-1",
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=true",
        "algorithm.use_kl_in_reward=false",
        f"trainer.total_training_steps={spec['total_steps']}",
        "trainer.total_epochs=1",
        "trainer.logger=[jsonl]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.nnodes=1",
        "trainer.n_gpus_per_node=1",
        f"trainer.cpus_per_worker={spec['threads']}",
        f"trainer.default_local_dir={spec['hybridflow_run_dir']}",
        *placement_overrides(spec),
        *(
            [f"custom_reward_function.path={REPO_DIR / 'bench' / 'dense_reward.py'}"]
            if spec["reward"] == "dense"
            else []
        ),
        *(["actor_rollout_ref.rollout.ignore_eos=true"] if spec["fixed_lengths"] else []),
        *micro_batch_overrides(spec),
        *spec["hybridflow_extra_overrides"],
    ]


def micro_batch_overrides(spec: dict[str, Any]) -> list[str]:
    if not spec["micro_batch"]:
        return []
    return [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={spec['micro_batch']}"]


class StepEndHook:
    """A ``hybridflow.trainer.hooks.StepHook`` that marks the recorder after every step."""

    def __init__(self, recorder: StepRecorder):
        self.recorder = recorder

    def after_step(self, global_step: int, batch: Any, metrics: dict[str, float]) -> None:
        phases = {key.removeprefix("timing_s/"): value for key, value in metrics.items() if key.startswith("timing_s/")}
        self.recorder.mark(
            tokens=int(batch.batch["response_mask"].sum()), phases=phases, zero_signal=zero_signal_share(batch)
        )


def zero_signal_share(batch: Any) -> float:
    """Share of prompt groups (same ``uid``) whose samples all have the same sequence score."""
    scores = batch.batch["token_level_scores"].sum(dim=-1).tolist()
    groups: dict[Any, list[float]] = {}
    for uid, score in zip(batch.non_tensor_batch["uid"], scores):
        groups.setdefault(uid, []).append(score)
    return sum(max(group) == min(group) for group in groups.values()) / len(groups)


def run_hybridflow(spec: dict[str, Any]) -> dict[str, Any]:
    """hybridflow's GRPO driver in this process, as ``main_ppo.run_ppo`` runs it, with a timing hook."""
    import ray
    import torch
    from hydra import compose, initialize_config_module

    from hybridflow.config.load import load_config
    from hybridflow.distributed import init_local_ray
    from hybridflow.trainer.main_ppo import build_trainer

    torch.set_num_threads(spec["threads"])
    setup_start = time.perf_counter()
    with initialize_config_module("hybridflow.config.yaml", version_base=None):
        config = load_config(compose("ppo_trainer", overrides=hybridflow_overrides(spec)))
    trainer = build_trainer(config)
    if spec["ray"]:
        ray_config = config.ray_init
        init_local_ray(
            num_cpus=ray_config.num_cpus,
            object_store_memory=ray_config.object_store_memory,
            temp_dir=ray_config.temp_dir,
        )
    recorder = StepRecorder()
    try:
        trainer.init_workers()
        trainer.hooks.append(StepEndHook(recorder))
        setup_s = time.perf_counter() - setup_start
        recorder.start()
        trainer.fit()
    finally:
        trainer.shutdown()
        if spec["ray"]:
            ray.shutdown()
    return {
        "setup_s": setup_s,
        "start": recorder.start_mark,
        "steps": recorder.marks,
        "settings": {
            "overrides": hybridflow_overrides(spec),
            # Each worker's group sets OMP_NUM_THREADS=int(cpus_per_worker); the worker sets torch's from it.
            "worker_torch_threads": int(config.trainer.cpus_per_worker),
            "driver_torch_threads": torch.get_num_threads(),
        },
    }


# -------------------------------------------------------------------------------------------- set-up
def prepare_inputs(
    work_dir: pathlib.Path,
    args: argparse.Namespace,
    model_size: dict[str, int] = MODEL_SIZE,
    max_new_tokens: int = MAX_NEW_TOKENS,
    fixed_lengths: bool = False,
) -> dict[str, Any]:
    """Build the model (Qwen2 of ``model_size``) and the prompt parquet once; returns the spec both sides read.
    ``fixed_lengths``: both sides decode ``max_new_tokens`` for every sample (no stop at EOS), the same work,
    and both train on each sample up to its first EOS, as a run whose generation stopped there would."""
    from hybridflow.data.parquet_io import write_parquet_rows
    from hybridflow.data.synthetic import arithmetic_problems, to_verl_rows
    from hybridflow.models.loading import load_tokenizer
    from hybridflow.models.tiny import build_tiny_model
    from hybridflow.trainer.perf import count_parameters

    total_steps = args.warmup + args.steps
    model_dir = build_tiny_model(work_dir / "model", seed=0, **model_size)
    rows = to_verl_rows(
        arithmetic_problems(PROMPTS_PER_STEP * total_steps, seed=args.seed), "arithmetic", "math", "train"
    )
    train_file = write_parquet_rows(rows, work_dir / "train.parquet")
    tokenizer = load_tokenizer(model_dir)
    texts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]
    prompt_lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    return {
        "model_dir": str(model_dir),
        "train_file": str(train_file),
        "max_prompt_length": max(prompt_lengths),
        "mean_prompt_length": statistics.mean(prompt_lengths),
        "total_steps": total_steps,
        "prompts_per_step": PROMPTS_PER_STEP,
        "samples_per_prompt": SAMPLES_PER_PROMPT,
        "max_new_tokens": max_new_tokens,
        "model_size": model_size,
        "fixed_lengths": fixed_lengths,
        "vocab_size": len(tokenizer),
        "temperature": 1.0,
        "lr": 1e-6,
        "clip_ratio": 0.2,
        "grad_clip": 1.0,
        "seed": args.seed,
        "threads": args.threads,
        "hybridflow_extra_overrides": args.override,
        "micro_batch": args.micro_batch,
        "num_parameters": count_parameters(model_dir),
        "reward": args.reward,
        "ray": args.ray,
    }


def child_env(threads: int) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "OMP_WAIT_POLICY": "PASSIVE",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": str(REPO_DIR),
    }


def launch(system: str, spec: dict[str, Any], run_dir: pathlib.Path) -> dict[str, Any]:
    """Run one system in a fresh process; returns what it wrote (step marks, settings)."""
    run_dir.mkdir(parents=True)
    ray_temp_dir = tempfile.mkdtemp(prefix="hfbench", dir="/tmp")  # Ray's socket paths must stay short
    spec = {
        **spec,
        "trl_output_dir": str(run_dir / "trl"),
        "hybridflow_run_dir": str(run_dir / "hybridflow"),
        "ray_temp_dir": ray_temp_dir,
    }
    spec_path, out_path = run_dir / "spec.json", run_dir / "result.json"
    spec_path.write_text(json.dumps(spec))
    module = ["bench.trl_side"] if system == "trl" else ["bench.bench_vs_trl", "--child", "hybridflow"]
    log_path = run_dir / "output.log"
    try:
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", *module, str(spec_path), str(out_path)],
                cwd=REPO_DIR,
                env=child_env(spec["threads"]),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            # The child's own rusage: its peak resident memory (with --ray, not that of its Ray worker).
            _, status, usage = os.wait4(process.pid, 0)
            process.returncode = os.waitstatus_to_exitcode(status)
    finally:
        shutil.rmtree(ray_temp_dir, ignore_errors=True)
    if process.returncode != 0:
        sys.exit(f"{system} run failed (exit {process.returncode}):\n{log_path.read_text()[-6000:]}")
    return {**json.loads(out_path.read_text()), "peak_rss_gib": usage.ru_maxrss / 2**20}


# ------------------------------------------------------------------------------------------ analysis
# hybridflow's phases nested inside another phase (the weight sync happens inside generation).
NESTED_PHASES = ("step", "update_weights")


def with_remainder(phases: dict[str, float], wall: float) -> dict[str, float]:
    """The step's phases plus the time outside them: for TRL everything after generate-and-score (the loss,
    backward and optimiser step), for hybridflow the driver's work outside its timed phases."""
    if "generate_and_score" in phases:
        return {**phases, "rest_of_step": wall - phases["generate_and_score"]}
    return {**phases, "outside_phases": wall - sum(v for k, v in phases.items() if k not in NESTED_PHASES)}


def summarize(result: dict[str, Any], warmup: int) -> dict[str, Any]:
    """Per-step deltas between consecutive marks, reduced over the steps after ``warmup``."""
    marks = [result["start"], *result["steps"]]
    steps = [
        {
            "wall": after["wall"] - before["wall"],
            "cpu": after["cpu"] - before["cpu"],
            "own_cpu": after["own_cpu"] - before["own_cpu"],
            "tokens": after["tokens"],
            "phases": with_remainder(after["phases"], after["wall"] - before["wall"]),
            "zero_signal": after["zero_signal"],
        }
        for before, after in zip(marks, marks[1:])
    ]
    measured = steps[warmup:]
    if not measured:
        raise ValueError(f"no steps left after {warmup} warm-up steps; pass --steps >= 1")
    walls = [step["wall"] for step in measured]
    samples = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    phase_names = sorted({name for step in measured for name in step["phases"]})
    return {
        "s_per_step": statistics.median(walls),
        "s_min": min(walls),
        "s_max": max(walls),
        "samples_per_s": samples / statistics.median(walls),
        "tokens_per_s": sum(step["tokens"] for step in measured) / sum(walls),
        "mean_response_tokens": statistics.mean(step["tokens"] for step in measured) / samples,
        "zero_signal_pct": 100 * statistics.mean(step["zero_signal"] for step in measured),
        "cpu_s_per_step": statistics.median(step["cpu"] for step in measured),
        "own_cpu_s_per_step": statistics.median(step["own_cpu"] for step in measured),
        "load_start": marks[warmup]["load1"],
        "load_end": marks[-1]["load1"],
        "setup_s": result["setup_s"],
        "phases": {name: statistics.median(step["phases"].get(name, 0.0) for step in measured) for name in phase_names},
        "steps_measured": len(measured),
        "peak_rss_gib": result["peak_rss_gib"],
    }


ROWS = (
    ("s/step (median)", "s_per_step", "{:.3f}"),
    ("s/step min..max", None, None),
    ("samples/s", "samples_per_s", "{:.1f}"),
    ("generated tokens/s", "tokens_per_s", "{:.0f}"),
    ("mean response tokens", "mean_response_tokens", "{:.1f}"),
    ("zero-signal groups %", "zero_signal_pct", "{:.0f}"),
    ("CPU s/step (process tree)", "cpu_s_per_step", "{:.3f}"),
    ("  of which the main process", "own_cpu_s_per_step", "{:.3f}"),
    ("load1 at start", "load_start", "{:.2f}"),
    ("load1 at end", "load_end", "{:.2f}"),
    ("start-up s (not in steps)", "setup_s", "{:.1f}"),
    ("peak RSS GiB (main process)", "peak_rss_gib", "{:.2f}"),
)


def print_table(summaries: dict[str, dict[str, Any]]) -> None:
    systems = list(summaries)
    print(f"{'':<28}" + "".join(f"{system:>14}" for system in systems))
    for label, key, fmt in ROWS:
        if key is None:
            cells = [f"{s['s_min']:.3f}..{s['s_max']:.3f}" for s in summaries.values()]
        else:
            cells = [fmt.format(s[key]) for s in summaries.values()]
        print(f"{label:<28}" + "".join(f"{cell:>14}" for cell in cells))
    if set(systems) == set(SYSTEMS):
        trl, ours = summaries["trl"], summaries["hybridflow"]
        print(f"{'speed-up (TRL s/step / hybridflow s/step)':<44}{trl['s_per_step'] / ours['s_per_step']:.2f}x")
        print(f"{'CPU ratio (TRL CPU s / hybridflow CPU s)':<44}{trl['cpu_s_per_step'] / ours['cpu_s_per_step']:.2f}x")
    for system, summary in summaries.items():
        phases = ", ".join(f"{name} {seconds:.3f}" for name, seconds in summary["phases"].items())
        print(f"  {system} phases (median s): {phases}")


def print_settings(spec: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
    print("== Settings (shared)")
    shared = {
        key: spec[key]
        for key in (
            "num_parameters",
            "prompts_per_step",
            "samples_per_prompt",
            "max_new_tokens",
            "temperature",
            "lr",
            "clip_ratio",
            "grad_clip",
            "seed",
            "threads",
            "max_prompt_length",
            "mean_prompt_length",
            "total_steps",
            "micro_batch",
        )
    }
    print("  " + json.dumps(shared))
    reward = "bench/dense_reward.py" if spec["reward"] == "dense" else "default_compute_score"
    print(
        f"  model: Qwen2 {json.dumps(spec['model_size'])}, vocab 263, fp32 weights, sdpa; task: arithmetic, "
        f"reward: {reward}"
    )
    print(
        f"  hybridflow's workers: {'one Ray worker process' if spec['ray'] else 'in its driver process (local mode)'}"
    )
    print(
        f"  env of both processes: OMP_NUM_THREADS={spec['threads']} OMP_WAIT_POLICY=PASSIVE; "
        f"machine: {os.cpu_count()} CPUs"
    )
    for system, result in results.items():
        print(f"== Settings ({system})")
        for key, value in result["settings"].items():
            print(f"  {key}: {' '.join(value) if key == 'overrides' else value}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12, help="measured steps per run (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="steps run but not measured")
    parser.add_argument("--only", choices=SYSTEMS, help="run one system only")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each system's compute process")
    parser.add_argument("--repeats", type=int, default=1, help="alternate the systems this many times (busy machines)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--precisions", default="fp32,bf16", help="rows to measure, comma-separated: fp32, bf16")
    parser.add_argument(
        "--reward",
        choices=REWARDS,
        default="dense",
        help="dense: every group carries signal (default); task: the arithmetic task's 0/1 score",
    )
    parser.add_argument(
        "--micro-batch",
        type=int,
        help="samples per forward and backward of the update on both sides (default: the whole batch at once)",
    )
    parser.add_argument("--ray", action="store_true", help="hybridflow's workers on Ray, not in its driver process")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra main_ppo override for the hybridflow side, applied last (repeatable; for profiling)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder (model, parquet, run outputs)")
    parser.add_argument("--child", choices=["hybridflow"], help=argparse.SUPPRESS)
    parser.add_argument("child_args", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec_path, out_path = args.child_args
        result = run_hybridflow(json.loads(pathlib.Path(spec_path).read_text()))
        pathlib.Path(out_path).write_text(json.dumps(result))
        return
    check_micro_batch(args.micro_batch)
    if args.only != "hybridflow" and importlib.util.find_spec("trl") is None:
        sys.exit("TRL is not installed: pip install -c constraints.txt 'hybridflow[bench]', or pass --only hybridflow")
    work_dir = pathlib.Path(tempfile.mkdtemp(prefix="bench_vs_trl_"))
    try:
        run_all(args, work_dir)
    finally:
        if args.keep:
            print(f"work folder kept: {work_dir}")
        else:
            shutil.rmtree(work_dir, ignore_errors=True)


def check_micro_batch(micro_batch: int | None) -> None:
    samples = PROMPTS_PER_STEP * SAMPLES_PER_PROMPT
    if micro_batch is not None and (micro_batch < 1 or samples % micro_batch):
        sys.exit(f"--micro-batch {micro_batch}: must divide the step's {samples} samples")


def checked_precisions(text: str) -> list[str]:
    """``--precisions``' comma-separated names; exits naming any unknown one."""
    precisions = [name.strip() for name in text.split(",")]
    unknown = [name for name in precisions if name not in PRECISIONS]
    if unknown:
        sys.exit(f"--precisions {text!r}: {unknown} unknown; choose from {list(PRECISIONS)}")
    return precisions


def run_all(args: argparse.Namespace, work_dir: pathlib.Path) -> None:
    spec = prepare_inputs(work_dir, args)
    systems = [args.only] if args.only else list(SYSTEMS)
    precisions = checked_precisions(args.precisions)
    # runs[precision][repeat] = {system: summary}; the systems alternate within each repeat.
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {precision: [] for precision in precisions}
    results: dict[str, dict[str, Any]] = {}
    for repeat in range(args.repeats):
        for precision in precisions:
            summaries = {}
            for system in systems:
                print(
                    f"running {system} {precision} (repeat {repeat + 1}/{args.repeats}), "
                    f"load1 {os.getloadavg()[0]:.2f} ...",
                    flush=True,
                )
                run_dir = work_dir / f"run{repeat}_{precision}_{system}"
                results[system] = launch(system, {**spec, "precision": precision}, run_dir)
                summaries[system] = summarize(results[system], args.warmup)
            runs[precision].append(summaries)
    print()
    print_settings(spec, results)
    for precision, repeats in runs.items():
        for repeat, summaries in enumerate(repeats):
            print(f"\n== {precision}, repeat {repeat + 1}: {args.steps} measured steps after {args.warmup} warm-up")
            print_table(summaries)
    if len(systems) == 2:
        print(f"\n== Speed-up of hybridflow over TRL, median over {args.repeats} repeat(s) (target >= 2x)")
        for precision, repeats in runs.items():
            cells = []
            for label, key in (("wall", "s_per_step"), ("CPU-seconds", "cpu_s_per_step")):
                ratios = [summaries["trl"][key] / summaries["hybridflow"][key] for summaries in repeats]
                cells.append(f"{label} {statistics.median(ratios):.2f}x ({min(ratios):.2f}x..{max(ratios):.2f}x)")
            loads = [
                summaries[system][mark]
                for summaries in repeats
                for system in systems
                for mark in ("load_start", "load_end")
            ]
            print(f"  {precision}: " + ", ".join(cells) + f"; load1 {min(loads):.2f}..{max(loads):.2f}")


if __name__ == "__main__":
    main()
