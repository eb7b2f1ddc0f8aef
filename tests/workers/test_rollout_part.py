"""Hybrid-engine weight sync: after an actor update and ``update_weights`` the rollout engine generates with the new
weights; generating with weights older than the actor's is refused; after a rollout the engine frees its weights
until a sync sends them all again."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoConfig

from hybridflow.protocol import DataProto
from hybridflow.rollout.weight_loading import IncompleteSyncError
from hybridflow.workers import ActorRolloutRefWorker
from hybridflow.workers.rollout_part import StaleRolloutError
from tests.float_bounds import longest_reduction, model_output_bound

from .helpers import actor_rollout_ref_config, rollout_batch

pytestmark = pytest.mark.usefixtures("process_group")


def engine_log_probs(rollout_part, batch: DataProto) -> torch.Tensor:
    tensors = batch.batch
    return rollout_part.engine.compute_log_probs(
        tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"], tensors["responses"].shape[1]
    )


def prompts_of(batch: DataProto) -> DataProto:
    prompts = batch.batch["prompts"]
    attention_mask = batch.batch["attention_mask"][:, : prompts.shape[1]]
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp_min(0)
    return DataProto.from_dict({"input_ids": prompts, "attention_mask": attention_mask, "position_ids": position_ids})


LORA = {"lora_rank": 4, "lora_alpha": 8}
LORA_MERGED = {**LORA, "lora": {"merge": True}}


@pytest.mark.parametrize("model", [{}, LORA, LORA_MERGED], ids=["full", "lora-adapter", "lora-merged"])
def test_rollout_log_probs_equal_the_trained_actor_after_sync(tiny_model_dir, model):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(tiny_model_dir, model=model), "actor_rollout")
    worker.init_model()
    rollout = worker.parts["rollout"]
    batch = rollout_batch(8, seed=1)
    batch = batch.union(worker.compute_log_prob(batch))
    # The engine's unsharded copy runs the actor's sums in other batch shapes (tests/float_bounds.py).
    num_terms = longest_reduction(AutoConfig.from_pretrained(tiny_model_dir))
    bound = model_output_bound(batch.batch["old_log_probs"], num_terms)
    torch.testing.assert_close(engine_log_probs(rollout, batch), batch.batch["old_log_probs"], rtol=0, atol=bound)

    worker.update_actor(batch)
    trained = worker.compute_log_prob(batch).batch["old_log_probs"]
    assert rollout.is_stale
    assert (engine_log_probs(rollout, batch) - trained).abs().max() > 1e-3

    with pytest.raises(StaleRolloutError, match="call update_weights"):
        worker.generate_sequences(prompts_of(batch))
    worker.update_weights()
    assert not rollout.is_stale
    torch.testing.assert_close(
        engine_log_probs(rollout, batch), trained, rtol=0, atol=model_output_bound(trained, num_terms)
    )
    output = worker.generate_sequences(prompts_of(batch))
    assert len(output) == 8 and rollout.asleep


def engine_weight_bytes(rollout_part) -> int:
    return sum(parameter.untyped_storage().nbytes() for parameter in rollout_part.engine.model.parameters())


def test_after_a_rollout_the_engine_frees_its_weights_until_the_next_sync_sends_them_all(tiny_model_dir):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(tiny_model_dir), "actor_rollout")
    worker.init_model()
    rollout, batch = worker.parts["rollout"], rollout_batch(8, seed=1)
    held = engine_weight_bytes(rollout)
    first = worker.generate_sequences(prompts_of(batch))
    assert held > 0 and engine_weight_bytes(rollout) == 0 and rollout.is_stale
    # No update since (a validation after the step's sync): the next rollout has the actor's weights sent again.
    loads = spy_on_weight_loads(rollout)
    again = worker.generate_sequences(prompts_of(batch))
    assert len(loads) > 0 and engine_weight_bytes(rollout) == 0
    assert first.batch["responses"].shape == again.batch["responses"].shape
    # An update since: refused as before, not silently synced; update_weights brings every weight back.
    worker.update_actor(batch.union(worker.compute_log_prob(batch)))
    with pytest.raises(StaleRolloutError, match="call update_weights"):
        worker.generate_sequences(prompts_of(batch))
    worker.update_weights()
    assert engine_weight_bytes(rollout) == held
    trained = worker.compute_log_prob(batch).batch["old_log_probs"]
    bound = model_output_bound(trained, longest_reduction(AutoConfig.from_pretrained(tiny_model_dir)))
    torch.testing.assert_close(engine_log_probs(rollout, batch), trained, rtol=0, atol=bound)


def test_a_sync_that_leaves_out_a_freed_weight_stops_the_run(tiny_model_dir):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(tiny_model_dir), "actor_rollout")
    worker.init_model()
    engine = worker.parts["rollout"].engine
    weights = list(worker.parts["actor"].hf_weights())
    engine.sleep()
    assert engine.discard_weights()
    with pytest.raises(IncompleteSyncError, match="missing"):
        engine.load_weights(weights[1:])


def test_without_new_weights_the_sync_copies_nothing(tiny_model_dir):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(tiny_model_dir, rollout={"n": 2}), "actor_rollout")
    worker.init_model()
    loads = spy_on_weight_loads(worker.parts["rollout"])
    worker.update_weights()
    assert loads == []
    prompts = prompts_of(rollout_batch(3, seed=2))
    output = worker.generate_sequences(prompts)
    assert len(output) == 6
    assert output.batch["responses"].shape == (6, 5)
    assert torch.equal(output.batch["prompts"][0], output.batch["prompts"][1])


def spy_on_weight_loads(rollout_part) -> list[tuple[str, tuple[int, ...]]]:
    """Record (name, shape) of every tensor the engine's ``load_weights`` is given."""
    loads, load_weights = [], rollout_part.engine.load_weights

    def recording(named_tensors):
        def record():
            for name, tensor in named_tensors:
                loads.append((name, tuple(tensor.shape)))
                yield name, tensor

        return load_weights(record())

    rollout_part.engine.load_weights = recording
    return loads


