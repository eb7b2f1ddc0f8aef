"""Exact equality checks for DataProtos in tests: keys, dtypes, shapes and values (NaN equal to NaN)."""

from hybridflow.protocol import DataProto
from hybridflow.protocol.columns import columns_equal, tensors_equal, values_equal


def assert_same_data(actual: DataProto, expected: DataProto, check_meta: bool = True) -> None:
    assert len(actual) == len(expected), f"len {len(actual)} != {len(expected)}"
    assert set(actual.batch.keys()) == set(expected.batch.keys())
    for key in expected.batch.keys():
        got, want = actual.batch[key], expected.batch[key]
        assert got.dtype == want.dtype and got.shape == want.shape, f"{key}: {got.dtype}{got.shape}"
        assert tensors_equal(got, want), f"tensor {key!r} differs"
    assert set(actual.non_tensor_batch) == set(expected.non_tensor_batch)
    for key, want in expected.non_tensor_batch.items():
        got = actual.non_tensor_batch[key]
        assert got.dtype == want.dtype, f"{key}: dtype {got.dtype} != {want.dtype}"
        assert columns_equal(got, want), f"non-tensor column {key!r} differs"
    if check_meta:
        assert values_equal(actual.meta_info, expected.meta_info)
