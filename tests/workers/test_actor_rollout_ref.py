"""ActorRolloutRefWorker on two Ray ranks (FSDP2 over gloo) against the same worker on one rank in-process."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from hybridflow.distributed import RayClassWithInitArgs, RayWorkerGroup, ResourcePool
from hybridflow.protocol import DataProto
from hybridflow.workers import ActorRolloutRefWorker

from .helpers import actor_rollout_ref_config, full_parameters, rollout_batch

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
    batch = batch.union(group.compute_log_prob(batch))
    return batch.union(group.compute_ref_log_prob(batch))


def exported_weights(group_or_worker, path) -> dict[str, torch.Tensor]:
    group_or_worker.export_hf(str(path))
    return load_file(path / "model.safetensors")


def test_two_ranks_and_one_rank_give_the_same_log_probs_losses_and_weights(two_rank_group, one_rank_worker, tmp_path):
    batch = with_log_probs(two_rank_group, rollout_batch(8, seed=20))
    local = one_rank_worker.compute_log_prob(batch)
    torch.testing.assert_close(batch.batch["old_log_probs"], local.batch["old_log_probs"], rtol=0, atol=1e-6)
    torch.testing.assert_close(batch.batch["ref_log_prob"], batch.batch["old_log_probs"], rtol=0, atol=1e-6)

    metrics = two_rank_group.update_actor(batch).meta_info["metrics"]
    reordered = batch[ONE_RANK_ORDER]
    expected = one_rank_worker.update_actor(reordered).meta_info["metrics"]
    assert len(metrics["pg_loss"]) == 2
    for key in ("pg_loss", "kl_loss", "entropy", "ppo_kl", "pg_clipfrac", "grad_norm"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key

    weights = exported_weights(two_rank_group, tmp_path / "two_ranks")
    local_weights = full_parameters(one_rank_worker.parts["actor"].module)
    assert weights.keys() == local_weights.keys()
    differences = torch.cat([(weights[name] - local_weights[name]).abs().flatten() for name in weights])
    # Adam's early steps are ~lr * sign(g): entries with ~0 gradient may differ by a little of lr (1e-3).
    assert differences.max() < 1e-4
    assert (differences > 1e-6).float().mean() < 1e-3


def test_generation_after_an_update_syncs_the_weights_on_every_rank(two_rank_group):
    batch = with_log_probs(two_rank_group, rollout_batch(4, seed=21))
    two_rank_group.update_actor(batch)
    prompts = DataProto.from_dict(
        {
            "input_ids": batch.batch["prompts"],
            "attention_mask": batch.batch["attention_mask"][:, :6],
            "position_ids": batch.batch["position_ids"][:, :6],
        }
    )
    output = two_rank_group.generate_sequences(prompts)
    assert len(output) == 8 and output.batch["responses"].shape == (8, 5)
    assert output.meta_info["timing_s/update_weights"] > 0
    again = two_rank_group.generate_sequences(prompts)
    assert again.meta_info["timing_s/update_weights"] == 0.0


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
