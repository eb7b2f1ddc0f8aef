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


@pytest.fixture(scope="session")
def saved_adapter(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter (rank 4, alpha 8) of the tiny model with non-zero weights, saved by peft."""
    from hybridflow.models.loading import load_causal_lm
    from hybridflow.models.lora import apply_lora

    model = apply_lora(load_causal_lm(tiny_model_dir), rank=4, alpha=8)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    folder = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(folder)
    return folder
