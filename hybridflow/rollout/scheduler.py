"""Runs ``BatchedDecoder``s on background threads; requests arrive from any thread or event loop.

A ``DecodeScheduler`` runs one decoder on one thread: each loop iteration admits waiting requests (up to
``max_num_seqs`` rows in flight), then runs one decode step for every row, so requests submitted concurrently
(e.g. by the agent loop's coroutines) share forwards. ``paused()`` holds the model between steps, for loading new
weights without stopping in-flight requests. A submission's ``stop_when`` rule, checked by the decode thread after
each step that finished a request, ends every request still waiting or decoding once it holds, each future
resolving to the tokens drawn so far (finish reason ``abort``; the V1 trainers' partial rollout continues them
later): the decode steps, not the caller's timing, decide where it stops.

A ``DecodePool`` runs several schedulers over one model, each thread with its share of the torch threads, and
gives each its share of the requests (a prompt's samples stay together, so it is still prefilled once). On a CPU
a small model's decode step is mostly per-operation overhead (waking the other torch threads for ops of a few
microseconds of work), so two single-threaded decoders of half the rows each finish a step in about 0.6x the
time of one two-threaded decoder (bench_vs_trl's 4M model, 64 rows). Samples do not change: each request
draws from its own generator.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator

import torch

from hybridflow.rollout.batched_decoder import BatchedDecoder, Sequence
from hybridflow.rollout.requests import FINISH_ABORT, GenerationRequest


class EngineAsleepError(RuntimeError):
    """A request reached a rollout engine that is asleep; call ``engine.wake()`` first."""


class DecodeScheduler:
    def __init__(self, decoder: BatchedDecoder, max_num_seqs: int, torch_threads: int | None = None):
        self.decoder = decoder
        self.max_num_seqs = max_num_seqs
        self.torch_threads = torch_threads  # the decode thread's own torch threads; None = the process default
        self._waiting: deque[Sequence] = deque()
        self._futures: dict[int, Future] = {}
        self._condition = threading.Condition()
        self._model_lock = threading.RLock()
        self._stopping = False
        self._stop_when: Callable[[], bool] | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def load(self) -> int:
        """Rows waiting or decoding."""
        return len(self._waiting) + len(self.decoder.sequences)

    def start(self) -> None:
        if self.running:
            return
        self._stopping = False
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, args=(ready,), name="hybridflow-rollout-decoder", daemon=True
        )
        self._thread.start()
        ready.wait()

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

    def submit_all(
        self, requests: list[GenerationRequest], stop_when: Callable[[], bool] | None = None
    ) -> list[Future]:
        """Queue ``requests`` at once, so they are admitted together (and the samples of one prompt prefill it
        once); one future per request, in order. ``stop_when``: see the module docstring (it replaces the rule of
        an earlier submission)."""
        futures = [Future() for _ in requests]
        with self._condition:
            if not self.running or self._stopping:
                raise EngineAsleepError("the rollout engine is asleep (sleep() was called); call engine.wake() first")
            self._stop_when = stop_when
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

    def _loop(self, ready: threading.Event) -> None:
        if self.torch_threads is not None:
            torch.get_num_threads()  # the thread's lazy first setting, which would otherwise undo the next line
            torch.set_num_threads(self.torch_threads)
        ready.set()
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
            if finished and self._stop_when is not None and self._stop_when():
                self._end_all()

    def _admit(self) -> list[Sequence]:
        if not self.decoder.can_merge:
            return []
        room = self.max_num_seqs - len(self.decoder.sequences)
        return [self._waiting.popleft() for _ in range(min(room, len(self._waiting)))]

    def _end_all(self) -> None:
        """A ``stop_when`` rule that holds: every request ends as far as it got, the KV cache dropped."""
        with self._condition:
            sequences = [*self._waiting, *self.decoder.sequences]
            self._waiting.clear()
            self._stop_when = None
        with self._model_lock:
            self.decoder.release()
        for sequence in sequences:
            sequence.finish_reason = FINISH_ABORT
            self._futures.pop(id(sequence)).set_result(sequence.result())

    def _fail(self, sequences: list[Sequence], error: Exception) -> None:
        for sequence in sequences:
            future = self._futures.pop(id(sequence), None)
            if future is not None:
                future.set_exception(error)


class DecodePool:
    """Schedulers over one model, one thread each; the same surface as one ``DecodeScheduler``."""

    def __init__(self, schedulers: list[DecodeScheduler]):
        self.schedulers = schedulers

    @property
    def running(self) -> bool:
        return all(scheduler.running for scheduler in self.schedulers)

    def start(self) -> None:
        # torch.set_num_threads in a decode thread also sets the default of threads started later: restore it.
        threads = torch.get_num_threads()
        for scheduler in self.schedulers:
            scheduler.start()
        torch.set_num_threads(threads)

    def stop(self) -> None:
        for scheduler in self.schedulers:
            scheduler.stop()

    def submit(self, request: GenerationRequest) -> Future:
        """A lone request goes by its prompt, so the samples of one prompt submitted one by one meet in one batch."""
        return self.schedulers[hash(tuple(request.prompt_ids)) % len(self.schedulers)].submit(request)

    def submit_all(self, requests: list[GenerationRequest]) -> list[Future]:
        """Each prompt's requests to the scheduler with the fewest rows so far; futures in the requests' order."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(tuple(request.prompt_ids), []).append(i)
        loads = [scheduler.load for scheduler in self.schedulers]
        shares: list[list[int]] = [[] for _ in self.schedulers]
        for indices in groups.values():
            least = loads.index(min(loads))
            shares[least] += indices
            loads[least] += len(indices)
        futures: list[Future | None] = [None] * len(requests)
        for scheduler, share in zip(self.schedulers, shares):
            if share:
                for i, future in zip(share, scheduler.submit_all([requests[i] for i in share])):
                    futures[i] = future
        return futures

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Hold every decoder between decode steps."""
        with ExitStack() as stack:
            for scheduler in self.schedulers:
                stack.enter_context(scheduler.paused())
            yield

    @property
    def decoders(self) -> list[BatchedDecoder]:
        return [scheduler.decoder for scheduler in self.schedulers]
