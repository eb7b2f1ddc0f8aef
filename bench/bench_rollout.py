"""Rollout engines on CPU: ``model.generate`` vs transformers' continuous batching vs hybridflow's "hf" engine.

Workload: 64 prompts of 8-40 random tokens, up to 128 new tokens each, sampling at temperature 1, on a
randomly initialised Qwen2 of about 3M parameters (hidden 256, 4 layers, vocabulary 263 like the tiny model).
- ``fixed``: no stop token, every sequence runs 128 tokens;
- ``eos-varied``: 8 token ids end a sequence (about 3% per step), so lengths vary from 1 to 128;
- ``groups``: as a GRPO step samples: 16 prompts of 120-136 tokens, each 8 times (128 requests, each with its
  own seed), ended by the same stop ids.

Methods:
- ``generate``: ``model.generate`` on the left-padded batch (finished rows keep decoding until the longest ends);
- ``cb``: transformers' ``generate_batch`` (continuous batching, attention "sdpa") with ``num_blocks`` and
  ``max_batch_tokens`` set explicitly (its defaults size the cache from 60% of RAM on CPU);
- ``hybridflow``: ``HFRolloutEngine.generate_batch`` (rollout/batched_decoder.py: rows leave the KV cache at
  their own end, new requests join running batches).

Each (method, workload) runs in a fresh subprocess with one torch thread: a warm-up pass, then a timed pass.
"tokens/s" counts useful tokens (up to and including each sequence's stop token); "cpu s" is the child's
CPU time for the timed pass; "peak MiB" is the child's peak resident memory minus its resident memory after
the model was built; "tokens/cpu s" is the throughput per CPU-second. Run: ``.venv/bin/python -m
bench.bench_rollout`` (a few minutes on a quiet machine).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

PROMPTS, MAX_NEW_TOKENS, VOCAB_SIZE, PAD_ID = 64, 128, 263, 0
STOP_IDS = list(range(100, 108))
METHODS = ("generate", "cb", "hybridflow")
WORKLOADS = ("fixed", "eos-varied", "groups")
GROUPS, SAMPLES_PER_PROMPT = 16, 8
PAGE_SIZE = 32


def build_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def build_prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    lengths = torch.randint(8, 41, (PROMPTS,), generator=generator).tolist()
    return [torch.randint(110, VOCAB_SIZE, (n,), generator=generator).tolist() for n in lengths]


def build_group_prompts() -> list[list[int]]:
    """``GROUPS`` prompts of 120-136 tokens, each repeated ``SAMPLES_PER_PROMPT`` times in a row."""
    generator = torch.Generator().manual_seed(2)
    lengths = torch.randint(120, 137, (GROUPS,), generator=generator).tolist()
    distinct = [torch.randint(110, VOCAB_SIZE, (n,), generator=generator).tolist() for n in lengths]
    return [prompt for prompt in distinct for _ in range(SAMPLES_PER_PROMPT)]


def useful_tokens(rows: list[list[int]], stop_ids: list[int]) -> int:
    """Tokens up to and including each row's first stop token."""
    total = 0
    for row in rows:
        ends = [i for i, token in enumerate(row) if token in stop_ids]
        total += ends[0] + 1 if ends else len(row)
    return total


def run_generate(model, prompts, stop_ids) -> int:
    width = max(map(len, prompts))
    input_ids = torch.full((len(prompts), width), PAD_ID)
    attention_mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, width - len(ids) :] = torch.tensor(ids)
        attention_mask[row, width - len(ids) :] = 1
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=MAX_NEW_TOKENS,
            eos_token_id=stop_ids or None,
            pad_token_id=PAD_ID,
        )
    return useful_tokens(out[:, width:].tolist(), stop_ids)


def run_cb(model, prompts, stop_ids) -> int:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=MAX_NEW_TOKENS,
        eos_token_id=stop_ids or -1,
        pad_token_id=PAD_ID,
    )
    longest = max(map(len, prompts)) + MAX_NEW_TOKENS
    cb_config = ContinuousBatchingConfig(
        page_size=PAGE_SIZE,
        num_blocks=len(prompts) * math.ceil(longest / PAGE_SIZE),
        max_batch_tokens=2048,
        auto_switch_to_flash=False,
        seed=0,
    )
    results = model.generate_batch(prompts, generation_config=generation_config, continuous_batching_config=cb_config)
    return sum(len(result.generated_tokens) for result in results.values())


def run_hybridflow(model, prompts, stop_ids) -> int:
    from hybridflow.rollout import GenerationRequest, HFRolloutEngine, RolloutConfig, SamplingParams
    from hybridflow.rollout.sequences import sample_seed

    class Tokenizer:  # the engine only needs these two ids here (no stop strings, no chat template)
        eos_token_id = None
        pad_token_id = PAD_ID

    engine = HFRolloutEngine(model, Tokenizer(), RolloutConfig(max_batch_tokens=2048))
    try:
        requests = [
            GenerationRequest(
                ids, SamplingParams(max_new_tokens=MAX_NEW_TOKENS, stop_token_ids=stop_ids, seed=sample_seed(0, i))
            )
            for i, ids in enumerate(prompts)
        ]
        return sum(len(result.token_ids) for result in engine.generate_batch(requests))
    finally:
        engine.close()


RUNNERS = {"generate": run_generate, "cb": run_cb, "hybridflow": run_hybridflow}


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child(method: str, workload: str) -> dict:
    torch.set_num_threads(1)
    model = build_model()
    prompts = build_group_prompts() if workload == "groups" else build_prompts()
    stop_ids = [] if workload == "fixed" else STOP_IDS
    baseline = _rss_bytes()
    RUNNERS[method](model, prompts, stop_ids)  # warm-up
    cpu, start = _cpu_seconds(), time.perf_counter()
    tokens = RUNNERS[method](model, prompts, stop_ids)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline
    return {
        "method": method,
        "workload": workload,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "cpu_s": _cpu_seconds() - cpu,
        "peak_mib": peak / 2**20,
        "load1": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", nargs=2, metavar=("METHOD", "WORKLOAD"), help=argparse.SUPPRESS)
    parser.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    params = sum(p.numel() for p in build_model().parameters())
    print(f"up to {MAX_NEW_TOKENS} new tokens per request, Qwen2 {params / 1e6:.1f}M params, 1 torch thread")
    print("| workload | method | tokens | wall s | tokens/s | cpu s | tokens/cpu s | peak MiB | load1 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    per_cpu_second: dict[tuple[str, str], float] = {}
    for workload in WORKLOADS:
        for method in args.methods:
            command = [sys.executable, "-m", "bench.bench_rollout", "--child", method, workload]
            proc = subprocess.run(
                command, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)) or "."
            )
            if proc.returncode != 0:
                print(f"| {workload} | {method} | failed: {proc.stderr.strip().splitlines()[-1]} |||||")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            per_cpu_second[workload, method] = r["tokens"] / r["cpu_s"]
            print(
                f"| {workload} | {method} | {r['tokens']} | {r['wall_s']:.2f} | {r['tokens_per_s']:.0f} | "
                f"{r['cpu_s']:.2f} | {r['tokens'] / r['cpu_s']:.0f} | {r['peak_mib']:.1f} | {r['load1']:.2f} |",
                flush=True,
            )
    for workload in WORKLOADS:
        if (workload, "hybridflow") in per_cpu_second and (workload, "generate") in per_cpu_second:
            ratio = per_cpu_second[workload, "hybridflow"] / per_cpu_second[workload, "generate"]
            print(f"{workload}: hybridflow's tokens per CPU-second are {ratio:.2f}x model.generate's")


if __name__ == "__main__":
    main()
