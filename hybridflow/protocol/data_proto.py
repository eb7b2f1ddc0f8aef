"""DataProto: the batch that flows between the driver and the worker groups (HybridFlow, arXiv 2409.19256).

Three parts, as in verl: ``batch``, a ``tensordict.TensorDict`` of tensors whose first dimension is the batch
size N; ``non_tensor_batch``, numpy columns of length N (``object`` dtype for strings, dicts and chat
messages); ``meta_info``, a dict that describes the whole batch (``eos_token_id``, ``temperature``,
``metrics``). Every row operation (indexing, chunk, concat, repeat, pad) acts on tensors and numpy columns
alike, so a row's prompt, response and ``uid`` never drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from tensordict import TensorDict

from hybridflow.protocol.columns import columns_equal, tensors_equal, to_column, values_equal
from hybridflow.protocol.errors import (
    DataProtoError,
    LengthMismatchError,
    MissingKeyError,
    NotDivisibleError,
    UnionConflictError,
)
from hybridflow.protocol.rows import (
    concat_parts,
    merge_meta_info,
    repeat_rows,
    require_row_indexable,
    rows_index,
    shape_text,
)
from hybridflow.protocol.serialization import tensordict_from_state, tensordict_to_state

Index = int | slice | torch.Tensor | np.ndarray | Sequence[int] | Sequence[bool]


@dataclass(eq=False)
class DataProtoItem:
    """One row of a DataProto: ``batch`` has batch_size [], non-tensor values are the row's entries."""

    batch: TensorDict
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class DataProto:
    """A batch of N rows: ``batch`` (TensorDict, batch_size [N]), ``non_tensor_batch``, ``meta_info``.

    ``batch`` is always a TensorDict after construction (empty, with batch_size [N], when the rows carry only
    non-tensor columns), so ``len(dp)`` is ``dp.batch.batch_size[0]``. A DataProto holding only meta_info
    (e.g. a worker's metrics) has length 0 and unions with a batch of any length.
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        columns = self.non_tensor_batch or {}
        self.non_tensor_batch = {key: to_column(key, values) for key, values in columns.items()}
        self.meta_info = {} if self.meta_info is None else self.meta_info
        if self.batch is None:
            lengths = [len(values) for values in self.non_tensor_batch.values()]
            self.batch = TensorDict({}, batch_size=[lengths[0] if lengths else 0])
        self.check_consistency()

    def check_consistency(self) -> None:
        """Raise LengthMismatchError unless every tensor and non-tensor column has the same N rows."""
        if not isinstance(self.batch, TensorDict) or self.batch.batch_dims != 1:
            raise DataProtoError(f"DataProto.batch must be a TensorDict with one batch dimension, got {self.batch!r}")
        rows = self.batch.batch_size[0]
        first_tensor = next(iter(self.batch.keys(include_nested=True, leaves_only=True)), None)
        first_column = next(iter(self.non_tensor_batch), None)
        if first_tensor is not None:
            reference = f"tensor {first_tensor!r}"
        elif first_column is not None and len(self.non_tensor_batch[first_column]) == rows:
            reference = f"non-tensor column {first_column!r}"
        else:
            reference = f"the batch (batch_size [{rows}])"
        for key, values in self.non_tensor_batch.items():
            if len(values) != rows:
                raise LengthMismatchError(
                    f"non-tensor column {key!r} has {len(values)} rows but {reference} has {rows}; "
                    f"every column of a DataProto needs one entry per row"
                )

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Any] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> "DataProto":
        """Build from a dict of tensors [N, ...] and a dict of columns (numpy arrays or lists of length N)."""
        tensors = tensors or {}
        non_tensors = {key: to_column(key, values) for key, values in (non_tensors or {}).items()}
        rows, first = None, None
        for key, tensor in tensors.items():
            if not isinstance(tensor, torch.Tensor):
                raise TypeError(
                    f"tensor {key!r} is a {type(tensor).__name__}; pass tensors in `tensors` and numpy "
                    f"arrays or lists in `non_tensors`"
                )
            if tensor.dim() == 0:
                raise DataProtoError(f"tensor {key!r} is 0-d; give a tensor with one row per sample")
            if rows is None:
                rows, first = tensor.size(0), key
            elif tensor.size(0) != rows:
                raise LengthMismatchError(
                    f"tensor {key!r} has {tensor.size(0)} rows (shape ({shape_text(tensor)})) but tensor "
                    f"{first!r} has {rows}; every tensor's first dimension must be the batch size"
                )
        if rows is None:
            rows = len(next(iter(non_tensors.values()))) if non_tensors else 0
        batch = TensorDict(dict(tensors), batch_size=[rows])
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict[str, Any] | None = None) -> "DataProto":
        """Build from one dict: tensors go to ``batch``, numpy arrays and lists to ``non_tensor_batch``."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, (np.ndarray, list, tuple)):
                non_tensors[key] = value
            else:
                raise TypeError(
                    f"{key!r} is a {type(value).__name__}; from_single_dict takes tensors, numpy arrays or "
                    f"lists (put per-batch values in meta_info)"
                )
        return cls.from_dict(tensors, non_tensors, meta_info)

    def __len__(self) -> int:
        return self.batch.batch_size[0]

    def __iter__(self) -> Iterator[DataProtoItem]:
        return (self[row] for row in range(len(self)))

    def __getitem__(self, index: Index) -> "DataProto | DataProtoItem":
        """``dp[int]`` gives a DataProtoItem; a slice, index tensor, list or numpy array gives a DataProto."""
        if isinstance(index, (int, np.integer)) or (isinstance(index, torch.Tensor) and index.dim() == 0):
            row = int(index)
            if not -len(self) <= row < len(self):
                raise IndexError(f"row {row} is out of range for a DataProto of {len(self)} rows")
            return DataProtoItem(
                batch=self.batch[row],
                non_tensor_batch={key: values[row] for key, values in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        if isinstance(index, slice) and (index.step or 1) > 0:
            return self._take(index, index)  # a view, no copy
        if isinstance(index, slice):
            index = np.arange(len(self))[index]  # torch has no negative-step slicing
        tensor_index, numpy_index = rows_index(index, len(self))
        return self._take(tensor_index, numpy_index)

    def _take(self, tensor_index: Any, numpy_index: Any) -> "DataProto":
        require_row_indexable(self.batch)
        return DataProto(
            batch=self.batch[tensor_index],
            non_tensor_batch={key: values[numpy_index] for key, values in self.non_tensor_batch.items()},
            meta_info=dict(self.meta_info),
        )

    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> "DataProto":
        """A DataProto of the named keys only (None keeps every key of that part); tensors are shared."""
        batch_keys = list(self.batch.keys()) if batch_keys is None else list(batch_keys)
        non_tensor_batch_keys = (
            list(self.non_tensor_batch) if non_tensor_batch_keys is None else list(non_tensor_batch_keys)
        )
        meta_info_keys = list(self.meta_info) if meta_info_keys is None else list(meta_info_keys)
        self._require_keys(batch_keys, non_tensor_batch_keys, meta_info_keys)
        return DataProto(
            batch=self.batch.select(*batch_keys),
            non_tensor_batch={key: self.non_tensor_batch[key] for key in non_tensor_batch_keys},
            meta_info={key: self.meta_info[key] for key in meta_info_keys},
        )

    def pop(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> "DataProto":
        """Remove the named keys from self and return them as a DataProto (None pops nothing, as in verl)."""
        batch_keys, non_tensor_batch_keys = list(batch_keys or []), list(non_tensor_batch_keys or [])
        meta_info_keys = list(meta_info_keys or [])
        self._require_keys(batch_keys, non_tensor_batch_keys, meta_info_keys)
        return DataProto(
            batch=TensorDict({key: self.batch.pop(key) for key in batch_keys}, batch_size=[len(self)]),
            non_tensor_batch={key: self.non_tensor_batch.pop(key) for key in non_tensor_batch_keys},
            meta_info={key: self.meta_info.pop(key) for key in meta_info_keys},
        )

    def _require_keys(self, batch_keys: list, non_tensor_batch_keys: list, meta_info_keys: list) -> None:
        parts = (
            ("batch", batch_keys, list(self.batch.keys())),
            ("non_tensor_batch", non_tensor_batch_keys, list(self.non_tensor_batch)),
            ("meta_info", meta_info_keys, list(self.meta_info)),
        )
        for part, wanted, present in parts:
            missing = [key for key in wanted if key not in present]
            if missing:
                raise MissingKeyError(f"{part} has no key(s) {missing}; it holds {sorted(present)}")

    def union(self, other: "DataProto") -> "DataProto":
        """Merge ``other``'s keys into self and return self.

        A key present in both must hold equal values (tensors by ``torch.equal``, numpy columns entry by
        entry, meta_info values by ``==``; NaN equals NaN), else UnionConflictError naming the key, raised
        before anything is merged. Both must have the same number of rows, unless one of them holds no
        columns at all (only meta_info).
        """
        if self._has_columns() and other._has_columns() and len(self) != len(other):
            raise LengthMismatchError(
                f"cannot union DataProtos of {len(self)} and {len(other)} rows; union joins columns of the same rows"
            )
        self._check_union_conflicts(other)
        if not self._has_columns():
            self.batch = TensorDict({}, batch_size=other.batch.batch_size)
        for key, tensor in other.batch.items():
            if key not in self.batch.keys():
                self.batch[key] = tensor
        for key, values in other.non_tensor_batch.items():
            self.non_tensor_batch.setdefault(key, values)
        for key, value in other.meta_info.items():
            self.meta_info.setdefault(key, value)
        return self

    def _check_union_conflicts(self, other: "DataProto") -> None:
        for key in set(self.batch.keys()) & set(other.batch.keys()):
            mine, theirs = self.batch[key], other.batch[key]
            if not tensors_equal(mine, theirs):
                raise UnionConflictError(
                    f"union conflict on tensor {key!r}: {_describe(mine)} vs {_describe(theirs)}, not equal; "
                    f"pop or rename one of them before the union"
                )
        parts = (
            ("non-tensor column", self.non_tensor_batch, other.non_tensor_batch, columns_equal),
            ("meta_info key", self.meta_info, other.meta_info, values_equal),
        )
        for what, mine, theirs, equal in parts:
            for key in mine.keys() & theirs.keys():
                if not equal(mine[key], theirs[key]):
                    raise UnionConflictError(
                        f"union conflict on {what} {key!r}: {_describe(mine[key])} vs "
                        f"{_describe(theirs[key])}; pop or rename one of them before the union"
                    )

    def _has_columns(self) -> bool:
        return bool(self.non_tensor_batch) or not self.batch.is_empty()

    def chunk(self, chunks: int) -> list["DataProto"]:
        """Cut into ``chunks`` equal parts; raises NotDivisibleError unless len is divisible (pad first)."""
        _require_positive_int("chunks", chunks)
        if len(self) % chunks:
            raise NotDivisibleError(
                f"cannot chunk a DataProto of {len(self)} rows into {chunks} equal parts; "
                f"call pad_to_divisor({chunks}) first and unpad the result"
            )
        return self.split(len(self) // chunks) if len(self) else [self[0:0] for _ in range(chunks)]

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive parts of ``split_size`` rows; the last one may be shorter."""
        _require_positive_int("split_size", split_size)
        return [self[start : start + split_size] for start in range(0, len(self), split_size)]

    @staticmethod
    def concat(parts: Sequence["DataProto"]) -> "DataProto":
        """Join parts row-wise (same keys in every part) and merge their meta_info as verl does.

        ``meta_info['metrics']`` of all parts are gathered into ``{name: [one value per metrics dict]}``; any
        other key must hold the same value in every part that has it, else MetaInfoConflictError (see
        :func:`hybridflow.protocol.rows.merge_meta_info`).
        """
        if not parts:
            raise DataProtoError("DataProto.concat needs at least one DataProto, got an empty list")
        batch, non_tensor_batch = concat_parts([p.batch for p in parts], [p.non_tensor_batch for p in parts])
        meta_info = merge_meta_info([part.meta_info for part in parts])
        return DataProto(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=meta_info)

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Repeat every row: interleaved [a, a, b, b] (a prompt's samples adjacent), else [a, b, a, b]."""
        _require_positive_int("repeat_times", repeat_times)
        index = repeat_rows(len(self), repeat_times, interleave)
        return self._take(torch.from_numpy(index), index)

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> "DataProto":
        """Reorder the rows in place (``indices`` has one entry per row) and return self."""
        tensor_index, numpy_index = rows_index(indices, len(self))
        if len(numpy_index) != len(self):
            raise LengthMismatchError(
                f"reorder got {len(numpy_index)} indices for a DataProto of {len(self)} rows; give a "
                f"permutation of all rows (use indexing to take a subset)"
            )
        reordered = self._take(tensor_index, numpy_index)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch
        return self

    def pad_to_divisor(self, divisor: int) -> tuple["DataProto", int]:
        """Append copies of the first rows (real data, cycling if needed) until len divides by ``divisor``.

        Returns (padded DataProto, pad_size); self is returned unchanged when no padding is needed.
        """
        _require_positive_int("divisor", divisor)
        pad_size = -len(self) % divisor
        if pad_size == 0:
            return self, 0
        padding = self[np.arange(pad_size) % len(self)]
        # Rows only: merging meta_info with the padding's copy would turn metrics into lists.
        parts = (self, padding)
        batch, non_tensor_batch = concat_parts([p.batch for p in parts], [p.non_tensor_batch for p in parts])
        return DataProto(batch=batch, non_tensor_batch=non_tensor_batch, meta_info=dict(self.meta_info)), pad_size

    def unpad(self, pad_size: int) -> "DataProto":
        """Drop the last ``pad_size`` rows added by :meth:`pad_to_divisor`.

        A DataProto with no columns (e.g. concatenated metrics-only worker results) is returned as is.
        """
        if not self._has_columns():
            return self
        if not isinstance(pad_size, (int, np.integer)) or not 0 <= pad_size <= len(self):
            raise DataProtoError(f"pad_size={pad_size!r} must be an int between 0 and the {len(self)} rows")
        return self if pad_size == 0 else self[: len(self) - pad_size]

    def to(self, device: str | torch.device) -> "DataProto":
        """Move the tensors to ``device`` in place and return self."""
        self.batch = self.batch.to(device)
        return self

    def make_iterator(self, mini_batch_size: int, epochs: int, seed: int | None = None) -> Iterator["DataProto"]:
        """Yield shuffled mini-batches of ``mini_batch_size`` rows, ``epochs`` passes over the data.

        With ``seed`` the order comes from a seeded torch.Generator (reproducible); without it, from
        torch's global generator.
        """
        _require_positive_int("mini_batch_size", mini_batch_size)
        if len(self) % mini_batch_size:
            raise NotDivisibleError(
                f"{len(self)} rows do not split into mini-batches of {mini_batch_size}; choose a mini-batch "
                f"size that divides the batch size"
            )
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        return self._mini_batches(mini_batch_size, epochs, generator)

    def _mini_batches(
        self, mini_batch_size: int, epochs: int, generator: torch.Generator | None
    ) -> Iterator["DataProto"]:
        for _ in range(epochs):
            order = torch.randperm(len(self), generator=generator)
            for start in range(0, len(self), mini_batch_size):
                yield self[order[start : start + mini_batch_size]]

    def __getstate__(self) -> dict[str, Any]:
        # Tensors travel as numpy arrays, which Ray ships out-of-band with no copy (see serialization.py).
        return {
            "batch": tensordict_to_state(self.batch),
            "non_tensor_batch": self.non_tensor_batch,
            "meta_info": self.meta_info,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.batch = tensordict_from_state(state["batch"])
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def __repr__(self) -> str:
        tensors = ", ".join(
            f"{key}: {str(t.dtype).removeprefix('torch.')}[{shape_text(t)}]" for key, t in self.batch.items()
        )
        columns = ", ".join(f"{key}: {v.dtype}{list(v.shape)}" for key, v in self.non_tensor_batch.items())
        return (
            f"DataProto(len={len(self)}, batch={{{tensors}}}, non_tensor_batch={{{columns}}}, "
            f"meta_info keys={sorted(self.meta_info)})"
        )


def _require_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise DataProtoError(f"{name} must be a positive int, got {value!r}")


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape ({shape_text(value)}) dtype {value.dtype}"
    if isinstance(value, np.ndarray):
        return f"array of shape {value.shape} dtype {value.dtype}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
