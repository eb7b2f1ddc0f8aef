"""Split a group call's arguments over the ranks (dispatch) and merge the ranks' results (collect).

Pure functions of the ``@register`` spec and the world size; no Ray here, so they are tested directly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any, Callable

from hybridflow.distributed.decorator import Dispatch, Execute, MethodSpec
from hybridflow.protocol import DataProto

RankCall = tuple[tuple, dict]


@dataclass
class DispatchedCall:
    """The arguments of each rank that runs (``calls[i]`` goes to ``ranks[i]``) and how to merge results;
    ``stream``: each rank's call yields ``Part``s of its result (joined, they are what ``collect`` takes);
    ``concurrent``: it may run beside a call in progress (``register(concurrent=True)``)."""

    ranks: list[int]
    calls: list[RankCall]
    collect: Callable[[list[Any]], Any]
    stream: bool = False
    concurrent: bool = False


def dispatch(spec: MethodSpec, method: str, world_size: int, args: tuple, kwargs: dict) -> DispatchedCall:
    """Per-rank arguments and the collect function for one call of ``method`` under ``spec``."""
    return replace(_dispatch(spec, method, world_size, args, kwargs), concurrent=spec.concurrent)


def _dispatch(spec: MethodSpec, method: str, world_size: int, args: tuple, kwargs: dict) -> DispatchedCall:
    if spec.dispatch_mode is Dispatch.RANK_ZERO or spec.execute_mode is Execute.RANK_ZERO:
        return DispatchedCall(ranks=[0], calls=[(args, kwargs)], collect=_only_result)
    ranks = list(range(world_size))
    if spec.dispatch_mode is Dispatch.ONE_TO_ALL:
        return DispatchedCall(ranks, [(args, kwargs)] * world_size, collect=list)
    if spec.dispatch_mode is Dispatch.ALL_TO_ALL:
        return DispatchedCall(ranks, _split_all_to_all(method, world_size, args, kwargs), collect=list)
    if spec.dispatch_mode is Dispatch.DP_COMPUTE_PROTO:
        calls, pad_size = _split_data_protos(method, world_size, args, kwargs)
        collect = functools.partial(_concat_data_protos, pad_size=pad_size)
        return DispatchedCall(ranks, calls, collect, stream=spec.stream)
    raise ValueError(f"method {method!r} has an unknown dispatch mode {spec.dispatch_mode!r}")


def _only_result(results: list[Any]) -> Any:
    return results[0]


def _split_all_to_all(method: str, world_size: int, args: tuple, kwargs: dict) -> list[RankCall]:
    for where, value in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]:
        if not isinstance(value, (list, tuple)) or len(value) != world_size:
            is_list = isinstance(value, (list, tuple))
            found = f"a {type(value).__name__} of length {len(value)}" if is_list else type(value).__name__
            raise ValueError(
                f"method {method!r} is registered ALL_TO_ALL, so {where} must be a list with one item per rank "
                f"(length {world_size}); got {found}"
            )
    return [
        (tuple(a[rank] for a in args), {key: value[rank] for key, value in kwargs.items()})
        for rank in range(world_size)
    ]


def _split_data_protos(method: str, world_size: int, args: tuple, kwargs: dict) -> tuple[list[RankCall], int]:
    """Pad every DataProto argument to a multiple of ``world_size`` and give rank ``r`` chunk ``r``."""
    lengths = {len(v) for v in (*args, *kwargs.values()) if isinstance(v, DataProto)}
    if len(lengths) > 1:
        raise ValueError(
            f"method {method!r} is registered DP_COMPUTE_PROTO, so its DataProto arguments must have one "
            f"batch size; got sizes {sorted(lengths)}"
        )
    pad_size = 0

    def chunks(value: Any) -> list[Any]:
        nonlocal pad_size
        if not isinstance(value, DataProto):
            return [value] * world_size
        padded, pad_size = value.pad_to_divisor(world_size)
        return padded.chunk(world_size)

    arg_chunks = [chunks(a) for a in args]
    kwarg_chunks = {key: chunks(value) for key, value in kwargs.items()}
    calls = [
        (tuple(c[rank] for c in arg_chunks), {key: c[rank] for key, c in kwarg_chunks.items()})
        for rank in range(world_size)
    ]
    return calls, pad_size


def _concat_data_protos(results: list[Any], pad_size: int) -> Any:
    """Concatenate DataProto results in rank order and drop the padding rows; other results stay a list."""
    if not all(isinstance(r, DataProto) for r in results):
        return results
    merged = DataProto.concat(results)
    return merged.unpad(pad_size) if pad_size else merged
