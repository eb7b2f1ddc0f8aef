"""``trainer.local_mode``: every role in the driver's process, no Ray (``distributed.LocalWorkerGroup``).

One process only, so the settings that shape or reach a Ray cluster are refused up front rather than
ignored; ``ray_kwargs.ray_init.runtime_env.env_vars`` still apply, to this process.
"""

from __future__ import annotations

from hybridflow.config.schema import PPOTrainerConfig

KEY = "trainer.local_mode"
# The one runtime_env entry that means something to a process already running.
_LOCAL_RUNTIME_ENV = {"env_vars"}


def local_mode_errors(config: PPOTrainerConfig) -> list[str]:
    """Why ``config`` cannot run in one local process (none: it can, or local mode is off)."""
    trainer, ray_config = config.trainer, config.ray_kwargs.ray_init
    if not trainer.local_mode:
        return []
    errors = []
    if trainer.nnodes * trainer.n_gpus_per_node != 1:
        errors.append(
            f"{KEY}=true runs one process, but trainer.nnodes={trainer.nnodes} x trainer.n_gpus_per_node="
            f"{trainer.n_gpus_per_node}; set both to 1, or {KEY}=false for several processes"
        )
    if ray_config.address:
        errors.append(
            f"{KEY}=true starts no Ray, but ray_kwargs.ray_init.address={ray_config.address!r} joins a cluster; "
            "drop one"
        )
    if config.ray_kwargs.timeline_json_file:
        errors.append(f"{KEY}=true has no Ray tasks for ray_kwargs.timeline_json_file to trace; drop one")
    ray_only = sorted(
        key for key, value in ray_config.runtime_env.items() if value is not None and key not in _LOCAL_RUNTIME_ENV
    )
    if ray_only:
        errors.append(
            f"{KEY}=true has no Ray workers for ray_kwargs.ray_init.runtime_env {ray_only}; only env_vars apply "
            f"(to this process)"
        )
    return errors
