"""torch.profiler over a range of training steps in a worker process, under verl's profiler keys.

A role's ``profiler`` section (:class:`ProfilerConfig`) says whether its ranks are traced and what the trace
records; ``global_profiler`` (the trainer's) which steps and where. The driver calls :meth:`Profiled.start_profile`
on a profiled role's group before the first step of a range and :meth:`Profiled.stop_profile` after its last.
torch.profiler runs once per process, so roles fused into one process (colocated, or local mode) share one
trace, named by all of them: ``<save_path>/<role>[+<role>...]_step<first>[-<last>]_rank<rank>.json``, a chrome
trace holding everything the process ran in those steps.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import torch

from hybridflow.distributed.decorator import Dispatch, register
from hybridflow.help_fields import option, section

CONTENTS = ("cpu", "cuda", "memory", "shapes", "stack")


@dataclass
class TorchToolConfig:
    """What torch.profiler records (``profiler.tool_config.torch``)."""

    contents: list = option(
        [], "What the trace records besides CPU ops (always on): cuda, memory, shapes, stack; cpu may be listed."
    )
    discrete: bool = option(False, "A trace per stage (true: not served); false: one per role and step range.")


@dataclass
class ProfilerToolConfig:
    """Options of each profiler tool (``profiler.tool_config``)."""

    torch: TorchToolConfig = section(TorchToolConfig, "torch.profiler (global_profiler.tool=torch).")


@dataclass
class ProfilerConfig:
    """Whether a role's ranks are traced over ``global_profiler.steps`` (``<role>.profiler``)."""

    enable: bool = option(False, "Trace this role's processes over global_profiler.steps.")
    all_ranks: bool = option(False, "Trace every rank of the role.")
    ranks: list = option([], "Ranks to trace when all_ranks is false; empty: rank 0.")
    tool_config: ProfilerToolConfig = section(ProfilerToolConfig, "Options of each profiler tool.")


@dataclass(frozen=True)
class TraceRequest:
    """One role's trace of one step range: ``ranks`` None means every rank."""

    role: str
    steps: str  # "step3" or "step3-5"
    save_path: str
    ranks: tuple[int, ...] | None
    contents: tuple[str, ...]

    def traces(self, rank: int) -> bool:
        return self.ranks is None or rank in self.ranks


class _ProcessTrace:
    """The one torch.profiler session of this process, and the roles sharing it."""

    def __init__(self, request: TraceRequest, rank: int):
        cuda = "cuda" in request.contents and torch.cuda.is_available()
        activities = [torch.profiler.ProfilerActivity.CPU]
        activities += [torch.profiler.ProfilerActivity.CUDA] if cuda else []
        self.request, self.rank, self.roles, self.active = request, rank, [request.role], {request.role}
        self.profile = torch.profiler.profile(
            activities=activities,
            profile_memory="memory" in request.contents,
            record_shapes="shapes" in request.contents,
            with_stack="stack" in request.contents,
        )
        self.profile.start()

    def join(self, role: str) -> None:
        self.roles += [] if role in self.roles else [role]
        self.active.add(role)

    def leave(self, role: str) -> str | None:
        """The trace's path once the last role sharing it has left, else None."""
        self.active.discard(role)
        if self.active:
            return None
        self.profile.stop()
        request = self.request
        path = pathlib.Path(request.save_path) / f"{'+'.join(self.roles)}_{request.steps}_rank{self.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.profile.export_chrome_trace(str(path))
        return str(path)


_session: _ProcessTrace | None = None


class Profiled:
    """Mixin of a role worker (with ``rank``): its group can trace it over a range of steps."""

    rank: int

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, request: TraceRequest) -> None:
        global _session
        if not request.traces(self.rank):
            return
        if _session is None:
            _session = _ProcessTrace(request, self.rank)
        else:
            _session.join(request.role)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self, role: str) -> str | None:
        """The path of the trace this call finished (on the rank's last role to stop), else None."""
        global _session
        if _session is None or role not in _session.active:
            return None
        path = _session.leave(role)
        if path is not None:
            _session = None
        return path
