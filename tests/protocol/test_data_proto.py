"""Unit tests for every DataProto operation and every error message it raises."""

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hybridflow.protocol import (
    DataProto,
    DataProtoError,
    DataProtoItem,
    KeySetMismatchError,
    LengthMismatchError,
    MetaInfoConflictError,
    MissingKeyError,
    NestedLayoutError,
    NotDivisibleError,
    ShapeMismatchError,
    UnionConflictError,
)

from .dp_asserts import assert_same_data


def make_batch(rows: int = 4) -> DataProto:
    """Rows whose values encode the row number, so reordering and repeats are easy to check."""
    row = torch.arange(rows)
    return DataProto.from_dict(
        tensors={
            "input_ids": row[:, None] * 10 + torch.arange(3),
            "attention_mask": torch.ones(rows, 3, dtype=torch.int64),
            "old_log_probs": -row.float()[:, None].repeat(1, 2),
        },
        non_tensors={
            "uid": [f"u{i}" for i in range(rows)],
            "reward_model": [{"ground_truth": str(i)} for i in range(rows)],
            "index": list(range(rows)),
        },
        meta_info={"eos_token_id": 2},
    )


def row_numbers(dp: DataProto) -> list[int]:
    return dp.non_tensor_batch["index"].tolist()


def test_from_dict_builds_three_parts():
    dp = make_batch(4)
    assert len(dp) == 4
    assert isinstance(dp.batch, TensorDict) and list(dp.batch.batch_size) == [4]
    assert dp.non_tensor_batch["uid"].dtype == object
    assert dp.non_tensor_batch["reward_model"][2] == {"ground_truth": "2"}
    assert dp.non_tensor_batch["index"].dtype == np.int64
    assert dp.meta_info == {"eos_token_id": 2}


def test_lists_of_lists_stay_one_object_per_row():
    messages = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    dp = DataProto.from_dict(non_tensors={"prompt": messages, "pairs": [[1, 2], [3, 4]]})
    assert dp.non_tensor_batch["prompt"].shape == (2,)
    assert dp.non_tensor_batch["pairs"].shape == (2,) and dp.non_tensor_batch["pairs"][1] == [3, 4]


def test_tensors_only_and_non_tensors_only():
    only_tensors = DataProto.from_dict({"values": torch.zeros(5, 2)})
    assert len(only_tensors) == 5 and only_tensors.non_tensor_batch == {}
    only_columns = DataProto.from_dict(non_tensors={"uid": np.array(["a", "b", "c"], dtype=object)})
    assert len(only_columns) == 3 and list(only_columns.batch.keys()) == []
    assert len(DataProto(non_tensor_batch={"uid": ["a", "b"]})) == 2
    assert len(DataProto()) == 0 and len(DataProto(meta_info={"metrics": {}})) == 0
    assert DataProto(batch=None, non_tensor_batch=None, meta_info=None).meta_info == {}


def test_from_dict_tensor_length_error_names_key_and_lengths():
    with pytest.raises(LengthMismatchError) as err:
        DataProto.from_dict({"input_ids": torch.zeros(4, 3), "responses": torch.zeros(3, 2)})
    message = str(err.value)
    assert "'responses' has 3 rows" in message and "(3, 2)" in message and "'input_ids' has 4" in message


def test_non_tensor_length_error_names_key_and_lengths():
    with pytest.raises(LengthMismatchError) as err:
        DataProto.from_dict({"input_ids": torch.zeros(4, 3)}, {"uid": ["a", "b"]})
    assert "'uid' has 2 rows but tensor 'input_ids' has 4" in str(err.value)
    with pytest.raises(LengthMismatchError) as err:
        DataProto(non_tensor_batch={"uid": ["a", "b"], "index": [1, 2, 3]})
    assert "'index' has 3 rows but non-tensor column 'uid' has 2" in str(err.value)


def test_construction_type_errors_name_the_key():
    with pytest.raises(TypeError, match="tensor 'uid' is a list"):
        DataProto.from_dict({"uid": ["a"]})
    with pytest.raises(TypeError, match="non-tensor column 'score' is a float"):
        DataProto.from_dict(non_tensors={"score": 1.0})
    with pytest.raises(TypeError, match="'eos' is a int; .* meta_info"):
        DataProto.from_single_dict({"eos": 2})
    with pytest.raises(DataProtoError, match="tensor 'x' is 0-d"):
        DataProto.from_dict({"x": torch.tensor(1.0)})
    with pytest.raises(DataProtoError, match="one batch dimension"):
        DataProto(batch=TensorDict({"x": torch.zeros(2, 2)}, batch_size=[2, 2]))


