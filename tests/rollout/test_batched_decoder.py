"""Continuous batching: rows leave the cache when they end, joiners do not change anyone's samples."""

import asyncio

import torch
from transformers import Qwen3NextForCausalLM

from hybridflow.models.loading import load_causal_lm
from hybridflow.rollout import GenerationRequest, SamplingParams
from hybridflow.rollout.batched_decoder import BatchedDecoder
from tests.float_bounds import longest_reduction, model_output_bound
from tests.recurrent_model import qwen3_next_config


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
            GenerationRequest(
                tokenizer.encode("x" * (3 + 7 * i)), SamplingParams(max_new_tokens=5 + 9 * i, seed=i, top_k=20 * i)
            )
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


def _decode_all(decoder, sequences, together):
    """Prefill ``sequences`` in one call (together) or one call each, then decode until every row ends."""
    if together:
        decoder.add(sequences)
    else:
        for sequence in sequences:
            decoder.add([sequence])
    while decoder.sequences:
        decoder.step()
    return [(s.token_ids, s.log_probs) for s in sequences]


def test_the_samples_of_one_prompt_prefill_it_once_and_sample_as_if_alone(tiny_model_dir, tokenizer):
    model = load_causal_lm(tiny_model_dir).eval()
    prefill_rows = []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: (
            prefill_rows.append(kwargs["input_ids"].shape[0]) if kwargs["input_ids"].shape[1] > 1 else None
        ),
        with_kwargs=True,
    )
    prompts = [tokenizer.encode("first prompt"), tokenizer.encode("the second, longer prompt")]

    def sequences(decoder):
        return [
            decoder.new_sequence(GenerationRequest(prompt, SamplingParams(max_new_tokens=12, seed=10 * p + k)))
            for p, prompt in enumerate(prompts)
            for k in range(4)
        ]

    decoder = BatchedDecoder(model, eos_token_ids=set(), max_batch_tokens=1024)
    shared = _decode_all(decoder, sequences(decoder), together=True)
    assert prefill_rows == [2]  # two distinct prompts, eight samples
    prefill_rows.clear()
    decoder = BatchedDecoder(model, eos_token_ids=set(), max_batch_tokens=1024)
    alone = _decode_all(decoder, sequences(decoder), together=False)
    assert prefill_rows == [1] * 8
    # The same seeds draw the same tokens; log-probs agree up to the batch's float32 summation order.
    assert [tokens for tokens, _ in shared] == [tokens for tokens, _ in alone]
    assert len({tuple(tokens) for tokens, _ in shared[:4]}) > 1  # the four samples of a prompt differ
    expected = torch.tensor([lp for _, lps in alone for lp in lps])
    bound = model_output_bound(expected, longest_reduction(model.config))
    torch.testing.assert_close(torch.tensor([lp for _, lps in shared for lp in lps]), expected, atol=bound, rtol=0)


def test_a_model_with_recurrent_layers_keeps_each_rows_state_as_rows_share_and_leave_the_batch():
    """Qwen3-Next's linear-attention layers hold a state per row, not keys per token: copying a shared prompt's
    row and dropping finished rows must select those states too, or a row decodes from another's."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen3NextForCausalLM(qwen3_next_config()).eval()
    prompts = [[5, 9, 17, 40, 2], [100, 7], [33, 34, 35]]  # left-padded to 5 in the shared prefill

    def sequences(decoder):
        return [
            decoder.new_sequence(GenerationRequest(prompt, SamplingParams(max_new_tokens=2 + 3 * k + p, seed=k)))
            for p, prompt in enumerate(prompts)
            for k in range(2)
        ]

    decoder = BatchedDecoder(model, eos_token_ids=set(), max_batch_tokens=1024)
    shared = _decode_all(decoder, sequences(decoder), together=True)
    alone = []
    for sequence in sequences(decoder):
        alone += _decode_all(BatchedDecoder(model, eos_token_ids=set(), max_batch_tokens=1024), [sequence], True)
    assert [len(tokens) for tokens, _ in shared] == [2, 5, 3, 6, 4, 7]  # rows leave at six different steps
    assert [tokens for tokens, _ in shared] == [tokens for tokens, _ in alone]
    expected = torch.tensor([lp for _, lps in alone for lp in lps])
    bound = model_output_bound(expected, longest_reduction(model.config))
    torch.testing.assert_close(torch.tensor([lp for _, lps in shared for lp in lps]), expected, atol=bound, rtol=0)
