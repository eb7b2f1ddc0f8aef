"""The "hf" engine's generate_sequences contract, seeding, stop conditions, validation and sleep/wake."""

import asyncio
import math
import threading
import time

import pytest
import torch

from hybridflow.protocol import join_parts
from hybridflow.rollout import EngineAsleepError, GenerationRequest, SamplingParams, create_rollout_engine
from hybridflow.rollout.config import RolloutConfig
from tests.rollout.prompts import TOOL_CALL_TEXT, TOOL_QUESTION, left_padded

PROMPTS = ["hi", "what is 12 * 7?", "tell me a story about a cat"]


def _stop_ids(tokenizer):
    """Forty common byte tokens: random-weight samples then stop after a few tokens, at varied lengths."""
    return tokenizer.convert_tokens_to_ids(list("abcdefghijklmnopqrstuvwxyz0123456789 .,!"))


def test_shapes_masks_and_positions_for_several_samples_per_prompt(make_engine, tokenizer):
    engine = make_engine(n=3, response_length=16, calculate_log_probs=True)
    prompts = left_padded(tokenizer, PROMPTS)
    prompts.meta_info["eos_token_id"] = _stop_ids(tokenizer)
    out = engine.generate_sequences(prompts).batch
    rows, width, length = 9, prompts.batch["input_ids"].shape[1], 16
    for key, shape in [
        ("prompts", (rows, width)),
        ("responses", (rows, length)),
        ("response_mask", (rows, length)),
        ("rollout_log_probs", (rows, length)),
        ("input_ids", (rows, width + length)),
        ("attention_mask", (rows, width + length)),
        ("position_ids", (rows, width + length)),
    ]:
        assert tuple(out[key].shape) == shape, key
    assert torch.equal(out["prompts"], prompts.batch["input_ids"].repeat_interleave(3, dim=0))
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], dim=1))
    mask = out["response_mask"]
    lengths = mask.sum(dim=1)
    assert torch.equal(mask, (torch.arange(length)[None, :] < lengths[:, None]).long()), "mask is a prefix of ones"
    assert torch.all(out["responses"][mask == 0] == tokenizer.pad_token_id)
    assert torch.equal(out["attention_mask"][:, width:], mask)
    assert torch.equal(out["attention_mask"][:, :width], prompts.batch["attention_mask"].repeat_interleave(3, dim=0))
    last_prompt_position = out["position_ids"][:, width - 1 : width]
    assert torch.equal(out["position_ids"][:, width:], last_prompt_position + torch.arange(1, length + 1))
    assert torch.all(out["rollout_log_probs"][mask == 1] < 0) and torch.all(out["rollout_log_probs"][mask == 0] == 0)
    assert len(set(lengths.tolist())) > 1, "stop ids should give varied lengths"


def test_the_stream_yields_samples_as_they_finish_and_joins_into_generate_sequences(make_engine, tokenizer):
    engine = make_engine(n=3, response_length=16, calculate_log_probs=True)
    prompts = left_padded(tokenizer, PROMPTS)
    prompts.meta_info.update(eos_token_id=_stop_ids(tokenizer), seed=11)
    parts = list(engine.generate_sequences_stream(prompts))
    assert len(parts) > 1 and {part.total for part in parts} == {9}
    lengths = [part.data.batch["response_mask"].sum(-1) for part in parts]
    # All admitted together, the shorter samples finish (and are handed over) first
    assert all(earlier.max() <= later.min() for earlier, later in zip(lengths, lengths[1:]))
    whole = engine.generate_sequences(prompts)
    joined = join_parts(parts)
    assert set(joined.batch.keys()) == set(whole.batch.keys())
    for key in whole.batch.keys():
        assert torch.equal(joined.batch[key], whole.batch[key]), key


