"""Pickling a DataProto: tensors travel as numpy arrays and come back as the same torch tensors."""

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from hybridflow.protocol import DataProto
from hybridflow.protocol.serialization import tensordict_from_state, tensordict_to_state
from tests.trainer.cli import HANG_GUARD_S

from .dp_asserts import assert_same_data

EXOTIC_DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.bool, torch.uint8, torch.int32]


def mixed_batch(rows: int = 4) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    return DataProto.from_dict(
        {
            "input_ids": torch.randint(0, 100, (rows, 8), generator=generator),
            "old_log_probs": torch.randn(rows, 5, generator=generator).to(torch.bfloat16),
            "values": torch.randn(rows, 5, generator=generator),
        },
        {"uid": [f"u{i}" for i in range(rows)], "extra_info": [{"index": i} for i in range(rows)]},
        {"eos_token_id": 2, "metrics": {"a": 1.0}},
    )


@pytest.mark.parametrize("protocol", [4, 5])
def test_pickle_round_trip_keeps_dtypes_and_values(protocol):
    dp = mixed_batch()
    restored = pickle.loads(pickle.dumps(dp, protocol=protocol))
    assert_same_data(restored, dp)
    assert all(isinstance(t, torch.Tensor) for t in restored.batch.values())


@pytest.mark.parametrize("dtype", EXOTIC_DTYPES, ids=str)
def test_dtypes_without_numpy_equivalent_survive(dtype):
    tensor = (torch.arange(12, dtype=torch.float32).view(4, 3) / 4).to(dtype)
    restored = pickle.loads(pickle.dumps(DataProto.from_dict({"x": tensor})))
    assert restored.batch["x"].dtype == dtype
    assert torch.equal(restored.batch["x"].view(torch.uint8), tensor.view(torch.uint8))


def test_state_holds_numpy_not_tensors():
    state = mixed_batch().__getstate__()
    kinds = {key: type(array) for key, array, _, _ in state["batch"]["columns"]}
    assert kinds == {"input_ids": np.ndarray, "old_log_probs": np.ndarray, "values": np.ndarray}
    dtypes = {key: torch_dtype for key, _, torch_dtype, _ in state["batch"]["columns"]}
    assert dtypes == {"input_ids": None, "old_log_probs": "bfloat16", "values": None}


def test_slice_ships_only_its_rows():
    big = DataProto.from_dict({"x": torch.zeros(1000, 256)})
    whole, part = pickle.dumps(big, protocol=5), pickle.dumps(big[:10], protocol=5)
    assert len(part) < len(whole) / 50


def test_restored_tensors_are_writable_and_independent():
    dp = DataProto.from_dict({"x": torch.zeros(3, 2)})
    state = dp.__getstate__()
    _, array, _, _ = state["batch"]["columns"][0]
    array.flags.writeable = False  # what Ray's zero-copy get hands back
    restored = DataProto.__new__(DataProto)
    restored.__setstate__(state)
    restored.batch["x"].add_(1)
    assert dp.batch["x"].sum() == 0 and restored.batch["x"].sum() == 6


def test_non_contiguous_grad_and_nested_tensors():
    weights = torch.randn(3, 4, requires_grad=True)
    batch = TensorDict({"t": weights.t(), "nested": {"a": torch.arange(4)}}, batch_size=[4])
    restored = tensordict_from_state(pickle.loads(pickle.dumps(tensordict_to_state(batch))))
    assert torch.equal(restored["t"], weights.detach().t()) and not restored["t"].requires_grad
    assert torch.equal(restored["nested", "a"], torch.arange(4))


def test_ray_ships_data_proto_between_processes(ray_cluster):
    ray = ray_cluster

    @ray.remote(num_cpus=0.5)
    def double_values(dp: DataProto) -> DataProto:
        dp.batch["values"].mul_(2)  # in place: the received tensors must be writable private copies
        dp.non_tensor_batch["uid"] = np.array([u + "!" for u in dp.non_tensor_batch["uid"]], dtype=object)
        return dp

    dp = mixed_batch()
    from_store = ray.get(ray.put(dp), timeout=60)
    assert_same_data(from_store, dp)
    from_store.batch["values"].add_(1)  # must not corrupt the shared object
    assert_same_data(ray.get(ray.put(dp), timeout=60), dp)

    result = ray.get(double_values.remote(dp), timeout=HANG_GUARD_S)
    assert torch.equal(result.batch["values"], dp.batch["values"] * 2)
    assert result.batch["old_log_probs"].dtype == torch.bfloat16
    assert result.non_tensor_batch["uid"].tolist() == ["u0!", "u1!", "u2!", "u3!"]
    assert result.meta_info == dp.meta_info


def jagged(rows: list[torch.Tensor]) -> torch.Tensor:
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def assert_same_nested(restored: torch.Tensor, original: torch.Tensor) -> None:
    assert restored.is_nested and restored.layout == original.layout and restored.dtype == original.dtype
    originals = original.unbind()
    assert len(restored.unbind()) == len(originals)
    assert all(torch.equal(got, want) for got, want in zip(restored.unbind(), originals))


JAGGED_CASES = {
    "float": jagged([torch.arange(6.0).view(2, 3), torch.arange(9.0).view(3, 3), torch.arange(3.0).view(1, 3)]),
    "bfloat16": jagged([torch.full((2, 2), 1.5), torch.full((1, 2), -2.0)]).to(torch.bfloat16),
    "tokens": jagged([torch.arange(4), torch.arange(1)]),
    "ragged last dim": jagged([torch.ones(3, 2), torch.zeros(3, 4)]).transpose(1, 2),
    # A view with holes between its rows (offsets alone do not describe it).
    "narrowed": torch.nested.narrow(
        torch.arange(12.0).view(3, 4), 1, torch.tensor([0, 1, 2]), torch.tensor([1, 2, 2]), layout=torch.jagged
    ),
}


@pytest.mark.parametrize("name", JAGGED_CASES)
def test_jagged_nested_tensors_round_trip(name):
    nested = JAGGED_CASES[name]
    restored = pickle.loads(pickle.dumps(DataProto.from_dict({"x": nested, "row": torch.arange(nested.size(0))})))
    assert_same_nested(restored.batch["x"], nested)
    assert torch.equal(restored.batch["row"], torch.arange(nested.size(0)))


def test_empty_jagged_slice_round_trips():
    dp = DataProto.from_dict({"x": JAGGED_CASES["float"]})[0:0]
    restored = pickle.loads(pickle.dumps(dp))
    assert len(restored) == 0 and restored.batch["x"].is_nested and restored.batch["x"].shape[-1] == 3


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype stage")
def test_strided_nested_tensors_round_trip_row_by_row():
    # verl's case: rows that differ in every dimension, next to a dense tensor and a bfloat16 one.
    nested = torch.nested.as_nested_tensor([torch.randn(2, 3), torch.randn(3, 4), torch.randn(1, 5)])
    batch = TensorDict(
        {"nested": nested, "regular": torch.randn(3, 4, 5), "half": torch.ones(3).bfloat16()}, batch_size=[3]
    )
    restored = pickle.loads(pickle.dumps(DataProto(batch=batch)))
    assert_same_nested(restored.batch["nested"], nested)
    assert torch.equal(restored.batch["regular"], batch["regular"]) and restored.batch["half"].dtype == torch.bfloat16
