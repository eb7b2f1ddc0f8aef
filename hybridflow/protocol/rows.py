"""Row arithmetic of DataProto operations: index normalisation, repeat orders, and concatenation: the parts'
tensors and numpy columns joined row-wise, their ``meta_info`` merged (verl's ``DataProto.concat``, verl PR
#3699). Each part may carry its own ``metrics`` (a worker rank's, say): they are gathered, never dropped, into
one dict of per-part lists. Every other meta_info key describes the whole batch, so the parts that hold it must
agree.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from hybridflow.protocol.columns import values_equal
from hybridflow.protocol.errors import (
    KeySetMismatchError,
    LengthMismatchError,
    MetaInfoConflictError,
    NestedLayoutError,
    ShapeMismatchError,
)

METRICS_KEY = "metrics"


def rows_index(index: Any, rows: int) -> tuple[torch.Tensor, np.ndarray]:
    """Normalise an index tensor, numpy array or list (of ints or bools) to row positions.

    Returns the same int64 positions as a torch tensor (for the TensorDict) and a numpy array (for the
    numpy columns). Raises IndexError naming the first out-of-range position, LengthMismatchError for a
    boolean mask of the wrong length.
    """
    if isinstance(index, torch.Tensor):
        index = index.detach().cpu().numpy()
    positions = np.asarray(index)
    if positions.ndim != 1:
        raise IndexError(f"a DataProto row index must be 1-D, got shape {positions.shape}")
    if positions.dtype == bool:
        if len(positions) != rows:
            raise LengthMismatchError(f"boolean mask has {len(positions)} entries but the DataProto has {rows} rows")
        positions = np.flatnonzero(positions)
    elif positions.size == 0:
        positions = positions.astype(np.int64)
    elif positions.dtype.kind not in "iu":
        raise IndexError(f"a DataProto row index must hold ints or bools, got dtype {positions.dtype}")
    out_of_range = (positions >= rows) | (positions < -rows)
    if out_of_range.any():
        raise IndexError(f"row {int(positions[out_of_range][0])} is out of range for a DataProto of {rows} rows")
    positions = np.where(positions < 0, positions + rows, positions).astype(np.int64)
    return torch.from_numpy(positions), positions


def require_row_indexable(batch: TensorDict) -> None:
    """Raise NestedLayoutError for a nested tensor that torch cannot index by row (any layout but jagged)."""
    for key, tensor in batch.items(include_nested=True, leaves_only=True):
        if tensor.is_nested and tensor.layout != torch.jagged:
            raise NestedLayoutError(
                f"cannot select rows of nested tensor {key!r}: torch indexes nested tensors by row only with "
                f"layout=torch.jagged; build it with torch.nested.as_nested_tensor(rows, layout=torch.jagged)"
            )


def shape_text(tensor: torch.Tensor) -> str:
    """The sizes as ``"N, ..."`` for messages; a strided nested tensor has no ``.shape`` (rows differ in any dim)."""
    if tensor.is_nested and tensor.layout == torch.strided:
        return f"{tensor.size(0)}, nested"
    return ", ".join(map(str, tensor.shape))


def repeat_rows(rows: int, repeat_times: int, interleave: bool) -> np.ndarray:
    """Row positions of a repeat: interleaved [0, 0, 1, 1, ...] or tiled [0, 1, ..., 0, 1, ...]."""
    positions = np.arange(rows, dtype=np.int64)
    return np.repeat(positions, repeat_times) if interleave else np.tile(positions, repeat_times)


def concat_parts(
    batches: Sequence[TensorDict], columns_of_parts: Sequence[dict[str, np.ndarray]]
) -> tuple[TensorDict, dict[str, np.ndarray]]:
    """Concatenate the parts' tensors (``batches``) and numpy columns row-wise, checking keys and trailing shapes."""
    _require_same_keys("batch", [set(batch.keys()) for batch in batches])
    _require_same_keys("non_tensor_batch", [set(columns) for columns in columns_of_parts])
    total_rows = sum(batch.batch_size[0] for batch in batches)
    tensors = {}
    for key in batches[0].keys():
        pieces = [batch[key] for batch in batches]
        if any(piece.is_nested for piece in pieces):
            tensors[key] = _concat_nested(key, pieces)
            continue
        _require_same_trailing_shape(key, [piece.shape for piece in pieces])
        tensors[key] = torch.cat(pieces)
    columns = {}
    for key in columns_of_parts[0]:
        pieces = [part_columns[key] for part_columns in columns_of_parts]
        _require_same_trailing_shape(key, [piece.shape for piece in pieces])
        columns[key] = np.concatenate(pieces)
    return TensorDict(tensors, batch_size=[total_rows]), columns


