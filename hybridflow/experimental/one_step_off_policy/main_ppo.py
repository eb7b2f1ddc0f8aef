"""``python -m hybridflow.experimental.one_step_off_policy.main_ppo key=value ...``: verl's one-step-off entry point.

The trainer of ``hybridflow.trainer.main_ppo`` on ``one_step_off_ppo_trainer.yaml``: ``ppo_trainer.yaml`` with the
settings verl's file of that name adds (the rollout engine's log-probs, bypass mode's old log-probs from them).
verl's scripts set ``actor_rollout_ref.hybrid_engine=False`` and the top-level ``rollout.nnodes`` /
``rollout.n_gpus_per_node`` themselves; what that mode does is ``hybridflow.config.rollout_pool_options``.
"""

from __future__ import annotations

import sys

from hybridflow.trainer import main_ppo

CONFIG_NAME = "one_step_off_ppo_trainer"


def cli(argv: list[str]) -> None:
    """``main_ppo.cli`` on this config, unless the command line names another (``--config-name``)."""
    main_ppo.cli_on_config(CONFIG_NAME, argv)


if __name__ == "__main__":
    cli(sys.argv[1:])
