"""Tensor-parallel generation on real gloo groups of 4 processes: resharding puts every element where its
layout says with the bytes the paper counts, the split model generates the one-rank model's tokens (greedy and
seeded sampling, groups of 2 and 4), and a sync from FSDP2 shards, or from a rollout pool's buckets of each rank's
slices, leaves each rank exactly its slice."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from transformers import AutoConfig

from hybridflow.distributed.resharding import check_rank_order, rank_boxes, reshard_into
from hybridflow.models.loading import load_causal_lm, load_tokenizer
from hybridflow.rollout import GenerationRequest, HFRolloutEngine, RolloutConfig, SamplingParams
from hybridflow.rollout.weight_loading import shard_buckets
from hybridflow.workers import ActorRolloutRefWorker
from tests.float_bounds import longest_reduction, model_output_bound
from tests.gloo_ranks import run_on_ranks
from tests.rollout.moved_weights import moved_model

WORLD_SIZE = 4
GROUP_SIZES = (2, 4)
# (source mesh shape, source placements) -> (target mesh shape, target placements); meshes over ranks 0..3.
LAYOUTS = [
    (((4,), [Shard(0)]), ((2, 2), [Shard(0), Replicate()])),  # FSDP -> rows in halves (ranks 0, 1 | 2, 3)
    (((4,), [Shard(0)]), ((4,), [Shard(1)])),  # FSDP -> a row-split layer at t_g = 4
    (((2, 2), [Replicate(), Shard(0)]), ((2, 2), [Shard(1), Shard(0)])),  # hybrid FSDP -> 2-D
    (((2, 2), [Shard(0), Shard(1)]), ((1, 4), [Replicate(), Replicate()])),  # anything -> whole on every rank
]
PROMPTS = [[5, 9, 14, 3], [7, 7, 2], [11, 4, 6, 8, 10], [3], [12, 13], [2, 6, 9, 9, 1, 4], [15, 5], [8, 3, 3]]


def _reshard_checks() -> list:
    """For each layout: whether every rank's target shard is the global tensor's slice, and the bytes received."""
    torch.manual_seed(0)
    whole = torch.randn(12, 10)  # the same on every rank; 10 columns split 4 ways unevenly
    results = []
    for (source_shape, source_placements), (target_shape, target_placements) in LAYOUTS:
        source = distribute_tensor(whole, init_device_mesh("cpu", source_shape), source_placements)
        target = distribute_tensor(torch.zeros(12, 10), init_device_mesh("cpu", target_shape), target_placements)
        traffic = reshard_into(source, target)
        box = rank_boxes(target)[dist.get_rank()]
        expected = whole[tuple(slice(start, stop) for start, stop in box)]
        results.append((torch.equal(target.to_local(), expected), traffic.received))
    return results


def _requests(rank: int, do_sample: bool) -> list[GenerationRequest]:
    # Rank r's own two prompts, seeded by their global index.
    return [
        GenerationRequest(
            PROMPTS[i], SamplingParams(max_new_tokens=12, do_sample=do_sample, temperature=1.0, seed=100 + i)
        )
        for i in (2 * rank, 2 * rank + 1)
    ]


def _generations(model_dir: str, size: int, rank: int) -> dict:
    config = RolloutConfig.from_dict({"tensor_model_parallel_size": size, "response_length": 12})
    engine = HFRolloutEngine.from_pretrained(model_dir, config, tokenizer=load_tokenizer(model_dir))
    local = [p.to_local() if isinstance(p, DTensor) else p for p in engine.model.parameters()]
    out = {"local_parameters": sum(p.numel() for p in local)}
    for do_sample in (False, True):
        results = engine.generate_batch(_requests(rank, do_sample))
        out[do_sample] = [(result.token_ids, torch.tensor(result.log_probs)) for result in results]
    engine.close()
    return out


def _sync_check(model_dir: str) -> tuple[bool, int]:
    """FSDP2 shards of a changed model into a t_g = 2 engine: each rank's shard equals the new weights' slice."""
    actor = load_causal_lm(model_dir)
    with torch.no_grad():
        for param in actor.parameters():
            param.add_(0.01)
    fully_shard(actor, mesh=init_device_mesh("cpu", (WORLD_SIZE,)))
    config = RolloutConfig.from_dict({"tensor_model_parallel_size": 2})
    engine = HFRolloutEngine.from_pretrained(model_dir, config, tokenizer=load_tokenizer(model_dir))
    assert engine.takes_sharded_weights
    engine.load_weights((name, param.detach()) for name, param in actor.named_parameters())
    new = {name: param.full_tensor() for name, param in actor.named_parameters()}
    exact = all(_holds_slice(param, new[name]) for name, param in engine.model.named_parameters())
    engine.close()
    return exact, sum(p.numel() for p in new.values())


def _worker_sync_check(model_dir: str, training_split: int) -> bool:
    """The sync a run does, through the worker: its actor's shards into its t_g = 2 engine, after an update moved
    every weight; each rank's shard equals the new weights' slice. The actor trains in (t, d) = (1, 4), FSDP2
    splitting the row-split layers by columns, or in (``training_split``, 4 / ``training_split``)."""
    rollout = {"tensor_model_parallel_size": 2, "free_cache_engine": False, "n": 1}
    actor = {
        "ppo_mini_batch_size": 4,
        "ppo_micro_batch_size_per_gpu": 1,
        "fsdp_config": {"tensor_parallel_size": training_split},
    }
    config = {"model": {"path": model_dir}, "actor": actor, "rollout": rollout}
    worker = ActorRolloutRefWorker(config, "actor_rollout")
    worker.init_model()
    actor, engine = worker.parts["actor"], worker.parts["rollout"].engine
    with torch.no_grad():
        for param in actor.module.parameters():
            param.add_(0.01)
    actor.weights_version += 1
    worker.update_weights()
    new = dict(actor.hf_weights())
    exact = all(_holds_slice(param, new[name]) for name, param in engine.model.named_parameters())
    engine.close()
    return exact


def _bucket_sync_check(model_dir: str) -> bool:
    """A rollout pool's sync into a t_g = 2 engine: each rank loads only its shard's buckets of a changed model's
    whole weights (``shard_buckets``); each rank's shard equals the new weights' slice."""
    new = {name: param.detach() for name, param in moved_model(model_dir).named_parameters()}
    config = RolloutConfig.from_dict({"tensor_model_parallel_size": 2})
    engine = HFRolloutEngine.from_pretrained(model_dir, config, tokenizer=load_tokenizer(model_dir))
    own = [bucket for shard, bucket in shard_buckets(new.items(), 0.01, 2) if shard == engine.generation_shard]
    engine.load_weights(pair for bucket in own for pair in bucket)
    exact = all(_holds_slice(param, new[name]) for name, param in engine.model.named_parameters())
    engine.close()
    return exact


def _holds_slice(param: torch.Tensor, whole: torch.Tensor) -> bool:
    if not isinstance(param, DTensor):
        return torch.equal(param, whole)
    box = rank_boxes(param)[dist.get_rank()]
    return torch.equal(param.to_local(), whole[tuple(slice(a, b) for a, b in box)])


def _all_checks(model_dir: str) -> dict:
    out = {"reshard": _reshard_checks(), "sync": _sync_check(model_dir)}
    out["worker_sync"] = [_worker_sync_check(model_dir, split) for split in (1, 2, 4)]
    out["bucket_sync"] = _bucket_sync_check(model_dir)
    for size in GROUP_SIZES:
        out[size] = _generations(model_dir, size, dist.get_rank())
    return out


@pytest.fixture(scope="module")
def every_rank(four_kv_heads_model_dir, tmp_path_factory) -> dict:
    return run_on_ranks(_all_checks, WORLD_SIZE, four_kv_heads_model_dir, tmp_path_factory.mktemp("tensor_parallel"))


def test_resharding_puts_every_element_in_place_and_receives_only_what_is_missing(every_rank):
    element = 4  # float32
    for rank, out in every_rank.items():
        (fsdp_to_tp2, fsdp_to_rows4, hybrid_to_2d, to_whole) = out["reshard"]
        assert all(exact for exact, _ in out["reshard"]), rank
        # FSDP rank r holds rows 3r..3r+2; its half (ranks 0 and 1 the first) is the 6 rows around them.
        assert fsdp_to_tp2[1] == (6 - 3) * 10 * element
        # A column slice of every row: all rows but its own 3, of its 3 (or 1) columns.
        columns = 3 if rank < 3 else 1
        assert fsdp_to_rows4[1] == (12 - 3) * columns * element
        assert to_whole[1] == (120 - 30) * element  # the naive gather: everything but its own quarter


def test_a_mesh_whose_ranks_do_not_increase_is_refused():
    # torch shards by sorted sub-group rank, so boxes from this mesh's coordinates would be wrong.
    with pytest.raises(ValueError, match="ranks increase along every dimension"):
        check_rank_order(torch.tensor([0, 2, 1, 3]))
    check_rank_order(torch.tensor([[0, 2], [1, 3]]))


def test_synced_shards_are_exact_and_no_rank_holds_the_whole_model(every_rank):
    for out in every_rank.values():
        exact, total = out["sync"]
        assert exact and all(out["worker_sync"]) and out["bucket_sync"]
        # Norm weights stay whole on every rank: they are the only excess over 1/k.
        assert out[2]["local_parameters"] < 0.6 * total and out[4]["local_parameters"] < 0.35 * total


@pytest.mark.parametrize("size", GROUP_SIZES)
def test_split_generation_equals_one_rank(size, four_kv_heads_model_dir, every_rank):
    model_dir = four_kv_heads_model_dir
    model = load_causal_lm(model_dir)
    engine = HFRolloutEngine(model, load_tokenizer(model_dir), RolloutConfig.from_dict({"response_length": 12}))
    num_terms = longest_reduction(AutoConfig.from_pretrained(model_dir))
    try:
        greedy = [tokens for out in every_rank.values() for tokens, _ in out[size][False]]
        sampled = [tokens for out in every_rank.values() for tokens, _ in out[size][True]]
        assert greedy != sampled and sum(map(len, greedy + sampled)) > 4 * len(greedy), "too little decoded to compare"
        for rank, out in every_rank.items():
            for do_sample in (False, True):
                expected = engine.generate_batch(_requests(rank, do_sample))
                for (tokens, log_probs), result in zip(out[size][do_sample], expected):
                    assert tokens == result.token_ids, (rank, do_sample)
                    want = torch.tensor(result.log_probs)
                    bound = model_output_bound(want, num_terms)
                    torch.testing.assert_close(log_probs, want, rtol=0, atol=bound)
    finally:
        engine.close()
