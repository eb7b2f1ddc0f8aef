"""Run a function on every rank of a real gloo group of spawned processes and collect what each returns."""

from __future__ import annotations

import pathlib
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from hybridflow.distributed.worker import find_free_port


def run_on_ranks(work: Callable[[str], Any], world_size: int, model_dir, out_dir: pathlib.Path) -> dict[int, Any]:
    """``work(model_dir)`` on each of ``world_size`` processes (one torch thread each, a gloo group over them);
    returns each rank's result by rank. ``work`` is a module-level function (spawn pickles it); a rank's exception
    is raised here with its traceback."""
    out_dir.mkdir(parents=True, exist_ok=True)
    mp.spawn(_rank, args=(work, world_size, find_free_port(), str(model_dir), str(out_dir)), nprocs=world_size)
    return {rank: torch.load(out_dir / f"rank{rank}.pt", weights_only=False) for rank in range(world_size)}


def _rank(rank: int, work, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.save(work(model_dir), f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()