def test_from_single_dict_splits_by_type():
    dp = DataProto.from_single_dict(
        {"input_ids": torch.ones(2, 3), "uid": np.array(["a", "b"], dtype=object), "index": [0, 1]},
        meta_info={"temperature": 1.0},
    )
    assert list(dp.batch.keys()) == ["input_ids"]
    assert set(dp.non_tensor_batch) == {"uid", "index"}
    assert dp.meta_info == {"temperature": 1.0}


def test_int_index_gives_item_with_row_values():
    dp = make_batch(4)
    item = dp[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["input_ids"].tolist() == [20, 21, 22]
    assert item.non_tensor_batch == {"uid": "u2", "reward_model": {"ground_truth": "2"}, "index": 2}
    assert item.meta_info == {"eos_token_id": 2}
    assert dp[-1].non_tensor_batch["uid"] == "u3" and dp[torch.tensor(1)].non_tensor_batch["uid"] == "u1"
    assert [it.non_tensor_batch["index"] for it in dp] == [0, 1, 2, 3]


def test_int_index_out_of_range_names_row_and_length():
    with pytest.raises(IndexError, match="row 4 is out of range for a DataProto of 4 rows"):
        make_batch(4)[4]


@pytest.mark.parametrize(
    "index, expected",
    [
        (slice(1, 3), [1, 2]),
        (slice(None, None, 2), [0, 2]),
        (slice(None, None, -1), [3, 2, 1, 0]),
        (torch.tensor([3, 0]), [3, 0]),
        ([2, -1], [2, 3]),
        (np.array([1, 1, 0]), [1, 1, 0]),
        (torch.tensor([True, False, False, True]), [0, 3]),
        ([], []),
    ],
)
def test_row_indexing_keeps_columns_aligned(index, expected):
    part = make_batch(4)[index]
    assert isinstance(part, DataProto) and row_numbers(part) == expected
    assert part.batch["input_ids"][:, 0].tolist() == [10 * i for i in expected]
    assert part.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in expected]
    assert part.meta_info == {"eos_token_id": 2}


def test_index_errors():
    dp = make_batch(4)
    with pytest.raises(IndexError, match="row 7 is out of range for a DataProto of 4 rows"):
        dp[[0, 7]]
    with pytest.raises(LengthMismatchError, match="mask has 3 entries but the DataProto has 4 rows"):
        dp[np.array([True, False, True])]
    with pytest.raises(IndexError, match="must hold ints or bools, got dtype float"):
        dp[np.array([0.5])]


def test_select_keeps_named_keys_and_shares_tensors():
    dp = make_batch(3)
    part = dp.select(batch_keys=["input_ids"], non_tensor_batch_keys=["uid"], meta_info_keys=[])
    assert list(part.batch.keys()) == ["input_ids"] and list(part.non_tensor_batch) == ["uid"]
    assert part.meta_info == {} and len(part) == 3
    assert part.batch["input_ids"].data_ptr() == dp.batch["input_ids"].data_ptr()
    assert_same_data(dp.select(), dp)


def test_select_missing_key_names_it_and_lists_present():
    with pytest.raises(MissingKeyError) as err:
        make_batch(2).select(batch_keys=["input_ids", "values"])
    assert str(err.value) == (
        "batch has no key(s) ['values']; it holds ['attention_mask', 'input_ids', 'old_log_probs']"
    )
    with pytest.raises(KeyError, match="non_tensor_batch has no key"):
        make_batch(2).pop(non_tensor_batch_keys=["data_source"])


def test_pop_removes_from_self_and_returns_popped():
    dp = make_batch(3)
    popped = dp.pop(batch_keys=["old_log_probs"], non_tensor_batch_keys=["uid"], meta_info_keys=["eos_token_id"])
    assert list(popped.batch.keys()) == ["old_log_probs"] and list(popped.non_tensor_batch) == ["uid"]
    assert popped.meta_info == {"eos_token_id": 2} and len(popped) == 3
    assert "old_log_probs" not in dp.batch.keys() and "uid" not in dp.non_tensor_batch and dp.meta_info == {}
    assert len(dp.pop()) == 3 and len(dp.batch.keys()) == 2
    columns_only = make_batch(3)
    columns_only.pop(batch_keys=["input_ids", "attention_mask", "old_log_probs"])
    assert len(columns_only) == 3


