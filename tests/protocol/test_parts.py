"""``Part`` and ``join_parts``: a DataProto rebuilt from parts yielded in any order."""

import numpy as np
import pytest
import torch

from hybridflow.protocol import DataProto, DataProtoError, LengthMismatchError, Part, join_parts


def whole(rows: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(rows, dtype=torch.float32)[:, None].repeat(1, 2)},
        non_tensors={"uid": np.array([f"u{i}" for i in range(rows)], dtype=object)},
    )


def test_parts_in_any_order_join_into_the_whole_with_every_parts_meta_info():
    data = whole(5)
    first, second = np.array([4, 1]), np.array([0, 3, 2])
    parts = [Part(data[first], first, 5), Part(data[second], second, 5)]
    parts[0].data.meta_info = {"metrics": {"timing_s/update_weights": 0.5}}
    parts[1].data.meta_info = {"eos_token_id": 2}
    joined = join_parts(parts)
    assert torch.equal(joined.batch["x"], data.batch["x"])
    assert list(joined.non_tensor_batch["uid"]) == list(data.non_tensor_batch["uid"])
    assert joined.meta_info == {"metrics": {"timing_s/update_weights": 0.5}, "eos_token_id": 2}


def test_a_part_is_placed_further_into_a_larger_whole():
    part = Part(whole(2), [1, 0], 2).shifted(4, 8)
    assert part.rows.tolist() == [5, 4] and part.total == 8


def test_a_missing_or_repeated_row_is_refused():
    data = whole(3)
    with pytest.raises(DataProtoError, match=r"whole of 3 rows hold 2 row positions \(missing e.g. \[2\]\)"):
        join_parts([Part(data[[0, 1]], [0, 1], 3)])
    with pytest.raises(DataProtoError, match="exactly once"):
        join_parts([Part(data[[0, 1]], [0, 1], 3), Part(data[[1]], [1], 3)])
    with pytest.raises(DataProtoError, match="needs at least one Part"):
        join_parts([])


def test_parts_that_disagree_on_meta_info_or_miscount_their_rows_are_refused():
    data = whole(2)
    left, right = Part(data[[0]], [0], 2), Part(data[[1]], [1], 2)
    left.data.meta_info, right.data.meta_info = {"temperature": 1.0}, {"temperature": 0.5}
    with pytest.raises(DataProtoError, match=r"meta_info\['temperature'\]: 1.0 and 0.5"):
        join_parts([left, right])
    with pytest.raises(LengthMismatchError, match="a Part of 2 rows was given 1 row positions"):
        Part(data, [0], 2)