def test_each_sequence_ends_at_its_own_first_stop_token(make_engine, tokenizer):
    engine = make_engine(n=4, response_length=24)
    prompts = left_padded(tokenizer, PROMPTS)
    prompts.meta_info["eos_token_id"] = _stop_ids(tokenizer)
    stop_ids = set(_stop_ids(tokenizer)) | engine.eos_token_ids
    out = engine.generate_sequences(prompts).batch
    for response, length in zip(out["responses"].tolist(), out["response_mask"].sum(dim=1).tolist()):
        stops = [i for i, token in enumerate(response[:length]) if token in stop_ids]
        if length < 24:
            assert stops == [length - 1], "the sequence ends with its first stop token, which is kept"
        else:
            assert not stops[:-1] and (not stops or stops[-1] == 23)


def test_eos_ends_the_sequence_and_is_in_the_mask(make_engine, tokenizer, tool_calling_model_dir):
    engine = make_engine(tool_calling_model_dir, response_length=64, do_sample=False)
    out = engine.generate_sequences(left_padded(tokenizer, [TOOL_QUESTION])).batch
    length = int(out["response_mask"].sum())
    expected = tokenizer.encode(TOOL_CALL_TEXT, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert out["responses"][0, :length].tolist() == expected
    assert torch.all(out["responses"][0, length:] == tokenizer.pad_token_id)


def test_ignore_eos_generates_past_the_eos_to_the_full_length(make_engine, tokenizer, tool_calling_model_dir):
    engine = make_engine(tool_calling_model_dir, response_length=64, do_sample=False, ignore_eos=True)
    out = engine.generate_sequences(left_padded(tokenizer, [TOOL_QUESTION])).batch
    expected = tokenizer.encode(TOOL_CALL_TEXT, add_special_tokens=False) + [tokenizer.eos_token_id]
    assert int(out["response_mask"].sum()) == 64
    assert out["responses"][0, : len(expected)].tolist() == expected


@pytest.mark.parametrize("stop", ["</tool_call>", '"calc'])
def test_stop_strings_end_the_sequence_and_are_kept(make_engine, tokenizer, tool_calling_model_dir, stop):
    engine = make_engine(tool_calling_model_dir, response_length=64, do_sample=False, stop=[stop])
    out = engine.generate_sequences(left_padded(tokenizer, [TOOL_QUESTION])).batch
    length = int(out["response_mask"].sum())
    text = tokenizer.decode(out["responses"][0, :length])
    assert text.endswith(stop) and text.count(stop) == 1
    assert TOOL_CALL_TEXT.startswith(text)


def test_same_seed_same_samples_and_successive_calls_differ(make_engine, tokenizer):
    prompts = left_padded(tokenizer, PROMPTS)
    first, second, other = (make_engine(n=2, response_length=12, seed=seed) for seed in (7, 7, 8))
    a1, a2 = (first.generate_sequences(prompts).batch["responses"] for _ in range(2))
    b1, b2 = (second.generate_sequences(prompts).batch["responses"] for _ in range(2))
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert not torch.equal(a1, a2)
    assert not torch.equal(a1, other.generate_sequences(prompts).batch["responses"])


def test_seed_from_meta_info_and_shards_sample_as_the_whole_batch(make_engine, tokenizer):
    """The driver's seed wins over the call counter (resume), and a data-parallel shard given its
    first_prompt_index samples exactly the rows it would have in the unsharded batch."""
    prompts = left_padded(tokenizer, PROMPTS)
    engine = make_engine(n=2, response_length=12, seed=0)
    prompts.meta_info["seed"] = 41
    whole = engine.generate_sequences(prompts).batch["responses"]
    fresh = make_engine(n=2, response_length=12, seed=0)
    fresh.generate_sequences(prompts)  # a later call on a fresh engine, with the same seed sent again
    assert torch.equal(fresh.generate_sequences(prompts).batch["responses"], whole)
    head, tail = prompts[:1], prompts[1:]
    head.meta_info, tail.meta_info = {"seed": 41}, {"seed": 41, "first_prompt_index": 1}
    shards = torch.cat([engine.generate_sequences(part).batch["responses"] for part in (head, tail)])
    assert torch.equal(shards, whole)


def test_validation_is_greedy_with_its_own_n_and_matches_transformers_generate(make_engine, tokenizer):
    engine = make_engine(n=5, response_length=10, val_kwargs={"n": 2, "do_sample": False})
    prompts = left_padded(tokenizer, PROMPTS)
    prompts.meta_info["validate"] = True
    out = engine.generate_sequences(prompts).batch
    assert out["responses"].shape == (6, 10)
    assert torch.equal(out["responses"][0::2], out["responses"][1::2])
    reference = engine.model.generate(
        input_ids=prompts.batch["input_ids"],
        attention_mask=prompts.batch["attention_mask"],
        do_sample=False,
        max_new_tokens=10,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )[:, prompts.batch["input_ids"].shape[1] :]
    for row in range(3):
        length = int(out["response_mask"][2 * row].sum())
        assert out["responses"][2 * row, :length].tolist() == reference[row, :length].tolist()


def test_sleep_frees_the_kv_cache_and_wake_restores_generation(make_engine, tokenizer):
    engine = make_engine(response_length=200)
    request = GenerationRequest(tokenizer.encode("hello there"), SamplingParams(max_new_tokens=200, seed=3))
    future = engine._scheduler.submit(request)
    deadline = time.monotonic() + 30
    while engine.kv_cache_bytes() == 0 and not future.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    held = engine.kv_cache_bytes()
    engine.sleep()  # finishes the in-flight request first
    assert held > 0 and future.done() and future.result().finish_reason in ("eos", "length")
    assert not engine.is_awake and engine.kv_cache_bytes() == 0
    with pytest.raises(EngineAsleepError, match="wake"):
        engine.generate_batch([request])
    engine.wake()
    assert engine.is_awake
    assert engine.generate_batch([request])[0].token_ids == future.result().token_ids


def test_async_generate_serves_concurrent_callers(make_engine, tokenizer):
    engine = make_engine()
    prompt = tokenizer.encode("abc")

    async def ask_all():
        requests = [GenerationRequest(prompt, SamplingParams(max_new_tokens=4 + i, seed=i)) for i in range(6)]
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    results = asyncio.run(ask_all())
    for i, result in enumerate(results):
        assert (len(result.token_ids), result.finish_reason) == (4 + i, "length") or result.finish_reason == "eos"


def test_create_rollout_engine_picks_hf_by_name(tiny_model_dir, tokenizer):
    engine = create_rollout_engine(RolloutConfig(name="hf"), tiny_model_dir)
    try:
        assert type(engine).__name__ == "HFRolloutEngine" and engine.is_awake
    finally:
        engine.close()


def test_a_failing_batch_fails_its_requests_and_the_engine_keeps_serving(make_engine, tokenizer):
    engine = make_engine()
    bad = GenerationRequest([10_000], SamplingParams(max_new_tokens=3, seed=0))  # id outside the vocabulary
    with pytest.raises(IndexError):
        engine.generate_batch([bad])
    good = GenerationRequest(tokenizer.encode("ok"), SamplingParams(max_new_tokens=3, seed=0))
    result = engine.generate_batch([good])[0]
    assert result.token_ids and result.finish_reason in ("eos", "length")


def test_an_added_lora_adapter_takes_adapter_tensors_and_generates_as_the_adapter_model(
    make_engine, tiny_model_dir, tokenizer
):
    from hybridflow.models.loading import load_causal_lm
    from hybridflow.models.log_probs import forward_log_probs
    from hybridflow.models.lora import apply_lora, lora_config

    policy = apply_lora(load_causal_lm(tiny_model_dir).eval(), rank=4, alpha=8)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.1)
    engine = make_engine(response_length=4)
    engine.add_lora_adapter(lora_config(policy))
    engine.load_weights((name, tensor) for name, tensor in policy.named_parameters() if ".lora_" in name)

    tensors = left_padded(tokenizer, PROMPTS).batch
    input_ids, attention_mask, position_ids = tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"]
    with torch.no_grad():
        expected, _ = forward_log_probs(policy, input_ids, attention_mask, position_ids, response_length=4)
    engine_log_probs = engine.compute_log_probs(input_ids, attention_mask, position_ids, response_length=4)
    torch.testing.assert_close(engine_log_probs, expected, rtol=0, atol=1e-5)
    # Greedy decoding with the adapter equals the adapter model's own greedy continuation.
    prompt = tokenizer.encode(PROMPTS[1])
    greedy = engine.generate_batch([GenerationRequest(prompt, SamplingParams(max_new_tokens=4, do_sample=False))])[0]
    with torch.no_grad():
        reference = policy.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)
    assert greedy.token_ids == reference[0, len(prompt) : len(prompt) + len(greedy.token_ids)].tolist()


