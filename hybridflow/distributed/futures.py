"""``GroupFuture``: the pending result of a non-blocking group call.

Waiting watches every rank at once (``ray.wait``) and raises as soon as any one fails, so a rank that
died never leaves the driver blocked on its peers (which may be stuck in a collective waiting for it). A rank
whose collective timed out (the process group's timeout, the role's ``nccl_timeout``) names the ranks it waited
for: those still running once the other waiters' timeouts have had ``STALL_GRACE_S`` to arrive.
"""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError

from hybridflow.distributed.errors import StalledRanksError, WorkerError, WorkerTimeoutError

_UNSET = object()
# gloo's and NCCL's words for a collective that waited past the process group's timeout.
_COLLECTIVE_TIMEOUT = re.compile(r"[Tt]imed out|timing out|Timeout\(ms\)")
# The waiters of one collective time out within this much of each other, unless they entered it that far apart.
STALL_GRACE_S = 5.0


def worker_error(group: str, rank: int, method: str, error: RayError, nodes: Sequence[dict] = ()) -> WorkerError:
    """The driver-side error for one rank's failed call; ``nodes`` (``node_id`` and ``ip`` by rank, when the group
    knows them) name the node of a rank whose process died."""
    if isinstance(error, RayTaskError) and isinstance(error.cause, WorkerError):
        return error.cause
    if isinstance(error, RayActorError):
        reason = f"the worker process died or was killed: {error}"
        node = node_of_rank(rank, nodes)
        return WorkerError(group, rank, method, reason, type(error).__name__, str(error), process_died=True, node=node)
    return WorkerError(group, rank, method, str(error), type(error).__name__)


def node_of_rank(rank: int, nodes: Sequence[dict]) -> str:
    """Where ``rank`` ran: its node's IP and id, the group's ranks on that node (all lost with it, if the node went
    down), and whether Ray already counts the node dead (it notices within its health checks' period)."""
    if rank >= len(nodes):
        return ""
    node_id, ip = nodes[rank]["node_id"], nodes[rank]["ip"]
    ranks = [other for other, node in enumerate(nodes) if node["node_id"] == node_id]
    dead = any(node["NodeID"] == node_id and not node["Alive"] for node in ray.nodes())
    return f"node {ip} ({node_id[:8]}{', which Ray lists as dead' if dead else ''}) with rank(s) {ranks} of the group"


def wait_for_ranks(
    group: str, method: str, refs: dict[int, ray.ObjectRef], timeout: float | None, nodes: Sequence[dict] = ()
) -> dict[int, Any]:
    """Every rank's result, by rank; raises the first rank's failure as soon as it happens (``nodes``: see
    :func:`worker_error`)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    rank_of = {ref: rank for rank, ref in refs.items()}
    pending = list(refs.values())
    results: dict[int, Any] = {}
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=remaining)
        if not ready:
            waiting = sorted(rank_of[ref] for ref in pending)
            raise WorkerTimeoutError(
                f"group {group!r} method {method!r}: ranks {waiting} did not finish within {timeout:g} s"
            )
        rank = rank_of[ready[0]]
        try:
            results[rank] = ray.get(ready[0])
        except RayError as error:
            failure = worker_error(group, rank, method, error, nodes)
            if _COLLECTIVE_TIMEOUT.search(failure.cause_message) and pending:
                raise _stalled(failure, [rank_of[ref] for ref in _still_running(pending)]) from None
            raise failure from None
    return results


def _still_running(refs: list[ray.ObjectRef]) -> list[ray.ObjectRef]:
    _, running = ray.wait(refs, num_returns=len(refs), timeout=STALL_GRACE_S)
    return running


def _stalled(failure: WorkerError, ranks: list[int]) -> WorkerError | StalledRanksError:
    if not ranks:
        return failure
    return StalledRanksError(
        f"worker group {failure.group!r}: rank(s) {sorted(ranks)} never joined a collective of {failure.method!r} "
        f"(stuck, or stopped mid-call); rank {failure.rank} waited for them until the process group's timeout "
        f"({failure.cause_message.strip()}); the role's nccl_timeout sets how long that wait is"
    )


class GroupFuture:
    """Result of a ``blocking=False`` group method; ``get()`` waits and applies the method's collect mode."""

    def __init__(
        self,
        group: str,
        method: str,
        refs: dict[int, ray.ObjectRef],
        collect: Callable[[list[Any]], Any],
        nodes: Sequence[dict] = (),
    ):
        self.group = group
        self.method = method
        self._refs = refs
        self._collect = collect
        self._nodes = nodes
        self._result: Any = _UNSET

    def done(self) -> bool:
        """True once every rank has finished (successfully or not)."""
        refs = list(self._refs.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(ready) == len(refs)

    def get(self, timeout: float | None = None) -> Any:
        """The collected result.

        Raises ``WorkerError`` as soon as any rank fails, ``WorkerTimeoutError`` after ``timeout`` seconds.
        """
        if self._result is _UNSET:
            by_rank = wait_for_ranks(self.group, self.method, self._refs, timeout, self._nodes)
            self._result = self._collect([by_rank[rank] for rank in sorted(by_rank)])
        return self._result

    def __repr__(self) -> str:
        return f"GroupFuture(group={self.group!r}, method={self.method!r}, ranks={sorted(self._refs)})"
