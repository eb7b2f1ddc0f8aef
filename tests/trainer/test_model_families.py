"""One GRPO step through ``python -m hybridflow.trainer.main_ppo`` on each model family users bring (Llama, Qwen3, Gemma
3, Mistral, Seed-OSS, Qwen3 MoE), in local mode: rollout, packed log-probs, update and weight sync run on each; the
families with a sliding window shorter than the samples say that their samples do not share prompts."""

import math

import pytest

from hybridflow.tracking.trackers import read_metrics

from .cli import run_cli
from .helpers import tiny_run_overrides

pytestmark = pytest.mark.slow

WINDOWED = {"gemma3": "gemma3_text", "mistral": "mistral"}  # family: its model_type


def test_one_grpo_step(model_family, family_model_dir, tiny_parquet, tmp_path):
    overrides = tiny_run_overrides(family_model_dir, tiny_parquet, tmp_path / "run") + [
        "trainer.local_mode=true",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
    ]
    completed = run_cli(overrides, cwd=tmp_path)
    (record,) = read_metrics(tmp_path / "run")
    assert record["step"] == 1
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl"):
        assert math.isfinite(record[key]), f"{key} is {record[key]}"
    assert record["actor/grad_norm"] > 0
    # Two mini-batches of 4 samples: the second is scored under the weights the first one's update moved.
    assert record["actor/ppo_kl"] != 0
    output = completed.stdout + completed.stderr
    assert ("do not share prompts" in output) is (model_family in WINDOWED)
    if model_family in WINDOWED:
        assert f"{WINDOWED[model_family]}: samples longer than its sliding window (8 tokens" in output
