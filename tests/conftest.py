"""Fixtures shared across the suite: one local Ray cluster and one tiny model per test session."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """A local Ray cluster shared by every test that needs one (start-up costs seconds)."""
    import ray

    from hybridflow.distributed.ray_init import init_local_ray

    init_local_ray(num_cpus=4, temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised tiny causal LM with its tokenizer and chat template, in HF folder format."""
    from hybridflow.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)
