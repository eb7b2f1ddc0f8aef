"""The driver's side of ``global_profiler``: torch.profiler started on the traced groups before the first step of
each range and stopped after its last (``config/profiler_options.py`` decides which; ``distributed/profiler.py``
runs it in the workers). A run without profiling gets :class:`NoProfiler`, so the loop never checks."""

from __future__ import annotations

from typing import Any

from hybridflow.config.profiler_options import ProfilePlan
from hybridflow.distributed.profiler import TraceRequest


class NoProfiler:
    def before_step(self, step: int) -> None:
        pass

    def after_step(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class StepProfiler:
    """Traces ``groups`` ({role: its group}) over the plan's step ranges."""

    def __init__(self, plan: ProfilePlan, groups: dict[str, Any]):
        self.plan = plan
        self.groups = {role: group for role, group in groups.items() if role in plan.groups}
        self.open: tuple[int, int] | None = None

    def before_step(self, step: int) -> None:
        for first, last in self.plan.ranges:
            if step == first:
                self.open = (first, last)
                steps = f"step{first}" if first == last else f"step{first}-{last}"
                for role, group in self.groups.items():
                    ranks, contents = self.plan.groups[role]
                    group.start_profile(TraceRequest(role, steps, self.plan.save_path, ranks, contents))

    def after_step(self, step: int) -> None:
        if self.open is not None and step == self.open[1]:
            self.close()

    def close(self) -> None:
        """Stop an open range (the run ended inside it) and say where its traces are."""
        if self.open is None:
            return
        self.open = None
        paths = [path for role, group in self.groups.items() for path in group.stop_profile(role) if path]
        print(f"[hybridflow] profiler: wrote {', '.join(paths)}")


def step_profiler(plan: ProfilePlan | None, groups: dict[str, Any]) -> StepProfiler | NoProfiler:
    return StepProfiler(plan, groups) if plan is not None else NoProfiler()