def _concat_nested(key: str, pieces: list[torch.Tensor]) -> torch.Tensor:
    """Row-wise join of nested tensors (torch.cat refuses dim 0 of a nested tensor): rebuilt from the rows."""
    layouts = {piece.layout if piece.is_nested else "dense" for piece in pieces}
    if len(layouts) != 1:
        raise ShapeMismatchError(
            f"cannot concat {key!r}: its parts mix layouts {sorted(map(str, layouts))}; give every part a "
            f"nested tensor of one layout"
        )
    rows = [row for piece in pieces for row in piece.unbind()]
    if not rows:
        return pieces[0]
    try:
        return torch.nested.as_nested_tensor(rows, layout=pieces[0].layout)
    except RuntimeError as error:
        raise ShapeMismatchError(f"cannot concat nested tensor {key!r}: {error}") from None


def _require_same_keys(part_name: str, key_sets: list[set[str]]) -> None:
    expected = key_sets[0]
    for number, keys in enumerate(key_sets[1:], start=1):
        if keys != expected:
            raise KeySetMismatchError(
                f"cannot concat: part {number}'s {part_name} lacks {sorted(expected - keys)} and has extra "
                f"{sorted(keys - expected)} compared with part 0; every part needs the same keys"
            )


def _require_same_trailing_shape(key: str, shapes: list[tuple[int, ...]]) -> None:
    for number, shape in enumerate(shapes[1:], start=1):
        if tuple(shape[1:]) != tuple(shapes[0][1:]):
            raise ShapeMismatchError(
                f"cannot concat {key!r}: part 0 has shape {tuple(shapes[0])} and part {number} has shape "
                f"{tuple(shape)}; only the first (row) dimension may differ"
            )


def merge_meta_info(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One meta_info for the concatenation of parts whose meta_info are ``metas`` (in order).

    ``metrics`` of each part (a dict, a list of dicts, or None) become ``{name: [value of each dict]}``,
    present only when some part reported metrics. Any other key is kept if the parts that hold it agree
    (``values_equal``: NaN equals NaN), else MetaInfoConflictError. Differs from verl: a metric that the
    first metrics dict lacks is kept, where verl's ``list_of_dict_to_dict_of_list`` raises on it.
    """
    merged: dict[str, Any] = {}
    first_holder: dict[str, int] = {}
    metric_dicts: list[Mapping[str, Any]] = []
    for number, meta in enumerate(metas):
        for key, value in meta.items():
            if key == METRICS_KEY:
                metric_dicts += _as_metric_dicts(value, number)
            elif key not in merged:
                merged[key], first_holder[key] = value, number
            elif not values_equal(merged[key], value):
                raise MetaInfoConflictError(
                    f"cannot concat: meta_info key {key!r} is {_short(merged[key])} in part {first_holder[key]} "
                    f"but {_short(value)} in part {number}; per-part values belong in meta_info['metrics']"
                )
    if metric_dicts:
        merged[METRICS_KEY] = _dict_of_lists(metric_dicts)
    return merged


def _as_metric_dicts(value: Any, number: int) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    dicts = value if isinstance(value, list) else [value]
    for item in dicts:
        if not isinstance(item, Mapping):
            raise MetaInfoConflictError(
                f"cannot concat: part {number}'s meta_info['metrics'] holds a {type(item).__name__}; give a "
                f"dict of metrics or a list of such dicts"
            )
    return dicts


def _dict_of_lists(dicts: list[Mapping[str, Any]]) -> dict[str, list]:
    merged: dict[str, list] = {}
    for metrics in dicts:
        for name, value in metrics.items():
            merged.setdefault(name, []).append(value)
    return merged


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
