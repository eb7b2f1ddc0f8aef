"""``LocalWorkerGroup``: a worker group of one rank that lives in the driver's own process, without Ray.

For single-process runs (``trainer.local_mode``): the same worker classes are built here and their
``@register``-ed methods are dispatched and collected exactly as ``RayWorkerGroup`` does with world size 1,
so a breakpoint in ``update_actor`` or a reward function stops the driver, and a run starts without a
cluster. A worker's exception reaches the caller as raised (no ``WorkerError`` wrapping, nothing pickled).
"""

from __future__ import annotations

import os
from typing import Any

from hybridflow.distributed.class_with_init import RayClassWithInitArgs
from hybridflow.distributed.colocate import ColocatedClassWithInitArgs
from hybridflow.distributed.dispatch import DispatchedCall
from hybridflow.distributed.group_base import WorkerGroupBase, roles_of
from hybridflow.distributed.streams import LocalPartStream
from hybridflow.distributed.worker import find_free_port

# What a Ray worker process would see; Worker.__init__ reads them and forms a one-process group.
_ONE_RANK_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


class CompletedCall:
    """A local call's result behind ``GroupFuture``'s interface (``blocking=False`` methods)."""

    def __init__(self, result: Any):
        self._result = result

    def done(self) -> bool:
        return True

    def get(self, timeout: float | None = None) -> Any:
        return self._result


class LocalWorkerGroup(WorkerGroupBase):
    """Builds ``cls_with_init``'s roles in this process, in order, as rank 0 of a world of 1.

    ``num_threads`` sets torch's intra-op threads as ``RayWorkerGroup`` does from a pool's CPUs per process.
    """

    def __init__(
        self,
        cls_with_init: RayClassWithInitArgs | ColocatedClassWithInitArgs,
        name_prefix: str | None = None,
        num_threads: int | None = None,
    ):
        self._roles = roles_of(cls_with_init, type(self).__name__)
        self.name = name_prefix or "_".join(self._roles) or self._roles[""].cls.__name__
        # A port of its own: one inherited from the environment (torchrun, a parent process) may be taken.
        os.environ.update(_ONE_RANK_ENV, MASTER_PORT=str(find_free_port()))
        if num_threads is not None:
            os.environ["OMP_NUM_THREADS"] = str(max(1, num_threads))
        self._instances: dict[str, Any] | None = {
            role: spec.cls(*spec.args, **spec.kwargs) for role, spec in self._roles.items()
        }
        self._bind_methods()

    @property
    def world_size(self) -> int:
        return 1

    def _run(self, role: str, method: str, public_name: str, plan: DispatchedCall) -> CompletedCall | LocalPartStream:
        if self._instances is None:
            raise RuntimeError(f"group {self.name!r} was killed; create a new LocalWorkerGroup to call {public_name!r}")
        bound = getattr(self._instances[role], method)
        if plan.stream:
            ((args, kwargs),) = plan.calls
            return LocalPartStream(self.name, public_name, bound(*args, **kwargs), plan.collect)
        return CompletedCall(plan.collect([bound(*args, **kwargs) for args, kwargs in plan.calls]))

    def worker_info(self) -> list[dict[str, Any]]:
        """The one rank: this process."""
        return [{"rank": 0, "pid": os.getpid(), "node_id": None}]

    def kill(self) -> None:
        """Drop the workers (their models are freed with them)."""
        self._instances = None

    def __repr__(self) -> str:
        return f"LocalWorkerGroup({self.name!r})"
