"""vLLM's CPU KV cache arithmetic (hybridflow/rollout/vllm_memory.py), on the tiny model: hidden 128, 4 heads of
32, 2 KV heads, 2 layers; no vLLM needed (the node's memory is given, as vLLM would read it)."""

import pytest

from hybridflow.models.loading import load_causal_lm, load_model_config
from hybridflow.rollout import RolloutConfig
from hybridflow.rollout.vllm_memory import (
    GIB,
    KV_BYTES_KEY,
    NodeMemory,
    cpu_kv_cache_error,
    kv_bytes_per_token,
    kv_cache_bytes,
    weight_bytes,
)

# keys and values x 2 layers x 2 KV heads x 32 dimensions x 4 bytes
PER_TOKEN_FLOAT32 = 2 * 2 * 2 * 32 * 4


def test_a_token_and_a_cache_in_whole_blocks_of_128_tokens(tiny_model_dir):
    config = load_model_config(tiny_model_dir)
    assert kv_bytes_per_token(config, "float32") == PER_TOKEN_FLOAT32
    assert kv_bytes_per_token(config, "bfloat16") == PER_TOKEN_FLOAT32 // 2
    assert kv_cache_bytes(config, "float32", 6, 128) == 6 * 128 * PER_TOKEN_FLOAT32
    assert kv_cache_bytes(config, "float32", 6, 129) == 6 * 256 * PER_TOKEN_FLOAT32  # a second block each


def test_the_weights_as_vllm_holds_them_are_read_from_the_headers(tiny_model_dir):
    parameters = sum(p.numel() for p in load_causal_lm(tiny_model_dir).parameters())  # tied ones once, as saved
    assert weight_bytes(tiny_model_dir, "float32") == 4 * parameters
    assert weight_bytes(tiny_model_dir, "bfloat16") == 2 * parameters


@pytest.fixture
def rollout():
    return RolloutConfig.from_dict(
        {"name": "vllm", "prompt_length": 64, "response_length": 64, "gpu_memory_utilization": 0.5}
    )


def test_a_share_is_refused_exactly_when_it_leaves_less_than_one_sequence(tiny_model_dir, rollout):
    """Half of a 1 GiB node is 512 MiB; the cache must hold one sequence of 128 tokens (one block) beyond what the
    process holds, as vLLM requires."""
    config, node = load_model_config(tiny_model_dir), NodeMemory(0, GIB, GIB)
    one_sequence = 128 * PER_TOKEN_FLOAT32
    fits = GIB // 2 - one_sequence
    assert cpu_kv_cache_error(rollout, config, node, fits, 4, "room for 4") is None
    error = cpu_kv_cache_error(rollout, config, node, fits + 1, 4, "room for 4")
    assert error.startswith("actor_rollout_ref.rollout.gpu_memory_utilization=0.5 gives vLLM 0.50 GiB on CPU")
    assert f"set +{KV_BYTES_KEY}={4 * one_sequence} (0.00 GiB, room for 4, on any machine)" in error
    # What the process holds plus four sequences, as a share of the node, rounded up to a hundredth.
    assert error.endswith("or actor_rollout_ref.rollout.gpu_memory_utilization=0.51")


def test_a_share_beyond_what_is_available_and_an_explicit_size_beyond_it_are_refused(tiny_model_dir, rollout):
    config, node = load_model_config(tiny_model_dir), NodeMemory(1, GIB, GIB // 4)
    assert "more than the 0.25 GiB available there" in cpu_kv_cache_error(rollout, config, node, 0, 1, "room for 1")
    rollout.engine_kwargs = {"vllm": {"kv_cache_memory_bytes": GIB // 4}}
    assert cpu_kv_cache_error(rollout, config, node, GIB, 1, "room for 1") is None  # the share no longer counts
    rollout.engine_kwargs = {"vllm": {"kv_cache_memory_bytes": GIB // 4 + 1}}
    error = cpu_kv_cache_error(rollout, config, node, 0, 1, "room for 1")
    assert error.startswith(
        f"{KV_BYTES_KEY}={GIB // 4 + 1} (0.25 GiB) is more than the 0.25 GiB available on NUMA "
        "node 1, where vLLM's CPU build allocates; set "
    )
