"""The example run scripts in examples/, run end to end on the tiny model with small sizes appended.

The GSM8K script is run with all its own (GPU-sized) keys followed by small overrides, which proves every key
it sets is a valid hybridflow key and that the preprocessing + training pipeline runs.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
from hydra import compose, initialize_config_module

from hybridflow.trainer.main_ppo import prompt_tool_schemas
from tests.trainer.cli import HANG_GUARD_S

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"
TOOLS_YAML = EXAMPLES / "multiturn_calculator" / "tools.yaml"
GSM8K_RECORDS = [
    {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A car costs $1,200 plus $34. Total?", "answer": "1200+34=1234\n#### 1,234"},
    {"question": "Half of 10?", "answer": "10/2=5\n#### 5"},
    {"question": "Two times 6?", "answer": "2*6=12\n#### 12"},
]


def run_script(script, env_vars, overrides):
    """Run an example script with a short Ray temp dir and one torch thread; return its output (raises on failure)."""
    ray_temp_dir = tempfile.mkdtemp(prefix="hfray", dir="/tmp")  # Ray's socket paths must stay short
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OMP_NUM_THREADS": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        "RAY_AUTH_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        **env_vars,
    }
    try:
        result = subprocess.run(
            ["bash", str(script), *overrides, "ray_init.num_cpus=2", f"ray_init.temp_dir={ray_temp_dir}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
    finally:
        shutil.rmtree(ray_temp_dir, ignore_errors=True)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


def metric_steps(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row for row in rows}


def test_multi_turn_prompts_carry_the_tool_schemas():
    tool_config = f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOLS_YAML}"
    with initialize_config_module("hybridflow.config.yaml", version_base=None):
        enabled = compose("ppo_trainer", overrides=[tool_config, "actor_rollout_ref.rollout.multi_turn.enable=true"])
        disabled = compose("ppo_trainer", overrides=[tool_config])
    (schema,) = prompt_tool_schemas(enabled)
    assert schema["function"]["name"] == "calculator"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert prompt_tool_schemas(disabled) is None


@pytest.mark.slow
def test_gsm8k_grpo_script_keys_run_on_the_tiny_model(tmp_path, tiny_model_dir):
    source = tmp_path / "gsm8k"
    source.mkdir()
    for split, records in (("train", GSM8K_RECORDS), ("test", GSM8K_RECORDS[:2])):
        (source / f"{split}.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    run_dir = tmp_path / "run"
    small = [
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "data.max_response_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={run_dir}",
        f"hydra.run.dir={run_dir / 'hydra'}",
    ]
    env_vars = {"MODEL_PATH": str(tiny_model_dir), "GSM8K_DIR": str(source), "DATA_DIR": str(tmp_path / "data")}
    stdout = run_script(EXAMPLES / "gsm8k_grpo_qwen2_5.sh", env_vars, small)
    assert "wrote 4 train and 2 test rows" in stdout
    steps = metric_steps(run_dir)
    assert sorted(steps) == [0, 1]  # validation before training (test_freq=5), then the one step
    assert "val-core/openai/gsm8k/acc/mean@1" in steps[0]
    assert "actor/kl_loss" in steps[1] and steps[1]["response_length/max"] <= 16


@pytest.mark.slow
def test_multi_turn_calculator_script_runs_two_steps(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    small = [
        "trainer.total_training_steps=2",
        "trainer.test_freq=-1",
        "data.val_files=null",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=2",
        "data.max_response_length=32",
    ]
    env_vars = {"MODEL_PATH": str(tiny_model_dir), "RUN_DIR": str(run_dir)}
    run_script(EXAMPLES / "multiturn_calculator" / "run.sh", env_vars, small)
    steps = metric_steps(run_dir)
    assert sorted(steps) == [1, 2]
    for record in steps.values():
        assert 0 < record["response_length/max"] <= 32
