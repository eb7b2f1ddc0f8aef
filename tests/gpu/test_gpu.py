"""What only a GPU runs: FSDP2 on CUDA over NCCL, bf16 mixed precision, offload, the flash-attention packed
path, the hf engine's sleep freeing GPU memory, vLLM on GPU with weight sync, and GRPO through main_ppo on
trainer.device=cuda. Skipped without CUDA; docs/multi_node.md records each GPU run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hybridflow.protocol import DataProto
from hybridflow.workers import ActorRolloutRefWorker
from tests.trainer.cli import HANG_GUARD_S, assert_demo_learned, run_demo
from tests.workers.helpers import actor_rollout_ref_config, rollout_batch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (make test-gpu on a GPU machine)"),
    pytest.mark.usefixtures("cuda_group"),
]

BF16 = {"fsdp_config": {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}}


def make_worker(model_dir, role="actor_rollout", **overrides) -> ActorRolloutRefWorker:
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, **overrides), role)
    worker.init_model()
    return worker


def one_update(worker) -> dict:
    batch = rollout_batch(8, seed=0)
    batch = batch.union(worker.compute_log_prob(batch))
    return worker.update_actor(batch).meta_info["metrics"]


def test_fsdp2_trains_on_cuda_in_bf16_with_float32_shards(tiny_model_dir):
    worker = make_worker(tiny_model_dir, actor=BF16)
    actor = worker.parts["actor"].module
    before = [parameter.detach().full_tensor().clone() for parameter in actor.parameters()]
    metrics = one_update(worker)
    assert all(torch.isfinite(torch.tensor(metrics[key])).all() for key in ("pg_loss", "grad_norm"))
    for parameter in actor.parameters():
        assert parameter.device.type == "cuda" and parameter.dtype == torch.float32
    after = [parameter.detach().full_tensor() for parameter in actor.parameters()]
    assert any(not torch.equal(new, old) for new, old in zip(after, before))


def test_offload_keeps_parameters_and_optimizer_state_on_the_cpu_between_calls(tiny_model_dir):
    offload = {"fsdp_config": {"param_offload": True, "optimizer_offload": True}}
    worker = make_worker(tiny_model_dir, actor=offload)
    one_update(worker)
    trainer = worker.parts["actor"].trainer
    assert all(parameter.device.type == "cpu" for parameter in worker.parts["actor"].module.parameters())
    # The moments move; the step counters stay beside the parameters' compute device (fused AdamW reads them there).
    states = [
        value
        for state in trainer.optimizer.state.values()
        for key, value in state.items()
        if torch.is_tensor(value) and key != "step"
    ]
    assert states and all(value.device.type == "cpu" for value in states)


def test_the_flash_attention_packed_path_equals_the_padded_one(tiny_model_dir):
    pytest.importorskip("flash_attn")
    packed = make_worker(
        tiny_model_dir,
        role="actor",
        actor=BF16,
        model={"attn_implementation": "flash_attention_2", "use_remove_padding": True},
    )
    padded = make_worker(
        tiny_model_dir,
        role="actor",
        actor=BF16,
        model={"attn_implementation": "flash_attention_2", "use_remove_padding": False},
    )
    batch = rollout_batch(8, seed=0)
    ours = packed.compute_log_prob(batch).batch["old_log_probs"]
    theirs = padded.compute_log_prob(batch).batch["old_log_probs"]
    mask = batch.batch["response_mask"].bool()
    # bf16 activations (8 bits of mantissa) through two layers, summed in other orders: a few 2**-8 relative
    # of log-probs around -5 (log of a 256-token vocabulary).
    torch.testing.assert_close(ours[mask], theirs[mask], rtol=0, atol=8 * 2**-8 * 6)


def test_the_hf_engine_on_cuda_frees_its_memory_when_it_sleeps(tiny_model_dir):
    worker = make_worker(tiny_model_dir, rollout={"free_cache_engine": True})
    rollout = worker.parts["rollout"]
    rollout._wake()
    awake = torch.cuda.memory_allocated()
    rollout._sleep()
    assert torch.cuda.memory_allocated() < awake
    output = worker.generate_sequences(prompts_of(rollout_batch(4, seed=1)))
    assert output.batch["responses"].shape[0] == 4 and rollout.asleep


def prompts_of(batch: DataProto) -> DataProto:
    prompts = batch.batch["prompts"]
    attention_mask = batch.batch["attention_mask"][:, : prompts.shape[1]]
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp_min(0)
    return DataProto.from_dict({"input_ids": prompts, "attention_mask": attention_mask, "position_ids": position_ids})


def test_vllm_on_gpu_generates_with_synced_weights_and_the_actors_log_probs(tmp_path):
    pytest.importorskip("vllm")
    script = f"""
