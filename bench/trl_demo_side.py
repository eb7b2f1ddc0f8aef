"""The TRL side of ``bench/bench_time_to_accuracy.py``: TRL's ``GRPOTrainer`` on ``make demo``'s task.

Run in its own process (``python -m bench.trl_demo_side SPEC OUT``). It trains the demo's base model on the
demo's sorting parquet with the demo's settings (see ``grpo_config``), validates greedily on the demo's
validation parquet before training and every ``spec["test_freq"]`` steps (and after the last), and writes
to ``OUT`` the training seconds (wall time of the steps alone, validation excluded, as hybridflow's
``timing_s/step``) and the accuracy at each validation.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow.parquet as pq
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from bench.trl_side import grpo_settings, load_prompts, run_child
from hybridflow.rewards.scoring import default_compute_score


def grpo_config(spec: dict[str, Any]) -> GRPOConfig:
    """``hybridflow.demo``'s GRPO settings in TRL's keys: ``grpo_settings`` (32 prompts x 8 samples, 16 new
    tokens, no KL, token-mean loss, group-std advantages) with temperature 1, clip 0.2, grad clip 1, AdamW betas
    (0.9, 0.99) without weight decay, lr 3e-4 after 10 warm-up steps, cosine decay to a tenth."""
    return GRPOConfig(
        **grpo_settings(spec),
        bf16=False,
        temperature=1.0,
        epsilon=0.2,
        learning_rate=spec["lr"],
        warmup_steps=spec["lr_warmup_steps"],
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": spec["min_lr_ratio"]},
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=spec["steps"],
        data_seed=spec["seed"],
    )


def score(texts: list[str], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        default_compute_score(row["data_source"], text, row["reward_model"]["ground_truth"])
        for text, row in zip(texts, rows, strict=True)
    ]


def sorting_reward(completions: list, data_source: list, reward_model: list, **kwargs: Any) -> list[float]:
    """hybridflow's rule score of each completion (TRL passes the dataset's other columns as lists)."""
    rows = [{"data_source": source, "reward_model": truth} for source, truth in zip(data_source, reward_model)]
    return [float(result["score"]) for result in score([completion[-1]["content"] for completion in completions], rows)]


class GreedyValidation:
    """Greedy accuracy on the validation rows, as hybridflow's validation computes it (``acc`` of the rule
    score of each greedy response, at most ``max_new_tokens`` tokens)."""

    def __init__(self, val_file: str, tokenizer: Any, max_new_tokens: int):
        self.rows = pq.read_table(val_file).to_pylist()
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        texts = [
            tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
            for row in self.rows
        ]
        self.inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)

    @torch.no_grad()
    def accuracy(self, model: Any) -> float:
        was_training = model.training
        model.eval()
        output = model.generate(
            **self.inputs, max_new_tokens=self.max_new_tokens, do_sample=False, pad_token_id=self.tokenizer.pad_token_id
        )
        model.train(was_training)
        prompt_length = self.inputs["input_ids"].shape[1]
        texts = self.tokenizer.batch_decode(output[:, prompt_length:], skip_special_tokens=True)
        results = score(texts, self.rows)
        return sum(float(result["acc"]) for result in results) / len(results)


class TrainingClock(TrainerCallback):
    """Training seconds that stop while validating: validates at the start, every ``test_freq`` steps and at
    the last step, and records ``(step, training seconds, accuracy)``."""

    def __init__(self, validation: GreedyValidation, test_freq: int, last_step: int):
        self.validation = validation
        self.test_freq = test_freq
        self.last_step = last_step
        self.training_s = 0.0
        self.resumed = 0.0
        self.points: list[dict[str, float]] = []

    def _validate(self, step: int, model: Any) -> None:
        self.points.append({"step": step, "training_s": self.training_s, "acc": self.validation.accuracy(model)})
        print(
            f"step {step}: {self.training_s:.1f} s of training, validation accuracy {self.points[-1]['acc']:.3f}",
            flush=True,
        )
        self.resumed = time.perf_counter()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._validate(0, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.training_s += time.perf_counter() - self.resumed
        step = state.global_step
        if step % self.test_freq == 0 or step == self.last_step:
            self._validate(step, model)
        else:
            self.resumed = time.perf_counter()


def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(spec["threads"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32, attn_implementation="sdpa")
    clock = TrainingClock(
        GreedyValidation(spec["val_file"], tokenizer, spec["max_new_tokens"]), spec["test_freq"], spec["steps"]
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=sorting_reward,
        args=grpo_config(spec),
        train_dataset=load_prompts(spec["train_file"]),
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.train()
    return {"points": clock.points, "torch_threads": torch.get_num_threads()}


if __name__ == "__main__":
    run_child(run_trl)
