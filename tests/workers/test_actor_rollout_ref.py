"""ActorRolloutRefWorker on two Ray ranks (FSDP2 over gloo) against the same worker on one rank in-process."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from hybridflow.distributed import RayClassWithInitArgs, RayWorkerGroup, ResourcePool
from hybridflow.distributed.errors import WorkerError
from hybridflow.protocol import DataProto
from hybridflow.workers import ActorRolloutRefWorker
from hybridflow.workers.training import local_loss_counts
from tests.float_bounds import longest_reduction, model_output_bound

from .helpers import (
    actor_rollout_ref_config,
    assert_same_adamw_steps,
    assert_same_update_metrics,
    full_parameters,
    gradient_bound,
    rollout_batch,
)

# Two optimizer steps per update of 8 samples (mini-batches of 2 prompts x n=2 samples), micro-batches of 1
# on two ranks, 4 on one.
OVERRIDES = {"actor": {"ppo_mini_batch_size": 2, "use_kl_loss": True}, "rollout": {"n": 2}}
TWO_RANK_OVERRIDES = {"actor": {"ppo_micro_batch_size_per_gpu": 1}}
# Rank r gets rows [4r, 4r + 4) and splits them into mini-batches of 2, so the global mini-batch k is
# rows {2k, 2k+1, 4+2k, 4+2k+1}: the one-rank run sees the batch in that order.
ONE_RANK_ORDER = [0, 1, 4, 5, 2, 3, 6, 7]


@pytest.fixture(scope="module")
def two_rank_group(ray_cluster, tiny_model_dir):
    import omegaconf

    config = actor_rollout_ref_config(tiny_model_dir, **omegaconf.OmegaConf.merge(OVERRIDES, TWO_RANK_OVERRIDES))
    pool = ResourcePool([2], num_cpus_per_process=0.5, name_prefix="actor_rollout_ref")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config, "actor_rollout_ref"))
    group.init_model()
    yield group
    group.kill()
    pool.release()


@pytest.fixture(scope="module")
def one_rank_worker(process_group, tiny_model_dir):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(tiny_model_dir, **OVERRIDES), "actor_rollout_ref")
    worker.init_model()
    return worker


def with_log_probs(group, batch: DataProto) -> DataProto:
    batch = batch.union(group.compute_log_prob(batch, calculate_entropy=True))
    return batch.union(group.compute_ref_log_prob(batch))


def exported_weights(group_or_worker, path) -> dict[str, torch.Tensor]:
    group_or_worker.export_hf(str(path))
    return load_file(path / "model.safetensors")


def test_two_ranks_and_one_rank_give_the_same_log_probs_losses_and_weights(
    two_rank_group, one_rank_worker, tiny_model_dir, tmp_path
):
    # The ranks run micro-batches of 1 row, the one rank 4, and the ranks' gradients are summed by gloo: the
    # same float32 sums in other orders. Every tolerance below follows from float_bounds, none from a run.
    num_terms = longest_reduction(AutoConfig.from_pretrained(tiny_model_dir))
    batch = with_log_probs(two_rank_group, rollout_batch(8, seed=20))
    old_log_probs = batch.batch["old_log_probs"]
    log_prob_bound = model_output_bound(old_log_probs, num_terms)
    local = one_rank_worker.compute_log_prob(batch)
    torch.testing.assert_close(old_log_probs, local.batch["old_log_probs"], rtol=0, atol=log_prob_bound)
    torch.testing.assert_close(batch.batch["ref_log_prob"], old_log_probs, rtol=0, atol=log_prob_bound)

    per_rank = two_rank_group.update_actor(batch).meta_info["metrics"]
    # The metrics are all-reduced, so rank 0 alone reports them: one entry per name.
    assert all(len(values) == 1 for values in per_rank.values())
    metrics = {key: values[0] for key, values in per_rank.items()}
    reordered = batch[ONE_RANK_ORDER]
    expected = one_rank_worker.update_actor(reordered).meta_info["metrics"]
    assert len(metrics["pg_loss"]) == 2
    assert_same_update_metrics(metrics, expected, reordered, log_prob_bound, num_terms, mini_batch_rows=4)

    # After the update both policies give the same log-probs to the same bound (a wrong gradient would show
    # here: the update moves log-probs by up to ~1).
    trained = two_rank_group.compute_log_prob(batch).batch["old_log_probs"]
    local_trained = one_rank_worker.compute_log_prob(batch).batch["old_log_probs"]
    torch.testing.assert_close(trained, local_trained, rtol=0, atol=model_output_bound(trained, num_terms))
    weights = exported_weights(two_rank_group, tmp_path / "two_ranks")
    local_weights = full_parameters(one_rank_worker.parts["actor"].module)
    assert_same_adamw_steps(
        weights, local_weights, steps=2, lr=1e-3, gradient_rel_bound=gradient_bound(log_prob_bound, num_terms)
    )


def test_the_weight_sync_after_an_update_reaches_every_rank(two_rank_group):
    batch = with_log_probs(two_rank_group, rollout_batch(4, seed=21))
    two_rank_group.update_actor(batch)
    prompts = DataProto.from_dict(
        {
            "input_ids": batch.batch["prompts"],
            "attention_mask": batch.batch["attention_mask"][:, :6],
            "position_ids": batch.batch["position_ids"][:, :6],
        }
    )
    with pytest.raises(WorkerError, match="call update_weights"):  # no rank generates with stale weights
        two_rank_group.generate_sequences(prompts)
    two_rank_group.update_weights()  # every rank gathers each parameter: a collective of both
    output = two_rank_group.generate_sequences(prompts)
    assert len(output) == 8 and output.batch["responses"].shape == (8, 5)


def test_a_two_rank_checkpoint_restores_on_two_ranks_and_on_one(two_rank_group, one_rank_worker, tmp_path):
    path = str(tmp_path / "actor")
    two_rank_group.save_checkpoint(path, global_step=5)
    saved = exported_weights(two_rank_group, tmp_path / "saved")
    two_rank_group.update_actor(with_log_probs(two_rank_group, rollout_batch(4, seed=22)))
    manifests = two_rank_group.load_checkpoint(path)
    assert [manifest["world_size"] for manifest in manifests] == [2, 2]
    restored = exported_weights(two_rank_group, tmp_path / "restored")
    one_rank_worker.load_checkpoint(path)
    resharded = full_parameters(one_rank_worker.parts["actor"].module)
    for name, tensor in saved.items():
        assert torch.equal(restored[name], tensor), name
        assert torch.equal(resharded[name], tensor), name


@pytest.fixture(scope="module")
def two_rank_on_policy_group(ray_cluster, tiny_model_dir):
    """Two ranks, one mini-batch of 8 samples per update (4 per rank), one row per micro-batch, no KL."""
    overrides = {"actor": {"ppo_micro_batch_size_per_gpu": 1, "optim": {"weight_decay": 0.01}}}
    pool = ResourcePool([2], num_cpus_per_process=0.5, name_prefix="on_policy_actor")
    config = actor_rollout_ref_config(tiny_model_dir, **overrides)
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config, "actor"))
    group.init_model()
    yield group
    group.kill()
    pool.release()


def update_rows_with_signal(group, batch: DataProto, rows: list[int], whole: DataProto) -> DataProto:
    """The update the trainer calls when skipping zero-signal samples: ``rows``, padded to an even count with
    an inert copy (response_mask and advantages 0), no old_log_probs, and the whole batch's loss counts."""
    part = batch[rows] if rows else batch[0:0]
    part, pad_size = part.pad_to_divisor(2)
    if pad_size:
        part.batch["response_mask"][-pad_size:] = 0
        part.batch["advantages"][-pad_size:] = 0
    counts = dataclasses.asdict(local_loss_counts(whole.batch["response_mask"]))
    return group.update_actor(part, old_log_probs_from_update=True, loss_counts=counts)


