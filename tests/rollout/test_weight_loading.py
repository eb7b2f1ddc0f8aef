"""Hybrid-engine weight sync: tensor-by-tensor in-place loading into the one generation model."""

import threading
import time
import weakref

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from hybridflow.models.loading import load_causal_lm
from hybridflow.models.log_probs import forward_log_probs
from hybridflow.rollout.weight_loading import (
    WeightNameError,
    WeightShapeError,
    load_weights_in_place,
    shard_buckets,
    weight_buckets,
)
from tests.rollout.moved_weights import moved_model
from tests.rollout.prompts import left_padded


def test_after_load_weights_rollout_log_probs_equal_the_updated_actor(make_engine, tiny_model_dir, tokenizer):
    engine = make_engine(n=2, response_length=12, calculate_log_probs=True)
    actor = moved_model(tiny_model_dir, scale=0.1)
    fixed = engine.generate_sequences(left_padded(tokenizer, ["a fixed sequence", "and another one"])).batch
    inputs = (fixed["input_ids"], fixed["attention_mask"], fixed["position_ids"], 12)

    def actor_log_probs(batch):
        with torch.no_grad():
            return forward_log_probs(
                actor, batch["input_ids"], batch["attention_mask"], batch["position_ids"], 12, use_remove_padding=False
            )[0]

    assert not torch.allclose(engine.compute_log_probs(*inputs), actor_log_probs(fixed), atol=1e-3)
    engine.load_weights((name, param.detach().clone()) for name, param in actor.named_parameters())
    torch.testing.assert_close(engine.compute_log_probs(*inputs), actor_log_probs(fixed), atol=1e-5, rtol=0)
    # The log-probs recorded while sampling equal the actor's too.
    generated = engine.generate_sequences(left_padded(tokenizer, ["a fixed sequence", "and another one"])).batch
    mask = generated["response_mask"].bool()
    torch.testing.assert_close(
        generated["rollout_log_probs"][mask], actor_log_probs(generated)[mask], atol=1e-4, rtol=0
    )


def test_wrapper_prefixes_and_tied_names_resolve(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    new_embedding = torch.randn_like(model.lm_head.weight)
    new_norm = torch.randn_like(model.model.layers[0].input_layernorm.weight)
    new_q = torch.randn_like(model.model.layers[1].self_attn.q_proj.weight)
    loaded = load_weights_in_place(
        model,
        [
            ("module.lm_head.weight", new_embedding),
            ("_fsdp_wrapped_module.model.layers.0._checkpoint_wrapped_module.input_layernorm.weight", new_norm),
            ("layers.1.self_attn._orig_mod.q_proj.weight", new_q),
        ],
    )
    assert loaded == [
        "lm_head.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.1.self_attn.q_proj.weight",
    ]
    assert torch.equal(model.model.embed_tokens.weight, new_embedding)
    assert torch.equal(model.model.layers[0].input_layernorm.weight, new_norm)
    assert torch.equal(model.model.layers[1].self_attn.q_proj.weight, new_q)


def test_unknown_names_and_wrong_shapes_are_refused(tiny_model_dir):
    model = load_causal_lm(tiny_model_dir)
    with pytest.raises(WeightNameError, match="value_head.weight"):
        load_weights_in_place(model, [("value_head.weight", torch.zeros(1))])
    with pytest.raises(WeightShapeError, match=r"model.norm.weight.*\(3,\)"):
        load_weights_in_place(model, [("model.norm.weight", torch.zeros(3))])


def test_no_streamed_tensor_is_kept_while_the_next_is_made(tiny_model_dir):
    """When the stream makes tensor k, every earlier streamed tensor has already been freed."""
    model = load_causal_lm(tiny_model_dir)
    source = moved_model(tiny_model_dir, scale=0.1)
    refs, alive_counts = [], []

    def stream():
        for name, param in source.named_parameters():
            alive_counts.append(sum(ref() is not None for ref in refs))
            tensor = param.detach().clone()
            refs.append(weakref.ref(tensor))
            yield name, tensor
            del tensor

    load_weights_in_place(model, stream())
    assert len(alive_counts) == len(list(source.parameters())) and max(alive_counts) == 0
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), source.parameters()))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096


