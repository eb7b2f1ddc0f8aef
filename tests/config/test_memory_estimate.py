"""The config check's memory estimate (``config/memory_estimate.py``): its arithmetic pinned, its parts where a
run has them, and its refusal in one line, on CPU and on a GPU."""

import dataclasses

import pytest
from transformers import AutoModelForCausalLM

from hybridflow.config import memory_estimate
from hybridflow.config.load import ConfigError, load_config
from hybridflow.config.memory_estimate import CUDA_CONTEXT_BYTES, ModelShape, Part, ProcessEstimate
from hybridflow.config.plan import build_plan, describe
from tests.trainer.helpers import compose_config

# The demo's model (examples/tiny_base_model): hidden 256, 2 layers, 2 of 4 heads for keys and values, vocab 263.
DEMO = ModelShape(parameters=1_000_000, layers=2, hidden=256, intermediate=512, kv_width=128, vocab=263)


def test_the_shape_is_read_from_the_models_files(tiny_model_dir):
    shape = ModelShape.read(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert shape.parameters == sum(parameter.numel() for parameter in model.parameters())
    config = model.config
    assert (shape.layers, shape.hidden, shape.vocab) == (
        config.num_hidden_layers,
        config.hidden_size,
        config.vocab_size,
    )
    assert shape.kv_width == config.num_key_value_heads * config.hidden_size // config.num_attention_heads


def test_bytes_per_token_are_pinned():
    # per layer 8 x 256 + 2 x 128 + 4 x 512 = 4352 elements; 2 layers, the final norm's 2 x 256; fp32 logits 3 x 263
    assert DEMO.training_bytes_per_token(4, checkpointing=False) == 4 * (2 * 4352 + 512) + 4 * 3 * 263 == 40020
    # checkpointing: each layer's input, one layer recomputed
    assert DEMO.training_bytes_per_token(4, checkpointing=True) == 4 * (2 * 256 + 4352 + 512) + 4 * 3 * 263
    assert DEMO.training_bytes_per_token(2, checkpointing=False, logits=False) == 2 * (2 * 4352 + 512)
    assert DEMO.forward_bytes_per_token(4) == 4 * 4352 + 4 * 2 * 263
    assert DEMO.kv_bytes_per_token(2) == 2 * 2 * 128 * 2
    assert DEMO.adapter_parameters(8) == 2 * 8 * (8 * 256 + 2 * 128 + 3 * 512)


def test_a_process_peaks_with_its_state_and_its_largest_phase():
    process = ProcessEstimate(
        "pool",
        2,
        100,
        (
            Part("weights", 10, "k"),
            Part("cache", 5, "k", "gen"),
            Part("prefill", 3, "k", "gen"),
            Part("acts", 7, "k", "up"),
        ),
    )
    assert process.peak == 100 + 10 + 5 + 3
    assert [part.name for part in process.counted()] == ["weights", "cache", "prefill"]


def plan_of(overrides):
    return build_plan(load_config(compose_config(overrides)), train_prompts=16)


def parts_of(plan):
    (process,) = plan.memory
    return {part.name: part for part in process.parts}


def test_a_grpo_runs_parts_follow_its_keys(base, tiny_model_dir):
    shape = ModelShape.read(str(tiny_model_dir))
    plan = plan_of(base + ["actor_rollout_ref.actor.use_kl_loss=true", "trainer.local_mode=true"])
    parts = parts_of(plan)
    assert parts["actor optimizer state"].bytes == 2 * 4 * shape.parameters
    assert parts["reference weights"].bytes == 4 * shape.parameters
    # 2 samples of at most 64 + 8 tokens per micro-batch (ppo_micro_batch_size_per_gpu=2)
    assert parts["actor activations"].bytes == 2 * 72 * shape.training_bytes_per_token(4, False)
    assert parts["actor activations"].key.startswith("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
    # the rollout decodes the step's 4 x 2 samples at once
    assert parts["rollout KV cache"].bytes == 8 * 72 * shape.kv_bytes_per_token(4)
    assert "critic weights" not in parts
    assert any(line.startswith("memory per process of the driver") for line in describe(plan))


def test_lora_trains_the_adapter_alone_and_its_reference_is_the_actor(base, tiny_model_dir):
    shape = ModelShape.read(str(tiny_model_dir))
    parts = parts_of(
        plan_of(base + ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.actor.use_kl_loss=true"])
    )
    assert parts["actor gradients"].bytes == 4 * shape.adapter_parameters(4)
    assert parts["actor weights"].bytes == 4 * shape.parameters
    assert "reference weights" not in parts


def test_two_processes_shard_the_training_state_and_each_holds_a_rollout_copy(base, tiny_model_dir):
    shape = ModelShape.read(str(tiny_model_dir))
    plan = plan_of(base + ["algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=2", "trainer.cpus_per_worker=0.5"])
    (process,) = plan.memory
    assert process.processes == 2
    parts = {part.name: part.bytes for part in process.parts}
    assert parts["actor weights"] == parts["critic weights"] == 4 * shape.parameters // 2
    assert parts["rollout weights"] == 4 * shape.parameters


def test_each_teacher_holds_its_shard_of_the_pool_and_one_forward_runs_at_a_time(base, tiny_model_dir):
    """Two teachers (verl's MOPD) over a teacher pool of 2 processes: each process holds half of each, in each
    one's dtype, and the larger forward (float32's) is the phase's."""
    shape = ModelShape.read(str(tiny_model_dir))
    teachers = [
        f"+distillation.teacher_models.{key}.{field}={value}"
        for key in ("gsm8k", "math")
        for field, value in (("key", key), ("model_path", tiny_model_dir))
    ]
    distilled = ["distillation.enabled=true", "distillation.nnodes=1", "distillation.n_gpus_per_node=2"]
    bf16 = "+distillation.teacher_models.math.inference.dtype=bfloat16"
    plan = plan_of(base + distilled + teachers + [bf16, "trainer.cpus_per_worker=0.5"])
    (teacher,) = [process for process in plan.memory if process.pool == "teacher_pool"]
    parts = {part.name: part.bytes for part in teacher.parts}
    assert parts["teacher weights (gsm8k)"] == 4 * shape.parameters // 2
    assert parts["teacher weights (math)"] == 2 * shape.parameters // 2
    single = plan_of(base + distilled + teachers[:2] + ["trainer.cpus_per_worker=0.5"])
    (alone,) = [process for process in single.memory if process.pool == "teacher_pool"]
    assert parts["teacher forward"] == {part.name: part.bytes for part in alone.parts}["teacher forward"]


def test_a_run_that_does_not_fit_this_machine_is_refused_in_one_line(base, monkeypatch):
    overrides = base + ["trainer.local_mode=true"]
    (process,) = plan_of(overrides).memory
    largest = max(process.counted(), key=lambda part: part.bytes)
    monkeypatch.setattr(memory_estimate, "host_memory_available", lambda: 0)
    with pytest.raises(ConfigError) as raised:
        plan_of(overrides)
    (line,) = raised.value.errors
    assert "GiB this machine has available" in line
    assert line.endswith(
        f"the largest part, {largest.name} ({largest.bytes / 2**30:.2f} GiB), shrinks with {largest.key}"
    )


def test_a_gpu_process_is_measured_against_its_gpus_memory(base, monkeypatch):
    plan = plan_of(base)
    on_gpu = dataclasses.replace(plan, trainer=dataclasses.replace(plan.trainer, device="cuda"))
    (process,) = plan.memory
    needed = process.peak - process.runtime + CUDA_CONTEXT_BYTES
    monkeypatch.setattr(memory_estimate, "cuda_memory_total", lambda: needed)
    assert memory_estimate.memory_errors(on_gpu, plan.memory, 0) == []
    monkeypatch.setattr(memory_estimate, "cuda_memory_total", lambda: needed - 1)
    (line,) = memory_estimate.memory_errors(on_gpu, plan.memory, 0)
    assert "GiB of GPU memory per process" in line and "GiB of this GPU" in line


def test_a_joined_cluster_is_not_measured_against_this_machine(base, monkeypatch):
    plan = plan_of(base + ["ray_kwargs.ray_init.address=127.0.0.1:1"])
    monkeypatch.setattr(memory_estimate, "host_memory_available", lambda: 0)
    assert memory_estimate.memory_errors(plan, plan.memory, 0) == []


def test_no_estimate_where_a_model_folder_is_not_here(base, tmp_path):
    plan = build_plan(load_config(compose_config(base), check_environment=False), train_prompts=16)
    missing = dataclasses.replace(
        plan,
        actor_rollout_ref=dataclasses.replace(
            plan.actor_rollout_ref, model=dataclasses.replace(plan.actor_rollout_ref.model, path=str(tmp_path / "gone"))
        ),
    )
    assert memory_estimate.estimate(missing, 0) is None
