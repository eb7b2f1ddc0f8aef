"""Ulysses sequence parallelism's rules (``*.ulysses_sequence_parallel_size``, verl's keys): which layouts can
run, checked before any worker starts, one line each naming the key and the fix."""

from __future__ import annotations

from typing import Any

from hybridflow.config.phases import uses_reference
from hybridflow.config.role_pools import processes_words, role_nodes
from hybridflow.config.schema import PPOTrainerConfig

ACTOR = "actor_rollout_ref.actor"
REF = "actor_rollout_ref.ref"
KEY = "ulysses_sequence_parallel_size"
ROLE_OF_KEY = {f"{ACTOR}.{KEY}": "actor_rollout_ref", f"{REF}.{KEY}": "ref", f"critic.{KEY}": "critic"}


def data_parallel_ranks(world: int, size: int, tensor_parallel_size: int = 1) -> int:
    """The ranks that hold different rows when groups of ``size`` (Ulysses) or of ``tensor_parallel_size`` (a
    split model) share theirs (``world`` where that does not divide it: that is reported by
    :func:`sequence_parallel_errors` and the tensor-parallel rules)."""
    size = max(size, 1) * max(tensor_parallel_size, 1)
    return world // size if world % size == 0 else world


def sequence_parallel_sizes(config: PPOTrainerConfig, with_critic: bool) -> dict[str, tuple[int, str]]:
    """``{key: (size, model path)}`` of each role this config runs: the actor, the reference where one is used,
    the critic ``with_critic``."""
    arr = config.actor_rollout_ref
    sizes = {f"{ACTOR}.{KEY}": (arr.actor.ulysses_sequence_parallel_size, arr.model.path)}
    if uses_reference(config):
        sizes[f"{REF}.{KEY}"] = (arr.ref.ulysses_sequence_parallel_size, arr.model.path)
    if with_critic:
        sizes[f"critic.{KEY}"] = (config.critic.ulysses_sequence_parallel_size, config.critic.model.path)
    return sizes


def sequence_parallel_errors(config: PPOTrainerConfig, with_critic: bool) -> list[str]:
    """Every Ulysses size that cannot run: not a divisor of its role's worker processes or of the model's
    attention heads, or a LoRA actor's reference (the actor's own model) split differently."""
    errors = []
    for key, (size, path) in sequence_parallel_sizes(config, with_critic).items():
        world = sum(role_nodes(config, ROLE_OF_KEY[key]))
        if size < 1:
            errors.append(f"{key}={size} must be a positive integer (1: no sequence parallelism)")
        elif size > 1 and world % size:
            errors.append(
                f"{key}={size} does not divide the {world} worker processes ({processes_words(config)}); choose a "
                f"divisor of {world}"
            )
        elif size > 1:
            errors += _head_errors(key, size, path, config.actor_rollout_ref.model.trust_remote_code)
    arr = config.actor_rollout_ref
    actor_size, ref_size = arr.actor.ulysses_sequence_parallel_size, arr.ref.ulysses_sequence_parallel_size
    if arr.model.uses_lora and uses_reference(config) and ref_size != actor_size:
        errors.append(
            f"{REF}.{KEY}={ref_size} differs from {ACTOR}.{KEY}={actor_size}, but a LoRA actor's reference is the "
            f"actor's own model with the adapter off; remove the {REF}.{KEY} override"
        )
    return errors


def _head_errors(key: str, size: int, path: str, trust_remote_code: bool) -> list[str]:
    """Each rank of a group attends with ``1/size`` of the attention heads (key-value heads are repeated where
    ``size`` does not divide them), and Qwen3-Next's linear attention with ``1/size`` of its key heads; any other
    recurrent layer would carry its state over the rank's part of the sequence alone."""
    from hybridflow.models.layouts import recurrent_layer_types
    from hybridflow.models.sequence_parallel_recurrent import SPLIT_MODEL_TYPES

    text_config = _text_config(path, trust_remote_code)
    if text_config is None:
        return []  # the model's own check reports a folder it cannot read
    recurrent = recurrent_layer_types(text_config)
    if recurrent and (text_config.model_type not in SPLIT_MODEL_TYPES or recurrent != ["linear_attention"]):
        return [
            f"{key}={size}: the model ({path}) has {'/'.join(recurrent)} layers, whose state runs along the whole "
            f"sequence, which Ulysses splits (it splits the linear attention of {', '.join(SPLIT_MODEL_TYPES)} "
            f"only); set {key}=1"
        ]
    heads = {"attention heads": text_config.num_attention_heads}
    if recurrent:
        heads["linear-attention key heads"] = text_config.linear_num_key_heads
    return [
        f"{key}={size} does not divide the model's {count} {name} ({path}); choose one of {_divisors(count)}"
        for name, count in heads.items()
        if count % size
    ]


def _divisors(count: int) -> list[int]:
    return [divisor for divisor in range(1, count + 1) if count % divisor == 0]


def _text_config(path: str, trust_remote_code: bool) -> Any:
    from hybridflow.models.loading import load_model_config  # reads the folder; only Ulysses runs need it

    try:
        model_config: Any = load_model_config(path, trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - any unreadable folder is the model check's to report
        return None
    return model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
