"""The two numbers MFU needs besides time: the actor's parameter count and a worker's peak FLOP/s."""

from __future__ import annotations

import json
import math
import pathlib
import struct
import time

import torch


def count_parameters(model_dir: str | pathlib.Path) -> int:
    """Parameters stored in a Hugging Face folder's ``*.safetensors`` files, read from their headers only."""
    total = 0
    for file in sorted(pathlib.Path(model_dir).expanduser().glob("*.safetensors")):
        with file.open("rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_size))
        total += sum(math.prod(entry["shape"]) for key, entry in header.items() if key != "__metadata__")
    return total


def measure_cpu_matmul_flops(threads: int, size: int = 512, seconds: float = 0.3) -> float:
    """Dense fp32 matmul FLOP/s on ``threads`` CPU threads: the peak a CPU worker process can reach."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        torch.mm(a, b)  # warm-up
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            torch.mm(a, b)
            runs += 1
        elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(previous)
    return 2.0 * size**3 * runs / elapsed


def peak_flops_per_process(configured: float | None, device: str, cpus_per_worker: float) -> float | None:
    """``trainer.peak_flops_per_device`` if set; else measured on CPU; else None (MFU is not logged)."""
    if configured:
        return float(configured)
    if device == "cpu":
        return measure_cpu_matmul_flops(threads=max(1, int(cpus_per_worker)))
    return None
