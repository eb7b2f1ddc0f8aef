"""A checkpoint of an actor trained one step becomes a Hugging Face folder computing the same policy."""

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.model_merger.merge import LORA_ADAPTER_DIR, MergerError, compare_with_hf, merge
from hybridflow.models.adapter_files import read_adapter_config
from hybridflow.workers import ActorRolloutRefWorker
from tests.workers.helpers import actor_rollout_ref_config, rollout_batch

pytestmark = pytest.mark.usefixtures("process_group")

LORA = {"lora_rank": 4, "lora_alpha": 8}
SAVE_ALL = {"checkpoint": {"save_contents": ["model", "optimizer", "extra", "hf_model"]}}


def train_one_step_and_save(model_dir, folder, model):
    """An actor trained one step and its checkpoint (with the trainer's own Hugging Face export)."""
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, model=model, actor=SAVE_ALL), "actor")
    worker.init_model()
    batch = rollout_batch(8, seed=4)
    worker.update_actor(batch.union(worker.compute_log_prob(batch)))
    worker.save_checkpoint(str(folder), global_step=1)
    return worker, batch


def logits(model, batch):
    tensors = batch.batch
    with torch.no_grad():
        inputs = {key: tensors[key] for key in ("input_ids", "attention_mask", "position_ids")}
        return model(**inputs).logits


# fp32: the merge computes W + s * (B @ A) once, the actor W x + s * B (A x); both round to ~1e-7 relative
# of logits of size ~1, summed over 128 hidden units: well inside 1e-5.
ATOL = 1e-5


@pytest.mark.parametrize("model", [{}, LORA], ids=["full", "lora"])
def test_the_merged_folder_loads_and_computes_the_trained_actor(tiny_model_dir, tmp_path, model):
    worker, batch = train_one_step_and_save(tiny_model_dir, tmp_path / "actor", model)
    target = merge(tmp_path / "actor", tmp_path / "merged")

    assert not any("lora" in key for key in load_file(target / "model.safetensors"))
    assert AutoTokenizer.from_pretrained(target).eos_token == "<|im_end|>"
    merged = AutoModelForCausalLM.from_pretrained(target).eval()
    actor = worker.parts["actor"].module.eval()
    torch.testing.assert_close(logits(merged, batch), logits(actor, batch), rtol=0, atol=ATOL)
    assert not (target / LORA_ADAPTER_DIR).exists()
    assert compare_with_hf(tmp_path / "actor", tmp_path / "actor" / "huggingface") == len(merged.state_dict())


def test_save_lora_adapter_writes_the_base_weights_and_the_adapter_apart(tiny_model_dir, tmp_path):
    worker, batch = train_one_step_and_save(tiny_model_dir, tmp_path / "actor", LORA)
    target = merge(tmp_path / "actor", tmp_path / "merged", save_lora_adapter=True)

    original = load_file(tiny_model_dir / "model.safetensors")
    written = load_file(target / "model.safetensors")
    assert written.keys() == original.keys()
    assert all(torch.equal(written[name], original[name]) for name in original)  # LoRA left the base as it was
    adapter = target / LORA_ADAPTER_DIR
    assert (read_adapter_config(adapter)["r"], read_adapter_config(adapter)["base_model_name_or_path"]) == (
        4,
        str(target.resolve()),
    )
    policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(target), adapter).eval()
    actor = worker.parts["actor"].module.eval()
    torch.testing.assert_close(logits(policy, batch), logits(actor, batch), rtol=0, atol=ATOL)


def test_test_names_the_tensors_that_differ(tiny_model_dir, tmp_path):
    train_one_step_and_save(tiny_model_dir, tmp_path / "actor", LORA)
    with pytest.raises(MergerError, match=r"differs from .* in \d+ ways: model\.layers\.0\..* differs by up to"):
        compare_with_hf(tmp_path / "actor", tiny_model_dir)  # the untrained model


def test_merge_refuses_what_it_cannot_do_before_writing(tiny_model_dir, tmp_path):
    train_one_step_and_save(tiny_model_dir, tmp_path / "actor", {})
    with pytest.raises(MergerError, match="holds no LoRA adapter"):
        merge(tmp_path / "actor", tmp_path / "merged", save_lora_adapter=True)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(MergerError, match="exists and is not an empty folder"):
        merge(tmp_path / "actor", tmp_path / "taken")
    with pytest.raises(MergerError, match="has no huggingface/config.json"):
        merge(tmp_path, tmp_path / "merged")
    assert not (tmp_path / "merged").exists() and (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_a_two_rank_lora_run_syncs_its_adapter_on_every_rank_and_its_checkpoint_merges(
    ray_cluster, tiny_model_dir, tmp_path
):
    from hybridflow.distributed import RayClassWithInitArgs, RayWorkerGroup, ResourcePool
    from hybridflow.models.log_probs import forward_log_probs
    from hybridflow.protocol import DataProto

    config = actor_rollout_ref_config(tiny_model_dir, model=LORA, actor={"ppo_micro_batch_size_per_gpu": 2})
    pool = ResourcePool([2], num_cpus_per_process=0.5, name_prefix="lora_merge")
    group = RayWorkerGroup(pool, RayClassWithInitArgs(ActorRolloutRefWorker, config, "actor_rollout"))
    try:
        group.init_model()
        batch = rollout_batch(8, seed=5)
        group.update_actor(batch.union(group.compute_log_prob(batch)))
        prompts = DataProto.from_dict(
            {
                "input_ids": batch.batch["prompts"],
                "attention_mask": batch.batch["attention_mask"][:, :6],
                "position_ids": batch.batch["position_ids"][:, :6],
            },
            meta_info={"calculate_log_probs": True},
        )
        group.update_weights()
        output = group.generate_sequences(prompts)
        actor_log_probs = group.compute_log_prob(output).batch["old_log_probs"]
        mask = output.batch["response_mask"].bool()
        # Each rank's engine sampled with the adapter synced from the two-rank shards.
        torch.testing.assert_close(output.batch["rollout_log_probs"][mask], actor_log_probs[mask], rtol=0, atol=1e-5)
        group.save_checkpoint(str(tmp_path / "actor"), global_step=1)
    finally:
        group.kill()
        pool.release()

    merged = AutoModelForCausalLM.from_pretrained(merge(tmp_path / "actor", tmp_path / "merged")).eval()
    tensors = output.batch
    with torch.no_grad():
        log_probs, _ = forward_log_probs(
            merged, tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"], response_length=5
        )
    torch.testing.assert_close(log_probs[mask], actor_log_probs[mask], rtol=0, atol=1e-5)
