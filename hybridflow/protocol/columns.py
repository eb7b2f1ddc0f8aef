"""The columns of a DataProto: which batch keys each worker call reads (verl's names), the non-tensor
columns (numpy arrays with one entry per row), and value comparison for union.

The driver sends each call only the keys it reads, from the lists here, so it imports no worker module.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable

import numpy as np
import torch

# The prompt tensors a rollout reads, [B, P] each.
PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
# A log-prob pass (actor or reference) over prompt + response, [B, L] each, and the responses [B, R].
LOG_PROB_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")
ACTOR_UPDATE_INPUTS = LOG_PROB_INPUTS + ("response_mask", "advantages")
# Read by the actor's update when present: the loss's old log-probs, its KL term's reference, rollout
# correction's weights, on-policy distillation's teacher scores.
ACTOR_UPDATE_OPTIONAL_INPUTS = (
    "old_log_probs",
    "ref_log_prob",
    "rollout_is_weights",
    "teacher_logprobs",
    "teacher_ids",
)
VALUE_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")
CRITIC_UPDATE_INPUTS = VALUE_INPUTS + ("response_mask", "values", "returns")


def actor_update_columns(present: Iterable[str], old_log_probs_from_update: bool) -> list[str]:
    """The batch keys an actor update reads, of the keys ``present`` (an on-policy update has no old log-probs)."""
    present = set(present)
    optional = [key for key in ACTOR_UPDATE_OPTIONAL_INPUTS if key in present]
    if old_log_probs_from_update:
        optional = [key for key in optional if key != "old_log_probs"]
    return list(ACTOR_UPDATE_INPUTS) + optional


def to_column(key: str, values: Any) -> np.ndarray:
    """Return ``values`` as a numpy column of one entry per row.

    numpy arrays are kept as they are. A list or tuple of plain numbers becomes a typed array; any other
    list (strings, dicts, chat messages, nested lists) becomes a 1-D ``object`` array, one element per row,
    so ragged or nested rows are never broadcast into extra dimensions.
    """
    if isinstance(values, np.ndarray):
        if values.ndim == 0:
            raise TypeError(f"non-tensor column {key!r} is a 0-d array; give one value per row")
        return values
    if not isinstance(values, (list, tuple)):
        raise TypeError(
            f"non-tensor column {key!r} is a {type(values).__name__}; give a numpy array or a list with "
            f"one value per row (tensors belong in the tensor batch)"
        )
    if values and all(_is_real_number(v) for v in values):
        return np.asarray(values)
    column = np.empty(len(values), dtype=object)
    for row, value in enumerate(values):
        column[row] = value
    return column


def _is_real_number(value: Any) -> bool:
    return isinstance(value, numbers.Real)


def values_equal(a: Any, b: Any) -> bool:
    """Equality for meta_info values and object-array elements: tensors, arrays, NaN-aware floats.

    Containers that hold themselves (an object array whose element is the array) compare equal when the
    cycle repeats the same structure, instead of recursing forever (as verl's ``_deep_equal``).
    """
    return _equal(a, b, set())


def columns_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Elementwise equality of two numpy columns (object columns compared entry by entry)."""
    return _equal(a, b, set())


def tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and values (NaN equal to NaN); nested tensors compare row by row."""
    if a.is_nested or b.is_nested:
        return (
            a.is_nested
            and b.is_nested
            and a.layout == b.layout
            and a.dtype == b.dtype
            and a.size(0) == b.size(0)
            and all(map(tensors_equal, a.unbind(), b.unbind()))
        )
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
    return torch.equal(a, b)


_CONTAINERS = (np.ndarray, dict, list, tuple)


def _equal(a: Any, b: Any, on_path: set[tuple[int, int]]) -> bool:
    """``on_path`` holds the (id, id) pairs of containers being compared further up the recursion."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and tensors_equal(a, b)
    if isinstance(a, np.ndarray) != isinstance(b, np.ndarray):
        return False
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True  # NaN on both sides counts as the same value
    if not (isinstance(a, _CONTAINERS) and isinstance(b, _CONTAINERS)):
        try:
            return bool(a == b)
        except (TypeError, ValueError):
            return False
    pair = (id(a), id(b))
    if pair in on_path:
        return True  # a cycle: this pair's comparison is already under way
    on_path.add(pair)
    try:
        return _containers_equal(a, b, on_path)
    finally:
        on_path.discard(pair)


def _containers_equal(a: Any, b: Any, on_path: set[tuple[int, int]]) -> bool:
    if isinstance(a, np.ndarray):
        if a.shape != b.shape:
            return False
        if a.dtype == object or b.dtype == object:
            return all(_equal(x, y, on_path) for x, y in zip(a.ravel(), b.ravel()))
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[key], b[key], on_path) for key in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y, on_path) for x, y in zip(a, b))
    return False
