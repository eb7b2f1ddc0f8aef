"""Running scoring calls with a time limit, so one hanging or crashing function costs a sample, not the run.

Calls run on a few daemon worker threads. A call that raises gives an ``error`` outcome; a call still
running ``timeout_s`` seconds after it started gives a ``timeout`` outcome and is abandoned: Python cannot
kill a thread, so its thread keeps running until the call returns (then exits) while a fresh thread takes
its place. Because the threads are daemons, a call that never returns cannot block interpreter exit;
``num_stuck_threads`` counts the abandoned threads still running. Scoring functions that need a hard
kill (e.g. running untrusted code) should isolate that work in a subprocess of their own. A call that bounds
its own time (a remote judge's request) raises :class:`CallTimeout` when it runs out, a ``timeout`` outcome too.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

_IDLE_POLL_S = 0.05


@dataclass
class CallOutcome:
    """What one call produced: ``status`` is "ok" (``value`` holds the result), "error" or "timeout"."""

    status: str
    value: Any = None
    error: str = ""


class CallTimeout(TimeoutError):
    """Raised by a call that ran past a time limit of its own; its outcome is a "timeout", not an "error"."""


@dataclass(eq=False)
class _Job:
    index: int
    call: Callable[[], Any]
    results: queue.SimpleQueue
    started_at: float = 0.0
    abandoned: bool = False


def call_safely(call: Callable[[], Any]) -> CallOutcome:
    """Run ``call`` in this thread and turn an exception into an "error" outcome."""
    try:
        return CallOutcome("ok", call())
    except CallTimeout as error:
        return CallOutcome("timeout", error=str(error))
    except Exception as error:  # a user's scoring function may raise anything
        return CallOutcome("error", error=f"{type(error).__name__}: {error}")


def check_runner_options(max_workers: int, timeout_s: float | None) -> None:
    if not isinstance(max_workers, int) or max_workers < 1:
        raise ValueError(f"max_workers={max_workers!r} must be a positive integer")
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} must be positive, or None for no time limit")


class TimedCallRunner:
    """Runs batches of zero-argument calls on up to ``max_workers`` threads, each limited to ``timeout_s``.

    ``timeout_s=None`` runs the calls one by one in the caller's thread (exceptions still caught, no limit).
    ``run`` is meant to be called from one thread at a time.
    """

    def __init__(self, max_workers: int = 4, timeout_s: float | None = 30.0):
        check_runner_options(max_workers, timeout_s)
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._running: set[_Job] = set()
        self._num_workers = 0
        self.num_stuck_threads = 0

    def run(self, calls: Sequence[Callable[[], Any]]) -> list[CallOutcome]:
        """One outcome per call, in order."""
        if self.timeout_s is None:
            return [call_safely(call) for call in calls]
        results: queue.SimpleQueue = queue.SimpleQueue()
        self._start_workers(min(self.max_workers, len(calls)))
        for index, call in enumerate(calls):
            self._jobs.put(_Job(index, call, results))
        outcomes: list[CallOutcome | None] = [None] * len(calls)
        pending = len(calls)
        while pending:
            try:
                index, outcome = results.get(timeout=self._seconds_to_next_deadline())
            except queue.Empty:
                self._abandon_overdue_jobs()
                continue
            if outcomes[index] is None:
                outcomes[index] = outcome
                pending -= 1
        return outcomes

    def __getstate__(self) -> dict[str, Any]:
        # Threads, queues and locks do not pickle: a copy sent to a Ray actor starts its own workers.
        return {"max_workers": self.max_workers, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def close(self) -> None:
        """Let the idle worker threads exit (stuck ones exit when their call returns)."""
        with self._lock:
            for _ in range(self._num_workers):
                self._jobs.put(None)
            self._num_workers = 0

    def _start_workers(self, wanted: int) -> None:
        with self._lock:
            while self._num_workers < wanted:
                self._spawn_worker()

    def _spawn_worker(self) -> None:
        # Called with the lock held.
        self._num_workers += 1
        threading.Thread(target=self._work, name="hybridflow-scoring", daemon=True).start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            with self._lock:
                job.started_at = time.monotonic()
                self._running.add(job)
            outcome = call_safely(job.call)
            with self._lock:
                self._running.discard(job)
                if job.abandoned:
                    self.num_stuck_threads -= 1
                    return  # a replacement thread already took this one's place
            job.results.put((job.index, outcome))

    def _seconds_to_next_deadline(self) -> float:
        with self._lock:
            if not self._running:
                return _IDLE_POLL_S
            earliest = min(job.started_at for job in self._running)
        return max(earliest + self.timeout_s - time.monotonic(), 0.0) + 1e-3

    def _abandon_overdue_jobs(self) -> None:
        now = time.monotonic()
        with self._lock:
            for job in [job for job in self._running if now - job.started_at >= self.timeout_s]:
                job.abandoned = True
                self._running.discard(job)
                self.num_stuck_threads += 1
                self._num_workers -= 1
                self._spawn_worker()
                job.results.put((job.index, CallOutcome("timeout", error=f"still running after {self.timeout_s} s")))