def test_peak_memory_while_loading_stays_far_below_a_second_copy():
    """Streaming a ~68 MB model's weights in grows resident memory by about one tensor, never by one model."""
    config = Qwen2Config(
        vocab_size=263,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config).eval()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    samples, done = [], threading.Event()

    def watch():
        while not done.is_set():
            samples.append(_rss_bytes())
            time.sleep(0.0005)

    def stream():
        for name, param in list(model.named_parameters()):
            yield name, torch.randn_like(param)
            time.sleep(0.001)  # let the watcher sample while this tensor is alive

    before = _rss_bytes()
    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        load_weights_in_place(model, stream())
    finally:
        done.set()
        watcher.join()
    growth = max(samples) - before
    assert growth < 0.25 * model_bytes, (
        f"resident memory grew {growth / 2**20:.1f} MiB for a {model_bytes / 2**20:.1f} MiB model"
    )


def test_weights_load_between_decode_steps_without_dropping_in_flight_requests(make_engine, tiny_model_dir, tokenizer):
    from hybridflow.rollout import GenerationRequest, SamplingParams

    engine = make_engine()
    actor = moved_model(tiny_model_dir, scale=0.1)
    request = GenerationRequest(
        tokenizer.encode("keep going"), SamplingParams(max_new_tokens=300, stop_token_ids=[], seed=0)
    )
    future = engine._scheduler.submit(request)
    engine.load_weights((name, param.detach().clone()) for name, param in actor.named_parameters())
    result = future.result(timeout=60)
    assert result.finish_reason in ("eos", "length") and len(result.token_ids) == len(result.log_probs)
    assert all(torch.equal(a, b) for a, b in zip(engine.model.parameters(), actor.parameters()))


def test_weight_buckets_hold_each_tensor_once_in_order_and_close_at_the_size():
    megabyte = 2**20 // 4  # float32 elements in a MiB
    named = [(f"w{index}", torch.zeros(size * megabyte)) for index, size in enumerate([1, 2, 3, 1, 1])]
    pulled = []

    def stream():
        for item in named:
            pulled.append(item[0])
            yield item

    buckets = weight_buckets(stream(), 3)
    first = next(buckets)
    assert [name for name, _ in first] == ["w0", "w1"] and pulled == ["w0", "w1"]  # read only as far as needed
    rest = list(buckets)
    assert [[name for name, _ in bucket] for bucket in rest] == [["w2"], ["w3", "w4"]]  # the last may be smaller


def test_a_split_rollouts_buckets_hold_each_ranks_slices(tiny_model_dir):
    """Buckets for a rollout split 2 ways: shard r's hold rank r's slice of every split weight (DTensor's chunks:
    q/k/v/gate/up and the vocabulary by rows, o/down by columns) and every other weight whole (the same tensor)."""
    model = moved_model(tiny_model_dir)
    weights = {name: param.detach() for name, param in model.named_parameters()}
    by_shard: dict[int, dict[str, torch.Tensor]] = {0: {}, 1: {}}
    for shard, bucket in shard_buckets(weights.items(), 0.01, 2):
        by_shard[shard].update(bucket)
    vocab = weights["model.embed_tokens.weight"].shape[0]
    rows = -(-vocab // 2)  # torch.chunk's: the first half rounded up
    for shard, pieces in by_shard.items():
        assert pieces.keys() == weights.keys()
        q = weights["model.layers.0.self_attn.q_proj.weight"]
        half = q.shape[0] // 2
        assert torch.equal(pieces["model.layers.0.self_attn.q_proj.weight"], q[shard * half : (shard + 1) * half])
        o = weights["model.layers.0.self_attn.o_proj.weight"]
        assert torch.equal(pieces["model.layers.0.self_attn.o_proj.weight"], o[:, shard * half : (shard + 1) * half])
        embedding = weights["model.embed_tokens.weight"]
        assert torch.equal(pieces["model.embed_tokens.weight"], embedding[shard * rows : (shard + 1) * rows])
        norm = weights["model.norm.weight"]
        assert pieces["model.norm.weight"] is norm
