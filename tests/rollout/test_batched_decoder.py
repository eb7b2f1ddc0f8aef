"""Continuous batching: rows leave the cache when they end, joiners do not change anyone's samples."""

import asyncio

import torch

from hybridflow.models.loading import load_causal_lm
from hybridflow.rollout import GenerationRequest, SamplingParams
from hybridflow.rollout.batched_decoder import BatchedDecoder


def test_finished_rows_leave_the_batch_and_the_cache(tiny_model_dir, tokenizer):
    model = load_causal_lm(tiny_model_dir).eval()
    decoder = BatchedDecoder(model, eos_token_ids=set(), max_batch_tokens=1024)
    prompts = ["a", "a longer prompt", "mid size"]
    sequences = [
        decoder.new_sequence(GenerationRequest(tokenizer.encode(p), SamplingParams(max_new_tokens=k, seed=i)))
        for i, (p, k) in enumerate(zip(prompts, (2, 5, 9)))
    ]
    assert decoder.add(sequences) == []
    rows_per_step, cache_rows = [], []
    while decoder.sequences:
        decoder.step()
        rows_per_step.append(len(decoder.sequences))
        cache_rows.append(decoder._cache.layers[0].keys.shape[0] if decoder._cache is not None else 0)
    assert rows_per_step == [2, 2, 2, 1, 1, 1, 1, 0]
    assert cache_rows == rows_per_step
    assert [len(s.token_ids) for s in sequences] == [2, 5, 9]
    assert decoder.cache_bytes() == 0


def test_samples_do_not_depend_on_which_requests_share_the_batch(make_engine, tokenizer):
    """A request decoded alone equals the same request joined mid-decode by others (and left by them)."""
    engine = make_engine()
    target = GenerationRequest(tokenizer.encode("the target prompt"), SamplingParams(max_new_tokens=40, seed=123))
    alone = engine.generate_batch([target])[0]

    async def crowded():
        others = [
            GenerationRequest(tokenizer.encode("x" * (3 + 7 * i)), SamplingParams(max_new_tokens=5 + 9 * i, seed=i, top_k=20 * i))
            for i in range(5)
        ]
        early = [asyncio.ensure_future(engine.generate(r)) for r in others[:2]]
        await asyncio.sleep(0.02)
        mine = asyncio.ensure_future(engine.generate(target))
        await asyncio.sleep(0.02)
        late = [asyncio.ensure_future(engine.generate(r)) for r in others[2:]]
        await asyncio.gather(*early, *late)
        return await mine

    joined = asyncio.run(crowded())
    assert joined.token_ids == alone.token_ids
    torch.testing.assert_close(torch.tensor(joined.log_probs), torch.tensor(alone.log_probs), atol=1e-4, rtol=0)
