"""Scoring calls in child processes that are killed at their time limit (verl's ``prime`` manager shape).

A thread cannot be killed: a scorer stuck in a C call or an endless loop would keep its thread (and whatever
it holds) forever. Here each of up to ``max_workers`` warm processes (``scoring_child.py``, started once, in a
session of its own) takes one call at a time; a call still running ``timeout_s`` seconds after it started has
its process group killed and a fresh process takes its place. The calls travel cloudpickled, so a reward
function loaded from a file (registered to pickle by value) runs in the child as it would here.
"""

from __future__ import annotations

import os
import pathlib
import pickle
import select
import signal
import subprocess
import sys
import time
from collections import deque
from typing import Any, Callable, Sequence

import cloudpickle

from hybridflow.rewards.scoring_child import HEADER
from hybridflow.rewards.timed_calls import CallOutcome, check_runner_options

CHILD = pathlib.Path(__file__).with_name("scoring_child.py")


class _Child:
    """One scoring process and the call it is running (index and start time), if any."""

    def __init__(self):
        # The parent's import path, so a function pickled by reference imports in the child as it does here.
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, env=env
        )
        self.index: int | None = None
        self.started = 0.0
        if len(self.process.stdout.read(HEADER.size)) < HEADER.size:
            raise RuntimeError(f"the scoring process {CHILD} did not start (exit code {self.process.wait()})")

    def send(self, index: int, payload: bytes) -> None:
        self.index, self.started = index, time.monotonic()
        self.process.stdin.write(HEADER.pack(len(payload)) + payload)
        self.process.stdin.flush()

    def receive(self) -> CallOutcome:
        header = self.process.stdout.read(HEADER.size)
        if len(header) < HEADER.size:
            code = self.process.wait()
            return CallOutcome("error", error=f"the scoring process died (exit code {code})")
        status, value, error = pickle.loads(self.process.stdout.read(HEADER.unpack(header)[0]))
        return CallOutcome(status, value, error)

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: children it started go too
        except ProcessLookupError:
            pass
        self.process.wait()


class ProcessCallRunner:
    """Runs batches of zero-argument calls on up to ``max_workers`` processes, each call limited to ``timeout_s``.

    The same interface as :class:`~hybridflow.rewards.timed_calls.TimedCallRunner`; ``num_killed`` counts the
    processes killed at their limit.
    """

    def __init__(self, max_workers: int = 4, timeout_s: float | None = 30.0):
        check_runner_options(max_workers, timeout_s)
        self.max_workers = max_workers
        self.timeout_s = timeout_s
        self._children: list[_Child] = []
        self.num_killed = 0

    def run(self, calls: Sequence[Callable[[], Any]]) -> list[CallOutcome]:
        """One outcome per call, in order."""
        outcomes: list[CallOutcome | None] = [None] * len(calls)
        waiting = deque(enumerate(calls))
        while len(self._children) < min(self.max_workers, len(calls)):
            self._children.append(_Child())
        while waiting or any(child.index is not None for child in self._children):
            for child in self._children:
                if child.index is None and waiting:
                    index, call = waiting.popleft()
                    try:
                        payload = cloudpickle.dumps(call)
                    except Exception as error:  # noqa: BLE001 - an unpicklable call fails alone
                        outcomes[index] = CallOutcome("error", error=f"the call cannot be sent to a process: {error}")
                        continue
                    child.send(index, payload)
            self._collect(outcomes)
        return outcomes

    def _collect(self, outcomes: list[CallOutcome | None]) -> None:
        busy = {child.process.stdout.fileno(): child for child in self._children if child.index is not None}
        if not busy:
            return
        ready, _, _ = select.select(list(busy), [], [], self._seconds_to_next_deadline())
        for fileno in ready:
            child = busy[fileno]
            outcomes[child.index] = child.receive()
            child.index = None
            if child.process.poll() is not None:
                self._replace(child)
        now = time.monotonic()
        for child in list(busy.values()):
            if child.index is not None and self.timeout_s is not None and now - child.started >= self.timeout_s:
                outcomes[child.index] = CallOutcome(
                    "timeout", error=f"still running after {self.timeout_s:g} s; killed"
                )
                self.num_killed += 1
                self._replace(child)

    def _replace(self, child: _Child) -> None:
        child.kill()
        self._children[self._children.index(child)] = _Child()

    def _seconds_to_next_deadline(self) -> float | None:
        if self.timeout_s is None:
            return None
        started = [child.started for child in self._children if child.index is not None]
        return max(min(started) + self.timeout_s - time.monotonic(), 0.0) + 1e-3

    def pids(self) -> list[int]:
        return [child.process.pid for child in self._children]

    def __getstate__(self) -> dict[str, Any]:
        # Processes do not pickle: a copy sent to a Ray actor starts its own.
        return {"max_workers": self.max_workers, "timeout_s": self.timeout_s}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def close(self) -> None:
        """End the scoring processes."""
        for child in self._children:
            child.kill()
        self._children = []

    def __del__(self) -> None:
        self.close()
