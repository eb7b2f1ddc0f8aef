"""The PPO driver: config schema and validation, the fit loop, metrics, tracking and checkpoints."""