def test_union_merges_and_returns_self():
    dp = make_batch(3)
    other = DataProto.from_dict(
        {"values": torch.ones(3, 2), "input_ids": dp.batch["input_ids"].clone()},
        {"data_source": ["gsm8k"] * 3, "uid": dp.non_tensor_batch["uid"].copy()},
        {"eos_token_id": 2, "global_steps": 5},
    )
    assert dp.union(other) is dp
    assert set(dp.batch.keys()) == {"input_ids", "attention_mask", "old_log_probs", "values"}
    assert set(dp.non_tensor_batch) == {"uid", "reward_model", "index", "data_source"}
    assert dp.meta_info == {"eos_token_id": 2, "global_steps": 5}


def test_union_with_metrics_only_and_into_empty():
    dp = make_batch(3).union(DataProto(meta_info={"metrics": {"actor/pg_loss": 0.1}}))
    assert len(dp) == 3 and dp.meta_info["metrics"] == {"actor/pg_loss": 0.1}
    merged = DataProto().union(make_batch(2))
    assert_same_data(merged, make_batch(2))


def test_union_conflicts_name_the_key():
    def conflicting(**kwargs):
        return DataProto.from_dict(**kwargs)

    changed = make_batch(3).batch["input_ids"].clone()
    changed[1, 1] = -1
    with pytest.raises(UnionConflictError) as err:
        make_batch(3).union(conflicting(tensors={"input_ids": changed}))
    assert str(err.value) == (
        "union conflict on tensor 'input_ids': tensor of shape (3, 3) dtype torch.int64 vs tensor of shape "
        "(3, 3) dtype torch.int64, not equal; pop or rename one of them before the union"
    )
    with pytest.raises(UnionConflictError, match="tensor 'input_ids'.*torch.int64 vs .*torch.float32"):
        make_batch(3).union(conflicting(tensors={"input_ids": changed.float()}))
    dp = make_batch(3)
    with pytest.raises(UnionConflictError, match="non-tensor column 'uid': array of shape"):
        dp.union(conflicting(tensors={"values": torch.ones(3)}, non_tensors={"uid": ["u0", "u1", "x"]}))
    assert "values" not in dp.batch.keys()  # nothing is merged when the union is refused
    with pytest.raises(UnionConflictError, match="meta_info key 'eos_token_id': 2 vs 3"):
        make_batch(3).union(DataProto(meta_info={"eos_token_id": 3}))
    with pytest.raises(LengthMismatchError, match="cannot union DataProtos of 3 and 2 rows"):
        make_batch(3).union(make_batch(2))


def test_union_treats_nan_as_equal():
    values = torch.tensor([[float("nan")], [1.0]])
    dp = DataProto.from_dict({"values": values}, meta_info={"x": float("nan")})
    dp.union(DataProto.from_dict({"values": values.clone()}, meta_info={"x": float("nan")}))


def test_chunk_and_split():
    dp = make_batch(6)
    chunks = dp.chunk(3)
    assert [row_numbers(c) for c in chunks] == [[0, 1], [2, 3], [4, 5]]
    assert all(c.meta_info == {"eos_token_id": 2} for c in chunks)
    assert [row_numbers(s) for s in dp.split(4)] == [[0, 1, 2, 3], [4, 5]]
    assert [len(c) for c in DataProto(meta_info={"m": 1}).chunk(2)] == [0, 0]


def test_chunk_not_divisible_names_lengths_and_fix():
    with pytest.raises(NotDivisibleError) as err:
        make_batch(5).chunk(2)
    assert str(err.value) == (
        "cannot chunk a DataProto of 5 rows into 2 equal parts; call pad_to_divisor(2) first and unpad the result"
    )
    with pytest.raises(DataProtoError, match="chunks must be a positive int, got 0"):
        make_batch(4).chunk(0)
    with pytest.raises(DataProtoError, match="split_size must be a positive int, got 1.5"):
        make_batch(4).split(1.5)


def test_concat_joins_rows_and_merges_meta_info():
    a, b = make_batch(3), make_batch(2)
    a.meta_info["metrics"] = {"pg_loss": [0.5, 0.25]}
    b.meta_info.update(metrics={"pg_loss": [0.75, 1.0]}, temperature=0.7)
    joined = DataProto.concat([a, b])
    assert row_numbers(joined) == [0, 1, 2, 0, 1] and joined.batch["input_ids"].shape == (5, 3)
    # One metrics entry per part (per rank, in a worker group's collect), keys agreeing are kept once.
    assert joined.meta_info == {
        "eos_token_id": 2,
        "temperature": 0.7,
        "metrics": {"pg_loss": [[0.5, 0.25], [0.75, 1.0]]},
    }
    assert joined.meta_info is not a.meta_info


