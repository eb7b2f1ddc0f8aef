"""Property tests: chunk/concat, split/concat, pad/unpad, repeat/select, reorder and pickle round-trips."""

import pickle

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridflow.protocol import DataProto

from .dp_asserts import assert_same_data

TENSOR_DTYPES = [torch.float32, torch.bfloat16, torch.int64, torch.bool]
PROPERTY_SETTINGS = settings(max_examples=50, deadline=None)


@st.composite
def data_protos(draw, min_rows: int = 0, max_rows: int = 12) -> DataProto:
    """Random DataProtos: 0-3 tensors of random trailing shapes and dtypes, 0-2 object or int columns."""
    rows = draw(st.integers(min_rows, max_rows))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    tensors = {}
    for number in range(draw(st.integers(0, 3))):
        trailing = draw(st.lists(st.integers(1, 4), max_size=2))
        dtype = draw(st.sampled_from(TENSOR_DTYPES))
        values = torch.randn(rows, *trailing, generator=generator) * 5
        tensors[f"t{number}"] = values > 0 if dtype == torch.bool else values.to(dtype)
    non_tensors = {}
    if draw(st.booleans()) or not tensors:
        non_tensors["uid"] = [f"row{i}" if i % 2 else {"row": i} for i in range(rows)]
    if draw(st.booleans()):
        non_tensors["index"] = np.arange(rows) * 3
    meta_info = draw(st.dictionaries(st.sampled_from(["eos_token_id", "temperature"]), st.integers(0, 9)))
    return DataProto.from_dict(tensors, non_tensors, meta_info)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@PROPERTY_SETTINGS
@given(dp=data_protos(min_rows=1), data=st.data())
def test_chunk_then_concat_is_identity(dp, data):
    parts = dp.chunk(data.draw(st.sampled_from(divisors(len(dp)))))
    assert len({len(part) for part in parts}) == 1
    assert_same_data(DataProto.concat(parts), dp)


@PROPERTY_SETTINGS
@given(dp=data_protos(min_rows=1), split_size=st.integers(1, 14))
def test_split_then_concat_is_identity(dp, split_size):
    parts = dp.split(split_size)
    assert all(len(part) == split_size for part in parts[:-1]) and 1 <= len(parts[-1]) <= split_size
    assert_same_data(DataProto.concat(parts), dp)


@PROPERTY_SETTINGS
@given(dp=data_protos(), divisor=st.integers(1, 9))
def test_pad_then_unpad_is_identity(dp, divisor):
    padded, pad_size = dp.pad_to_divisor(divisor)
    assert len(padded) % divisor == 0 and 0 <= pad_size < divisor and len(padded) == len(dp) + pad_size
    if pad_size:
        cyclic_rows = np.arange(pad_size) % len(dp)
        assert_same_data(padded[len(dp) :], dp[cyclic_rows])
    assert_same_data(padded.unpad(pad_size), dp)


@PROPERTY_SETTINGS
@given(dp=data_protos(), times=st.integers(1, 4), interleave=st.booleans())
def test_repeat_holds_every_row_times_over(dp, times, interleave):
    repeated = dp.repeat(times, interleave=interleave)
    assert len(repeated) == len(dp) * times
    for copy in range(times):
        rows = slice(copy, None, times) if interleave else slice(copy * len(dp), (copy + 1) * len(dp))
        assert_same_data(repeated[rows], dp)


@PROPERTY_SETTINGS
@given(dp=data_protos(), times=st.integers(1, 3), interleave=st.booleans(), data=st.data())
def test_select_commutes_with_repeat(dp, times, interleave, data):
    batch_keys = [key for key in dp.batch.keys() if data.draw(st.booleans())]
    columns = [key for key in dp.non_tensor_batch if data.draw(st.booleans())]
    select = {"batch_keys": batch_keys, "non_tensor_batch_keys": columns}
    assert_same_data(dp.repeat(times, interleave).select(**select), dp.select(**select).repeat(times, interleave))


@PROPERTY_SETTINGS
@given(dp=data_protos(), seed=st.integers(0, 1000))
def test_reorder_then_inverse_is_identity(dp, seed):
    original = dp.select()
    permutation = torch.randperm(len(dp), generator=torch.Generator().manual_seed(seed))
    dp.reorder(permutation).reorder(torch.argsort(permutation))
    assert_same_data(dp, original)


@PROPERTY_SETTINGS
@given(dp=data_protos())
def test_pickle_round_trip(dp):
    assert_same_data(pickle.loads(pickle.dumps(dp, protocol=5)), dp)


@PROPERTY_SETTINGS
@given(dp=data_protos(min_rows=1), data=st.data())
def test_union_of_disjoint_selections_restores_whole(dp, data):
    batch_keys = [key for key in dp.batch.keys() if data.draw(st.booleans())]
    columns = [key for key in dp.non_tensor_batch if data.draw(st.booleans())]
    left = dp.select(batch_keys=batch_keys, non_tensor_batch_keys=columns)
    rest_batch = [key for key in dp.batch.keys() if key not in batch_keys]
    rest_columns = [key for key in dp.non_tensor_batch if key not in columns]
    right = dp.select(batch_keys=rest_batch, non_tensor_batch_keys=rest_columns)
    assert_same_data(left.union(right), dp)
