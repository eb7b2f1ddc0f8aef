"""The TRL side of ``bench/bench_vs_trl.py``: TRL's ``GRPOTrainer`` on the benchmark's model and prompts.

Run by ``bench_vs_trl`` in its own process (``python -m bench.trl_side SPEC OUT``) with the same thread
settings as the hybridflow side. It trains ``spec["total_steps"]`` GRPO steps and writes, per step, the
wall time and process CPU time at the step's end, the generated tokens, the share of prompt groups
whose samples all got the same reward (zero-signal groups), and the time spent in
``model.generate`` and in TRL's whole rollout-and-score call, to the JSON file ``OUT``.
The reward is the one hybridflow scores with (``bench/dense_reward.py`` by default, or hybridflow's
``default_compute_score`` with ``--reward task``) on the same parquet rows hybridflow trains on.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable

import pyarrow.parquet as pq
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from bench import dense_reward
from bench.bench_vs_trl import StepRecorder
from hybridflow.rewards.scoring import default_compute_score

# GRPOConfig fields echoed in the benchmark's settings block (read back from the live config).
SHOWN_SETTINGS = (
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "num_iterations",
    "steps_per_generation",
    "generation_batch_size",
    "max_completion_length",
    "temperature",
    "top_p",
    "top_k",
    "beta",
    "loss_type",
    "scale_rewards",
    "epsilon",
    "learning_rate",
    "lr_scheduler_type",
    "weight_decay",
    "max_grad_norm",
    "bf16",
    "gradient_checkpointing",
    "use_cpu",
    "use_vllm",
    "use_transformers_continuous_batching",
    "cache_implementation",
    "report_to",
    "logging_strategy",
    "save_strategy",
)


def grpo_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig keys both TRL benchmarks share: on CPU, one optimiser step per generation of
    prompts_per_step x samples_per_prompt completions, untempered top-k/top-p, no KL, hybridflow's loss and
    advantages, no logging, saving, evaluation or loader workers."""
    samples = spec["prompts_per_step"] * spec["samples_per_prompt"]
    micro_batch = spec.get("micro_batch") or samples
    return dict(
        output_dir=spec["trl_output_dir"],
        use_cpu=True,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=samples // micro_batch,
        num_generations=spec["samples_per_prompt"],
        num_iterations=1,
        max_completion_length=spec["max_new_tokens"],
        top_p=1.0,
        top_k=0,
        beta=0.0,
        loss_type="dapo",  # token-mean over the batch, as hybridflow's loss_agg_mode=token-mean
        scale_rewards="group",  # divide by the group's std, as norm_adv_by_std_in_grpo=True
        seed=spec["seed"],
        report_to=[],
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        # Fixed lengths, as hybridflow's rollout.ignore_eos: decode max_new_tokens past any EOS (generation stops
        # at an id no logit can give), and TRL masks what follows the first EOS, as hybridflow does.
        generation_kwargs={"eos_token_id": spec["vocab_size"]} if spec.get("fixed_lengths") else None,
    )


