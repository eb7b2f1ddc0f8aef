"""Per-group statistics of per-sample scores, vectorised with scatter/bincount.

Samples of one prompt share a ``uid`` (the ``index`` array verl passes to the estimators). These helpers
turn the uids into dense group ids once and compute every group's count, mean and standard deviation in
a few tensor ops, whatever the number of groups: no Python loop over groups.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np
import torch

NEAR_INTEGER_TOLERANCE = 1e-6
"""A numeric uid within this distance of an integer is that integer (verl's ``as_torch_index``)."""


def group_ids_from_index(index: Any, device: torch.device | str = "cpu") -> tuple[torch.Tensor, int]:
    """Dense group ids ``[B]`` (int64, 0..G-1) for an array of uids, and the number of groups G.

    ``index`` may be a numpy array (object uids such as strings, or numbers), a list, or a torch tensor.
    Samples with equal uids share a group id. A numeric uid within :data:`NEAR_INTEGER_TOLERANCE` of an
    integer counts as that integer, as in verl's ``verl/utils/groupwise.py::as_torch_index``: uids read
    back from a float column (1.0 and 1.0000000001) or mixed with ints (``np.float64(3.0)`` and ``3``)
    form one group.

    Differs from verl: only the near-integer uids are rounded, each on its own, and any other float keeps
    its exact value. verl rounds only when every uid is near an integer and otherwise casts the floats to
    int, which puts 1.2 and 1.7 in one group; it also parses all-numeric strings, so ``"01"`` and ``"1"``
    group together, where hybridflow compares strings as strings.
    """
    if isinstance(index, torch.Tensor):
        uids = index.reshape(-1)
        if uids.is_floating_point():
            uids = _round_near_integers(uids.double())
        unique, inverse = torch.unique(uids, return_inverse=True)
        return inverse.to(device=device, dtype=torch.long), len(unique)
    uids = index.reshape(-1) if isinstance(index, np.ndarray) else np.asarray(index, dtype=object).reshape(-1)
    if uids.dtype.kind == "f":
        uids = _round_near_integers(torch.from_numpy(uids.astype(np.float64))).numpy()
    elif uids.dtype.kind not in "iub":
        canonical = np.empty(len(uids), dtype=object)
        for position, uid in enumerate(uids):
            canonical[position] = _canonical_uid(uid)
        uids = canonical
    try:
        unique, inverse = np.unique(uids, return_inverse=True)
        num_groups = len(unique)
    except TypeError:
        # Uids of mixed, unorderable types: number them by first appearance instead of sorting.
        first_seen: dict[Any, int] = {}
        inverse = np.fromiter((first_seen.setdefault(uid, len(first_seen)) for uid in uids), np.int64, len(uids))
        num_groups = len(first_seen)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device), num_groups


def _round_near_integers(uids: torch.Tensor) -> torch.Tensor:
    nearest = torch.round(uids)
    return torch.where((uids - nearest).abs() <= NEAR_INTEGER_TOLERANCE, nearest, uids)


def _canonical_uid(uid: Any) -> Any:
    """A numeric uid as a Python int when it is within the tolerance of one; anything else unchanged."""
    if isinstance(uid, (numbers.Integral, np.bool_)):
        return int(uid)
    if not isinstance(uid, numbers.Real):
        return uid
    value = float(uid)
    if not math.isfinite(value):
        return value
    nearest = round(value)
    return nearest if abs(value - nearest) <= NEAR_INTEGER_TOLERANCE else value


def group_counts(group_ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Samples per group, ``[G]`` int64."""
    return torch.bincount(group_ids, minlength=num_groups)


def group_sums(values: torch.Tensor, group_ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Sum of ``values [B, ...]`` per group, ``[G, ...]`` (per-token values sum position by position)."""
    sums = torch.zeros((num_groups, *values.shape[1:]), dtype=values.dtype, device=values.device)
    return sums.index_add_(0, group_ids, values)


def group_max(values: torch.Tensor, group_ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Largest of ``values [B]`` per group, ``[G]`` (-inf for an empty group)."""
    start = torch.full((num_groups,), float("-inf"), dtype=values.dtype, device=values.device)
    return start.scatter_reduce(0, group_ids, values, reduce="amax", include_self=True)


def group_mean_std(
    scores: torch.Tensor, group_ids: torch.Tensor, num_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group mean, unbiased standard deviation and count of ``scores [B]``, each ``[G]``.

    A group of one sample has mean 0 and std 1 (verl's convention, so its advantage is its raw score).
    """
    counts = group_counts(group_ids, num_groups)
    counts_f = counts.to(scores.dtype)
    mean = group_sums(scores, group_ids, num_groups) / counts_f.clamp_min(1)
    squared_deviation = (scores - mean[group_ids]) ** 2
    variance = group_sums(squared_deviation, group_ids, num_groups) / (counts_f - 1).clamp_min(1)
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(variance), variance.sqrt())
    return mean, std, counts
