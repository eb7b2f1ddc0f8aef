"""``WorkerHost``: the one Ray actor class behind every rank of every worker group.

A host is created without the user's worker (so the group can first learn rank 0's address and pick the
master port), then ``construct`` sets the rank's environment and builds one instance per role, all in
this process; ``execute`` runs a role's method and turns any exception into a ``WorkerError`` that names
the group, rank and method and carries the traceback.
"""

from __future__ import annotations

import os
import traceback
from typing import Any, Iterator

import ray

from hybridflow.distributed.errors import WorkerError
from hybridflow.distributed.worker import find_free_port
from hybridflow.errors import HybridflowError


class WorkerHost:
    """Holds the role instances of one rank; methods are called by the group, never by users."""

    def __init__(self, group_name: str, rank: int):
        self._group_name = group_name
        self._rank = rank
        self._roles: dict[str, Any] = {}

    def __repr__(self) -> str:
        # Ray prefixes this actor's log lines with its repr.
        return f"{self._group_name}:rank{self._rank}"

    def node_address(self) -> dict[str, Any]:
        """This process's node id, node IP and a free port there (used as MASTER_PORT when rank 0)."""
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "free_port": find_free_port(),
        }

    def describe(self) -> dict[str, Any]:
        return {"rank": self._rank, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}

    def construct(self, roles: dict[str, tuple[type, tuple, dict]], dist_env: dict[str, str]) -> None:
        """Set RANK/WORLD_SIZE/MASTER_* etc., then build each role's instance (in the given order)."""
        os.environ.update(dist_env)
        for role, (cls, args, kwargs) in roles.items():
            try:
                self._roles[role] = cls(*args, **kwargs)
            except BaseException as error:
                raise self._error(f"{cls.__qualname__}.__init__", error) from None

    def execute(self, role: str, method: str, args: tuple, kwargs: dict) -> Any:
        try:
            return getattr(self._roles[role], method)(*args, **kwargs)
        except BaseException as error:
            raise self._error(f"{role}.{method}" if role else method, error) from None

    def execute_stream(self, role: str, method: str, args: tuple, kwargs: dict) -> Iterator[Any]:
        """A ``stream=True`` method's yields, one Ray object each (called with ``num_returns="streaming"``)."""
        try:
            yield from getattr(self._roles[role], method)(*args, **kwargs)
        except BaseException as error:
            raise self._error(f"{role}.{method}" if role else method, error) from None

    def _error(self, method: str, error: BaseException) -> WorkerError:
        return WorkerError(
            self._group_name,
            self._rank,
            method,
            traceback.format_exc(),
            type(error).__name__,
            str(error),
            user_facing=isinstance(error, HybridflowError),
        )


CONCURRENT_GROUP = "concurrent"


class ConcurrentWorkerHost(WorkerHost):
    """A host that also runs ``register(concurrent=True)`` calls on a thread of their own (Ray's concurrency group
    ``concurrent``, one call at a time), beside the call in progress on the default one."""

    @ray.method(concurrency_group=CONCURRENT_GROUP)
    def execute_concurrently(self, role: str, method: str, args: tuple, kwargs: dict) -> Any:
        return self.execute(role, method, args, kwargs)
