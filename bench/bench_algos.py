"""How long do the algorithms take on a large batch, next to one training step of the smallest model?

Every advantage estimator, the KL penalty, a policy loss (forward + backward), the value loss and the loss
aggregation run on a [4096, 1024] batch: 512 prompts x 8 samples, response lengths uniform in [64, 1024],
right-padded, the score on each sample's last token. The reference row is one optimiser step (forward,
backward, AdamW) of the test suite's tiny Qwen2 model (``hybridflow.models.tiny``) on an [8, 256]
micro-batch; a training step on the same [4096, 1024] batch needs at least 2048 of them (every token goes
through a forward and a backward), before generation, so the extrapolated step time is a lower bound.

Run: ``.venv/bin/python -m bench.bench_algos`` (about a minute). Each row prints wall time per call
(median over the repeats), CPU seconds per call of this process (``time.process_time``) and the 1-minute
load average when the row finished: the machine is shared, so read wall time next to both.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from typing import Callable

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hybridflow.algos import (  # noqa: E402
    ADV_ESTIMATORS,
    agg_loss,
    apply_kl_penalty,
    compute_value_loss,
    get_adv_estimator_fn,
    get_policy_loss_fn,
)

BATCH, LENGTH, SAMPLES_PER_PROMPT = 4096, 1024, 8
MICRO_BATCH, MICRO_LENGTH = 8, 256
REPEATS = 3
ESTIMATORS = [
    "gae",
    "grpo",
    "grpo_passk",
    "rloo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "opo",
    "gpg",
]


def make_batch(seed: int = 0) -> dict:
    """The [BATCH, LENGTH] tensors the estimators and losses read, with verl's key names."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(64, LENGTH + 1, (BATCH,), generator=generator)
    response_mask = (torch.arange(LENGTH).unsqueeze(0) < lengths.unsqueeze(1)).float()
    token_level_scores = torch.zeros(BATCH, LENGTH)
    token_level_scores[torch.arange(BATCH), lengths - 1] = torch.randint(0, 2, (BATCH,), generator=generator).float()
    old_log_probs = -torch.rand(BATCH, LENGTH, generator=generator) * 3
    return {
        "token_level_rewards": token_level_scores,
        "token_level_scores": token_level_scores,
        "response_mask": response_mask,
        "values": torch.randn(BATCH, LENGTH, generator=generator),
        "index": np.array([f"prompt-{i // SAMPLES_PER_PROMPT}" for i in range(BATCH)], dtype=object),
        "reward_baselines": torch.rand(BATCH, generator=generator),
        "old_log_probs": old_log_probs,
        "log_probs": old_log_probs + torch.randn(BATCH, LENGTH, generator=generator) * 0.1,
        "ref_log_prob": old_log_probs + torch.randn(BATCH, LENGTH, generator=generator) * 0.1,
        "advantages": torch.randn(BATCH, LENGTH, generator=generator),
    }


def measure(run: Callable[[], object], repeats: int = REPEATS) -> tuple[float, float, float]:
    """(median wall seconds per call, CPU seconds per call, 1-minute load average afterwards)."""
    run()  # warm-up: first-call allocations and lazy imports are not what we measure
    walls = []
    cpu_start = time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        walls.append(time.perf_counter() - start)
    cpu_per_call = (time.process_time() - cpu_start) / repeats
    return statistics.median(walls), cpu_per_call, os.getloadavg()[0]


def estimator_call(name: str, batch: dict) -> Callable[[], object]:
    estimator = get_adv_estimator_fn(name)
    inputs = {key: batch[key] for key in ADV_ESTIMATORS.traits(name)["requires"]}
    options = {"gamma": 1.0, "lam": 0.95, "norm_adv_by_std_in_grpo": True}
    return lambda: estimator(
        token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"], **options, **inputs
    )


def policy_loss_step(batch: dict) -> Callable[[], object]:
    loss_fn = get_policy_loss_fn("vanilla")

    def run() -> None:
        log_probs = batch["log_probs"].clone().requires_grad_(True)
        loss, _ = loss_fn(batch["old_log_probs"], log_probs, batch["advantages"], batch["response_mask"])
        loss.backward()

    return run


def tiny_model_train_step() -> Callable[[], object]:
    """One AdamW step of the tiny test model on a [MICRO_BATCH, MICRO_LENGTH] micro-batch (the reference row)."""
    from transformers import AutoModelForCausalLM

    from hybridflow.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tempfile.mkdtemp(prefix="bench_algos_"), seed=0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, model.config.vocab_size, (MICRO_BATCH, MICRO_LENGTH), generator=generator)

    def run() -> None:
        optimizer.zero_grad()
        model(input_ids=input_ids, labels=input_ids).loss.backward()
        optimizer.step()

    run.parameters = sum(p.numel() for p in model.parameters())  # type: ignore[attr-defined]
    return run


def print_row(name: str, wall: float, cpu: float, load: float) -> None:
    print(f"{name:<42} {wall * 1000:>10.1f} {cpu:>9.3f} {load:>7.2f}", flush=True)


def main() -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, load {os.getloadavg()[0]:.2f} at start")
    print(f"batch [{BATCH}, {LENGTH}], {BATCH // SAMPLES_PER_PROMPT} prompts x {SAMPLES_PER_PROMPT} samples")
    print(f"{'row':<42} {'wall ms':>10} {'cpu s':>9} {'load1':>7}")
    batch = make_batch()
    estimator_total = estimator_cpu = 0.0
    for name in ESTIMATORS:
        wall, cpu, load = measure(estimator_call(name, batch))
        estimator_total, estimator_cpu = estimator_total + wall, estimator_cpu + cpu
        print_row(f"adv_estimator={name}", wall, cpu, load)
    rows = {
        "apply_kl_penalty(kind=low_var_kl)": lambda: apply_kl_penalty(
            batch["token_level_scores"],
            batch["old_log_probs"],
            batch["ref_log_prob"],
            batch["response_mask"],
            kl_coef=0.001,
            kind="low_var_kl",
        ),
        "policy_loss=vanilla forward+backward": policy_loss_step(batch),
        "value loss (clipped)": lambda: compute_value_loss(
            batch["values"], batch["advantages"], batch["values"] * 0.9, batch["response_mask"], cliprange_value=0.5
        ),
        "agg_loss(seq-mean-token-mean)": lambda: agg_loss(
            batch["advantages"], batch["response_mask"], "seq-mean-token-mean"
        ),
    }
    for name, run in rows.items():
        print_row(name, *measure(run))
    reference = tiny_model_train_step()
    wall, cpu, load = measure(reference)
    print_row(f"REFERENCE tiny model step, [{MICRO_BATCH}, {MICRO_LENGTH}]", wall, cpu, load)
    # A training step passes every token of the batch through at least one forward and backward.
    micro_batches = BATCH * LENGTH // (MICRO_BATCH * MICRO_LENGTH)
    print(
        f"reference model: {reference.parameters / 1e6:.2f}M parameters; one training step on the same "
        f"[{BATCH}, {LENGTH}] batch is at least {micro_batches} such micro-batch steps = "
        f"{micro_batches * wall:.0f} s wall, {micro_batches * cpu:.0f} CPU-s"
    )
    print(
        f"all {len(ESTIMATORS)} estimators together: {estimator_total:.2f} s wall, {estimator_cpu:.2f} CPU-s "
        f"= {100 * estimator_cpu / (micro_batches * cpu):.3f}% of that step's CPU-s"
    )


if __name__ == "__main__":
    main()
