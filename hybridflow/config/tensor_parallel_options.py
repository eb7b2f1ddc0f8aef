"""Tensor-parallel generation's rules (``actor_rollout_ref.rollout.tensor_model_parallel_size``, verl's key):
which layouts can run, checked before any worker starts, one line each naming the key and the fix."""

from __future__ import annotations

from hybridflow.config.fully_async_options import fully_async
from hybridflow.config.resources import num_processes
from hybridflow.config.rollout_pool_options import one_step_off, rollout_pool_processes
from hybridflow.config.schema import PPOTrainerConfig

KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


def tensor_parallel_errors(config: PPOTrainerConfig) -> list[str]:
    """Every reason the rollout's ``tensor_model_parallel_size`` cannot run: not a divisor of the processes that
    generate (of a node's, on several nodes) or of the model's attention or key-value heads, a LoRA adapter kept
    apart from the base weights, fully async training.
    The vLLM engine's refusal is the rollout section's own."""
    arr = config.actor_rollout_ref
    size = arr.rollout.tensor_model_parallel_size
    if size <= 1 or arr.rollout.name != "hf":
        return []
    section = config.rollout if one_step_off(config) else config.trainer
    prefix = "rollout" if one_step_off(config) else "trainer"
    world = rollout_pool_processes(config) or num_processes(config)
    errors = []
    if world % size:
        errors.append(
            f"{KEY}={size} does not divide the {world} processes that generate ({prefix}.nnodes x "
            f"{prefix}.n_gpus_per_node); choose a divisor of {world}"
        )
    elif section.nnodes > 1 and section.n_gpus_per_node % size:
        errors.append(
            f"{KEY}={size} does not divide {prefix}.n_gpus_per_node={section.n_gpus_per_node}: a group's ranks "
            "must share a node, where its per-layer all-reduces stay off the network"
        )
    if fully_async(config):
        errors.append(
            f"{KEY}={size} with async_training.enable=true: new weights land on each rank between its own decode "
            f"steps, so a group's ranks would decode one step with shards of two versions; set {KEY}=1"
        )
    if arr.model.uses_lora and not arr.model.merges_lora(arr.rollout.name, size):
        errors.append(
            f"actor_rollout_ref.model.lora.merge=false with {KEY}={size}: a split generation model cannot also hold a "
            f"separate LoRA adapter; drop the merge override (the sync then sends merged weights) or set {KEY}=1"
        )
    return errors + _head_errors(arr.model.path, size, arr.model.trust_remote_code)


def _head_errors(path: str, size: int, trust_remote_code: bool) -> list[str]:
    from hybridflow.models.loading import load_model_config  # reads the folder; only split rollouts need it
    from hybridflow.models.tensor_parallel import head_errors

    try:
        model_config = load_model_config(path, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - any unreadable folder is the model check's to report
        return []
    return head_errors(model_config, size, KEY)
