"""Ulysses sequence parallelism: each rank's activation memory for one long sequence, against the group size.

A Qwen2-shaped model with random weights (hidden 256, 4 layers, 8 attention heads, 4 key-value heads,
intermediate 1024, the tiny tokenizer's 263-token vocabulary) takes the log-probs of one sequence of ``--length``
tokens whose last half is the response, and the backward of a loss on them, as the actor's update does
(``forward_token_statistics`` in the padded layout). ``k = 1`` is the ordinary path; ``k = 2, 4`` run the same
sequence split over a gloo group of ``k`` processes. Per rank:

- ``saved MiB``: the tensors autograd keeps for the backward (what activation memory is), counted once per
  storage through ``torch.autograd.graph.saved_tensors_hooks``;
- ``peak MiB``: the peak resident memory of the forward and backward (VmHWM, reset through
  ``/proc/self/clear_refs`` just before) minus the resident memory before them, which adds the transient
  tensors (attention's scores, the mask) to the saved ones;
- ``seconds``: the forward and backward.

One torch thread per rank. Run: ``.venv/bin/python -m bench.bench_sequence_parallel`` (about a minute).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MIB = 2**20


def _resident_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))


def _rank(rank: int, size: int, port: int, model_dir: str, length: int, out_dir: str) -> None:
    from hybridflow.distributed.sequence_parallel import sequence_parallel_group
    from hybridflow.models.layouts import PADDED
    from hybridflow.models.loading import load_causal_lm
    from hybridflow.models.log_probs import forward_token_statistics

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    group = sequence_parallel_group(size, torch.device("cpu")) if size > 1 else None
    model = load_causal_lm(model_dir)
    input_ids = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    position_ids = torch.arange(length)[None]
    storages: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        except RuntimeError:  # a wrapper without a plain storage (a collective's result): count its own bytes
            storages[id(tensor)] = tensor.numel() * tensor.element_size()
        return tensor

    def step() -> None:
        with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
            statistics = forward_token_statistics(
                model, input_ids, attention_mask, position_ids, length // 2, PADDED, sequence_parallel=group
            )
        statistics.log_probs.sum().backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up: gradients' buffers, the allocator's pools
    storages.clear()
    dist.barrier()
    before = _resident_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    start = time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    peak = _resident_kib("VmHWM") - before
    result = {"saved_mib": sum(storages.values()) / MIB, "peak_mib": peak / 1024, "seconds": seconds}
    with open(f"{out_dir}/rank{rank}.json", "w") as out:
        json.dump(result, out)
    dist.destroy_process_group()


def measure(size: int, model_dir: str, length: int) -> list[dict]:
    from hybridflow.distributed.worker import find_free_port

    out_dir = tempfile.mkdtemp()
    mp.spawn(_rank, args=(size, find_free_port(), model_dir, length, out_dir), nprocs=size)
    results = []
    for rank in range(size):
        with open(f"{out_dir}/rank{rank}.json") as result:
            results.append(json.load(result))
    return results


def main() -> None:
    from hybridflow.models.tiny import build_tiny_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=4096, help="tokens in the sequence (half of them response)")
    parser.add_argument("--sizes", default="1,2,4", help="group sizes to measure")
    args = parser.parse_args()
    model_dir = build_tiny_model(
        tempfile.mkdtemp(),
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=1024,
    )
    print(f"one sequence of {args.length} tokens, {args.length // 2} of them response; per rank:")
    print("| k | saved MiB (max over ranks) | peak MiB (max over ranks) | seconds (max over ranks) |")
    print("|---|---|---|---|")
    for size in (int(size) for size in args.sizes.split(",")):
        results = measure(size, model_dir, args.length)
        saved = max(result["saved_mib"] for result in results)
        peak = max(result["peak_mib"] for result in results)
        seconds = max(result["seconds"] for result in results)
        print(f"| {size} | {saved:.1f} | {peak:.1f} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
