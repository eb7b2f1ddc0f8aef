"""The vllm engine split over a tensor-parallel group (vLLM's SPMD engines, ``external_launcher``), on a real gloo
group of 2 processes: each rank passes its own prompts, the group generates them together, and each rank gets
its own back, equal token for token to one whole engine's, before and after a weight sync."""

import pytest
import torch
import torch.distributed as dist

pytest.importorskip("vllm")

from hybridflow.models.loading import load_causal_lm, load_model_config, load_tokenizer  # noqa: E402
from hybridflow.rollout import GenerationRequest, RolloutConfig, SamplingParams, create_rollout_engine  # noqa: E402
from hybridflow.rollout.vllm_memory import kv_cache_bytes  # noqa: E402
from tests.float_bounds import longest_reduction, model_output_bound  # noqa: E402
from tests.gloo_ranks import run_on_ranks  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 9, 14, 3], [7, 7, 2], [11, 4, 6, 8, 10], [12, 13]]


def _engine(model_dir: str, size: int):
    cache = kv_cache_bytes(load_model_config(model_dir), "float32", 4, 64)
    config = RolloutConfig.from_dict(
        {
            "name": "vllm",
            "tensor_model_parallel_size": size,
            "response_length": 10,
            "prompt_length": 16,
            "max_num_seqs": 4,
            "max_model_len": 64,
            "enforce_eager": True,
            "enable_chunked_prefill": False,
            "calculate_log_probs": True,
            "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": cache}},
        }
    )
    return create_rollout_engine(config, model_dir, tokenizer=load_tokenizer(model_dir))


def _generations(engine, prompts: list[list[int]]) -> list[tuple[list[int], torch.Tensor]]:
    requests = [GenerationRequest(ids, SamplingParams(max_new_tokens=10, do_sample=False)) for ids in prompts]
    return [(result.token_ids, torch.tensor(result.log_probs)) for result in engine.generate_batch(requests)]


def _before_and_after_a_sync(model_dir: str) -> dict:
    """This rank's prompts (its half when 2 ranks split the model, all of them alone), greedy, before and after a
    sync of weights that every rank changes alike."""
    size, rank = dist.get_world_size(), dist.get_rank()
    prompts = PROMPTS[rank * 2 : rank * 2 + 2] if size == 2 else PROMPTS
    engine = _engine(model_dir, size)
    before = _generations(engine, prompts)
    model = load_causal_lm(model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    engine.load_weights(model.named_parameters())
    return {"before": before, "after": _generations(engine, prompts)}


def test_a_split_engine_generates_what_a_whole_one_does_before_and_after_a_sync(tiny_model_dir, tmp_path):
    split = run_on_ranks(_before_and_after_a_sync, 2, tiny_model_dir, tmp_path / "split")
    (whole,) = run_on_ranks(_before_and_after_a_sync, 1, tiny_model_dir, tmp_path / "whole").values()
    num_terms = longest_reduction(load_model_config(tiny_model_dir))
    for moment in ("before", "after"):
        got = split[0][moment] + split[1][moment]
        assert [tokens for tokens, _ in got] == [tokens for tokens, _ in whole[moment]], moment
        for (_, log_probs), (_, expected) in zip(got, whole[moment]):
            torch.testing.assert_close(log_probs, expected, rtol=0, atol=model_output_bound(expected, num_terms))
    assert whole["before"] != whole["after"], "the sync changed nothing to compare"