def test_concat_refuses_meta_info_that_differs_between_parts():
    a, b = make_batch(3), make_batch(2)
    b.meta_info["eos_token_id"] = 9
    with pytest.raises(MetaInfoConflictError) as err:
        DataProto.concat([a, b])
    assert str(err.value) == (
        "cannot concat: meta_info key 'eos_token_id' is 2 in part 0 but 9 in part 1; per-part values belong in "
        "meta_info['metrics']"
    )


def test_pad_to_divisor_keeps_meta_info_as_it_is():
    dp = make_batch(3)
    dp.meta_info["metrics"] = {"lr": 0.1}
    padded, pad_size = dp.pad_to_divisor(2)
    assert pad_size == 1 and padded.meta_info == {"eos_token_id": 2, "metrics": {"lr": 0.1}}


def test_concat_errors_name_keys_parts_and_shapes():
    with pytest.raises(DataProtoError, match="at least one DataProto"):
        DataProto.concat([])
    missing = make_batch(2)
    missing.pop(batch_keys=["old_log_probs"])
    with pytest.raises(KeySetMismatchError) as err:
        DataProto.concat([make_batch(2), missing])
    assert str(err.value) == (
        "cannot concat: part 1's batch lacks ['old_log_probs'] and has extra [] compared with part 0; "
        "every part needs the same keys"
    )
    extra = make_batch(2)
    extra.non_tensor_batch["data_source"] = np.array(["a", "b"], dtype=object)
    expected = r"part 1's non_tensor_batch lacks \[\] and has extra \['data_source'\]"
    with pytest.raises(KeySetMismatchError, match=expected):
        DataProto.concat([make_batch(2), extra])
    wider = DataProto.from_dict({"responses": torch.zeros(2, 5)})
    with pytest.raises(ShapeMismatchError) as err:
        DataProto.concat([DataProto.from_dict({"responses": torch.zeros(3, 4)}), wider])
    assert "'responses': part 0 has shape (3, 4) and part 1 has shape (2, 5)" in str(err.value)


@pytest.mark.parametrize("interleave, expected", [(True, [0, 0, 1, 1, 2, 2]), (False, [0, 1, 2, 0, 1, 2])])
def test_repeat(interleave, expected):
    repeated = make_batch(3).repeat(2, interleave=interleave)
    assert row_numbers(repeated) == expected
    assert repeated.batch["input_ids"][:, 0].tolist() == [10 * i for i in expected]
    assert repeated.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in expected]
    with pytest.raises(DataProtoError, match="repeat_times must be a positive int, got 0"):
        make_batch(3).repeat(0)


def test_reorder_in_place():
    dp = make_batch(4)
    assert dp.reorder(torch.tensor([3, 1, 0, 2])) is dp
    assert row_numbers(dp) == [3, 1, 0, 2] and dp.batch["input_ids"][:, 0].tolist() == [30, 10, 0, 20]
    with pytest.raises(LengthMismatchError, match="reorder got 2 indices for a DataProto of 4 rows"):
        dp.reorder([0, 1])


def test_pad_to_divisor_repeats_rows_from_the_start():
    padded, pad_size = make_batch(5).pad_to_divisor(4)
    assert pad_size == 3 and row_numbers(padded) == [0, 1, 2, 3, 4, 0, 1, 2]
    assert_same_data(padded.unpad(pad_size), make_batch(5))
    short, pad_size = make_batch(2).pad_to_divisor(7)
    assert pad_size == 5 and row_numbers(short) == [0, 1, 0, 1, 0, 1, 0]
    same = make_batch(4)
    assert same.pad_to_divisor(2) == (same, 0) and same.unpad(0) is same


def test_pad_and_unpad_errors():
    with pytest.raises(DataProtoError, match="divisor must be a positive int, got -2"):
        make_batch(4).pad_to_divisor(-2)
    empty = make_batch(0)
    assert empty.pad_to_divisor(3) == (empty, 0)
    with pytest.raises(DataProtoError, match="pad_size=5 must be an int between 0 and the 4 rows"):
        make_batch(4).unpad(5)
    metrics_only = DataProto(meta_info={"metrics": {}})
    assert metrics_only.unpad(3) is metrics_only


def test_to_moves_tensors_and_returns_self():
    dp = make_batch(2)
    assert dp.to("cpu") is dp and dp.batch.device == torch.device("cpu")
    assert dp.batch["input_ids"].device.type == "cpu"


