"""Tensor parallelism's rules, in generation (``actor_rollout_ref.rollout.tensor_model_parallel_size``, verl's key)
and in training (``*.fsdp_config.tensor_parallel_size``, verl's torchtitan engine key): which layouts can run,
checked before any worker starts, one line each naming the key and the fix."""

from __future__ import annotations

from hybridflow.config.fully_async_options import partial_rollout
from hybridflow.config.parallel_plans import GENERATION_KEY
from hybridflow.config.phases import uses_reference
from hybridflow.config.role_pools import processes_words, role_nodes, spells_no_layout
from hybridflow.config.rollout_pool_options import one_step_off
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.config.worker_start_checks import fsdp_size_errors
from hybridflow.workers.config import FSDPConfig, ModelConfig

KEY = GENERATION_KEY
TRAINING_KEY = "fsdp_config.tensor_parallel_size"
ROLE_OF_PREFIX = {
    "actor_rollout_ref.actor": "actor_rollout_ref",
    "actor_rollout_ref.ref": "ref",
    "critic.model": "critic",
}


def tensor_parallel_errors(config: PPOTrainerConfig) -> list[str]:
    """Every reason the rollout's ``tensor_model_parallel_size`` cannot run: not a divisor of the processes that
    generate (for the ``hf`` engine, of a node's, on several nodes; vLLM's groups may span nodes) or of the
    model's attention or key-value heads, a LoRA adapter kept apart from the base weights, the hf engine's partial
    rollout."""
    arr = config.actor_rollout_ref
    size = arr.rollout.tensor_model_parallel_size
    if size <= 1:
        return []
    if one_step_off(config):
        nodes, where = (
            [config.rollout.n_gpus_per_node] * config.rollout.nnodes,
            "rollout.nnodes x rollout.n_gpus_per_node",
        )
    else:
        nodes, where = role_nodes(config, "actor_rollout_ref"), processes_words(config)
    world = sum(nodes)
    errors = []
    if world % size:
        errors.append(
            f"{KEY}={size} does not divide the {world} processes that generate ({where}); choose a divisor of {world}"
        )
    elif len(nodes) > 1 and any(count % size for count in nodes) and arr.rollout.name == "hf":
        per_node = _node_words(config, nodes, "rollout" if one_step_off(config) else "trainer")
        errors.append(
            f"{KEY}={size} does not divide {per_node}: a group's ranks must share a node, where its per-layer "
            "all-reduces stay off the network"
        )
    if partial_rollout(config) and arr.rollout.name == "hf":
        errors.append(
            f"{KEY}={size} with async_training.partial_rollout=true on the hf engine: its ranks land a sync between "
            f"their own decode steps, not at one the group agrees on (the vllm engine's do); set {KEY}=1, "
            "actor_rollout_ref.rollout.name=vllm or async_training.partial_rollout=false"
        )
    if arr.model.uses_lora and not arr.model.merges_lora(arr.rollout.name, size):
        errors.append(
            f"actor_rollout_ref.model.lora.merge=false with {KEY}={size}: a split generation model cannot also hold a "
            f"separate LoRA adapter; drop the merge override (the sync then sends merged weights) or set {KEY}=1"
        )
    return errors + _head_errors(arr.model.path, size, arr.model.trust_remote_code, KEY)


def training_tensor_parallel_errors(config: PPOTrainerConfig, with_critic: bool) -> list[str]:
    """Every training layout that cannot run: an ``fsdp_size`` that does not divide the training processes; a
    split that does not divide them (a node's, on several nodes) or the model's heads, with Ulysses, LoRA or
    hybrid sharding in the same role, or asked of the reward model (which computes each rank's own rows)."""
    arr, errors = config.actor_rollout_ref, []
    roles = {"actor_rollout_ref.actor": (arr.actor.fsdp_config, arr.actor.ulysses_sequence_parallel_size, arr.model)}
    if uses_reference(config):
        roles["actor_rollout_ref.ref"] = (arr.ref.fsdp_config, arr.ref.ulysses_sequence_parallel_size, arr.model)
    if with_critic:
        critic = config.critic
        roles["critic.model"] = (critic.model.fsdp_config, critic.ulysses_sequence_parallel_size, critic.model)
    for prefix, (fsdp, ulysses, model) in roles.items():
        world = sum(role_nodes(config, ROLE_OF_PREFIX[prefix]))
        errors += fsdp_size_errors(f"{prefix}.fsdp_config.fsdp_size", fsdp.fsdp_size, world, "training processes")
        errors += _role_errors(config, f"{prefix}.{TRAINING_KEY}", fsdp, ulysses, model)
    if config.reward_model.enable:
        reward_fsdp, world = config.reward_model.model.fsdp_config.fsdp_size, sum(role_nodes(config, "reward_model"))
        errors += fsdp_size_errors("reward_model.model.fsdp_config.fsdp_size", reward_fsdp, world, "processes")
    reward = config.reward_model.model.fsdp_config.tensor_parallel_size
    if config.reward_model.enable and reward != 1:
        errors.append(
            f"reward_model.model.{TRAINING_KEY}={reward}: the reward model scores each rank's own rows and is not "
            f"split; set it to 1"
        )
    return errors


def _role_errors(config: PPOTrainerConfig, key: str, fsdp: FSDPConfig, ulysses: int, model: ModelConfig) -> list[str]:
    role = key.split(".fsdp_config")[0]
    size, nodes = fsdp.tensor_parallel_size, role_nodes(config, ROLE_OF_PREFIX[role])
    world = sum(nodes)
    if size == 1:
        return []
    if size < 1:
        return [f"{key}={size} must be a positive integer (1: no tensor parallelism in training)"]
    errors = []
    if world % size:
        errors.append(
            f"{key}={size} does not divide the {world} training processes ({processes_words(config)}); choose a "
            f"divisor of {world}"
        )
    elif len(nodes) > 1 and any(count % size for count in nodes):
        errors.append(
            f"{key}={size} does not divide {_node_words(config, nodes, 'trainer')}: a group's ranks must share a "
            "node, where its per-layer all-reduces stay off the network"
        )
    if 0 < fsdp.fsdp_size < world // max(size, 1):
        errors.append(f"{role}.fsdp_config.fsdp_size={fsdp.fsdp_size} with {key}={size}: leave fsdp_size at -1")
    if ulysses > 1:
        errors.append(f"{key}={size} with ulysses_sequence_parallel_size={ulysses} in the same role: choose one")
    if model.lora_rank > 0 or getattr(model, "lora_adapter_path", None) is not None:
        errors.append(f"{key}={size} with a LoRA adapter: the adapter's layers are not split; set {key}=1")
    return errors + _head_errors(model.path, size, model.trust_remote_code, key)


def _node_words(config: PPOTrainerConfig, nodes: list[int], section: str) -> str:
    """A pool's processes per node, for an error line."""
    if section == "rollout" or spells_no_layout(config):
        return f"{section}.n_gpus_per_node={nodes[0]}"
    return f"the processes of its pool of trainer.placement={config.trainer.placement} on each node, {nodes}"


def _head_errors(path: str, size: int, trust_remote_code: bool, key: str) -> list[str]:
    from hybridflow.models.loading import load_model_config  # reads the folder; only split rollouts need it
    from hybridflow.models.tensor_parallel import head_errors

    try:
        model_config = load_model_config(path, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - any unreadable folder is the model check's to report
        return []
    return head_errors(model_config, size, key)
