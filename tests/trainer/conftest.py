"""The trainer tests' shared run: one GRPO run through the command line, compared with by several modules."""

import pytest

from .cli import run_cli
from .helpers import tiny_run_overrides
from .trained_prompts import DUMPS


@pytest.fixture(scope="session")
def grpo_run(tiny_model_dir, tiny_parquet, tmp_path_factory):
    """An uninterrupted GRPO run of 3 steps on Ray (with GRPO's KL loss), validated before training,
    every 2 steps and at the end, saved every step, each step's samples dumped: its folder and its overrides."""
    work = tmp_path_factory.mktemp("grpo")
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, work / "run", "grpo") + [
        "trainer.total_training_steps=3",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.save_freq=1",
        "trainer.test_freq=2",
        f"trainer.rollout_data_dir={DUMPS}",
    ]
    run_cli(overrides + ["trainer.logger=[console,jsonl]"], cwd=work)
    return work / "run", overrides
