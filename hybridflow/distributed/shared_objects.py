"""``SharedObject``: a value one worker puts in Ray's object store for workers of another group to read.

The driver passes the handle on without fetching the value (Ray resolves only object refs given directly as
call arguments, not refs inside another object), so data moves from the worker that made it to the workers
that read it, never through the driver. Used for the weight sync of a rollout pool beside the actor's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray


@dataclass(frozen=True)
class SharedObject:
    """A handle on a value in the object store; ``get()`` reads it in any process of the cluster."""

    ref: ray.ObjectRef

    def get(self) -> Any:
        return ray.get(self.ref)


def share(value: Any) -> SharedObject:
    """Put ``value`` in the object store (from a worker or the driver); it lives while a handle does."""
    return SharedObject(ray.put(value))
