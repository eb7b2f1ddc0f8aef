"""``Part``: some rows of a DataProto that is produced piece by piece (a rollout streamed as samples finish).

A streamed worker method yields parts; whoever consumes them can act on each one at once (score it) and
later rebuild the whole with :func:`join_parts`, which gives the DataProto the method would have returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hybridflow.protocol.data_proto import DataProto
from hybridflow.protocol.errors import DataProtoError, LengthMismatchError


@dataclass(eq=False)
class Part:
    """``data``'s row ``i`` is row ``rows[i]`` of a whole of ``total`` rows; ``data.meta_info`` is the
    whole's (what the producer knew when it yielded this part, e.g. its timing metrics)."""

    data: DataProto
    rows: np.ndarray
    total: int

    def __post_init__(self) -> None:
        self.rows = np.asarray(self.rows, dtype=np.int64)
        if len(self.rows) != len(self.data):
            raise LengthMismatchError(f"a Part of {len(self.data)} rows was given {len(self.rows)} row positions")

    def shifted(self, offset: int, total: int) -> "Part":
        """The same rows placed ``offset`` rows further into a whole of ``total`` rows."""
        return Part(self.data, self.rows + offset, total)


def join_parts(parts: list[Part]) -> DataProto:
    """The whole DataProto: every row of ``0..total-1`` from exactly one part, in order; meta_info is the
    union of the parts' (a key given twice must hold the same value)."""
    if not parts:
        raise DataProtoError("join_parts needs at least one Part, got none")
    total = parts[0].total
    rows = np.concatenate([part.rows for part in parts])
    if len(rows) != total or not np.array_equal(np.sort(rows), np.arange(total)):
        missing = sorted(set(range(total)) - set(rows.tolist()))[:5]
        raise DataProtoError(
            f"parts of a whole of {total} rows hold {len(rows)} row positions (missing e.g. {missing}); a streamed "
            f"method must yield each row exactly once"
        )
    meta_info: dict = {}
    for part in parts:
        for key, value in part.data.meta_info.items():
            if key in meta_info and meta_info[key] is not value and meta_info[key] != value:
                raise DataProtoError(f"parts disagree on meta_info[{key!r}]: {meta_info[key]!r} and {value!r}")
            meta_info[key] = value
    whole = DataProto.concat([DataProto(part.data.batch, part.data.non_tensor_batch) for part in parts])
    whole.reorder(np.argsort(rows, kind="stable"))
    whole.meta_info = meta_info
    return whole
