"""What do remove-padding and chunked log-probs buy in a training step: tokens/s and peak memory.

Cases (batch shapes and model):

- ``varied-32k``: a Qwen2 with a realistic vocabulary (32,768) and a tiny body (hidden 64, 2 layers), so
  the vocabulary projection dominates as it does in small-to-mid LLMs; 8 rows, prompts of 16-64 tokens
  left-padded to 64, responses of 16-192 tokens right-padded to 192 (about 60% of the rectangle real).
- ``trl-shapes``: the shapes of ``bench/bench_vs_trl.py`` as first estimated: the ~4M Qwen2 of that
  benchmark (``build_tiny_model`` hidden 256, 4 layers, intermediate 1024, vocabulary 263), 64 rows,
  prompts of 40-59 tokens left-padded to 59, responses of 16 tokens (a quarter end early, 1-16)
  right-padded to 16 (about 85% real).
- ``trl-actual``: the same model with the prompt lengths bench_vs_trl's arithmetic prompts really have
  (57-59 tokens) and full 16-token responses (about 99% real).

Layouts: ``padded`` runs the [B, L] rectangle; ``one-row`` packs every real token into one row (what
remove-padding did before, and still does under flash attention); ``auto`` is what
``use_remove_padding`` does now: ``hybridflow.models.layouts.choose_packing`` packs into the rows of
lowest estimated cost, or runs the rectangle when packing would not save at least 5%. The "rows"
column gives the shape that ran.
Log-prob: ``naive`` projects every position to the vocabulary and takes a full float32 log_softmax;
``chunked`` projects every position but takes the log-softmax statistics per chunk of rows;
``kept+chunked`` is ``hybridflow.models.log_probs.forward_log_probs``: projects only the positions that
predict response tokens (``logits_to_keep``) and takes statistics per chunk.
Modes: ``infer`` is the old/reference log-prob pass (no grad, with entropy); ``train`` is a
forward + backward of a token-mean policy-gradient loss.

Tables: ``log-prob`` (varied-32k, padded/auto x the three log-prob methods) and ``layout`` (every case,
padded/one-row/auto, kept+chunked). Each variant runs in a fresh subprocess so that its peak resident
memory (``ru_maxrss``) is its own; "peak MiB" is that peak minus the resident memory before the first
step. One torch thread. Each row prints the step's wall time (median of 3 after a warm-up), the child's
CPU seconds for those 3 steps (the robust number on a shared machine) and the 1-minute load average.
Run: ``.venv/bin/python -m bench.bench_models [--table log-prob|layout]`` (3-8 minutes, 30 subprocesses).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402


@dataclass(frozen=True)
class Case:
    """A batch shape and the model it runs on; lengths are drawn uniformly from the inclusive ranges."""

    model: str
    rows: int
    prompt_lengths: tuple[int, int]
    prompt_width: int
    response_lengths: tuple[int, int]
    response_width: int
    full_response_share: float


CASES = {
    "varied-32k": Case("wide-vocab", 8, (16, 64), 64, (16, 192), 192, 0.0),
    "trl-shapes": Case("trl-4m", 64, (40, 59), 59, (1, 16), 16, 0.75),
    "trl-actual": Case("trl-4m", 64, (57, 59), 59, (16, 16), 16, 0.0),
}
LOG_PROB_METHODS = ("naive", "chunked", "kept+chunked")
MODES = ("infer", "train")
REPEATS = 3


def build_model(name: str) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hybridflow.models.loading import load_causal_lm
    from hybridflow.models.tiny import build_tiny_model

    if name == "trl-4m":
        size = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
        with tempfile.TemporaryDirectory() as model_dir:
            return load_causal_lm(build_tiny_model(model_dir, seed=0, intermediate_size=1024, **size))
    config = Qwen2Config(
        vocab_size=32_768,
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


def build_batch(case: Case, vocab_size: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    low, high = case.prompt_lengths
    prompt_lengths = torch.randint(low, high + 1, (case.rows,), generator=generator)
    low, high = case.response_lengths
    response_lengths = torch.randint(low, high + 1, (case.rows,), generator=generator)
    if case.full_response_share:
        full = torch.rand(case.rows, generator=generator) < case.full_response_share
        response_lengths = torch.where(full, case.response_width, response_lengths)
    prompt_width = case.prompt_width
    columns = torch.arange(prompt_width + case.response_width)
    attention_mask = (
        (columns >= prompt_width - prompt_lengths[:, None]) & (columns < prompt_width + response_lengths[:, None])
    ).long()
    input_ids = torch.randint(0, vocab_size, attention_mask.shape, generator=generator)
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": attention_mask[:, prompt_width:],
        "advantages": torch.randn(case.rows, case.response_width, generator=generator),
    }


def choose_packing(model, batch, layout):
    """The PackedBatch the layout runs, or None for the padded rectangle."""
    from hybridflow.models import layouts

    if layout == "one-row":
        return layouts.pack_padded(batch["input_ids"], batch["attention_mask"])
    if layout == "auto":
        packing, _ = layouts.choose_packing(model, batch["attention_mask"])
        return packing.pack(batch["input_ids"], batch["attention_mask"])
    return None


def all_position_log_probs(model, batch, packed, response_width, method, calculate_entropy):
    """Project every position to the vocabulary, then take log-probs naively or per chunk: [B, R]."""
    from hybridflow.models.layouts import pack_values, packed_outputs, unpack
    from hybridflow.models.log_probs import log_probs_and_entropy

    input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
    labels = torch.roll(input_ids, shifts=-1, dims=1)
    if packed is not None:
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits
        logits, labels = packed_outputs(logits, packed), pack_values(labels, packed)
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
    window = slice(-response_width - 1, -1)
    if packed is not None:
        log_probs = unpack(log_probs, packed)[:, window]
        entropy = unpack(entropy, packed)[:, window] if entropy is not None else None
    else:
        log_probs = log_probs[:, window]
        entropy = entropy[:, window] if entropy is not None else None
    return log_probs, entropy


def step(model, batch, layout, response_width, method, mode):
    from fractions import Fraction

    from hybridflow.models.layouts import PADDED, Layout, choose_layout
    from hybridflow.models.log_probs import forward_token_statistics

    train = mode == "train"
    with torch.set_grad_enabled(train):
        if method == "kept+chunked":
            tensors = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
            if layout == "auto":
                chosen = choose_layout(model, *tensors[:2], response_width, False, True)
            else:
                chosen = PADDED if layout == "padded" else Layout(rows_per_sample=Fraction(1, len(tensors[0])))
            statistics = forward_token_statistics(model, *tensors, response_width, chosen, calculate_entropy=not train)
            log_probs = statistics.log_probs
        else:
            packed = choose_packing(model, batch, layout)
            log_probs, _ = all_position_log_probs(model, batch, packed, response_width, method, not train)
        if train:
            mask = batch["response_mask"]
            loss = -(batch["advantages"] * log_probs * mask).sum() / mask.sum()
            loss.backward()
            model.zero_grad(set_to_none=True)


def run_variant(case_name: str, layout: str, method: str, mode: str) -> dict:
    """Runs in the child process: warm-up, timed steps (packing included), memory; returns one table row."""
    torch.set_num_threads(1)
    case = CASES[case_name]
    model = build_model(case.model).train(mode == "train")
    batch = build_batch(case, model.config.vocab_size)
    packed = choose_packing(model, batch, layout)
    resident_before = _resident_mib()
    step(model, batch, layout, case.response_width, method, mode)
    cpu_start, walls = time.process_time(), []
    for _ in range(REPEATS):
        started = time.perf_counter()
        step(model, batch, layout, case.response_width, method, mode)
        walls.append(time.perf_counter() - started)
    wall = statistics.median(walls)
    shape = tuple(packed.input_ids.shape) if packed is not None else tuple(batch["input_ids"].shape)
    return {
        "case": case_name,
        "mode": mode,
        "layout": layout,
        "log_prob": method,
        "rows": "x".join(map(str, shape)),
        "tokens_per_s": int(batch["attention_mask"].sum()) / wall,
        "wall_s": wall,
        "cpu_s": time.process_time() - cpu_start,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - resident_before,
        "load1": os.getloadavg()[0],
    }


def _resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def variants(table: str) -> list[tuple[str, str, str, str]]:
    if table == "log-prob":
        layouts = ("padded", "auto")
        methods = LOG_PROB_METHODS
        return [("varied-32k", layout, method, mode) for mode in MODES for layout in layouts for method in methods]
    layouts = ("padded", "one-row", "auto")
    return [(case, layout, "kept+chunked", mode) for case in CASES for mode in MODES for layout in layouts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", nargs=4, metavar=("CASE", "LAYOUT", "LOG_PROB", "MODE"), help="run one (child)")
    parser.add_argument("--table", choices=("log-prob", "layout"), action="append", help="default: both")
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(*args.variant)))
        return
    for name, case in CASES.items():
        mask = build_batch(case, 2)["attention_mask"]
        print(f"{name}: {case.rows} rows x {mask.shape[1]} tokens, {int(mask.sum())} real ({mask.float().mean():.0%})")
    header = ("case", "mode", "layout", "log-prob", "rows", "tokens/s", "wall s", "cpu s", "peak MiB", "load1")
    for table in args.table or ("log-prob", "layout"):
        print(f"\n{table} table")
        print("{:10} {:5} {:7} {:12} {:>8} {:>8} {:>7} {:>6} {:>8} {:>5}".format(*header))
        for variant in variants(table):
            row = _run_child(variant)
            print(
                f"{row['case']:10} {row['mode']:5} {row['layout']:7} {row['log_prob']:12} {row['rows']:>8} "
                f"{row['tokens_per_s']:8.0f} {row['wall_s']:7.3f} {row['cpu_s']:6.2f} {row['peak_mib']:8.0f} "
                f"{row['load1']:5.2f}",
                flush=True,
            )


def _run_child(variant: tuple[str, str, str, str]) -> dict:
    command = [sys.executable, "-m", "bench.bench_models", "--variant", *variant]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
