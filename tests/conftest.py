"""Fixtures shared across the suite: one local Ray cluster, one tiny model per test session, one tiny model of each
other family users bring, and a tiny parquet task with the overrides of a small valid run."""

import collections
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest

from tests.hydra_configs_once import parse_package_configs_once
from tests.trainer.cli import RayTempDir

parse_package_configs_once()


def pytest_collection_modifyitems(items):
    """The files with the most end-to-end runs first: pytest-xdist hands out whole files in this order, so the
    long ones start early and the short ones fill the end, instead of one process finishing a long file alone."""
    slow_runs = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow_runs[item.path])


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster shared by every test that needs one (start-up costs seconds)."""
    import ray

    from hybridflow.distributed.ray_init import init_local_ray

    with RayTempDir() as temp_dir:  # short: Ray's socket paths must fit 107 bytes
        init_local_ray(num_cpus=4, temp_dir=temp_dir)
        yield ray
        ray.shutdown()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised tiny causal LM with its tokenizer and chat template, in HF folder format."""
    from hybridflow.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture(scope="session")
def four_kv_heads_model_dir(tmp_path_factory):
    """The tiny model with 4 key-value heads, so that tensor-parallel groups of 4 ranks hold one each."""
    from hybridflow.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("four_kv_heads"), num_attention_heads=4, num_key_value_heads=4)


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory):
    """A random tiny reward model whose tokenizer and chat template differ from the tiny model's."""
    from hybridflow.models.tiny_reward_model import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny_reward_model"), seed=0)


# The families users bring besides Qwen2 (the tiny model above), as hybridflow.models.tiny builds them.
MODEL_FAMILIES = ("llama", "qwen3", "gemma3", "mistral", "seed_oss", "qwen3_moe")


@pytest.fixture(scope="session", params=MODEL_FAMILIES)
def model_family(request):
    """Each family of MODEL_FAMILIES in turn: a test that takes it runs once per family."""
    return request.param


@pytest.fixture(scope="session")
def family_model_dir(model_family, tmp_path_factory):
    """A random tiny model of ``model_family`` with the tiny model's tokenizer, in HF folder format."""
    from hybridflow.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp(f"tiny_{model_family}"), seed=0, family=model_family)


@pytest.fixture(scope="session")
def saved_adapter(tiny_model_dir, tmp_path_factory):
    """A LoRA adapter (rank 4, alpha 8) of the tiny model with non-zero weights, saved by peft."""
    import torch

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


@pytest.fixture(scope="session")
def tiny_parquet(tmp_path_factory):
    """(train, val) parquet files of short arithmetic prompts in verl's row schema: 16 train, 4 val."""
    from hybridflow.data.parquet_io import write_train_test
    from hybridflow.data.synthetic import arithmetic_problems, train_test_rows

    problems = arithmetic_problems(20, seed=0, max_value=9)
    train_rows, val_rows = train_test_rows(problems, num_test=4, data_source="arithmetic", ability="math")
    return write_train_test(train_rows, val_rows, tmp_path_factory.mktemp("parquet"))


@pytest.fixture(scope="session")
def varied_parquet(tmp_path_factory):
    """Parquet files as ``tiny_parquet``'s, one-digit and four-digit operands taking turns: prompts of different
    lengths, so batches drawn apart are padded to different widths (``tiny_parquet``'s all have one length)."""
    from hybridflow.data.parquet_io import write_train_test
    from hybridflow.data.synthetic import arithmetic_problems, train_test_rows

    short, long = arithmetic_problems(10, seed=0, max_value=9), arithmetic_problems(10, seed=0, max_value=9999)
    problems = [problem for pair in zip(short, long) for problem in pair]
    train_rows, val_rows = train_test_rows(problems, num_test=4, data_source="arithmetic", ability="math")
    return write_train_test(train_rows, val_rows, tmp_path_factory.mktemp("varied_parquet"))


@pytest.fixture()
def base(tiny_model_dir, tiny_parquet, tmp_path):
    """The overrides of a small valid run (see ``tiny_run_overrides``), for tests that add one bad key."""
    from tests.trainer.helpers import tiny_run_overrides

    return tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run")
