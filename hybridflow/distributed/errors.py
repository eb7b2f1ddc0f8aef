"""Typed errors of the single controller, each naming what failed and what to change."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """A method (or constructor) raised inside one rank of a worker group, or that rank's process died.

    Carries the group name, the rank, the method name and the remote traceback, so the driver's error
    points at the line inside the worker that failed.
    """

    def __init__(self, group: str, rank: int, method: str, remote_traceback: str, cause_type: str = ""):
        self.group = group
        self.rank = rank
        self.method = method
        self.remote_traceback = remote_traceback
        self.cause_type = cause_type
        super().__init__(f"group {group!r} rank {rank} method {method!r} failed:\n{remote_traceback}")

    def __reduce__(self):
        # Ray pickles exceptions between processes; the default reduce would pass only the message.
        return (type(self), (self.group, self.rank, self.method, self.remote_traceback, self.cause_type))


class WorkerTimeoutError(TimeoutError):
    """A group call did not finish within the caller's timeout; names the ranks still running."""


class InsufficientResourcesError(RuntimeError):
    """A ResourcePool asks for more CPUs/GPUs than the Ray cluster has (or has free)."""
