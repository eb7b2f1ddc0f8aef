"""The GPU lane (`make test-gpu`): a CUDA process group for the tests that build workers in this process."""

from __future__ import annotations

import pytest
import torch.distributed as dist

from hybridflow.distributed.worker import find_free_port


@pytest.fixture(scope="session")
def cuda_group():
    """A 1-rank group in this process over NCCL for CUDA tensors (gloo for CPU ones), as the workers make it."""
    created = not dist.is_initialized()
    if created:
        dist.init_process_group(
            "cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1
        )
    yield
    if created:
        dist.destroy_process_group()
