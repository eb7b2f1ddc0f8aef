"""Row arithmetic shared by DataProto operations: index normalisation, repeat orders, row-wise concat."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from hybridflow.protocol.errors import (
    KeySetMismatchError,
    LengthMismatchError,
    NestedLayoutError,
    ShapeMismatchError,
)

if TYPE_CHECKING:
    from hybridflow.protocol.data_proto import DataProto


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
            raise LengthMismatchError(
                f"boolean mask has {len(positions)} entries but the DataProto has {rows} rows"
            )
        positions = np.flatnonzero(positions)
    elif positions.size == 0:
        positions = positions.astype(np.int64)
    elif positions.dtype.kind not in "iu":
        raise IndexError(f"a DataProto row index must hold ints or bools, got dtype {positions.dtype}")
    out_of_range = (positions >= rows) | (positions < -rows)
    if out_of_range.any():
        raise IndexError(
            f"row {int(positions[out_of_range][0])} is out of range for a DataProto of {rows} rows"
        )
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


def concat_parts(parts: Sequence["DataProto"]) -> tuple[TensorDict, dict[str, np.ndarray]]:
    """Concatenate the tensors and numpy columns of ``parts`` row-wise, checking keys and trailing shapes."""
    _require_same_keys(parts, "batch", lambda part: set(part.batch.keys()))
    _require_same_keys(parts, "non_tensor_batch", lambda part: set(part.non_tensor_batch))
    total_rows = sum(len(part) for part in parts)
    tensors = {}
    for key in parts[0].batch.keys():
        pieces = [part.batch[key] for part in parts]
        if any(piece.is_nested for piece in pieces):
            tensors[key] = _concat_nested(key, pieces)
            continue
        _require_same_trailing_shape(key, [piece.shape for piece in pieces])
        tensors[key] = torch.cat(pieces)
    columns = {}
    for key in parts[0].non_tensor_batch:
        pieces = [part.non_tensor_batch[key] for part in parts]
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


def _require_same_keys(parts: Sequence["DataProto"], part_name: str, keys_of: Any) -> None:
    expected = keys_of(parts[0])
    for number, part in enumerate(parts[1:], start=1):
        keys = keys_of(part)
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
