"""The vllm engine split over a tensor-parallel group (vLLM's SPMD engines, ``external_launcher``), on a real gloo
group of 2 processes: each rank passes its own prompts, the group generates them together, and each rank gets
its own back, equal token for token to one whole engine's, before and after a weight sync from the actor's FSDP2
shards, in which each rank receives only what its vLLM shard lacks."""

import functools
import itertools
import math
import os
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Shard

pytest.importorskip("vllm")

from hybridflow.models.loading import load_causal_lm, load_model_config, load_tokenizer  # noqa: E402
from hybridflow.models.tensor_parallel import ROW_SPLIT  # noqa: E402
from hybridflow.rollout import GenerationRequest, RolloutConfig, SamplingParams, create_rollout_engine  # noqa: E402
from hybridflow.rollout.group_landing import UnagreedLoadError  # noqa: E402
from hybridflow.rollout.vllm_memory import kv_cache_bytes  # noqa: E402
from hybridflow.rollout.vllm_shards import pool_slices  # noqa: E402
from hybridflow.rollout.weight_loading import shard_buckets  # noqa: E402
from tests.float_bounds import longest_reduction, model_output_bound  # noqa: E402
from tests.gloo_ranks import run_on_ranks  # noqa: E402
from tests.rollout.teacher_forced import teacher_forced_log_probs  # noqa: E402

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


