"""What the worker processes need of the cluster: a local one too small would leave them pending forever, so
its CPUs and nodes are checked before Ray starts."""

from __future__ import annotations

import os

from hybridflow.config.distillation_options import distills, teacher_pool_processes
from hybridflow.config.phases import uses_critic
from hybridflow.config.rollout_pool_options import rollout_pool_processes
from hybridflow.config.schema import PPOTrainerConfig


def num_processes(config: PPOTrainerConfig) -> int:
    """Worker processes of each training pool: ``trainer.nnodes x trainer.n_gpus_per_node``."""
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def resource_errors(config: PPOTrainerConfig) -> list[str]:
    """A local cluster too small for the worker processes would leave them pending forever."""
    num_cpus = config.ray_kwargs.ray_init.num_cpus
    return [] if num_cpus is None else _cpu_shortfall(config, num_cpus, f"ray_kwargs.ray_init.num_cpus={num_cpus}")


def machine_resource_errors(config: PPOTrainerConfig) -> list[str]:
    """What a local cluster on this machine lacks: a second node, or CPUs when ``ray_init.num_cpus`` is unset."""
    if config.ray_kwargs.ray_init.address or os.environ.get("RAY_ADDRESS"):
        return []
    if rollout_pool_processes(config) and config.rollout.nnodes > 1:
        return [
            f"rollout.nnodes={config.rollout.nnodes} but no cluster is given, and a local Ray cluster has one node; "
            "start Ray on each node and set ray_kwargs.ray_init.address (or RAY_ADDRESS), or set rollout.nnodes=1"
        ]
    if distills(config) and config.distillation.nnodes > 1:
        return [
            f"distillation.nnodes={config.distillation.nnodes} but no cluster is given, and a local Ray cluster has "
            "one node; start Ray on each node and set ray_kwargs.ray_init.address (or RAY_ADDRESS), or set "
            "distillation.nnodes=1"
        ]
    if config.trainer.nnodes > 1:
        return [
            f"trainer.nnodes={config.trainer.nnodes} but no cluster is given, and a local Ray cluster has one node; "
            "start Ray on each node and set ray_kwargs.ray_init.address (or RAY_ADDRESS), or set trainer.nnodes=1"
        ]
    if config.ray_kwargs.ray_init.num_cpus is not None:
        return []
    cpus = os.cpu_count() or 1
    return _cpu_shortfall(config, cpus, f"this machine has {cpus} (ray_kwargs.ray_init.num_cpus is unset)")


def _cpu_shortfall(config: PPOTrainerConfig, available: float, source: str) -> list[str]:
    trainer, ray_config = config.trainer, config.ray_kwargs.ray_init
    if ray_config.address or trainer.local_mode:  # local mode starts no worker processes
        return []
    # A layout or auto shares the run's devices among its pools; split gives each role a pool of that shape.
    pools = 1 + uses_critic(config) + config.reward_model.enable if trainer.placement == "split" else 1
    rollout_pool, teacher_pool = rollout_pool_processes(config), teacher_pool_processes(config)
    needed = (pools * num_processes(config) + rollout_pool + teacher_pool) * trainer.cpus_per_worker
    if needed <= available:
        return []
    rollout_part = f" + {rollout_pool} rollout-pool process(es)" if rollout_pool else ""
    rollout_part += f" + {teacher_pool} teacher-pool process(es)" if teacher_pool else ""
    return [
        f"trainer.placement={trainer.placement} needs {needed:g} CPUs ({pools} pool(s) x {num_processes(config)} "
        f"process(es){rollout_part} x trainer.cpus_per_worker={trainer.cpus_per_worker:g}) but {source}; lower "
        "trainer.n_gpus_per_node or trainer.cpus_per_worker, or raise ray_kwargs.ray_init.num_cpus"
    ]