import torch
from hybridflow.models.loading import load_causal_lm
from hybridflow.models.tiny import build_tiny_model
from hybridflow.rollout import RolloutConfig, create_rollout_engine
from tests.rollout.prompts import left_padded
model_dir = build_tiny_model({str(tmp_path)!r})
engine = create_rollout_engine(RolloutConfig.from_dict({{"name": "vllm", "n": 2, "response_length": 12,
    "prompt_length": 32, "calculate_log_probs": True, "gpu_memory_utilization": 0.2}}), model_dir)
actor = load_causal_lm(model_dir)
with torch.no_grad():
    for parameter in actor.parameters():
        parameter.add_(0.05 * torch.randn_like(parameter))
engine.sleep(); engine.wake()
engine.load_weights((name, parameter.detach().cuda()) for name, parameter in actor.named_parameters())
out = engine.generate_sequences(left_padded(engine.tokenizer, ["hi", "a longer prompt"])).batch
with torch.no_grad():
    logits = actor(input_ids=out["input_ids"], attention_mask=out["attention_mask"],
                   position_ids=out["position_ids"]).logits
width = out["prompts"].shape[1]
reference = torch.log_softmax(logits[:, width - 1:-1].float(), -1).gather(-1, out["responses"][..., None])[..., 0]
mask = out["response_mask"].bool()
print("MAXDIFF", float((out["rollout_log_probs"][mask] - reference[mask]).abs().max()))
"""
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert completed.returncode == 0, completed.stderr[-3000:]
    maxdiff = float(completed.stdout.split("MAXDIFF")[-1])
    # float32 on both sides, other kernels and summation orders: as tests/rollout/test_vllm_engine.py (1e-4),
    # with TF32 matmuls on the GPU (10 bits of mantissa) allowed for: 2**-10 relative of logits below 10.
    assert maxdiff < 10 * 2**-10


# Local mode runs in the driver's own process, without Ray, so it runs where Ray is not installed too.
@pytest.mark.parametrize("local_mode", ["false", "true"], ids=["ray", "local"])
def test_grpo_through_main_ppo_on_cuda_learns(tmp_path, local_mode):
    completed, rows = run_demo(
        tmp_path / "demo",
        "trainer.device=cuda",
        f"trainer.local_mode={local_mode}",
        "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bfloat16",
    )
    assert_demo_learned(completed, rows)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_ranks_over_nccl_train_the_demo(tmp_path):
    completed, rows = run_demo(
        tmp_path / "demo", "trainer.device=cuda", "trainer.local_mode=false", "trainer.n_gpus_per_node=2"
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    assert [row["step"] for row in rows if "critic/score/mean" in row] == list(range(1, 13))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_generate_tensor_parallel_and_learn_the_demo(tmp_path):
    """The generation model split over the 2 GPUs (nccl), synced by resharding, asleep on the CPU between rollouts."""
    completed, rows = run_demo(
        tmp_path / "demo",
        "trainer.device=cuda",
        "trainer.local_mode=false",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    )
    assert_demo_learned(completed, rows)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_train_and_generate_tensor_parallel_and_learn_the_demo(tmp_path):
    """The actor and its reference trained split over the 2 GPUs (FSDP2 x TP, (t, d) = (2, 1)), generating split
    too; the sync reshards each rank's training shard into its generation shard."""
    completed, rows = run_demo(
        tmp_path / "demo",
        "trainer.device=cuda",
        "trainer.local_mode=false",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.fsdp_config.tensor_parallel_size=2",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    )
    assert_demo_learned(completed, rows)
