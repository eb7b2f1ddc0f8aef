"""``trainer.placement`` read against the rest of the config: what a layout or ``auto`` cannot run with (which pool
each role runs on is ``role_pools``)."""

from __future__ import annotations

import difflib

from hybridflow.config.batch_sizes import batch_size_errors
from hybridflow.config.fully_async_options import fully_async
from hybridflow.config.layouts import Layout, LayoutError
from hybridflow.config.parallel_plans import PARALLEL_KEYS, value_at
from hybridflow.config.phases import uses_critic
from hybridflow.config.role_pools import NAMED_PLACEMENTS, placement_layout
from hybridflow.config.rollout_pool_options import one_step_off
from hybridflow.config.schema import PPOTrainerConfig


def placement_errors(config: PPOTrainerConfig) -> list[str]:
    """A layout that cannot be read or cannot run, and ``auto`` where there is nothing to choose among."""
    placement, trainer = config.trainer.placement, config.trainer
    if placement in ("colocated", "split"):
        return []
    if placement != "auto" and ":" not in placement:
        close = difflib.get_close_matches(placement, NAMED_PLACEMENTS, n=1)
        return [
            f"trainer.placement={placement!r} is not one of {list(NAMED_PLACEMENTS)} nor a layout such as "
            f"actor+ref:2/critic:2; {f'did you mean {close[0]!r}?' if close else 'choose one of them'}"
        ]
    try:
        layout = placement_layout(config)
    except LayoutError as error:
        return [str(error)]
    blockers = {
        "trainer.local_mode=true runs every role in this process": trainer.local_mode,
        "a rollout pool of its own (one-step-off or fully async) is placed by rollout.*": one_step_off(config)
        or fully_async(config),
    }
    errors = [
        f"trainer.placement={placement}: {reason}; use trainer.placement=colocated or split"
        for reason, present in blockers.items()
        if present
    ]
    parallel_sizes = _parallel_sizes(config) if placement == "auto" else []
    if parallel_sizes:
        errors.append(
            f"trainer.placement=auto chooses each role's tensor and sequence parallel sizes itself, but "
            f"{', '.join(parallel_sizes)} set; remove them, or spell out a layout (e.g. actor:2/critic:2) "
            "to keep them"
        )
    if layout is not None and not errors:
        errors += layout_batch_errors(config, layout)
    return errors


def layout_batch_errors(config: PPOTrainerConfig, layout: Layout) -> list[str]:
    """The batch-size rules on each role's own pool: the actor's on its devices, the critic's on its."""
    errors = batch_size_errors(config, layout.devices_of("actor_rollout_ref"), False)
    if uses_critic(config):
        errors += [
            error
            for error in batch_size_errors(config, layout.devices_of("critic"), True)
            if error.startswith("critic")
        ]
    return [f"trainer.placement={layout.spelled()}: {error}" for error in errors]


def _parallel_sizes(config: PPOTrainerConfig) -> list[str]:
    """The parallel size keys set above 1, as ``key=size``."""
    sizes = [f"{key}={value_at(config, key)}" for key in PARALLEL_KEYS]
    return [size for size in sizes if int(size.partition("=")[2]) > 1]
