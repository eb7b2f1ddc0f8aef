"""What do remove-padding and chunked log-probs buy in a training step: tokens/s and peak memory.

A Qwen2 with a realistic vocabulary (32,768) and a tiny body (hidden 64, 2 layers), so the vocabulary
projection dominates as it does in small-to-mid LLMs. Batch: 8 rows, prompts of 16-64 tokens left-padded
to 64, responses of 16-192 tokens right-padded to 192 (about 55% of the rectangle is real tokens).

Layouts: ``padded`` runs the [B, L] rectangle; ``packed`` runs the real tokens in one row.
Log-prob: ``naive`` projects every position to the vocabulary and takes a full float32 log_softmax;
``chunked`` projects every position but takes the log-softmax statistics per chunk of rows;
``kept+chunked`` is ``hybridflow.models.log_probs.forward_log_probs``: projects only the positions that
predict response tokens (``logits_to_keep``) and takes statistics per chunk.
Modes: ``infer`` is the old/reference log-prob pass (no grad, with entropy); ``train`` is a
forward + backward of a token-mean policy-gradient loss.

Each variant runs in a fresh subprocess so that its peak resident memory (``ru_maxrss``) is its own;
"peak MiB" is that peak minus the resident memory before the first step. One torch thread.
Run: ``.venv/bin/python -m bench.bench_models`` (1-4 minutes, 12 subprocesses). Each row also prints
the step's wall time (median of 3 after a warm-up), the child's CPU seconds for those 3 steps and the
1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

VOCAB_SIZE, ROWS, PROMPT_WIDTH, RESPONSE_WIDTH = 32_768, 8, 64, 192
LAYOUTS = ("padded", "packed")
LOG_PROB_METHODS = ("naive", "chunked", "kept+chunked")
MODES = ("infer", "train")
REPEATS = 3


def build_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def build_batch() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    prompt_lengths = torch.randint(16, PROMPT_WIDTH + 1, (ROWS,), generator=generator)
    response_lengths = torch.randint(16, RESPONSE_WIDTH + 1, (ROWS,), generator=generator)
    columns = torch.arange(PROMPT_WIDTH + RESPONSE_WIDTH)
    attention_mask = (
        (columns >= PROMPT_WIDTH - prompt_lengths[:, None]) & (columns < PROMPT_WIDTH + response_lengths[:, None])
    ).long()
    input_ids = torch.randint(0, VOCAB_SIZE, attention_mask.shape, generator=generator)
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": attention_mask[:, PROMPT_WIDTH:],
        "advantages": torch.randn(ROWS, RESPONSE_WIDTH, generator=generator),
    }


def all_position_log_probs(model, batch, layout, method, calculate_entropy):
    """Project every position to the vocabulary, then take log-probs naively or per chunk: [B, R]."""
    from hybridflow.models.chunked_softmax import log_probs_and_entropy
    from hybridflow.models.padding import pack_padded, unpack

    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    labels = torch.roll(input_ids, shifts=-1, dims=1)
    if layout == "packed":
        packed = pack_padded(input_ids, attention_mask)
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits[0]
        labels = labels.flatten()[packed.token_index]
    else:
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=batch["position_ids"], use_cache=False
        ).logits
    if method == "naive":
        log_softmax = logits.float().log_softmax(-1)
        log_probs = log_softmax.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
        entropy = -(log_softmax.exp() * log_softmax).sum(-1) if calculate_entropy else None
    else:
        log_probs, entropy = log_probs_and_entropy(logits, labels, calculate_entropy=calculate_entropy)
    window = slice(-RESPONSE_WIDTH - 1, -1)
    if layout == "packed":
        log_probs = unpack(log_probs, packed)[:, window]
        entropy = unpack(entropy, packed)[:, window] if entropy is not None else None
    else:
        log_probs = log_probs[:, window]
        entropy = entropy[:, window] if entropy is not None else None
    return log_probs, entropy


def step(model, batch, layout, method, mode):
    from hybridflow.models.log_probs import forward_log_probs

    train = mode == "train"
    with torch.set_grad_enabled(train):
        if method == "kept+chunked":
            log_probs, _ = forward_log_probs(
                model,
                batch["input_ids"],
                batch["attention_mask"],
                batch["position_ids"],
                RESPONSE_WIDTH,
                use_remove_padding=layout == "packed",
                calculate_entropy=not train,
            )
        else:
            log_probs, _ = all_position_log_probs(model, batch, layout, method, calculate_entropy=not train)
        if train:
            mask = batch["response_mask"]
            loss = -(batch["advantages"] * log_probs * mask).sum() / mask.sum()
            loss.backward()
            model.zero_grad(set_to_none=True)


def run_variant(layout: str, method: str, mode: str) -> dict:
    """Runs in the child process: warm-up, timed steps, memory; returns one row of the table."""
    torch.set_num_threads(1)
    model = build_model().train(mode == "train")
    batch = build_batch()
    resident_before = _resident_mib()
    step(model, batch, layout, method, mode)
    cpu_start, walls = time.process_time(), []
    for _ in range(REPEATS):
        started = time.perf_counter()
        step(model, batch, layout, method, mode)
        walls.append(time.perf_counter() - started)
    wall = statistics.median(walls)
    real_tokens = int(batch["attention_mask"].sum())
    return {
        "mode": mode,
        "layout": layout,
        "log_prob": method,
        "tokens_per_s": real_tokens / wall,
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu_start,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - resident_before,
        "load1": os.getloadavg()[0],
    }


def _resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", nargs=3, metavar=("LAYOUT", "LOG_PROB", "MODE"), help="run one variant (child)")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(*args.variant)))
        return
    batch = build_batch()
    real = int(batch["attention_mask"].sum())
    share = real / batch["attention_mask"].numel()
    print(f"vocab {VOCAB_SIZE}, {ROWS} rows x {PROMPT_WIDTH}+{RESPONSE_WIDTH} tokens, {real} real ({share:.0%})")
    header = ("mode", "layout", "log-prob", "tokens/s", "wall s", "cpu s", "peak MiB", "load1")
    print("{:6} {:7} {:13} {:>9} {:>7} {:>6} {:>9} {:>6}".format(*header))
    for mode in MODES:
        for layout in LAYOUTS:
            for method in LOG_PROB_METHODS:
                row = _run_child(layout, method, mode)
                print(
                    f"{row['mode']:6} {row['layout']:7} {row['log_prob']:13} {row['tokens_per_s']:9.0f} "
                    f"{row['wall_s']:7.3f} {row['cpu_s']:6.2f} {row['peak_mib']:9.0f} {row['load1']:6.2f}",
                    flush=True,
                )


def _run_child(layout: str, method: str, mode: str) -> dict:
    command = [sys.executable, "-m", "bench.bench_models", "--variant", layout, method, mode]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