def grpo_config(spec: dict[str, Any]) -> GRPOConfig:
    """``grpo_settings`` at a constant lr; fp32, or bf16 autocast over fp32 weights (``bf16=True``) in the bf16 row."""
    return GRPOConfig(
        **grpo_settings(spec),
        bf16=spec["precision"] == "bf16",
        fp16=False,
        gradient_checkpointing=False,
        temperature=spec["temperature"],
        epsilon=spec["clip_ratio"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=spec["grad_clip"],
        max_steps=spec["total_steps"],
    )


def arithmetic_reward(completions: list, data_source: list, reward_model: list, **kwargs: Any) -> list[float]:
    """hybridflow's rule score of each completion (TRL passes the dataset's other columns as lists)."""
    texts = [completion[-1]["content"] for completion in completions]
    return [
        float(default_compute_score(source, text, truth["ground_truth"])["score"])
        for source, text, truth in zip(data_source, texts, reward_model, strict=True)
    ]


def dense_reward_fn(completions: list, data_source: list, reward_model: list, **kwargs: Any) -> list[float]:
    """``bench/dense_reward.py``'s score of each completion, as hybridflow's custom reward function."""
    return [
        float(dense_reward.compute_score(source, completion[-1]["content"], truth["ground_truth"]))
        for source, completion, truth in zip(data_source, completions, reward_model, strict=True)
    ]


REWARDS = {"dense": dense_reward_fn, "task": arithmetic_reward}


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that also records the seconds of each ``model.generate`` and rollout-and-score call."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.bench_phases: list[dict[str, float]] = []
        self.bench_tokens: list[int] = []
        self.bench_zero_signal: list[float] = []

    def _generate_single_turn(self, *args: Any, **kwargs: Any):
        start = time.perf_counter()
        completion_ids, logprobs = super()._generate_single_turn(*args, **kwargs)
        self.bench_phases[-1]["generate"] = time.perf_counter() - start
        self.bench_tokens.append(sum(len(ids) for ids in completion_ids))
        return completion_ids, logprobs

    def _calculate_rewards(self, inputs: Any, prompts: Any, completions: Any, completion_ids_list: Any) -> torch.Tensor:
        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # TRL lays out the samples of one prompt next to each other.
        groups = rewards.sum(dim=1).view(-1, self.num_generations)
        self.bench_zero_signal.append(float((groups.max(dim=1).values == groups.min(dim=1).values).float().mean()))
        return rewards

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        self.bench_phases.append({})
        start = time.perf_counter()
        output = super()._generate_and_score_completions(inputs)
        self.bench_phases[-1]["generate_and_score"] = time.perf_counter() - start
        return output


class StepEnds(TrainerCallback):
    """Marks the recorder when training starts and at the end of every optimiser step."""

    def __init__(self, recorder: StepRecorder):
        self.recorder = recorder

    def on_train_begin(self, args, state, control, **kwargs):
        self.recorder.start()

    def on_step_end(self, args, state, control, **kwargs):
        self.recorder.mark()


def load_prompts(train_file: str) -> Dataset:
    """The parquet rows (``prompt`` as chat messages, ``data_source``, ``reward_model``) as a Dataset."""
    rows = pq.read_table(train_file).to_pylist()
    return Dataset.from_list([{key: row[key] for key in ("prompt", "data_source", "reward_model")} for row in rows])


def run_trl(spec: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(spec["threads"])
    setup_start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_dir"], dtype=torch.float32, attn_implementation="sdpa")
    recorder = StepRecorder()
    trainer = TimedGRPOTrainer(
        model=model,
        reward_funcs=REWARDS[spec["reward"]],
        args=grpo_config(spec),
        train_dataset=load_prompts(spec["train_file"]),
        processing_class=tokenizer,
        callbacks=[StepEnds(recorder)],
    )
    setup_s = time.perf_counter() - setup_start
    trainer.train()
    per_step = zip(recorder.marks, trainer.bench_phases, trainer.bench_tokens, trainer.bench_zero_signal, strict=True)
    for mark, phases, tokens, zero_signal in per_step:
        mark.update(tokens=tokens, phases=phases, zero_signal=zero_signal)
    settings = {key: getattr(trainer.args, key) for key in SHOWN_SETTINGS}
    settings.update(
        torch_threads=torch.get_num_threads(), dtype=str(model.dtype), attn=model.config._attn_implementation
    )
    return {"setup_s": setup_s, "start": recorder.start_mark, "steps": recorder.marks, "settings": settings}


def run_child(run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """``python -m bench.<side> SPEC OUT``: ``run`` on the JSON spec, its result written as JSON to OUT."""
    spec_path, out_path = sys.argv[1:3]
    with open(spec_path) as handle:
        spec = json.load(handle)
    result = run(spec)
    with open(out_path, "w") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    run_child(run_trl)