def test_make_iterator_shuffles_reproducibly():
    dp = make_batch(6)
    first = [row_numbers(mb) for mb in dp.make_iterator(mini_batch_size=2, epochs=2, seed=1)]
    again = [row_numbers(mb) for mb in dp.make_iterator(mini_batch_size=2, epochs=2, seed=1)]
    assert first == again and len(first) == 6 and all(len(rows) == 2 for rows in first)
    assert sorted(sum(first[:3], [])) == list(range(6)) and sorted(sum(first[3:], [])) == list(range(6))
    assert sum(first[:3], []) != sum(first[3:], [])  # each epoch draws a new order
    with pytest.raises(NotDivisibleError, match="6 rows do not split into mini-batches of 4"):
        dp.make_iterator(mini_batch_size=4, epochs=1)


def test_repr_lists_shapes_and_keys():
    text = repr(make_batch(2))
    assert text.startswith("DataProto(len=2, batch={input_ids: int64[2, 3]")
    assert "uid: object[2]" in text and "meta_info keys=['eos_token_id']" in text


def jagged_rows() -> list[torch.Tensor]:
    """Row i holds i + 1 tokens of width 2, valued 10 * i + position, so every row is recognisable."""
    return [(10 * i + torch.arange(2 * (i + 1), dtype=torch.float32)).view(i + 1, 2) for i in range(4)]


def assert_rows(nested: torch.Tensor, expected: list[torch.Tensor]) -> None:
    assert nested.is_nested and nested.size(0) == len(expected)
    assert all(torch.equal(got, want) for got, want in zip(nested.unbind(), expected))


def test_row_operations_on_jagged_nested_tensors():
    rows = jagged_rows()
    dp = DataProto.from_dict(
        {"tokens": torch.nested.as_nested_tensor(rows, layout=torch.jagged)}, {"index": [0, 1, 2, 3]}
    )
    assert_rows(dp[1:3].batch["tokens"], rows[1:3])
    assert_rows(dp[[3, 0]].batch["tokens"], [rows[3], rows[0]])
    assert_rows(dp.chunk(2)[1].batch["tokens"], rows[2:])
    assert_rows(DataProto.concat([dp[2:], dp[:1]]).batch["tokens"], [rows[2], rows[3], rows[0]])
    assert_rows(dp[:2].repeat(2).batch["tokens"], [rows[0], rows[0], rows[1], rows[1]])
    padded, pad_size = dp[:3].pad_to_divisor(2)
    assert pad_size == 1 and padded.batch["tokens"].layout == torch.jagged
    assert_rows(padded.batch["tokens"], [*rows[:3], rows[0]])
    assert_rows(DataProto.concat([dp[:0], dp[:0]]).batch["tokens"], [])
    same = torch.nested.as_nested_tensor([row.clone() for row in rows], layout=torch.jagged)
    assert len(dp.union(DataProto.from_dict({"tokens": same}))) == 4
    changed = torch.nested.as_nested_tensor([*rows[:3], rows[3] + 1], layout=torch.jagged)
    with pytest.raises(UnionConflictError, match="union conflict on tensor 'tokens'"):
        dp.union(DataProto.from_dict({"tokens": changed}))


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_strided_nested_tensors_concat_but_refuse_row_selection():
    # Rows of a strided nested tensor may differ in every dimension, and torch cannot slice them by row.
    rows = [torch.zeros(2, 3), torch.ones(3, 4)]
    dp = DataProto.from_dict({"images": torch.nested.as_nested_tensor(rows), "label": torch.tensor([0, 1])})
    assert repr(dp).startswith("DataProto(len=2, batch={images: float32[2, nested], label: int64[2]}")
    assert_rows(DataProto.concat([dp, dp]).batch["images"], rows + rows)
    assert dp[1].batch["images"].shape == (3, 4)
    with pytest.raises(NestedLayoutError) as err:
        dp.chunk(2)
    assert str(err.value) == (
        "cannot select rows of nested tensor 'images': torch indexes nested tensors by row only with "
        "layout=torch.jagged; build it with torch.nested.as_nested_tensor(rows, layout=torch.jagged)"
    )
    dense = DataProto.from_dict({"images": torch.zeros(2, 2, 3), "label": torch.tensor([0, 1])})
    with pytest.raises(ShapeMismatchError, match="'images': its parts mix layouts"):
        DataProto.concat([dp, dense])


def test_union_of_self_referencing_object_columns_terminates():
    loop = np.empty(1, dtype=object)
    loop[0] = loop
    other_loop = np.empty(1, dtype=object)
    other_loop[0] = other_loop
    dp = DataProto(non_tensor_batch={"tree": loop})
    assert dp.union(DataProto(non_tensor_batch={"tree": other_loop})) is dp
    with pytest.raises(UnionConflictError, match="union conflict on non-tensor column 'tree'"):
        dp.union(DataProto(non_tensor_batch={"tree": np.array([None], dtype=object)}))
