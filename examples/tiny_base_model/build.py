"""Build the demo's base model: a tiny Qwen2 that answers sorting prompts in the right format but is often wrong.

    python examples/tiny_base_model/build.py                 # writes examples/tiny_base_model/model (~5 MB)
    python examples/tiny_base_model/build.py --seed 1 --out /tmp/base_seed1

No download: everything is made here, from a seed.

1. A random 1.25M-parameter Qwen2 (hidden 256, 2 layers) and its character-level tokenizer with a ChatML
   chat template (``hybridflow.models.tiny.build_tiny_model``).
2. SFT data: "Sort 7 2 9 2 ascending. End with '#### <list>'." -> "#### 2 2 7 9" (``hybridflow.data.synthetic``),
   written as {prompt, response} parquet rows, none of them among the validation prompts.
3. SFT with the project's trainer (``hybridflow.trainer.main_sft``), stopped at the first check (every
   ``--eval_every`` steps) where greedy accuracy on the validation prompts reaches ``--target_accuracy``. The
   model then writes ``#### <four digits>`` almost always but sorts correctly only about a quarter of the time,
   while a correct answer is often among its samples: the situation RL is good at improving.
4. The model and tokenizer are saved to ``--out`` with ``build_info.json`` (seed, steps, accuracy).

The validation prompts are the first ``--num_val`` problems of ``sorting_problems(seed=0)``, which is exactly
``test.parquet`` of ``examples/data_preprocess/sorting.py --seed 0 --num_test <num_val>``: the demo's
validation set.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import tempfile

import torch
from hydra import compose, initialize_config_module

from hybridflow.config.sft import load_sft_config
from hybridflow.data.parquet_io import write_parquet_rows
from hybridflow.data.synthetic import Problem, sorting_problems
from hybridflow.distributed import init_local_ray
from hybridflow.models.loading import load_causal_lm, load_tokenizer
from hybridflow.models.tiny import build_tiny_model
from hybridflow.rewards.scoring import default_compute_score
from hybridflow.trainer.main_sft import build_sft_trainer

HERE = pathlib.Path(__file__).resolve().parent


@torch.no_grad()
def greedy_accuracy(model_dir: str | pathlib.Path, problems: list[Problem], batch_size: int = 100) -> float:
    """Fraction of ``problems`` whose greedy answer scores 1 (``data_source="sorting"``)."""
    tokenizer = load_tokenizer(model_dir, padding_side="left")
    model = load_causal_lm(model_dir).eval()
    correct = 0
    for start in range(0, len(problems), batch_size):
        chunk = problems[start : start + batch_size]
        conversations = [[{"role": "user", "content": p.question}] for p in chunk]
        texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in conversations]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        output = model.generate(**inputs, do_sample=False, max_new_tokens=16, pad_token_id=tokenizer.pad_token_id)
        responses = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        correct += sum(default_compute_score("sorting", r, p.ground_truth)["score"] for r, p in zip(responses, chunk))
    return correct / len(problems)


class StopAtAccuracy:
    """SFT hook: every ``every`` steps export the model, measure greedy accuracy, stop once it reaches ``target``."""

    def __init__(self, problems: list[Problem], target: float, every: int, scratch: pathlib.Path):
        self.problems, self.target, self.every, self.scratch = problems, target, every, scratch
        self.accuracy = 0.0

    def after_step(self, trainer, metrics: dict[str, float]) -> bool:
        if trainer.global_step % self.every:
            return False
        self.accuracy = greedy_accuracy(trainer.export_hf(self.scratch / "probe"), self.problems)
        metrics["val/greedy_accuracy"] = self.accuracy
        print(f"step {trainer.global_step}: sft loss {metrics['train/loss']:.3f}, greedy accuracy {self.accuracy:.3f}")
        return self.accuracy >= self.target


def sft_rows(num: int, seed: int, excluded: set[str]) -> list[dict]:
    problems = [p for p in sorting_problems(num + len(excluded), seed=seed) if p.question not in excluded][:num]
    return [{"prompt": p.question, "response": p.answer} for p in problems]


def sft_overrides(
    args: argparse.Namespace, model_dir: pathlib.Path, sft_file: pathlib.Path, run_dir: pathlib.Path
) -> list[str]:
    """The recipe: constant lr 2e-3 after 20 warmup steps, 64 examples a step, one process, padded batches."""
    return [
        f"data.train_files={sft_file}",
        "data.max_length=128",
        "data.train_batch_size=64",
        "data.micro_batch_size_per_gpu=64",
        f"data.seed={args.seed}",
        f"model.partial_pretrain={model_dir}",
        "optim.lr=2e-3",
        "optim.betas=[0.9,0.98]",
        "optim.weight_decay=0.0",
        "optim.lr_scheduler=constant",
        f"optim.warmup_steps_ratio={min(20 / args.max_steps, 0.5)}",
        # Packing builds a dense [tokens, tokens] attention mask; for 70-token rows on CPU padding is cheaper.
        "use_remove_padding=false",
        f"trainer.total_training_steps={args.max_steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.resume_mode=disable",
        "trainer.logger=[jsonl]",
        f"trainer.cpus_per_worker={args.threads}",
        f"ray_init.num_cpus={args.threads}",
    ]


def build(args: argparse.Namespace) -> dict:
    out = pathlib.Path(args.out)
    val_problems = sorting_problems(args.num_val, seed=0)
    with tempfile.TemporaryDirectory(prefix="tiny_base_") as scratch_name:
        scratch = pathlib.Path(scratch_name)
        model_dir = build_tiny_model(
            scratch / "random_init",
            seed=args.seed,
            hidden_size=args.hidden_size,
            num_hidden_layers=args.num_layers,
            intermediate_size=2 * args.hidden_size,
        )
        rows = sft_rows(args.num_sft, seed=args.seed + 1, excluded={p.question for p in val_problems})
        sft_file = write_parquet_rows(rows, scratch / "sft.parquet")
        with initialize_config_module("hybridflow.trainer.config", version_base=None):
            overrides = sft_overrides(args, model_dir, sft_file, scratch / "run")
            config = load_sft_config(compose("sft_trainer", overrides=overrides))
        torch.manual_seed(args.seed)
        trainer = build_sft_trainer(config)
        stopper = StopAtAccuracy(val_problems, args.target_accuracy, args.eval_every, scratch)
        trainer.hooks.append(stopper)
        init_local_ray(num_cpus=args.threads)
        try:
            trainer.init_workers()
            exported = trainer.fit()
        finally:
            trainer.shutdown()
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(exported, out)
    info = {
        "seed": args.seed,
        "sft_steps": trainer.global_step,
        "sft_examples": args.num_sft,
        "num_val": args.num_val,
        "greedy_val_accuracy": greedy_accuracy(out, val_problems),
        "target_accuracy": args.target_accuracy,
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(HERE / "model"), help="folder to write the base model to")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights, the SFT data and its order")
    parser.add_argument("--hidden_size", type=int, default=256, help="model width (4 attention heads, 2 KV heads)")
    parser.add_argument("--num_layers", type=int, default=2, help="decoder layers")
    parser.add_argument("--num_sft", type=int, default=4000, help="SFT examples (distinct sorting problems)")
    parser.add_argument("--num_val", type=int, default=200, help="validation prompts (the demo's test set)")
    parser.add_argument("--target_accuracy", type=float, default=0.2, help="stop SFT once greedy accuracy reaches this")
    parser.add_argument("--eval_every", type=int, default=10, help="SFT steps between accuracy checks")
    parser.add_argument("--max_steps", type=int, default=400, help="give up after this many SFT steps")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the SFT worker")
    args = parser.parse_args(argv)
    info = build(args)
    print(f"base model written to {args.out}: {json.dumps(info)}")
    return info


if __name__ == "__main__":
    main()
