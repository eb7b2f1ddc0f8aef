"""Weight sync into the rollout engine: seconds, and peak memory beyond the model's, against the bucket size.

Two paths of an ``ActorRolloutRefWorker`` (one rank, gloo, FSDP2) on a ~150 MB float32 Qwen2 (hidden 768, 6
layers, intermediate 2048):

- ``hybrid``: the hybrid engine's sync (``RolloutPart.update_weights``): each parameter gathered
  (``DTensor.full_tensor()``) and copied into the engine as it comes, so at most one gathered parameter is
  held beside the model.
- ``buckets <MB>``: the sync of a rollout pool of its own (``RolloutPart.load_weight_buckets``) fed as the
  object store would: the gathered weights copied into buckets of ``update_weights_bucket_megabytes``
  (``weight_buckets``), read one bucket at a time. Ray's object store itself is left out (it holds every
  bucket of a sync at once, outside the process).

Each variant runs in a fresh subprocess; "extra MiB" is the peak resident memory during the sync (VmHWM,
reset through ``/proc/self/clear_refs`` just before) minus the resident memory before it, the largest of 3
syncs after a warm-up one (which also makes resident the engine's weights, mapped from the safetensors file
until first written); "seconds" is the median of the 3. With one rank ``full_tensor()`` returns the shard
itself, so the hybrid sync allocates nothing; with N ranks it holds one gathered parameter at a time. The engine
is ``hf`` unless ``--engine vllm`` (run it with ``.venv-vllm/bin/python``, which ``make test-vllm`` builds). One
torch thread.
Run: ``.venv/bin/python -m bench.bench_weight_sync`` (about a minute). With ``--layouts``: resharding from a
training layout (t, d) into a tensor-parallel generation layout (t_g, d_g) on 4 ranks, against the naive
gather-then-slice (``bench/weight_sync_layouts.py`` says how it is measured; a few minutes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BUCKET_MEGABYTES = (8, 32, 128)


def build_sync_model() -> str:
    """The ~150 MB float32 Qwen2 both tables sync (hidden 768, 6 layers, 12 heads, 4 key-value heads)."""
    from hybridflow.models.tiny import build_tiny_model

    shape = {"hidden_size": 768, "num_hidden_layers": 6, "intermediate_size": 2048}
    return str(build_tiny_model(tempfile.mkdtemp(), num_attention_heads=12, num_key_value_heads=4, **shape))


def run_variant(path: str, bucket_megabytes: float, engine: str) -> dict:
    import torch
    import torch.distributed as dist

    from hybridflow.models.loading import load_model_config
    from hybridflow.models.weight_checksum import part_checksum
    from hybridflow.rollout import RolloutConfig
    from hybridflow.rollout.vllm_memory import kv_cache_bytes
    from hybridflow.rollout.weight_loading import weight_buckets
    from hybridflow.workers import ActorRolloutRefWorker

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
    model_dir = build_sync_model()
    rollout = {"name": engine, "prompt_length": 8, "response_length": 8, "free_cache_engine": False}
    if engine == "vllm":
        # A cache for one full batch of sequences, whatever the machine's memory (vllm_memory says why).
        kv_cache = kv_cache_bytes(load_model_config(model_dir), "float32", RolloutConfig().max_num_seqs, 16)
        rollout.update(
            enforce_eager=True,
            enable_chunked_prefill=False,
            engine_kwargs={"vllm": {"kv_cache_memory_bytes": kv_cache}},
        )
    config = {
        "model": {"path": str(model_dir)},
        "actor": {"ppo_mini_batch_size": 1, "ppo_micro_batch_size_per_gpu": 1},
        "rollout": rollout,
    }
    worker = ActorRolloutRefWorker(config, "actor_rollout")
    worker.init_model()
    actor, part = worker.parts["actor"], worker.parts["rollout"]
    model_mib = sum(p.numel() * p.element_size() for p in actor.module.parameters()) / 2**20
    largest_mib = max(p.numel() * p.element_size() for p in actor.module.parameters()) / 2**20

    def sync() -> None:
        if path == "hybrid":
            part.synced_version = None  # as after an update: the whole model is copied
            part.update_weights()
            return
        # The sender sums what it puts in the buckets (share_weights): here a pass of its own before the load.
        checksum = part_checksum((t for _, t in actor.hf_weights()), part.check.dtype) if part.check.freq else None
        copies = ((name, tensor.detach().clone()) for name, tensor in actor.hf_weights())
        part.load_weight_buckets(weight_buckets(copies, bucket_megabytes), 0, checksum)

    seconds, extra = {}, {}
    for checked in (False, True):
        part.check.freq = int(checked and part.engine.weights_readable)  # vLLM's syncs are not checksummed
        times, peaks = [], []
        for _ in range(4):  # the first is a warm-up
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")  # resets VmHWM to the current resident size
            before = _status_mib("VmRSS")
            start = time.perf_counter()
            sync()
            times.append(time.perf_counter() - start)
            peaks.append(_status_mib("VmHWM") - before)
        seconds[checked], extra[checked] = statistics.median(times[1:]), max(peaks[1:])
    return {
        "path": path,
        "bucket_mib": bucket_megabytes if path == "buckets" else None,
        "engine": engine,
        "seconds": seconds[False],
        "checked_seconds": seconds[True],
        "extra_mib": extra[False],
        "checked_extra_mib": extra[True],
        "model_mib": model_mib,
        "largest_parameter_mib": largest_mib,
        "load1": os.getloadavg()[0],
    }


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--variant", nargs=2, metavar=("PATH", "BUCKET_MB"), help="run one (child)")
    parser.add_argument(
        "--layouts", action="store_true", help="the training -> generation layouts on 4 ranks (weight_sync_layouts)"
    )
    args = parser.parse_args()
    if args.layouts:
        from bench.weight_sync_layouts import print_table

        print_table()
        return
    if args.variant:
        print(json.dumps(run_variant(args.variant[0], float(args.variant[1]), args.engine)))
        return
    header = ("path", "bucket MiB", "seconds", "checked s", "extra MiB", "checked MiB", "model MiB", "largest MiB")
    header += ("load1",)
    print(f"engine {args.engine}")
    print("{:8} {:>10} {:>8} {:>9} {:>9} {:>11} {:>9} {:>11} {:>5}".format(*header))
    for path, megabytes in itertools.chain([("hybrid", 0)], (("buckets", mb) for mb in BUCKET_MEGABYTES)):
        command = [
            sys.executable,
            "-m",
            "bench.bench_weight_sync",
            "--engine",
            args.engine,
            "--variant",
            path,
            str(megabytes),
        ]
        # Large allocations straight from mmap and back on free: otherwise glibc keeps a freed bucket's memory for
        # the next, and a later sync's peak would not show what it allocates.
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
        result = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
        row = json.loads(result.stdout.splitlines()[-1])
        bucket = "-" if row["bucket_mib"] is None else f"{row['bucket_mib']:.0f}"
        print(
            f"{row['path']:8} {bucket:>10} {row['seconds']:8.3f} {row['checked_seconds']:9.3f} {row['extra_mib']:9.1f} "
            f"{row['checked_extra_mib']:11.1f} {row['model_mib']:9.1f} {row['largest_parameter_mib']:11.1f} "
            f"{row['load1']:5.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
