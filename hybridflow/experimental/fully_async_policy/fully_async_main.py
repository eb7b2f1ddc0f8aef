"""``python -m hybridflow.experimental.fully_async_policy.fully_async_main key=value ...``: verl's fully async entry
point.

The trainer of ``hybridflow.trainer.main_ppo`` on ``fully_async_ppo_trainer.yaml``: ``ppo_trainer.yaml`` with
``async_training.enable=true`` and the settings verl's file of that name adds (the rollout on a pool of its own,
one prompt per loader batch, the engine's log-probs as the old ones). What that mode does is
``hybridflow.config.fully_async_options``; verl's scripts size the pools and the async keys themselves.
"""

from __future__ import annotations

import sys

from hybridflow.trainer import main_ppo

CONFIG_NAME = "fully_async_ppo_trainer"


def cli(argv: list[str]) -> None:
    """``main_ppo.cli`` on this config, unless the command line names another (``--config-name``)."""
    main_ppo.cli_on_config(CONFIG_NAME, argv)


if __name__ == "__main__":
    cli(sys.argv[1:])