def synced_tensors(tiny_model_dir, model) -> list[tuple[str, tuple[int, ...]]]:
    """What one sync after one update copies into the engine."""
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(tiny_model_dir, model=model), "actor_rollout")
    worker.init_model()
    batch = rollout_batch(8, seed=1)
    worker.update_actor(batch.union(worker.compute_log_prob(batch)))
    loads = spy_on_weight_loads(worker.parts["rollout"])
    worker.update_weights()
    return loads


def test_a_lora_sync_copies_only_the_adapter_unless_merge_is_asked(tiny_model_dir):
    adapter = synced_tensors(tiny_model_dir, LORA)
    merged = synced_tensors(tiny_model_dir, LORA_MERGED)
    adapted = [shape for name, shape in merged if name.endswith("proj.weight")]
    # 2 layers x 7 projections (q k v o gate up down), each with lora_A [r, d_in] and lora_B [d_out, r].
    assert len(adapted) == 14 and len(adapter) == 2 * len(adapted)
    assert all(".lora_A." in name or ".lora_B." in name for name, _ in adapter)
    assert not any(".lora_" in name for name, _ in merged)
    numel = lambda shapes: sum(math.prod(shape) for shape in shapes)  # noqa: E731
    rank = LORA["lora_rank"]
    assert numel(shape for _, shape in adapter) == sum(rank * (d_out + d_in) for d_out, d_in in adapted)
    assert numel(shape for _, shape in adapter) < numel(shape for _, shape in merged) / 10


@pytest.mark.parametrize("merge", [False, True], ids=["lora-adapter", "lora-merged"])
def test_a_saved_adapter_reaches_the_engine_before_the_first_generation(tiny_model_dir, saved_adapter, merge):
    model = {"lora_adapter_path": str(saved_adapter), "lora": {"merge": merge}}
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(tiny_model_dir, model=model), "actor_rollout")
    worker.init_model()
    rollout = worker.parts["rollout"]
    batch = rollout_batch(8, seed=1)
    actor_log_probs = worker.compute_log_prob(batch).batch["old_log_probs"]
    assert rollout.is_stale
    worker.update_weights()
    torch.testing.assert_close(engine_log_probs(rollout, batch), actor_log_probs, rtol=0, atol=1e-5)
