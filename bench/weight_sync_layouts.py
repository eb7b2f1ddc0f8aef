"""Resharding from a training layout (t, d) into a generation layout (t_g, d_g) on 4 CPU ranks: bytes sent and
received, peak extra memory and seconds per rank, against the naive gather-then-slice on the same run.

- ``reshard``: ``distributed/resharding.py``, what the hybrid engine's sync runs into a tensor-parallel engine:
  per weight, one all-to-all in which each rank receives only the part of its generation shard it lacks. The
  generation groups are strided so that each rank's training chunk lies inside its generation shard
  (``models/tensor_parallel.generation_mesh``), the 3D-HybridEngine's grouping (arXiv 2409.19256 §5.4).
- ``naive``: per weight, ``DTensor.full_tensor()`` on every rank, then the rank's slice copied (the paper's
  HybridFlow-V gathers the whole model first; this gathers one weight at a time, so its memory is one weight).

The training layout is the actor's own (``workers/fsdp.shard_model``): FSDP2 alone for t = 1, FSDP2 x TP on
``training_mesh`` for t > 1 (the split first, FSDP's chunks of each split; chunk r on rank r); FSDP chunks the
row-split layers by columns when t_g > 1, as the actor does for a tensor-parallel rollout. The model: the
~150 MB float32 Qwen2 of bench_weight_sync (hidden 768, 6 layers, 12 heads, 4 key-value heads). Bytes are
counted from the pieces each rank sends and receives (naive: an all-gather receives the weight less the rank's
own shard; a ring all-gather sends as much). "paper" is the 3D-HybridEngine's figure per rank,
``(1/t_g - 1/(t d)) M``. Extra memory: peak resident memory during the sync (VmHWM reset before it) minus the
resident memory before, the largest over ranks and over 3 syncs after a warm-up; seconds: the median sync.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time

LAYOUTS = [((1, 4), (1, 4)), ((1, 4), (2, 2)), ((1, 4), (4, 1)), ((2, 2), (4, 1)), ((4, 1), (2, 2))]
WORLD_SIZE = 4
SCHEMES = ("reshard", "naive")


def _rank(rank: int, port: int, model_dir: str, layout: tuple, scheme: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from hybridflow.distributed.resharding import Traffic, own_box, reshard_into
    from hybridflow.models.loading import load_causal_lm
    from hybridflow.models.tensor_parallel import ROW_SPLIT, generation_mesh, shard_for_generation
    from hybridflow.workers.config import FSDPConfig
    from hybridflow.workers.fsdp import build_device_mesh, shard_model

    torch.set_num_threads(1)
    # The naive gather of a 2-D layout is two all-gathers, which DTensor warns about on every weight.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    (t, _), (t_g, _) = layout
    # The actor's own sharding: FSDP2 alone (row-split layers by columns for a split rollout), or FSDP2 x TP.
    full = load_causal_lm(model_dir)
    model_mib = sum(p.numel() * p.element_size() for p in full.parameters()) / 2**20
    column_sharded = ROW_SPLIT if t_g > 1 else ()
    actor = shard_model(full, build_device_mesh(-1, torch.device("cpu"), t), FSDPConfig(), column_sharded)
    training = {name: param.detach() for name, param in actor.named_parameters()}
    generation = load_causal_lm(model_dir)
    with torch.no_grad():
        for param in generation.parameters():
            param.zero_()  # so that a weight the sync missed shows
    shard_for_generation(generation, generation_mesh(t_g, "cpu"))
    targets = dict(generation.named_parameters())

    def sync() -> Traffic:
        traffic = Traffic()
        for name, target in targets.items():
            source = training[name]
            if scheme == "reshard" and isinstance(target, DTensor):
                traffic.add(reshard_into(source, target))
                continue
            whole = source.full_tensor()
            box = own_box(target) if isinstance(target, DTensor) else tuple((0, n) for n in whole.shape)
            local = target.to_local() if isinstance(target, DTensor) else target.data
            local.copy_(whole[tuple(slice(a, b) for a, b in box)])
            gathered = (whole.numel() - source.to_local().numel()) * whole.element_size()
            traffic.add(Traffic(sent=gathered, received=gathered))
        return traffic

    seconds, extra = [], []
    with torch.no_grad():
        for _ in range(4):  # the first is a warm-up
            dist.barrier()
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
            before = _status_mib("VmRSS")
            start = time.perf_counter()
            traffic = sync()
            seconds.append(time.perf_counter() - start)
            extra.append(_status_mib("VmHWM") - before)
    exact = all(
        torch.equal(
            target.to_local() if isinstance(target, DTensor) else target,
            training[name].full_tensor()[
                tuple(slice(a, b) for a, b in (own_box(target) if isinstance(target, DTensor) else ()))
            ],
        )
        for name, target in targets.items()
    )
    local_mib = sum((p.to_local() if isinstance(p, DTensor) else p).numel() * 4 for p in targets.values()) / 2**20
    row = {
        "sent_mib": traffic.sent / 2**20,
        "received_mib": traffic.received / 2**20,
        "extra_mib": max(extra[1:]),
        "seconds": statistics.median(seconds[1:]),
        "exact": exact,
        "generation_shard_mib": local_mib,
        "model_mib": model_mib,
        "largest_parameter_mib": max(p.numel() * 4 for p in training.values()) / 2**20,
    }
    with open(f"{out_dir}/rank{rank}.json", "w") as out:
        json.dump(row, out)
    dist.destroy_process_group()


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def run_layout(model_dir: str, layout: tuple, scheme: str) -> dict:
    """One layout and scheme on 4 fresh processes; the worst rank's numbers."""
    import torch.multiprocessing as mp

    from hybridflow.distributed.worker import find_free_port

    out_dir = tempfile.mkdtemp()
    mp.spawn(_rank, args=(find_free_port(), model_dir, layout, scheme, out_dir), nprocs=WORLD_SIZE)
    rows = [json.load(open(f"{out_dir}/rank{rank}.json")) for rank in range(WORLD_SIZE)]
    worst = {key: max(row[key] for row in rows) for key in rows[0] if key != "exact"}
    return {**worst, "exact": all(row["exact"] for row in rows), "load1": os.getloadavg()[0]}


def print_table() -> None:
    from bench.bench_weight_sync import build_sync_model

    os.environ["MALLOC_MMAP_THRESHOLD_"] = "131072"  # freed buffers go back at once: peaks show what a sync holds
    model_dir = build_sync_model()
    header = ("(t,d)->(t_g,d_g)", "scheme", "sent MiB", "recv MiB", "paper MiB", "extra MiB", "shard MiB", "s", "ok")
    print("{:18} {:8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>3}".format(*header))
    for layout in LAYOUTS:
        (t, d), (t_g, d_g) = layout
        for scheme in SCHEMES:
            row = run_layout(model_dir, layout, scheme)
            paper = (1 / t_g - 1 / (t * d)) * row["model_mib"] if scheme == "reshard" else float("nan")
            print(
                f"{f'({t},{d})->({t_g},{d_g})':18} {scheme:8} {row['sent_mib']:9.1f} {row['received_mib']:9.1f} "
                f"{paper:9.1f} {row['extra_mib']:9.1f} {row['generation_shard_mib']:9.1f} {row['seconds']:6.2f} "
                f"{'yes' if row['exact'] else 'NO':>3}",
                flush=True,
            )
    print(f"model {row['model_mib']:.1f} MiB, largest weight {row['largest_parameter_mib']:.1f} MiB")
