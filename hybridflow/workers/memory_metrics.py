"""Memory after an actor update: verl's metrics (``perf/max_memory_allocated_gb`` and ``..._reserved_gb`` on a GPU,
``perf/cpu_memory_used_gb`` of the machine) and this process's peak resident memory, the number the config
check's estimate is measured against (``config/memory_estimate.py``)."""

from __future__ import annotations

import resource
import sys

import psutil
import torch

from hybridflow.tracking import metric_names as names

GIB = 2**30


def peak_resident_bytes() -> int:
    """This process's high-water resident memory (``getrusage``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def memory_metrics(device: str) -> dict[str, float]:
    metrics = {
        names.PERF_CPU_MEMORY_USED: psutil.virtual_memory().used / GIB,
        names.PERF_MAX_RESIDENT_MEMORY: peak_resident_bytes() / GIB,
    }
    if device == "cuda":
        metrics[names.PERF_MAX_MEMORY_ALLOCATED] = torch.cuda.max_memory_allocated() / GIB
        metrics[names.PERF_MAX_MEMORY_RESERVED] = torch.cuda.max_memory_reserved() / GIB
    return metrics
