"""Which data-parallel rank gets which sample, so every rank does about the same work (verl's ``balance_batch``).

The driver hands rank ``r`` the ``r``-th equal slice of a batch. :func:`rank_balanced_order` reorders the rows
so that each slice holds about the same workload, estimated per sample from its real tokens by
:func:`calculate_workload`, with the slices split by :func:`karmarkar_karp`. Every slice keeps its rows in
batch order. Only the order changes; each row keeps its columns (``uid`` included), so group statistics
computed by ``uid`` are unaffected. :func:`group_balanced_order` keeps each prompt's samples on one rank, where the
ranks compute each prompt once for all its samples (verl's group-level balancing with ``use_prefix_grouper``).
"""

from __future__ import annotations

import heapq
import itertools
from typing import Sequence

import torch


class PartitionError(ValueError):
    """Rows that cannot be split into the asked number of parts."""


def calculate_workload(seqlens: torch.Tensor) -> torch.Tensor:
    """Relative forward cost of each sequence of ``seqlens`` real tokens: ``24576 * s + s**2``.

    A dense transformer block costs about ``12 h**2 s + 2 h s**2`` FLOPs; verl fixes ``h = 4096`` (a 7B model)
    and divides by ``2 h`` (verl PR #3605), so short sequences weigh by their tokens and very long ones more.
    """
    return 24576 * seqlens + seqlens**2


def karmarkar_karp(values: Sequence[int], num_parts: int, equal_size: bool) -> list[list[int]]:
    """Indices of ``values`` split into ``num_parts`` parts of near-equal sums: the largest differencing
    method (Karmarkar and Karp 1982), in its k-way form.

    Each value starts as a partial solution of one part holding it (``equal_size``: the values, ascending,
    are taken ``num_parts`` at a time, one per part, so every part ends with ``len(values) / num_parts``).
    The two partial solutions with the largest spread (largest minus smallest part sum) are then merged,
    the largest part of one with the smallest of the other, until one remains. Parts come back with their
    indices ascending, in order of their first index.
    """
    count = len(values)
    if num_parts < 1 or count < num_parts or (equal_size and count % num_parts):
        raise PartitionError(
            f"cannot split {count} rows into {num_parts} parts{' of equal size' if equal_size else ''}"
        )
    order = sorted(range(count), key=lambda index: (values[index], index))
    step = num_parts if equal_size else 1
    tie_break = itertools.count()
    heap = []
    for start in range(0, count, step):
        parts = [(values[index], [index]) for index in order[start : start + step]]
        parts += [(0, []) for _ in range(num_parts - len(parts))]
        _push(heap, parts, tie_break)
    while len(heap) > 1:
        first, second = heapq.heappop(heap)[-1], heapq.heappop(heap)[-1]
        merged = [(a_sum + b_sum, a_rows + b_rows) for (a_sum, a_rows), (b_sum, b_rows) in zip(first, second[::-1])]
        _push(heap, merged, tie_break)
    parts = [sorted(rows) for _, rows in heapq.heappop(heap)[-1]]
    return sorted(parts, key=lambda rows: rows[0] if rows else count)


def _push(heap: list, parts: list[tuple[int, list[int]]], tie_break: itertools.count) -> None:
    """Push a partial solution, its parts sorted by sum (largest first); the heap pops the largest spread."""
    parts.sort(key=lambda part: part[0], reverse=True)
    heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), -parts[0][0], next(tie_break), parts))


def rank_balanced_order(seqlens: torch.Tensor, num_ranks: int) -> tuple[list[int], list[list[int]]]:
    """A row order whose ``num_ranks`` equal consecutive slices carry near-equal workloads.

    ``seqlens`` [B] are real tokens per row (``B`` a multiple of ``num_ranks``). Returns the order (slice
    ``r`` is rank ``r``'s rows) and the rows of each rank. Differs from verl: verl also sorts each rank's
    rows short-long-short, against pipeline-parallel bubbles; with no pipeline parallelism here each rank
    keeps its rows in batch order.
    """
    workloads = calculate_workload(seqlens.to(torch.int64)).tolist()
    partitions = karmarkar_karp(workloads, num_ranks, equal_size=True)
    return [row for rows in partitions for row in rows], partitions


def group_balanced_order(seqlens: torch.Tensor, uids: Sequence, num_ranks: int) -> tuple[list[int], list[list[int]]]:
    """As :func:`rank_balanced_order`, but each run of consecutive rows with one ``uid`` (a prompt's samples) stays
    on one rank where the rows per rank allow: a rank computes a prompt once for all its samples only if they
    are its rows (verl's ``get_group_balanced_partitions``, PR #4368).

    verl partitions the groups with Karmarkar-Karp, which needs equal groups that divide evenly among the ranks.
    Here the groups may differ in size (samples skipped without signal, padding rows), so they are placed
    largest workload first on the least loaded rank with room for the whole group; a group no rank has room for
    fills the rank with the most room and its rest goes on as a smaller group. Every rank ends with
    ``B / num_ranks`` rows, in batch order.
    """
    workloads = calculate_workload(seqlens.to(torch.int64)).tolist()
    count = len(workloads)
    if num_ranks < 1 or count % num_ranks or len(uids) != count:
        raise PartitionError(f"cannot split {count} rows into {num_ranks} parts of equal size")
    room, loads = [count // num_ranks] * num_ranks, [0] * num_ranks
    parts: list[list[int]] = [[] for _ in range(num_ranks)]
    for group in sorted(_uid_runs(uids), key=lambda rows: (-sum(workloads[row] for row in rows), rows[0])):
        while group:
            whole = [rank for rank in range(num_ranks) if room[rank] >= len(group)]
            rank = min(whole, key=lambda r: (loads[r], r)) if whole else max(range(num_ranks), key=room.__getitem__)
            placed, group = group[: room[rank]], group[room[rank] :]
            parts[rank] += placed
            room[rank] -= len(placed)
            loads[rank] += sum(workloads[row] for row in placed)
    partitions = [sorted(rows) for rows in parts]
    return [row for rows in partitions for row in rows], partitions


def _uid_runs(uids: Sequence) -> list[list[int]]:
    """The rows of each run of consecutive equal ``uids``."""
    runs: list[list[int]] = []
    for row, uid in enumerate(uids):
        if runs and uids[runs[-1][-1]] == uid:
            runs[-1].append(row)
        else:
            runs.append([row])
    return runs
