"""Every weight sync proves it took: the engine's exact checksum against the sender's, after each sync and each
wake (``workers/sync_check.py``). Each failure users report is injected and must end in the one line."""

from __future__ import annotations

import re

import pytest
import torch

from hybridflow.models.loading import resolve_dtype
from hybridflow.models.weight_checksum import ChecksummedWeights
from hybridflow.rollout.config import RolloutConfig, RolloutConfigError
from hybridflow.rollout.weight_loading import weight_buckets
from hybridflow.workers import ActorRolloutRefWorker
from hybridflow.workers.sync_check import WeightSyncError

from .helpers import actor_rollout_ref_config, rollout_batch
from .test_rollout_part import LORA, LORA_MERGED, prompts_of

pytestmark = pytest.mark.usefixtures("process_group")

MODELS = {"full": ({}, "hybrid engine"), "lora-adapter": (LORA, "hybrid engine, adapter-only LoRA")}
MODELS["lora-merged"] = (LORA_MERGED, "hybrid engine, merged LoRA")


def failure_line(mode: str, version: int, event: str = "sync") -> str:
    return (
        f"weight sync check: the hf rollout engine does not serve weight version {version} after the {mode} "
        rf"{event} \(checksum -?\d+ of its weights, -?\d+ of those sent\); the run stops rather than train on samples "
        "of weights the actor never had"
    )


def trained(model_dir, role: str = "actor_rollout", model=None, rollout=None) -> tuple:
    """A worker whose actor took one update (its engine is stale), and the batch it trained on."""
    config = actor_rollout_ref_config(model_dir, model=model or {}, rollout=rollout or {})
    worker = ActorRolloutRefWorker(config, role)
    worker.init_model()
    batch = rollout_batch(8, seed=1)
    worker.update_actor(batch.union(worker.compute_log_prob(batch)))
    return worker, batch


def skip_loading(rollout_part) -> None:
    """The engine is handed the weights and reads them, but keeps its own (a sync that does not take)."""
    rollout_part.engine.load_weights = lambda named_tensors: [None for _ in named_tensors]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", list(MODELS))
def test_syncs_that_take_pass_their_checks(tiny_model_dir, name, dtype):
    worker, batch = trained(tiny_model_dir, model=MODELS[name][0], rollout={"dtype": dtype})
    rollout = worker.parts["rollout"]
    assert worker.update_weights() >= 0.0
    version, checksum = rollout.check.expected
    assert version == worker.parts["actor"].weights_version == 1
    assert checksum == rollout.engine.weights_checksum(rollout.syncs_adapter_only)
    worker.generate_sequences(prompts_of(batch))  # sleeps after, wakes before: checked again


@pytest.mark.parametrize("name", list(MODELS))
def test_a_sync_that_does_not_take_stops_the_run(tiny_model_dir, name):
    """Full weights or merged LoRA kept by the engine (a sync skipped); an adapter received but not applied."""
    model, mode = MODELS[name]
    worker, _ = trained(tiny_model_dir, model=model)
    skip_loading(worker.parts["rollout"])
    with pytest.raises(WeightSyncError, match=f"^{failure_line(mode, 1)}$"):
        worker.update_weights()


def test_an_engine_that_keeps_its_old_weights_after_a_wake_stops_the_run(tiny_model_dir):
    worker, batch = trained(tiny_model_dir)
    rollout = worker.parts["rollout"]
    engine = rollout.engine
    old = {name: param.detach().clone() for name, param in engine.model.named_parameters()}
    worker.update_weights()
    wake = engine.wake

    def wake_with_old_weights():
        wake()
        with torch.no_grad():
            for name, param in engine.model.named_parameters():
                param.copy_(old[name])

    engine.wake = wake_with_old_weights
    with pytest.raises(WeightSyncError, match=f"^{failure_line('hybrid engine', 1, 'sync and a wake')}$"):
        worker.generate_sequences(prompts_of(batch))


def pool_and_buckets(model_dir) -> tuple:
    """A rollout pool's worker and the actor's weights after one update in small buckets, with their checksum."""
    actor, _ = trained(model_dir, role="actor")
    pool = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), "rollout")
    pool.init_model()
    weights = ChecksummedWeights(actor.parts["actor"].hf_weights(), resolve_dtype(pool.config.rollout.dtype))
    buckets = list(weight_buckets(weights, 0.5))
    return pool.parts["rollout"], buckets, weights.part


def test_a_dropped_bucket_stops_the_run(tiny_model_dir):
    """The pool holds the model folder's weights; one bucket of the update's never reaches it."""
    rollout, buckets, checksum = pool_and_buckets(tiny_model_dir)
    assert len(buckets) > 2
    with pytest.raises(WeightSyncError, match=f"^{failure_line('rollout pool', 4)}$"):
        rollout.load_weight_buckets(buckets[:1] + buckets[2:], version=4, checksum=checksum)


def test_a_changed_weight_changes_the_checksum(tiny_model_dir):
    """Whatever tensor is lost, the sum of bit patterns sees it: one element nudged by one float32 ulp."""
    rollout, buckets, checksum = pool_and_buckets(tiny_model_dir)
    assert rollout.load_weight_buckets(buckets, version=1, checksum=checksum) >= 0.0
    assert rollout.check.expected == (1, checksum)
    name, tensor = buckets[-1][-1]
    nudged = tensor.clone()
    nudged.view(-1)[0] = torch.nextafter(nudged.view(-1)[0], torch.tensor(float("inf")))
    with pytest.raises(WeightSyncError, match=re.escape("does not serve weight version 2 after the rollout pool")):
        rollout.load_weight_buckets([*buckets[:-1], [*buckets[-1][:-1], (name, nudged)]], 2, checksum)


@pytest.mark.parametrize("freq", [0, 2])
def test_the_check_runs_every_freq_syncs(tiny_model_dir, freq):
    worker, batch = trained(tiny_model_dir, rollout={"weight_sync_check_freq": freq})
    skip_loading(worker.parts["rollout"])
    worker.update_weights()  # sync 1: unchecked either way
    worker.update_actor(batch)
    if freq == 0:
        worker.update_weights()
        assert worker.parts["rollout"].check.expected is None
        return
    with pytest.raises(WeightSyncError, match=f"^{failure_line('hybrid engine', 2)}$"):
        worker.update_weights()


def test_a_negative_freq_is_refused():
    with pytest.raises(RolloutConfigError, match=r"weight_sync_check_freq=-1 must be >= 0 \(0 = never\)"):
        RolloutConfig(weight_sync_check_freq=-1).validate()
