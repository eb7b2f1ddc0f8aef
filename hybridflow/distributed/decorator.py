"""``@register``: how a worker method's arguments are split over the ranks and its results collected.

The driver calls ``group.update_actor(batch)`` as if the worker were local; the mode declared here on
``Worker.update_actor`` decides what each rank receives and what the driver gets back: the "transfer
protocols" of HybridFlow (arXiv 2409.19256).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)

REGISTER_ATTRIBUTE = "__hybridflow_register__"


class Dispatch(enum.Enum):
    """How arguments reach the ranks and results come back.

    - ``ONE_TO_ALL``: every rank gets the same arguments; the driver gets a list of results, by rank.
    - ``ALL_TO_ALL``: every argument is a list of ``world_size`` items, item ``r`` goes to rank ``r``;
      the driver gets a list of results, by rank.
    - ``DP_COMPUTE_PROTO``: every ``DataProto`` argument is padded to a multiple of ``world_size`` and
      chunked, chunk ``r`` to rank ``r`` (other arguments go to every rank); ``DataProto`` results are
      concatenated in rank order with the padding rows removed, other results come back as a list.
    - ``RANK_ZERO``: only rank 0 runs, with the arguments as given; the driver gets its result.
    """

    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    DP_COMPUTE_PROTO = "dp_compute_proto"
    RANK_ZERO = "rank_zero"


class Execute(enum.Enum):
    """Which ranks run: ``ALL``, or ``RANK_ZERO`` (the driver then gets rank 0's result, not a list)."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class MethodSpec:
    """What ``@register`` recorded on one method."""

    dispatch_mode: Dispatch
    execute_mode: Execute
    blocking: bool
    stream: bool = False
    concurrent: bool = False


def _check_combination(dispatch_mode: Dispatch, execute_mode: Execute) -> None:
    if execute_mode is Execute.RANK_ZERO and dispatch_mode in (Dispatch.ALL_TO_ALL, Dispatch.DP_COMPUTE_PROTO):
        raise ValueError(
            f"dispatch_mode={dispatch_mode.name} sends a different part to every rank, so it cannot run with "
            f"execute_mode=RANK_ZERO; use Dispatch.ONE_TO_ALL or Dispatch.RANK_ZERO"
        )
    if dispatch_mode is Dispatch.RANK_ZERO and execute_mode is Execute.ALL:
        raise ValueError(
            "dispatch_mode=RANK_ZERO runs rank 0 only, so it cannot run with execute_mode=ALL; "
            "leave execute_mode unset, or use Dispatch.ONE_TO_ALL to run every rank"
        )


def register(
    dispatch_mode: Dispatch = Dispatch.ALL_TO_ALL,
    execute_mode: Execute | None = None,
    blocking: bool = True,
    stream: bool = False,
    concurrent: bool = False,
) -> Callable[[F], F]:
    """Mark a worker method as a method of its worker group.

    ``execute_mode`` defaults to ``RANK_ZERO`` for ``Dispatch.RANK_ZERO`` and ``ALL`` otherwise.
    ``blocking=False`` makes the group method return a ``GroupFuture`` instead of the result.
    ``stream=True`` (``Dispatch.DP_COMPUTE_PROTO`` only): the method is a generator of ``protocol.Part``s of
    its rank's result; the group method returns a ``PartStream`` that hands the driver each part, its rows
    placed in the collected result, as soon as any rank yields it (``distributed/streams.py``).
    ``concurrent=True``: on a group started with ``concurrent_calls``, the call runs beside a call in progress on
    the same ranks (a second thread of each rank's actor, Ray's concurrency group ``concurrent``), e.g. new
    weights loaded between the decode steps of a running generation; on any other group it runs in order.
    The method itself is unchanged: inside the worker it is a plain method.
    """
    if callable(dispatch_mode) and not isinstance(dispatch_mode, Dispatch):
        raise TypeError("use @register(dispatch_mode=Dispatch.X), with parentheses, not a bare @register")
    if not isinstance(dispatch_mode, Dispatch):
        names = [m.name for m in Dispatch]
        raise TypeError(f"dispatch_mode must be a Dispatch member (one of {names}), got {dispatch_mode!r}")
    if execute_mode is None:
        execute_mode = Execute.RANK_ZERO if dispatch_mode is Dispatch.RANK_ZERO else Execute.ALL
    if not isinstance(execute_mode, Execute):
        names = [m.name for m in Execute]
        raise TypeError(f"execute_mode must be an Execute member (one of {names}), got {execute_mode!r}")
    _check_combination(dispatch_mode, execute_mode)
    if stream and dispatch_mode is not Dispatch.DP_COMPUTE_PROTO:
        raise ValueError(
            f"stream=True needs dispatch_mode=DP_COMPUTE_PROTO (parts of each rank's rows), got {dispatch_mode.name}"
        )
    spec = MethodSpec(dispatch_mode, execute_mode, bool(blocking), bool(stream), bool(concurrent))

    def decorator(method: F) -> F:
        setattr(method, REGISTER_ATTRIBUTE, spec)
        return method

    return decorator


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    """The ``@register``-ed methods of ``cls`` and its bases, by name."""
    methods = {}
    for name in dir(cls):
        spec = getattr(getattr(cls, name, None), REGISTER_ATTRIBUTE, None)
        if isinstance(spec, MethodSpec):
            methods[name] = spec
    return methods