def _synced_model(model_dir: str):
    """The tiny model with every weight moved alike on every rank: what a sync sends."""
    model = load_causal_lm(model_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return model


def _before_and_after_a_sync(model_dir: str, from_pool_buckets: bool = False) -> dict:
    """This rank's prompts (its half when 2 ranks split the model, all of them alone), greedy, before and after a
    sync of weights that every rank changes alike: whole into one engine; into a split engine, as the actor's
    FSDP2 shards (the row-split layers by columns, as a run with a split rollout trains them), or
    ``from_pool_buckets``: as a rollout pool of its own receives them (each rank its own slices, cut by the sender
    from whole weights)."""
    size, rank = dist.get_world_size(), dist.get_rank()
    prompts = PROMPTS[rank * 2 : rank * 2 + 2] if size == 2 else PROMPTS
    engine = _engine(model_dir, size)
    before = _generations(engine, prompts)
    model = _synced_model(model_dir)
    if size == 1:
        engine.load_weights(model.named_parameters())
        return {"before": before, "after": _generations(engine, prompts)}
    if from_pool_buckets:
        refusals = _loads_refused_mid_generation(engine, prompts)
        own = _pool_buckets(engine, model, size)
        engine.load_weights(itertools.chain.from_iterable(own))
        received = sum(piece.nbytes for bucket in own for _, piece in bucket)
        return {"before": before, "after": _generations(engine, prompts), "received": received, "refused": refusals}
    by_columns = {id(m.weight) for n, m in model.named_modules() if n.rpartition(".")[2] in ROW_SPLIT}
    fully_shard(model, mesh=init_device_mesh("cpu", (size,)), shard_placement_fn=lambda p: _by_columns(p, by_columns))
    engine.load_weights((name, param.detach()) for name, param in model.named_parameters())
    return {
        "before": before,
        "after": _generations(engine, prompts),
        "received": engine.shards.traffic.received,
        "segments": _shared_memory_segments(),
    }


def _loads_refused_mid_generation(engine, prompts: list[list[int]]) -> int:
    """How many loads a split engine never told ``land_loads_in_flight`` refused, of one tried before each step
    of a generation (its ranks would land them at different steps)."""
    step, refused = engine.llm.llm_engine.step, []

    def load_then_step():
        with pytest.raises(UnagreedLoadError, match="land_loads_in_flight"):
            with engine.loading_weights(1):
                pass
        refused.append(1)
        return step()

    engine.llm.llm_engine.step = load_then_step
    try:
        _generations(engine, prompts)
    finally:
        engine.llm.llm_engine.step = step
    return len(refused)


def _pool_buckets(engine, model, size: int) -> list:
    """The buckets of this rank's vLLM shard, as the actor's ``share_weights`` cuts them for a pool (small
    buckets, so that a shard's weights span several)."""
    layouts = engine.shard_layouts
    assert [layout.tp_rank for layout in layouts] == list(range(size))
    named = ((name, param.detach()) for name, param in model.named_parameters())
    buckets = shard_buckets(named, 0.05, size, pool_slices(layouts))
    own = [bucket for shard, bucket in buckets if shard == engine.generation_shard]
    assert len(own) > 1
    return own


def _shared_memory_segments() -> dict | None:
    """The name of vLLM's CPU all-reduce segments in this group, this run's ident, and what is left of them in
    /dev/shm (with the engine running); None where vLLM's kernels have no shared-memory all-reduce (its AVX2 build
    has none: the group all-reduces through torch.distributed)."""
    from vllm.distributed.parallel_state import get_tp_group

    if not hasattr(torch.ops._C, "init_shm_manager"):
        return None
    name = get_tp_group().device_communicator.dist_module.group_name
    ident = os.environ["VLLM_DIST_IDENT"]
    return {"name": name, "ident": ident, "left": [entry for entry in os.listdir("/dev/shm") if ident in entry]}


def _by_columns(param: torch.Tensor, by_columns: set[int]) -> Shard | None:
    return Shard(1) if id(param) in by_columns else None


def _lacking(model_dir, rank: int) -> int:
    """The bytes rank ``rank`` of 2 lacks of its vLLM shard when FSDP2 holds chunk ``rank`` of every weight (by
    rows, by columns for o and down). Of every split linear layer: nothing (vLLM takes the same half). Of the
    tied embedding: vLLM's rows (the vocabulary padded to a multiple of 64, then halved) outside FSDP's
    (ceil(V / 2) each). Of each norm (whole in vLLM): the other half."""
    config = load_model_config(model_dir)
    vocab, hidden, layers = config.vocab_size, config.hidden_size, config.num_hidden_layers
    assert config.tie_word_embeddings
    vllm_rows = math.ceil(vocab / 64) * 64 // 2
    vllm = range(rank * vllm_rows, min((rank + 1) * vllm_rows, vocab))
    fsdp = range(rank * math.ceil(vocab / 2), min((rank + 1) * math.ceil(vocab / 2), vocab))
    embedding_rows = len(set(vllm) - set(fsdp))
    norms = 2 * layers + 1
    return 4 * (embedding_rows * hidden + norms * hidden // 2)  # float32


def _assert_split_generates_as_whole(split: dict, whole: dict, model_dir) -> None:
    num_terms = longest_reduction(load_model_config(model_dir))
    for moment in ("before", "after"):
        got = split[0][moment] + split[1][moment]
        assert [tokens for tokens, _ in got] == [tokens for tokens, _ in whole[moment]], moment
        for (_, log_probs), (_, expected) in zip(got, whole[moment]):
            torch.testing.assert_close(log_probs, expected, rtol=0, atol=model_output_bound(expected, num_terms))
    assert whole["before"] != whole["after"], "the sync changed nothing to compare"


@pytest.fixture(scope="module")
def whole_engine_run(tiny_model_dir, tmp_path_factory):
    (whole,) = run_on_ranks(_before_and_after_a_sync, 1, tiny_model_dir, tmp_path_factory.mktemp("whole")).values()
    return whole


def test_a_split_engine_generates_what_a_whole_one_does_before_and_after_a_sync(
    tiny_model_dir, tmp_path, whole_engine_run
):
    split = run_on_ranks(_before_and_after_a_sync, 2, tiny_model_dir, tmp_path / "split")
    _assert_split_generates_as_whole(split, whole_engine_run, tiny_model_dir)
    # One name per run (a run that died leaves nothing to collide with), unlinked once mapped
    segments = [split[rank]["segments"] for rank in (0, 1)]
    if segments != [None, None]:
        _assert_one_name_per_run_unlinked(segments)
    # Each rank received only what its shard lacked: a few KiB, against half the model's 1.3 MB gathering whole.
    assert [split[rank]["received"] for rank in (0, 1)] == [_lacking(tiny_model_dir, rank) for rank in (0, 1)]


def _assert_one_name_per_run_unlinked(segments: list[dict]) -> None:
    assert segments[0]["ident"] == segments[1]["ident"] and segments[0]["ident"].startswith("hybridflow-")
    assert all(s["name"].startswith(s["ident"] + "-") and s["left"] == [] for s in segments), segments


def _pool_share(model_dir, rank: int) -> int:
    """The bytes rank ``rank`` of 2 is sent of the tiny model from a sender holding it whole: its vLLM rows of the
    tied embedding (the vocabulary padded to a multiple of 64, then halved), half of every other split weight,
    each norm whole."""
    config = load_model_config(model_dir)
    vocab, hidden, layers = config.vocab_size, config.hidden_size, config.num_hidden_layers
    head, kv = config.hidden_size // config.num_attention_heads, config.num_key_value_heads
    vllm_rows = math.ceil(vocab / 64) * 64 // 2
    embedding_rows = min((rank + 1) * vllm_rows, vocab) - rank * vllm_rows
    attention = hidden * hidden * 2 + 2 * hidden * kv * head  # q and o, k and v
    mlp = 3 * hidden * config.intermediate_size
    biases = (hidden + 2 * kv * head) if config.model_type == "qwen2" else 0  # q, k and v have biases in Qwen2
    per_layer = (attention + mlp + biases) // 2 + 2 * hidden
    return 4 * (embedding_rows * hidden + layers * per_layer + hidden)  # float32


def test_a_split_engine_on_a_rollout_pool_loads_its_own_slices_cut_by_the_sender(
    tiny_model_dir, tmp_path, whole_engine_run
):
    """A pool of its own (one-step-off) is sent whole weights cut into each vLLM rank's box: each rank receives
    its half and generates what the whole engine does after the same sync."""
    from_pool = functools.partial(_before_and_after_a_sync, from_pool_buckets=True)
    split = run_on_ranks(from_pool, 2, tiny_model_dir, tmp_path / "pool")
    _assert_split_generates_as_whole(split, whole_engine_run, tiny_model_dir)
    assert [split[rank]["received"] for rank in (0, 1)] == [_pool_share(tiny_model_dir, rank) for rank in (0, 1)]
    # Its loads never reach a generation in flight: no agreement is made, and a load that did is refused
    assert all(split[rank]["refused"] > 0 for rank in (0, 1))


def _loads_sent_apart(model_dir: str) -> list[tuple[list[int], torch.Tensor, list[int]]]:
    """Fully async's partial rollout on a split pool: during a generation, rank 0 is sent a sync at its 2nd step
    and rank 1 a second later (by then its steps would have run out). Each rank's tokens, log-probs and the weight
    version that drew each token."""
    rank = dist.get_rank()
    engine = _engine(model_dir, 2)
    engine.land_loads_in_flight()
    own = _pool_buckets(engine, _synced_model(model_dir), 2)

    def load() -> None:
        time.sleep(rank)
        with engine.loading_weights(1):
            engine.load_weights(itertools.chain.from_iterable(own))

    loader, step, steps = threading.Thread(target=load), engine.llm.llm_engine.step, []

    def step_then_maybe_send():
        steps.append(step())
        if len(steps) == 2:
            loader.start()
        return steps[-1]

    engine.llm.llm_engine.step = step_then_maybe_send
    requests = [
        GenerationRequest(ids, SamplingParams(max_new_tokens=10, do_sample=False))
        for ids in PROMPTS[rank * 2 : rank * 2 + 2]
    ]
    results = engine.generate_batch(requests)
    loader.join()
    return [(result.token_ids, torch.tensor(result.log_probs), result.weight_versions) for result in results]


def test_a_split_engine_lands_a_sync_sent_apart_at_one_step_of_every_rank(tiny_model_dir, tmp_path):
    """The ranks' loads arrive a second apart; both land before the same step (``group_landing.py``): every
    sample switches weights at one token, drawn before it by the old model and after it by the new one over the
    whole prefix, as teacher-forced forwards of each give."""
    split = run_on_ranks(_loads_sent_apart, 2, tiny_model_dir, tmp_path)
    old, new = load_causal_lm(tiny_model_dir), _synced_model(tiny_model_dir)
    samples = split[0] + split[1]
    switches = {versions.count(0) for _, _, versions in samples}
    assert len(switches) == 1 and 0 < switches.pop() < 10, [versions for _, _, versions in samples]
    for prompt, (tokens, log_probs, versions) in zip(PROMPTS, samples):
        assert versions == sorted(versions)
        before = teacher_forced_log_probs(old, prompt, tokens)
        after = teacher_forced_log_probs(new, prompt, tokens)
        expected = torch.where(torch.tensor(versions) == 0, before, after)
        bound = model_output_bound(expected, longest_reduction(load_model_config(tiny_model_dir)))
        torch.testing.assert_close(log_probs, expected, rtol=0, atol=bound)
        assert (before - after).abs().max() > bound
