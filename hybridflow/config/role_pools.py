"""Which pool each role of a run runs on: the run's roles as layouts name them, the layout ``trainer.placement``
spells out, and a role's processes per node (what the parallel-size rules check against)."""

from __future__ import annotations

from hybridflow.config.layouts import Layout, LayoutError, parse_layout
from hybridflow.config.phases import uses_critic, uses_reference
from hybridflow.config.schema import PPOTrainerConfig

NAMED_PLACEMENTS = ("colocated", "split", "auto")


def run_roles(config: PPOTrainerConfig) -> list[str]:
    """The run's training roles as layouts name them: the actor first, ``ref`` when it has a reference policy that
    can live apart (a LoRA actor's reference is the actor with its adapter off)."""
    lora = config.actor_rollout_ref.model.lora_rank > 0
    return (
        ["actor_rollout_ref"]
        + (["ref"] if uses_reference(config) and not lora else [])
        + (["critic"] if uses_critic(config) else [])
        + (["reward_model"] if config.reward_model.enable else [])
    )


def devices(config: PPOTrainerConfig) -> int:
    return config.trainer.nnodes * config.trainer.n_gpus_per_node


def spells_no_layout(config: PPOTrainerConfig) -> bool:
    return config.trainer.placement in NAMED_PLACEMENTS


def role_nodes(config: PPOTrainerConfig, role: str) -> list[int]:
    """The processes of ``role``'s pool (a role key) on each node it spans: under a layout spelled out, that pool's
    (a layout that cannot be read counts as none: ``placement_errors`` reports it), else every training pool's
    ``trainer.nnodes x trainer.n_gpus_per_node``."""
    trainer = config.trainer
    try:
        layout = None if spells_no_layout(config) else placement_layout(config)
    except LayoutError:
        layout = None
    if layout is None:
        return [trainer.n_gpus_per_node] * trainer.nnodes
    if role == "ref" and not layout.ref_apart:
        role = "actor_rollout_ref"
    pool = next(index for index, pool in enumerate(layout.pools) if role in pool.roles)
    return layout.node_counts(trainer.n_gpus_per_node)[pool]


def placement_layout(config: PPOTrainerConfig) -> Layout | None:
    """The layout ``trainer.placement`` spells out (None for a named placement)."""
    placement = config.trainer.placement
    if placement in NAMED_PLACEMENTS:
        return None
    return parse_layout(placement, run_roles(config), devices(config))


def processes_words(config: PPOTrainerConfig) -> str:
    """Where a role's processes come from, for an error line."""
    if spells_no_layout(config):
        return "trainer.nnodes x trainer.n_gpus_per_node"
    return f"its pool of trainer.placement={config.trainer.placement}"
