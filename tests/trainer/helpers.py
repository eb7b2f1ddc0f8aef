"""Helpers shared by the trainer tests: compose the trainer config and a small valid run's overrides."""

import pytest
from hydra import compose, initialize_config_module

from hybridflow.trainer.validate import ConfigError, load_config


def compose_config(overrides):
    """ppo_trainer.yaml with Hydra command-line style overrides, as main_ppo would see it."""
    with initialize_config_module("hybridflow.trainer.config", version_base=None):
        return compose("ppo_trainer", overrides=list(overrides))


def config_errors(overrides) -> list[str]:
    """The lines of the ConfigError that ``overrides`` must raise."""
    with pytest.raises(ConfigError) as caught:
        load_config(compose_config(overrides))
    return caught.value.errors


def tiny_run_overrides(model_dir, parquet, run_dir, estimator="grpo"):
    """A small, valid run: 4 prompts x 2 samples, short responses, one worker process on CPU."""
    train, val = parquet
    return [
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.train_batch_size=4",
        "data.max_prompt_length=64",
        "data.max_response_length=8",
        f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.n=2",
        f"critic.model.path={model_dir}",
        "critic.ppo_micro_batch_size_per_gpu=2",
        f"algorithm.adv_estimator={estimator}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]",
        "trainer.n_gpus_per_node=1",
    ]
