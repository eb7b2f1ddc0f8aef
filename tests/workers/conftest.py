"""Fixtures of the worker tests: a one-process torch.distributed group.

Most tests build workers in this process over a 1-rank gloo group (FSDP2 runs the same code at world
size 1); only the tests whose point is several processes start Ray groups.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hybridflow.distributed.worker import find_free_port


@pytest.fixture(scope="session")
def process_group():
    """A 1-rank gloo group in this process (reused if something else made one), and 1 torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    assert dist.get_world_size() == 1, "the in-process worker tests need a 1-rank group"
    yield
    if created:
        dist.destroy_process_group()
    torch.set_num_threads(threads)
