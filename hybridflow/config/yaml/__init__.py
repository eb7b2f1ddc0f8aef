"""Hydra configs of the trainers (``ppo_trainer.yaml``), loadable as a Python package."""
