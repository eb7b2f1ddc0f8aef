"""One actor update (the driver's ``update_actor`` in local mode, everything under it) runs code in at most
:data:`MAX_FILES` files of the ``hybridflow`` package, as ``tests/trainer/update_path.py`` records them: a GRPO
step on the tiny model, 4 prompts x 4 samples in one mini-batch, with shared prompts and a dense reward (so the
advantages are not all zero and the whole loss runs)."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from .cli import DENSE_REWARD, HANG_GUARD_S, cli_env
from .helpers import tiny_run_overrides

pytestmark = pytest.mark.slow

MAX_FILES = 12
REPO = pathlib.Path(__file__).resolve().parents[2]
# The small run's keys this one sets otherwise: 4 samples per prompt, all 16 in one mini-batch and micro-batch.
REPLACED = (
    "actor_rollout_ref.actor.ppo_mini_batch_size=",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=",
    "actor_rollout_ref.rollout.n=",
    "trainer.logger=",
)


def grpo_overrides(model_dir, parquet, run_dir) -> list[str]:
    small_run = [key for key in tiny_run_overrides(model_dir, parquet, run_dir) if not key.startswith(REPLACED)]
    return small_run + [
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.use_prefix_grouper=true",
        "actor_rollout_ref.rollout.n=4",
        "trainer.total_training_steps=1",
        "trainer.logger=[console]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"custom_reward_function.path={DENSE_REWARD}",
    ]


def test_one_actor_update_runs_code_in_at_most_twelve_package_files(tiny_model_dir, tiny_parquet, tmp_path):
    overrides = grpo_overrides(tiny_model_dir, tiny_parquet, tmp_path)
    command = [sys.executable, "-m", "tests.trainer.update_path", *overrides]
    # Run from the repository root, so the subprocess imports this tree's hybridflow and tests.
    result = subprocess.run(command, cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-6000:]}"
    report = json.loads(next(line for line in reversed(result.stdout.splitlines()) if line.startswith('{"files"')))
    files = report["files"]
    assert "hybridflow/workers/actor.py" in files, f"the update was not recorded: {files}"
    assert len(files) <= MAX_FILES, f"one actor update ran code in {len(files)} package files:\n" + "\n".join(files)