def _admitting_together(engine, monkeypatch) -> threading.Event:
    """Make every decode thread wait, after its first admission, until all have admitted theirs (so no thread
    can finish its rows before another begins); the event is set once they have."""
    all_admitted = threading.Event()
    decoders = engine._scheduler.decoders
    barrier = threading.Barrier(len(decoders), action=all_admitted.set)
    for decoder in decoders:
        admitted = threading.Event()

        def add_then_wait(sequences, add=decoder.add, admitted=admitted):
            finished = add(sequences)
            if not admitted.is_set():
                admitted.set()
                barrier.wait(timeout=60)
            return finished

        monkeypatch.setattr(decoder, "add", add_then_wait)
    return all_admitted


@pytest.mark.parametrize("decode_threads", [1, 2])
def test_weights_loaded_mid_generation_draw_the_rest_and_tag_each_token(
    make_engine, tokenizer, decode_threads, monkeypatch
):
    """Fully async's partial rollout: ``loading_weights`` lands between the decode steps of the requests in
    flight (in every decode thread), which go on with the new weights; each token carries the version of the
    weights that drew it."""
    length = 256
    engine = make_engine(
        n=2, response_length=length, ignore_eos=True, calculate_log_probs=True, decode_threads=decode_threads
    )
    all_admitted = _admitting_together(engine, monkeypatch)
    prompts = left_padded(tokenizer, PROMPTS[:2])
    prompts.meta_info["record_weight_versions"] = True
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=engine.generate_sequences(prompts)))
    thread.start()
    assert all_admitted.wait(timeout=60), "a decode thread never admitted its rows"
    # All-zero weights make every logit 0: a token they draw has log-probability -log(vocabulary).
    zeros = [(name, torch.zeros_like(param)) for name, param in engine.model.named_parameters()]
    loaded = False
    while not loaded and thread.is_alive():
        with engine._scheduler.paused():  # no decode step while the rows are looked at
            rows = [s for decoder in engine._scheduler.decoders for s in decoder.sequences]
            if len(rows) == 4 and min(len(s.token_ids) for s in rows) >= 2:
                with engine.loading_weights(7):
                    engine.load_weights(zeros)
                loaded = True
        time.sleep(0.001)
    thread.join(timeout=60)
    assert loaded, "the generation finished before the weights could land in it"
    out = result["out"].batch
    versions, log_probs = out["rollout_weight_versions"], out["rollout_log_probs"]
    uniform = -math.log(engine.model.config.vocab_size)
    for row in range(len(versions)):
        switch = int((versions[row] == 0).sum())
        assert 2 <= switch < length, versions[row]
        assert torch.equal(versions[row], torch.tensor([0] * switch + [7] * (length - switch)))
        torch.testing.assert_close(log_probs[row, switch:], torch.full((length - switch,), uniform))
        assert (log_probs[row, :switch] - uniform).abs().max() > 1e-3  # the model folder's weights drew these
