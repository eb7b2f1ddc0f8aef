"""``Worker``: the base class of every SPMD worker; one instance per rank, one process group per group.

The worker group sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` in the process before constructing the worker; ``Worker.__init__`` reads them and joins
the group's torch.distributed process group (world size 1 included, so FSDP2 code needs no special case).
Outside a worker group (e.g. a unit test), it forms a one-process group on a free local port.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

# How long a collective may wait for the slowest rank before torch.distributed gives up: the worker group sets
# it from the role's ``nccl_timeout`` (verl's key); torch's own default outside a group.
PROCESS_GROUP_TIMEOUT_ENV = "HYBRIDFLOW_DIST_TIMEOUT_S"
DEFAULT_PROCESS_GROUP_TIMEOUT_S = 1800.0
# oneDNN compiles one primitive per matmul shape and keeps 1,024 by default; a packed update's micro-batches have
# new token counts every step, so the cache filled with primitives never used again: 0.3-0.6 GB of a 30M bf16
# run's peak at 128 tokens (issue 27). 64 holds a micro-batch's forward and backward and the decode's shapes.
# ideep (torch's bf16 path onto oneDNN) keeps its own per-shape cache of 1,024 computations beside it: a 4M bf16
# actor's heap in use grew 0.11 -> 0.55 GiB over six steps with it, and stayed at 0.22 with 16 (issue 27).
# Both are read at the first bf16 matmul, so setting them here (before any model is built) works in the driver too.
ONEDNN_CACHE_CAPACITIES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "16"}


def find_free_port() -> int:
    """A TCP port that was free a moment ago on this machine (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def process_group_backend() -> str:
    """gloo on CPU; on GPU nccl for CUDA tensors and gloo for CPU ones."""
    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def _configure_cpu_runtime() -> None:
    # The group sets OMP_NUM_THREADS from the CPUs its pool gives each process; torch reads it only at import.
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads:
        torch.set_num_threads(max(1, int(threads)))
    for name, capacity in ONEDNN_CACHE_CAPACITIES.items():
        os.environ.setdefault(name, capacity)


class Worker:
    """Base class for the workers of a ``RayWorkerGroup``.

    Subclasses call ``super().__init__()`` first, then build their models; their ``@register``-ed methods
    become methods of the group. Several roles fused into one process (``create_colocated_worker_cls``)
    share the one process group: only the first role to start creates it.

    ``rank``, ``world_size``, ``local_rank``, ``local_world_size``, ``master_addr`` and ``master_port`` are read
    from the environment once; ``device`` is ``cpu`` or this rank's ``cuda:i``, where the worker's models and
    batches live.
    """

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if self.world_size == 1:
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(find_free_port()))
        self.master_addr = os.environ["MASTER_ADDR"]
        self.master_port = int(os.environ["MASTER_PORT"])
        _configure_cpu_runtime()
        self.device = self._select_device()
        self._init_process_group()

    def _select_device(self) -> torch.device:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # Ray shows each actor only its own GPUs, so the local rank wraps around the visible ones.
        index = self.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)

    def _init_process_group(self) -> None:
        if dist.is_initialized():
            return
        timeout_s = float(os.environ.get(PROCESS_GROUP_TIMEOUT_ENV, DEFAULT_PROCESS_GROUP_TIMEOUT_S))
        dist.init_process_group(
            backend=process_group_backend(),
            init_method=f"tcp://{self.master_addr}:{self.master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
