"""Typed errors of the single controller, each naming what failed and what to change."""

from __future__ import annotations

from hybridflow.errors import HybridflowError


class WorkerError(RuntimeError):
    """A method (or constructor) raised inside one rank of a worker group, or that rank's process died.

    Carries the group name, the rank, the method name and the remote traceback, so the driver's error
    points at the line inside the worker that failed. ``user_facing``: the cause was a
    :class:`~hybridflow.errors.HybridflowError`, whose message (``cause_message``) says all the user needs;
    ``process_died``: the rank's process is gone (killed, out of memory, its node down); ``node``: where it ran
    (the node, and the group's ranks on it), when the group knows.
    """

    def __init__(
        self,
        group: str,
        rank: int,
        method: str,
        remote_traceback: str,
        cause_type: str = "",
        cause_message: str = "",
        user_facing: bool = False,
        process_died: bool = False,
        node: str = "",
    ):
        self.group = group
        self.rank = rank
        self.method = method
        self.remote_traceback = remote_traceback
        self.cause_type = cause_type
        self.cause_message = cause_message
        self.user_facing = user_facing
        self.process_died = process_died
        self.node = node
        super().__init__(f"group {group!r} rank {rank} method {method!r} failed:\n{remote_traceback}")

    def summary(self) -> str:
        """One line: where it failed and why (the cause's own message when it is meant for the user)."""
        where = f"worker group {self.group!r} rank {self.rank} ({self.method})"
        if self.process_died:
            on_node = f" on {self.node}" if self.node else ""
            return f"{where}: the worker process died or was killed{on_node}; its log is in the Ray session folder"
        return f"{where}: {self.cause_message}"

    def __reduce__(self):
        # Ray pickles exceptions between processes; the default reduce would pass only the message.
        return (
            type(self),
            (
                self.group,
                self.rank,
                self.method,
                self.remote_traceback,
                self.cause_type,
                self.cause_message,
                self.user_facing,
                self.process_died,
                self.node,
            ),
        )


class StalledRanksError(HybridflowError, RuntimeError):
    """A rank's collective timed out waiting for peers that never joined it (stuck, or stopped mid-call)."""


class WorkerTimeoutError(HybridflowError, TimeoutError):
    """A group call did not finish within the caller's timeout; names the ranks still running."""


class InsufficientResourcesError(HybridflowError, RuntimeError):
    """A ResourcePool asks for more CPUs/GPUs than the Ray cluster has (or has free)."""