def test_two_ranks_skipping_zero_signal_rows_and_old_log_probs_match_the_full_updates(
    two_rank_on_policy_group, tiny_model_dir, tmp_path
):
    """Step 1: 5 of 8 samples have signal (padded to 6, so the ranks' rows differ from the full run's);
    step 2: none. Weights after both match the full updates with separately computed old log-probs."""
    group = two_rank_on_policy_group
    # A first update, so the checkpoint holds AdamW moments for the restore to overwrite.
    update_rows_with_signal(group, rollout_batch(8, seed=29), list(range(8)), whole=rollout_batch(8, seed=29))
    group.save_checkpoint(str(tmp_path / "start"))
    with_signal = rollout_batch(8, seed=30)
    with_signal.batch["advantages"][[1, 2, 3]] = 0.0
    no_signal = rollout_batch(8, seed=31)
    no_signal.batch["advantages"].zero_()
    full_batches, full_metrics = [], []
    for batch in (with_signal, no_signal):
        full_batches.append(batch.union(group.compute_log_prob(batch)))
        full_metrics.append(group.update_actor(full_batches[-1]).meta_info["metrics"])
    expected = exported_weights(group, tmp_path / "full")

    group.load_checkpoint(str(tmp_path / "start"))
    skipped = [
        update_rows_with_signal(group, with_signal, [0, 4, 5, 6, 7], whole=with_signal),
        update_rows_with_signal(group, no_signal, [], whole=no_signal),
    ]
    # The ranks hold other rows than in the full run, so they sum the gradient in another order; the full run's
    # ratio is e^(update's log pi - separate pass's), 1 within the log-prob bound, the skipping run's exactly 1.
    num_terms = longest_reduction(AutoConfig.from_pretrained(tiny_model_dir))
    log_prob_bound = model_output_bound(full_batches[0].batch["old_log_probs"], num_terms)
    weights = exported_weights(group, tmp_path / "skipping")
    assert_same_adamw_steps(
        weights, expected, steps=2, lr=1e-3, gradient_rel_bound=gradient_bound(log_prob_bound, num_terms)
    )
    for full, skip, batch in zip(full_metrics, skipped, full_batches):
        # One entry per reporting rank (rank 0 alone: the metrics are all-reduced).
        metrics, full = ({key: values[0] for key, values in m.items()} for m in (skip.meta_info["metrics"], full))
        assert_same_update_metrics(
            metrics, full, batch, log_prob_bound, num_terms, mini_batch_rows=8, keys=("pg_loss", "grad_norm")
        )
