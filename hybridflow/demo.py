"""`make demo`: GRPO on a laptop CPU that visibly learns, with no network.

    python -m hybridflow.demo [--seed 0] [--steps 150] [--algo grpo|ppo] [--reward rule|judge]
                              [--run_dir outputs/demo-seed0]

1. The base model: a tiny Qwen2 SFT-ed to answer sorting prompts in the right format but often wrongly
   (``examples/tiny_base_model/model``, built by ``examples/tiny_base_model/build.py`` when missing).
2. The task: "sort four digits", written as verl-schema parquet (``examples/data_preprocess/sorting.py``).
3. GRPO (or, with ``--algo ppo``, PPO with a critic and GAE) through the same entry point a user runs,
   ``python -m hybridflow.trainer.main_ppo`` with the overrides printed at start-up, validating greedily every
   ``--test_freq`` steps.
4. The reward: the sorting rule, or with ``--reward judge`` only the scores of a tiny learned judge
   (``examples/tiny_judge/model``, built by ``examples/tiny_judge/build.py`` when missing) through
   ``reward_model.*``; validation is scored by the rule either way.
5. A summary (validation accuracy before and after, time, tokens/s) and a PNG plot in the run folder.

The run resumes from its last checkpoint when started again (``trainer.resume_mode=auto``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shlex
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
BASE_MODEL = REPO / "examples" / "tiny_base_model" / "model"
JUDGE_MODEL = REPO / "examples" / "tiny_judge" / "model"
NUM_VAL = 200
NUM_TRAIN = 5000


def ensure_model(folder: pathlib.Path, what: str) -> pathlib.Path:
    """``folder``, built by the ``build.py`` beside it when missing (one-off)."""
    if not (folder / "config.json").exists():
        print(f"building the {what} into {folder} (one-off)", flush=True)
        subprocess.run([sys.executable, str(folder.parent / "build.py"), "--out", str(folder)], check=True)
    return folder


def ensure_base_model() -> pathlib.Path:
    return ensure_model(BASE_MODEL, "base model")


def write_task(data_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """Sorting prompts; the validation set is the one the base model's build held out."""
    from hybridflow.data.parquet_io import write_train_test
    from hybridflow.data.synthetic import sorting_problems, train_test_rows

    problems = sorting_problems(NUM_TRAIN + NUM_VAL, seed=0)
    train_rows, test_rows = train_test_rows(problems, NUM_VAL, data_source="sorting", ability="logic")
    return write_train_test(train_rows, test_rows, data_dir)


# Prompts per step and samples per prompt: PPO learns from fewer samples per prompt.
BATCHES = {"grpo": (32, 8), "ppo": (64, 4)}
# The advantage estimator, then PPO's critic, which starts from the same model with a new value head.
ALGORITHMS = {
    "grpo": ["algorithm.adv_estimator=grpo"],
    "ppo": [
        "algorithm.adv_estimator=gae",
        "critic.optim.lr=1e-3",
        "critic.optim.lr_warmup_steps=5",
        "critic.optim.weight_decay=0.0",
        "critic.optim.betas=[0.9,0.99]",
    ],
}

# A judge's scores are the only training reward: with a reward model, main_ppo takes its rm_scores as they are.
# Advantages are not divided by the group's std: a confident judge scores the wrong answers of an all-wrong group
# within a few hundredths of each other, and dividing by that std turned its noise into full-size advantages (the
# policy collapsed to one wrong answer in 15 steps, 2026-11-28).
REWARDS = {
    "rule": [],
    "judge": [
        "reward_model.enable=true",
        f"reward_model.model.path={JUDGE_MODEL}",
        "algorithm.norm_adv_by_std_in_grpo=false",
    ],
}


PROMPT_TOKENS, RESPONSE_TOKENS = 72, 16
VLLM_KV_CACHE_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"


def vllm_kv_cache(args: argparse.Namespace, model: pathlib.Path) -> list[str]:
    """With ``rollout.name=vllm``: a KV cache that holds a step's samples at once (float32, the widest dtype), so
    vLLM's CPU build does not size it from this machine's memory; none where the user sets one or runs hf."""
    if "actor_rollout_ref.rollout.name=vllm" not in args.overrides or any(
        override.lstrip("+").startswith(VLLM_KV_CACHE_KEY + "=") for override in args.overrides
    ):
        return []
    from hybridflow.models.loading import load_model_config
    from hybridflow.rollout.vllm_memory import kv_cache_bytes

    prompts, samples = BATCHES[args.algo]
    size = kv_cache_bytes(load_model_config(model), "float32", prompts * samples, PROMPT_TOKENS + RESPONSE_TOKENS)
    return [f"+{VLLM_KV_CACHE_KEY}={size}"]


