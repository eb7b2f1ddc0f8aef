"""Placements spelled as device layouts (``trainer.placement=actor+ref:2/critic:2``), and every layout of a run's
roles over its devices: the candidates ``trainer.placement=auto`` ranks (HybridFlow, arXiv 2409.19256, section 6).

A layout is pools separated by ``/``; a pool is its roles joined by ``+`` and ``:`` its number of devices
(processes). Roles: ``actor`` (the actor and its rollout, and the reference policy unless ``ref`` has a pool of its
own), ``ref``, ``critic``, ``reward_model``. The pools take the devices in order, node by node, and together take
at most ``trainer.nnodes x trainer.n_gpus_per_node``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

# The layout's role names and the run's role keys they stand for.
ROLE_KEYS = {"actor": "actor_rollout_ref", "ref": "ref", "critic": "critic", "reward_model": "reward_model"}
LAYOUT_NAMES = {key: name for name, key in ROLE_KEYS.items()}


class LayoutError(ValueError):
    """A layout that cannot be read or does not fit the run: one line naming ``trainer.placement`` and the fix."""


@dataclass(frozen=True)
class PoolLayout:
    roles: tuple[str, ...]  # role keys (``actor_rollout_ref``, ``ref``, ``critic``, ``reward_model``)
    devices: int

    def spelled(self) -> str:
        return "+".join(LAYOUT_NAMES[role] for role in self.roles) + f":{self.devices}"


@dataclass(frozen=True)
class Layout:
    pools: tuple[PoolLayout, ...]

    def spelled(self) -> str:
        return "/".join(pool.spelled() for pool in self.pools)

    @property
    def ref_apart(self) -> bool:
        return any("ref" in pool.roles for pool in self.pools)

    def devices_of(self, role: str) -> int:
        """The devices of ``role``'s pool (the reference's is the actor's unless it has its own)."""
        if role == "ref" and not self.ref_apart:
            role = "actor_rollout_ref"
        return next(pool.devices for pool in self.pools if role in pool.roles)

    def node_counts(self, processes_per_node: int) -> list[list[int]]:
        """Per pool, its processes on each node it spans, the devices taken in order node by node."""
        counts, start = [], 0
        for pool in self.pools:
            first, last = start, start + pool.devices - 1
            nodes = range(first // processes_per_node, last // processes_per_node + 1)
            counts.append(
                [
                    min(last, (node + 1) * processes_per_node - 1) - max(first, node * processes_per_node) + 1
                    for node in nodes
                ]
            )
            start += pool.devices
        return counts


def parse_layout(spelled: str, roles: list[str], devices: int) -> Layout:
    """The layout ``spelled`` of the run's ``roles`` (role keys, ``actor_rollout_ref`` first) over ``devices``."""
    pools = []
    for part in spelled.split("/"):
        names, _, count = part.partition(":")
        unknown = [name for name in names.split("+") if name not in ROLE_KEYS]
        if unknown or not count.isdigit() or int(count) < 1:
            raise LayoutError(
                f"trainer.placement={spelled!r}: pool {part!r} is not roles:devices; spell each pool as roles "
                f"joined by '+' (of {list(ROLE_KEYS)}), ':' and a device count, pools joined by '/', "
                "e.g. actor+ref:2/critic:2"
            )
        pools.append(PoolLayout(tuple(ROLE_KEYS[name] for name in names.split("+")), int(count)))
    layout = Layout(tuple(pools))
    _check_roles(spelled, layout, roles)
    used = sum(pool.devices for pool in pools)
    if used > devices:
        raise LayoutError(
            f"trainer.placement={spelled!r} takes {used} devices but the run has {devices} "
            "(trainer.nnodes x trainer.n_gpus_per_node); lower a pool's count or raise trainer.n_gpus_per_node"
        )
    return layout


def _check_roles(spelled: str, layout: Layout, roles: list[str]) -> None:
    placed = [role for pool in layout.pools for role in pool.roles]
    missing = [LAYOUT_NAMES[role] for role in roles if role != "ref" and role not in placed]
    extra = [LAYOUT_NAMES[role] for role in placed if role not in roles or placed.count(role) > 1]
    if missing or extra:
        raise LayoutError(
            f"trainer.placement={spelled!r} must place each of the run's roles "
            f"{[LAYOUT_NAMES[role] for role in roles]} once (ref optional: with the actor unless placed); "
            f"missing {missing}, not in this run or placed twice {sorted(set(extra))}"
        )


def colocated_layout(roles: list[str], devices: int) -> Layout:
    return Layout((PoolLayout(tuple(roles), devices),))


def candidate_layouts(roles: list[str], devices: int) -> list[Layout]:
    """HybridFlow's placements of the run's ``roles`` (role keys, ``ref`` among them when the run has a reference
    policy) over ``devices``: every role together; the actor (with its reference) apart from the critic and
    reward model; and each role apart, over every split of the devices that gives each pool at least one."""
    actor_side = [role for role in roles if role in ("actor_rollout_ref", "ref")]
    others = [role for role in roles if role not in actor_side]
    together = [role for role in roles if role != "ref"]
    layouts = [colocated_layout(together, devices)]
    groupings = []
    if others:
        groupings.append([tuple(role for role in actor_side if role != "ref"), tuple(others)])
    if "ref" in roles or len(others) > 1:
        groupings.append([(role,) for role in roles])
    for grouping in groupings:
        for counts in _splits(devices, len(grouping)):
            layouts.append(Layout(tuple(PoolLayout(group, count) for group, count in zip(grouping, counts))))
    return layouts


def _splits(devices: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to give ``parts`` pools at least one device each, all ``devices`` used."""
    return [counts for counts in itertools.product(range(1, devices + 1), repeat=parts) if sum(counts) == devices]
