"""Hybrid-engine weight sync: after an actor update the rollout engine generates with the new weights."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from hybridflow.protocol import DataProto
from hybridflow.workers import ActorRolloutRefWorker

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


@pytest.mark.parametrize("model", [{}, {"lora_rank": 4, "lora_alpha": 8}], ids=["full", "lora"])
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

    output = worker.generate_sequences(prompts_of(batch))
    assert output.meta_info["timing_s/update_weights"] > 0
    assert not rollout.is_stale and rollout.asleep
    torch.testing.assert_close(engine_log_probs(rollout, batch), trained, rtol=0, atol=model_output_bound(trained, num_terms))


def test_generate_sequences_without_new_weights_skips_the_sync(tiny_model_dir):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(tiny_model_dir, rollout={"n": 2}), "actor_rollout")
    worker.init_model()
    prompts = prompts_of(rollout_batch(3, seed=2))
    output = worker.generate_sequences(prompts)
    assert output.meta_info["timing_s/update_weights"] == 0.0
    assert len(output) == 6
    assert output.batch["responses"].shape == (6, 5)
    assert torch.equal(output.batch["prompts"][0], output.batch["prompts"][1])
