"""verl's profiler keys: ``global_profiler`` (tool, steps, where) and each role's ``profiler`` section.

With ``global_profiler.tool=torch`` and ``steps`` listed, the worker groups whose roles enable their profiler
run torch.profiler over those steps (``distributed/profiler.py``); the driver starts and stops them
(``trainer/profiling.py``). A group traces for the roles it plays: the actor's processes for the actor, the
reference and (in the hybrid engine) the rollout; a rollout pool of its own for the rollout; the critic's. Other
tools are refused by ``verl_compat``'s choices; what the keys cannot do is refused here, and keys set where
nothing is traced are listed at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.phases import uses_critic
from hybridflow.config.placement import ROLLOUT_ROLE
from hybridflow.config.role_pools import placement_layout
from hybridflow.config.rollout_pool_options import one_step_off
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.distributed.profiler import CONTENTS, ProfilerConfig

TOOL = "torch"
ACTOR, ROLLOUT = "actor_rollout_ref.actor.profiler", "actor_rollout_ref.rollout.profiler"
REF = "actor_rollout_ref.ref.profiler"


@dataclass(frozen=True)
class ProfilePlan:
    """The step ranges to trace (first, last) and, per worker group, the ranks (None: all) and what to record."""

    ranges: tuple[tuple[int, int], ...]
    save_path: str
    groups: dict[str, tuple[tuple[int, ...] | None, tuple[str, ...]]]

    def describe(self) -> str:
        steps = ", ".join(f"{first}" if first == last else f"{first}-{last}" for first, last in self.ranges)
        groups = ", ".join(
            f"{group} (ranks {'all' if ranks is None else list(ranks)})" for group, (ranks, _) in self.groups.items()
        )
        return f"torch.profiler over steps {steps} of {groups}, traces in {self.save_path}"


def role_sections(config: PPOTrainerConfig) -> dict[str, ProfilerConfig]:
    """{config path of a role's profiler section: the section}."""
    actor_rollout_ref = config.actor_rollout_ref
    return {
        ACTOR: actor_rollout_ref.actor.profiler,
        ROLLOUT: actor_rollout_ref.rollout.profiler,
        REF: actor_rollout_ref.ref.profiler,
        "critic.profiler": config.critic.profiler,
    }


def profiler_errors(config: PPOTrainerConfig) -> list[str]:
    """What the profiler keys ask for that cannot be done (other tools are refused before this check)."""
    settings, errors = config.global_profiler, []
    if settings.tool not in (None, TOOL):
        errors.append(f"global_profiler.tool={settings.tool!r}; choose {TOOL} (torch.profiler) or null")
    steps = settings.steps
    if steps is not None and not (isinstance(steps, list) and all(isinstance(s, int) and s >= 1 for s in steps)):
        errors.append(f"global_profiler.steps={steps!r} must be a list of training steps (from 1), or null")
    sections = role_sections(config)
    if sections[ROLLOUT] == sections[ACTOR]:  # the rollout's follow the actor's: one line for both
        del sections[ROLLOUT]
    for path, section in sections.items():
        torch_options = section.tool_config.torch
        unknown = [item for item in torch_options.contents if item not in CONTENTS]
        if unknown:
            errors.append(f"{path}.tool_config.torch.contents has {unknown}; choose from {list(CONTENTS)}")
        if torch_options.discrete:
            errors.append(
                f"{path}.tool_config.torch.discrete=True needs a trace per stage, which hybridflow does not have; "
                "set it to false (one trace per role and step range)"
            )
        if not all(isinstance(rank, int) and rank >= 0 for rank in section.ranks):
            errors.append(f"{path}.ranks={section.ranks!r} must be a list of ranks (>= 0)")
    return errors


def unread_profiler_options(config: PPOTrainerConfig) -> list[str]:
    """Profiler keys set where nothing is traced, each with why ("key=value (why)")."""
    settings = config.global_profiler
    enabled = [path for path, section in role_sections(config).items() if section.enable]
    if settings.tool == TOOL and settings.steps:
        return [] if enabled else [f"global_profiler.steps={settings.steps} (no role's profiler.enable is true)"]
    why = "global_profiler.tool is null" if settings.tool is None else "global_profiler.steps is empty"
    notes = [f"{path}.enable=True ({why}: nothing is traced)" for path in enabled]
    if settings.tool is None and settings.steps:
        notes.append(f"global_profiler.steps={settings.steps} ({why}: nothing is traced)")
    return notes


def profile_plan(config: PPOTrainerConfig) -> ProfilePlan | None:
    """What the driver traces, or None where nothing is."""
    settings = config.global_profiler
    if settings.tool != TOOL or not settings.steps:
        return None
    sections = role_sections(config)
    members = {"actor_rollout_ref": [ACTOR], "ref": []}
    layout = placement_layout(config)
    members["ref" if layout is not None and layout.ref_apart else "actor_rollout_ref"].append(REF)
    members[ROLLOUT_ROLE if one_step_off(config) else "actor_rollout_ref"].append(ROLLOUT)
    members["critic"] = ["critic.profiler"] if uses_critic(config) else []
    groups = {}
    for group, paths in members.items():
        chosen = [sections[path] for path in paths if sections[path].enable]
        if chosen:
            groups[group] = (_ranks(chosen), tuple(sorted({c for s in chosen for c in s.tool_config.torch.contents})))
    if not groups:
        return None
    return ProfilePlan(step_ranges(settings.steps, settings.profile_continuous_steps), settings.save_path, groups)


def _ranks(sections: list[ProfilerConfig]) -> tuple[int, ...] | None:
    if any(section.all_ranks for section in sections):
        return None
    return tuple(sorted({rank for section in sections for rank in (section.ranks or [0])}))


def step_ranges(steps: list[int], continuous: bool) -> tuple[tuple[int, int], ...]:
    """(first, last) of each trace: one per step, or one per run of consecutive steps when ``continuous``."""
    ranges: list[list[int]] = []
    for step in sorted(set(steps)):
        if continuous and ranges and ranges[-1][1] == step - 1:
            ranges[-1][1] = step
        else:
            ranges.append([step, step])
    return tuple((first, last) for first, last in ranges)
