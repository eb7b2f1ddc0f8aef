"""tools/verl_scaled.py: the one rule that scales a verl launch command down to this machine, and a sample of verl's
scripts run by it for 2 steps (their trainer commands recorded by ``tools/verl_surface.py run --record``)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from tools import verl_scaled, verl_surface

SAMPLE = pathlib.Path(__file__).with_name("verl_script_sample.yaml")
VERL_LIKE = [
    "data.train_files=/verl-home/data/gsm8k/train.parquet",
    "data.train_batch_size=1024",
    "data.max_prompt_length=512",
    "data.max_response_length=2048",
    "actor_rollout_ref.model.path=Qwen/Qwen3-8B",
    "actor_rollout_ref.actor.ppo_mini_batch_size=256",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
    "actor_rollout_ref.rollout.n=5",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=4",
]


def test_the_rule_scales_nodes_parallel_sizes_and_prompt_batches():
    config = verl_scaled.composed("hybridflow.trainer.main_ppo", VERL_LIKE)
    scaled = dict(item.split("=", 1) for item in verl_scaled.scale_overrides(config))
    # f = 1024 / 8: 8 prompts a step, 256 / f = 2 per mini-batch; 2 x 5 samples over 2 processes = 5 each
    assert scaled["data.train_batch_size"] == "8"
    assert scaled["actor_rollout_ref.actor.ppo_mini_batch_size"] == "2"
    assert scaled["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "5"
    assert scaled["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == "20"
    assert scaled["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "2"
    assert "actor_rollout_ref.actor.ulysses_sequence_parallel_size" not in scaled  # 2 fits already
    assert scaled["trainer.nnodes"] == "1" and scaled["trainer.n_gpus_per_node"] == "2"
    assert scaled["trainer.total_training_steps"] == "2"
    assert "actor_rollout_ref.rollout.n" not in scaled and "data.max_response_length" not in scaled


def test_a_micro_batch_that_does_not_split_a_process_share_becomes_the_largest_that_does():
    micro = [
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    ]
    config = verl_scaled.composed("hybridflow.trainer.main_ppo", VERL_LIKE + micro)
    scaled = dict(item.split("=", 1) for item in verl_scaled.scale_overrides(config))
    assert scaled["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "1"  # of 5 samples a process
    assert "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu" not in scaled  # 4 splits 20 already


@pytest.mark.parametrize(
    "path, family",
    [
        ("Qwen/Qwen3-8B", "qwen3"),
        ("/verl-home/models/Qwen2.5-32B-Instruct", "qwen2"),
        ("meta-llama/Llama-3.1-8B-Instruct", "llama"),
        ("mistralai/Mistral-Nemo-Instruct-2407", "mistral"),
        ("google/gemma-3-1b-it", "gemma3"),
        ("ByteDance-Seed/Seed-OSS-36B-Base", "seed_oss"),
        ("Qwen/Qwen3-30B-A3B-Base", "qwen3_moe"),
        ("/verl-home/Qwen3-Next-80B-A3B-Instruct", "qwen3_next"),
    ],
)
def test_a_model_stands_in_for_its_family(path, family):
    assert verl_scaled.model_family(path) == family


@pytest.mark.parametrize(
    "path", ["Qwen/Qwen2.5-VL-7B-Instruct", "zai-org/GLM-4.1V-9B-Thinking", "Qwen/Qwen3.5-27B", "openai/gpt-oss-20b"]
)
def test_a_model_with_no_tiny_family_is_named(path):
    with pytest.raises(verl_scaled.NoStandIn, match=pathlib.PurePath(path).name.lower()):
        verl_scaled.model_family(path)


def test_stand_in_data_has_the_data_sets_source_and_verls_schema(tmp_path):
    train = pq.read_table(verl_scaled.data_file(tmp_path, "/verl-home/data/gsm8k/train.parquet", "train")).to_pylist()
    test = pq.read_table(verl_scaled.data_file(tmp_path, "/data/math/test.parquet", "test")).to_pylist()
    assert (len(train), len(test)) == (32, 8)
    assert {row["data_source"] for row in train} == {"openai/gsm8k"}
    assert {row["data_source"] for row in test} == {"DigitalLearningGmbH/MATH-lighteval"}
    assert train[0]["prompt"][0]["content"].endswith('after "####".')
    assert set(train[0]) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    with pytest.raises(verl_scaled.NoStandIn, match="geo3k"):
        verl_scaled.data_file(tmp_path, "/verl-home/data/geo3k/train.parquet", "train")


@pytest.mark.parametrize("path", ["/home/u/data/dapo-math-17k/train.parquet", "/home/u/data/aime-2024/test.parquet"])
def test_dapos_data_sets_stand_in_with_the_math_dapo_rules_answer_line(tmp_path, path):
    (row, *_) = pq.read_table(verl_scaled.data_file(tmp_path, path, "test")).to_pylist()
    assert row["data_source"] == "math_dapo"
    assert row["prompt"][0]["content"].endswith('on its own line after "Answer:".')


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(yaml.safe_load(SAMPLE.read_text())))
def test_a_sample_of_verls_scripts_runs_two_steps(script, tmp_path):
    pytest.importorskip("vllm")
    command = yaml.safe_load(SAMPLE.read_text())[script]
    args = [arg.replace("/verl-home", str(tmp_path)) for arg in command["args"]]
    # As verl_surface.py run runs it: its stand-ins for uv and the rest on PATH (Ray starts a script's workers
    # through its py_executable='uv run ...'), trackers offline
    env = {**os.environ, "PATH": f"{verl_surface._shim_dir()}:{os.environ['PATH']}", "VERL_SURFACE_RUN": "1"}
    env.update(WANDB_MODE="offline", HOME=str(tmp_path), PYTHONPATH=str(verl_scaled.REPO))
    # vLLM's model-inspection cache stays under the real home: a cold one costs every run a subprocess of seconds
    env.setdefault("VLLM_CACHE_ROOT", os.path.expanduser("~/.cache/vllm"))
    run = subprocess.run(
        [sys.executable, str(verl_scaled.REPO / "tools/verl_scaled.py"), command["module"], *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-3000:]
    assert f"step {verl_scaled.STEPS}: " in output


def test_models_become_tiny_ones_of_their_family_and_vllm_gets_its_cpu_settings(tmp_path):
    config = verl_scaled.composed(
        "hybridflow.trainer.main_ppo",
        [*VERL_LIKE, "actor_rollout_ref.rollout.name=vllm", "critic.model.path=Qwen/Qwen3-8B"],
    )
    overrides = dict(item.split("=", 1) for item in verl_scaled.model_overrides(config, tmp_path))
    model = tmp_path / "qwen3-2560"  # room for the 512 + 2048 tokens
    assert overrides["actor_rollout_ref.model.path"] == overrides["critic.model.path"] == str(model)
    assert '"model_type": "qwen3"' in (model / "config.json").read_text()
    # A step's 8 prompts x 5 samples of 2560 tokens, in 128-token blocks, float32 keys and values of every layer
    per_token = 2 * 2 * 2 * 64 * 4  # keys and values x 2 layers x 2 KV heads x head size 64 x 4 bytes
    assert overrides["+actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes"] == str(
        40 * 2560 * per_token
    )
    assert overrides["actor_rollout_ref.rollout.enforce_eager"] == "true"
    assert overrides["actor_rollout_ref.rollout.enable_chunked_prefill"] == "false"
    assert "actor_rollout_ref.rollout.enable_prefix_caching" not in overrides
    assert "actor_rollout_ref.rollout.dtype" not in overrides
    # Unchunked, vLLM caches no prefixes of a model with recurrent layers, and runs them in bfloat16 only
    recurrent = verl_scaled.composed(
        "hybridflow.trainer.main_ppo",
        [*VERL_LIKE, "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.model.path=Qwen/Qwen3-Next-80B-A3B"],
    )
    overrides = dict(item.split("=", 1) for item in verl_scaled.model_overrides(recurrent, tmp_path))
    assert overrides["actor_rollout_ref.rollout.enable_prefix_caching"] == "false"
    assert overrides["actor_rollout_ref.rollout.dtype"] == "bfloat16"


def test_a_pool_of_its_own_shares_the_cpus_and_unchunked_vllm_gets_a_sequence_per_step(tmp_path):
    long_answers = ["data.max_response_length=10240"]  # 512 + 10240 tokens: above vLLM's default step budget (8192)
    distilled = [*VERL_LIKE, *long_answers, "distillation.enabled=true", "actor_rollout_ref.rollout.name=vllm"]
    config = verl_scaled.composed("hybridflow.trainer.main_ppo", distilled)
    scaled = dict(item.split("=", 1) for item in verl_scaled.scale_overrides(config))
    # The trainer's 2 processes and the teacher's 2 on this machine's CPUs
    assert float(scaled["trainer.cpus_per_worker"]) == len(os.sched_getaffinity(0)) / 4
    overrides = dict(item.split("=", 1) for item in verl_scaled.model_overrides(config, tmp_path))
    assert overrides["actor_rollout_ref.rollout.max_num_batched_tokens"] == str(512 + 10240)
    assert "trainer.cpus_per_worker" not in dict(
        item.split("=", 1)
        for item in verl_scaled.scale_overrides(verl_scaled.composed("hybridflow.trainer.main_ppo", VERL_LIKE))
    )


def test_an_adapter_to_start_from_becomes_one_of_the_tiny_model_at_the_scripts_rank(tmp_path):
    lora = ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_adapter_path=/verl-home/adapter"]
    config = verl_scaled.composed("hybridflow.trainer.main_ppo", VERL_LIKE + lora)
    overrides = dict(item.split("=", 1) for item in verl_scaled.model_overrides(config, tmp_path))
    adapter = pathlib.Path(overrides["actor_rollout_ref.model.lora_adapter_path"])
    settings = json.loads((adapter / "adapter_config.json").read_text())
    assert settings["r"] == 8 and settings["base_model_name_or_path"] == overrides["actor_rollout_ref.model.path"]


def test_fully_async_steps_of_require_batches_mini_batches_scale_to_the_same_8_prompts():
    """verl's fully async scripts leave data.train_batch_size at 0: a step is require_batches mini-batches."""
    fully_async = [
        "data.train_batch_size=0",
        "data.gen_batch_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.n=16",
        "actor_rollout_ref.hybrid_engine=false",
        "async_training.enable=true",
        "async_training.require_batches=4",
        "trainer.n_gpus_per_node=8",
        "rollout.n_gpus_per_node=8",
    ]
    config = verl_scaled.composed("hybridflow.trainer.main_ppo", fully_async)
    scaled = dict(item.split("=", 1) for item in verl_scaled.scale_overrides(config))
    # f = 4 x 32 / 8 = 16: mini-batches of 2 prompts, 4 a step; 2 x 16 samples over 2 processes = 16 each
    assert scaled["actor_rollout_ref.actor.ppo_mini_batch_size"] == "2"
    assert "data.train_batch_size" not in scaled and scaled["data.gen_batch_size"] == "1"  # never raised
    assert "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" not in scaled  # 8 splits 16 already
