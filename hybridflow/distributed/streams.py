"""``PartStream``: the parts of a streamed group call (``@register(..., stream=True)``), as the ranks yield them.

Iterating a stream gives each ``Part`` as soon as any rank yields it, its rows placed in the collected result
(rank ``r``'s rows follow those of ranks ``0..r-1``: ``DP_COMPUTE_PROTO`` gives every rank as many rows).
``get()`` reads whatever was not read yet, joins each rank's parts and collects them as the method's
unstreamed form would. A rank's failure is raised when the stream reaches it, as a ``WorkerError``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Iterator, Sequence

from hybridflow.protocol import Part, join_parts

_UNSET = object()


class StreamedValueError(TypeError):
    """A streamed worker method yielded something other than a ``Part``."""


class PartStream(ABC):
    """The parts of one streamed call over ``num_ranks`` ranks; ``collect`` merges the joined rank results."""

    def __init__(self, group: str, method: str, num_ranks: int, collect: Callable[[list[Any]], Any]):
        self.group = group
        self.method = method
        self.num_ranks = num_ranks
        self._collect = collect
        self._by_rank: dict[int, list[Part]] = {rank: [] for rank in range(num_ranks)}
        self._arriving = self._arrivals()
        self._result: Any = _UNSET

    def __iter__(self) -> Iterator[Part]:
        for rank, part in self._arriving:
            if not isinstance(part, Part):
                raise StreamedValueError(
                    f"group {self.group!r} method {self.method!r}: rank {rank} yielded a {type(part).__name__}; a "
                    f"stream=True method yields hybridflow.protocol.Part objects"
                )
            self._by_rank[rank].append(part)
            yield part.shifted(rank * part.total, self.num_ranks * part.total)

    def get(self) -> Any:
        """The collected result, as the unstreamed method returns it."""
        if self._result is _UNSET:
            for _ in self:
                pass
            self._result = self._collect([join_parts(self._by_rank[rank]) for rank in range(self.num_ranks)])
        return self._result

    @abstractmethod
    def _arrivals(self) -> Iterator[tuple[int, Any]]:
        """(rank, what it yielded), in the order they arrive."""


class RayPartStream(PartStream):
    """Reads every rank's Ray streaming generator (``num_returns="streaming"``), whichever has a part ready."""

    def __init__(
        self,
        group: str,
        method: str,
        generators: dict[int, Any],
        collect: Callable[[list[Any]], Any],
        nodes: Sequence[dict] = (),
    ):
        self._generators = generators
        self._nodes = nodes  # where each rank runs, to name the node of a rank that died
        super().__init__(group, method, len(generators), collect)

    def _arrivals(self) -> Iterator[tuple[int, Any]]:
        import ray  # here, so that local mode's streams never load Ray
        from ray.exceptions import RayError

        from hybridflow.distributed.futures import worker_error

        pending = dict(self._generators)
        while pending:
            ready, _ = ray.wait(list(pending.values()), num_returns=1)
            rank = next(rank for rank, generator in pending.items() if generator is ready[0])
            try:
                value = ray.get(next(pending[rank]))
            except StopIteration:
                del pending[rank]
                continue
            except RayError as error:
                raise worker_error(self.group, rank, self.method, error, self._nodes) from None
            yield rank, value


class LocalPartStream(PartStream):
    """One rank in this process: its generator runs as the stream is read."""

    def __init__(self, group: str, method: str, generator: Iterator[Any], collect: Callable[[list[Any]], Any]):
        self._generator = generator
        super().__init__(group, method, 1, collect)

    def _arrivals(self) -> Iterator[tuple[int, Any]]:
        for value in self._generator:
            yield 0, value
