"""A placement plan: a layout of the run's roles over its devices and, per role, how its pool's ranks share the
work: data parallel (``dp``), tensor parallel (``tp<k>``: each rank holds ``1/k`` of every layer) or Ulysses
sequence parallel (``sp<k>``: each rank holds ``1/k`` of every sequence), and the rollout's own tensor parallel
size in generation. HybridFlow's auto-mapping enumerates these per model on each placement (arXiv 2409.19256,
section 6, Algorithm 1: a model's parallel strategy on its allocated devices); ``trainer.placement=auto`` ranks
them (``trainer/auto_placement.py``) and runs the best by setting the keys below."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from hybridflow.config.layouts import LAYOUT_NAMES, Layout
from hybridflow.config.schema import PPOTrainerConfig

DATA_PARALLEL = "dp"
GENERATION = "generation"  # the rollout's split, owned by the actor's pool
GENERATION_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
# Per role key: its tensor and its sequence parallel size keys (verl's)
SPLIT_KEYS = {
    "actor_rollout_ref": (
        "actor_rollout_ref.actor.fsdp_config.tensor_parallel_size",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    ),
    "ref": (
        "actor_rollout_ref.ref.fsdp_config.tensor_parallel_size",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
    ),
    "critic": ("critic.model.fsdp_config.tensor_parallel_size", "critic.ulysses_sequence_parallel_size"),
}
PARALLEL_KEYS = (*(key for keys in SPLIT_KEYS.values() for key in keys), GENERATION_KEY)


def split_sizes(split: str) -> tuple[int, int]:
    """``(tensor, sequence)`` parallel sizes of ``dp``, ``tp<k>`` or ``sp<k>``."""
    if split == DATA_PARALLEL:
        return 1, 1
    size = int(split[2:])
    return (size, 1) if split.startswith("tp") else (1, size)


def splits_of(devices: int) -> list[str]:
    """Every split of a pool of ``devices`` ranks (whether a model's heads allow it is the rules' to say)."""
    divisors = [size for size in range(2, devices + 1) if devices % size == 0]
    return [DATA_PARALLEL] + [f"tp{size}" for size in divisors] + [f"sp{size}" for size in divisors]


def generation_splits_of(devices: int) -> list[str]:
    return [split for split in splits_of(devices) if not split.startswith("sp")]


@dataclass(frozen=True)
class Plan:
    """A layout and its roles' splits (``(role key or GENERATION, split)`` pairs; a role not named: ``dp``)."""

    layout: Layout
    splits: tuple[tuple[str, str], ...] = ()

    def split(self, owner: str) -> str:
        return dict(self.splits).get(owner, DATA_PARALLEL)

    def devices_of(self, owner: str) -> int:
        return self.layout.devices_of("actor_rollout_ref" if owner == GENERATION else owner)

    def sizes_spelled(self) -> str:
        """The splits that are not ``dp``, e.g. ``actor tp2, generation tp2`` (``dp`` when none)."""
        named = [
            f"{GENERATION if owner == GENERATION else LAYOUT_NAMES[owner]} {split}"
            for owner, split in self.splits
            if split != DATA_PARALLEL
        ]
        return ", ".join(named) or DATA_PARALLEL

    def spelled(self) -> str:
        return f"{self.layout.spelled()} ({self.sizes_spelled()})"

    def overrides(self, owners: list[str]) -> list[str]:
        """The command-line overrides that run this plan, setting every size of ``owners`` (role keys with split
        keys, and GENERATION)."""
        overrides = [f"trainer.placement={self.layout.spelled()}"]
        for owner in owners:
            if owner == GENERATION:
                overrides.append(f"{GENERATION_KEY}={split_sizes(self.split(owner))[0]}")
            else:
                tensor_key, sequence_key = SPLIT_KEYS[owner]
                tensor, sequence = split_sizes(self.split(owner))
                overrides += [f"{tensor_key}={tensor}", f"{sequence_key}={sequence}"]
        return overrides


def with_overrides(config: PPOTrainerConfig, overrides: list[str]) -> PPOTrainerConfig:
    """A copy of ``config`` with ``key=value`` overrides of its plain keys (a placement or an integer size)."""
    changed = copy.deepcopy(config)
    for override in overrides:
        key, _, value = override.partition("=")
        parent, _, name = key.rpartition(".")
        section = value_at(changed, parent)
        setattr(section, name, value if isinstance(getattr(section, name), str) else int(value))
    return changed


def value_at(config: PPOTrainerConfig, key: str) -> Any:
    """The value of a dotted ``key`` of ``config``."""
    section: Any = config
    for name in key.split("."):
        section = getattr(section, name)
    return section
