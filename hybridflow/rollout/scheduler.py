"""Runs a ``BatchedDecoder`` on one background thread; requests arrive from any thread or event loop.

Each loop iteration admits waiting requests (up to ``max_num_seqs`` rows in flight), then runs one decode
step for every row, so requests submitted concurrently (e.g. by the agent loop's coroutines) share forwards.
``paused()`` holds the model between steps, for loading new weights without stopping in-flight requests.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Iterator

from hybridflow.rollout.batched_decoder import BatchedDecoder, Sequence
from hybridflow.rollout.requests import GenerationRequest


class EngineAsleepError(RuntimeError):
    """A request reached a rollout engine that is asleep; call ``engine.wake()`` first."""


class DecodeScheduler:
    def __init__(self, decoder: BatchedDecoder, max_num_seqs: int):
        self.decoder = decoder
        self.max_num_seqs = max_num_seqs
        self._waiting: deque[Sequence] = deque()
        self._futures: dict[int, Future] = {}
        self._condition = threading.Condition()
        self._model_lock = threading.RLock()
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="hybridflow-rollout-decoder", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish every submitted request, then end the thread and drop the KV cache."""
        if not self.running:
            return
        with self._condition:
            self._stopping = True
            self._condition.notify_all()
        self._thread.join()
        self._thread = None
        self.decoder.release()

    def submit(self, request: GenerationRequest) -> Future:
        """Queue ``request``; the returned future resolves to its ``GenerationResult``."""
        return self.submit_all([request])[0]

    def submit_all(self, requests: list[GenerationRequest]) -> list[Future]:
        """Queue ``requests`` at once, so they are admitted together (and the samples of one prompt prefill it
        once); one future per request, in order."""
        futures = [Future() for _ in requests]
        with self._condition:
            if not self.running or self._stopping:
                raise EngineAsleepError("the rollout engine is asleep (sleep() was called); call engine.wake() first")
            for request, future in zip(requests, futures):
                sequence = self.decoder.new_sequence(request)
                self._futures[id(sequence)] = future
                self._waiting.append(sequence)
            self._condition.notify_all()
        return futures

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the model between decode steps (in-flight requests resume afterwards)."""
        with self._model_lock:
            yield

    def _loop(self) -> None:
        while True:
            with self._condition:
                while not self._waiting and not self.decoder.sequences and not self._stopping:
                    self._condition.wait()
                if not self._waiting and not self.decoder.sequences:
                    return
                admitted = self._admit()
            with self._model_lock:
                try:
                    finished = self.decoder.add(admitted) if admitted else []
                    finished += self.decoder.step()
                except Exception as error:  # noqa: BLE001 - the error is handed to every waiting caller
                    self._fail(admitted + self.decoder.sequences, error)
                    self.decoder.release()
                    continue
            for sequence in finished:
                self._futures.pop(id(sequence)).set_result(sequence.result())

    def _admit(self) -> list[Sequence]:
        if not self.decoder.can_merge:
            return []
        room = self.max_num_seqs - len(self.decoder.sequences)
        return [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]

    def _fail(self, sequences: list[Sequence], error: Exception) -> None:
        for sequence in sequences:
            future = self._futures.pop(id(sequence), None)
            if future is not None:
                future.set_exception(error)