def overrides(args: argparse.Namespace, model: pathlib.Path, train: pathlib.Path, val: pathlib.Path) -> list[str]:
    """The demo's settings as main_ppo overrides (found by sweeping on this 2-core machine)."""
    critic = [f"critic.model.path={model}"] if args.algo == "ppo" else []
    prompts, samples = BATCHES[args.algo]
    batch = [f"data.train_batch_size={prompts}", f"actor_rollout_ref.rollout.n={samples}"]
    return (
        ALGORITHMS[args.algo]
        + REWARDS[args.reward]
        + critic
        + batch
        + [
            f"data.train_files={train}",
            f"data.val_files={val}",
            f"data.max_prompt_length={PROMPT_TOKENS}",
            f"data.max_response_length={RESPONSE_TOKENS}",
            f"data.seed={args.seed}",
            f"actor_rollout_ref.model.path={model}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
            "actor_rollout_ref.actor.optim.lr=3e-4",
            "actor_rollout_ref.actor.optim.lr_warmup_steps=10",
            # Decay to a tenth by the last step: the accuracy reached holds instead of swinging.
            "actor_rollout_ref.actor.optim.warmup_style=cosine",
            "actor_rollout_ref.actor.optim.min_lr_ratio=0.1",
            "actor_rollout_ref.actor.optim.weight_decay=0.0",
            "actor_rollout_ref.actor.optim.betas=[0.9,0.99]",
            "actor_rollout_ref.actor.use_kl_loss=false",
            "actor_rollout_ref.rollout.temperature=1.0",
            f"actor_rollout_ref.rollout.seed={args.seed}",
            f"trainer.total_training_steps={args.steps}",
            f"trainer.test_freq={args.test_freq}",
            f"trainer.save_freq={args.test_freq}",
            "trainer.n_gpus_per_node=1",
            "trainer.cpus_per_worker=2",
            # One process: its workers in the driver's process, no Ray cluster to start.
            "trainer.local_mode=true",
            f"trainer.default_local_dir={args.run_dir}",
            "trainer.logger=[console,jsonl]",
            "trainer.resume_mode=auto",
            f"trainer.experiment_name=demo-{args.algo}-{args.reward}-seed{args.seed}",
            f"hydra.run.dir={args.run_dir / 'hydra'}",
        ]
        + vllm_kv_cache(args, model)
        + args.overrides
    )


def summarize(run_dir: pathlib.Path, seconds: float, algo: str, seed: int) -> str:
    from hybridflow.tracking import metric_names as names
    from hybridflow.trainer.plotting import plot_run, read_metrics, series, validation_keys

    metrics = run_dir / "metrics.jsonl"
    rows = read_metrics(metrics)
    (val_key,) = validation_keys(rows)
    steps, accuracy = series(rows, val_key)
    _, throughput = series(rows, names.PERF_THROUGHPUT)
    png = plot_run(metrics, run_dir / "demo.png", title=f"hybridflow demo: {algo.upper()} on sorting, seed {seed}")
    tokens_per_s = sum(throughput) / max(len(throughput), 1)
    return "\n".join(
        [
            f"validation accuracy ({val_key}): {100 * accuracy[0]:.1f}% at step {steps[0]} -> "
            f"{100 * accuracy[-1]:.1f}% at step {steps[-1]} ({100 * (accuracy[-1] - accuracy[0]):+.1f} points)",
            f"wall time {seconds:.0f} s this invocation, {len(throughput)} training steps logged, "
            f"{tokens_per_s:.0f} tokens/s on average",
            f"metrics: {metrics}",
            f"plot:    {png}",
        ]
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The demo's options (``argv``: the command line's by default), its run folder resolved."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algo", choices=sorted(ALGORITHMS), default="grpo", help="grpo, or ppo with a critic")
    parser.add_argument(
        "--reward", choices=sorted(REWARDS), default="rule", help="the sorting rule, or a judge's scores"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the data order and the rollout sampling")
    parser.add_argument("--steps", type=int, default=150, help="training steps (one pass over the prompts is 156)")
    parser.add_argument("--test_freq", type=int, default=10, help="validate (and checkpoint) every N steps")
    parser.add_argument(
        "--run_dir", type=pathlib.Path, default=None, help="default: outputs/demo[-ppo][-judge]-seed<seed>"
    )
    parser.add_argument("overrides", nargs="*", help="extra main_ppo overrides, key=value")
    args = parser.parse_intermixed_args(argv)  # options may follow the overrides (examples/ pass both)
    name = "-".join(["demo"] + [args.algo] * (args.algo != "grpo") + [args.reward] * (args.reward != "rule"))
    args.run_dir = (args.run_dir or REPO / "outputs" / f"{name}-seed{args.seed}").resolve()
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    start = time.perf_counter()
    model = ensure_base_model()
    if args.reward == "judge":
        ensure_model(JUDGE_MODEL, "judge")
    train, val = write_task(args.run_dir / "data")
    command = [sys.executable, "-m", "hybridflow.trainer.main_ppo", *overrides(args, model, train, val)]
    print("running:", shlex.join(command), flush=True)
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    run = subprocess.run(command, env=env, cwd=args.run_dir.parent)
    if run.returncode != 0:
        # main_ppo has printed its own one-line error; the demo adds where to look and ends with its code.
        print(
            f"hybridflow: error: the demo's training run stopped (exit {run.returncode}); see the line above. "
            f"The same command resumes from {args.run_dir}",
            file=sys.stderr,
        )
        sys.exit(run.returncode)
    print(summarize(args.run_dir, time.perf_counter() - start, args.algo, args.seed), flush=True)


if __name__ == "__main__":
    main()
