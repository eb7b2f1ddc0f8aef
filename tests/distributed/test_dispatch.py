"""Dispatch and collect without Ray: what each rank receives and what the driver gets back."""

import numpy as np
import pytest
import torch

from hybridflow.distributed import Dispatch, Execute
from hybridflow.distributed.decorator import MethodSpec
from hybridflow.distributed.dispatch import dispatch
from hybridflow.protocol import DataProto, MetaInfoConflictError


def spec(mode: Dispatch, execute: Execute = Execute.ALL) -> MethodSpec:
    return MethodSpec(mode, execute, True)


def batch(rows: int) -> DataProto:
    return DataProto.from_dict(
        tensors={"x": torch.arange(rows)}, non_tensors={"uid": np.array([f"u{i}" for i in range(rows)], dtype=object)}
    )


def test_one_to_all_sends_the_same_call_to_every_rank():
    plan = dispatch(spec(Dispatch.ONE_TO_ALL), "m", 3, (1,), {"k": 2})
    assert plan.ranks == [0, 1, 2]
    assert plan.calls == [((1,), {"k": 2})] * 3
    assert plan.collect(["a", "b", "c"]) == ["a", "b", "c"]


def test_execute_rank_zero_sends_one_call_and_unwraps_its_result():
    for mode, execute in [(Dispatch.ONE_TO_ALL, Execute.RANK_ZERO), (Dispatch.RANK_ZERO, Execute.RANK_ZERO)]:
        plan = dispatch(spec(mode, execute), "m", 4, ("x",), {})
        assert (plan.ranks, plan.calls, plan.collect(["only"])) == ([0], [(("x",), {})], "only")


def test_all_to_all_transposes_lists_and_names_the_bad_argument():
    plan = dispatch(spec(Dispatch.ALL_TO_ALL), "m", 2, ([1, 2],), {"k": ("a", "b")})
    assert plan.calls == [((1,), {"k": "a"}), ((2,), {"k": "b"})]
    with pytest.raises(ValueError, match=r"method 'm' is registered ALL_TO_ALL, so k must be a list .* got int"):
        dispatch(spec(Dispatch.ALL_TO_ALL), "m", 2, ([1, 2],), {"k": 5})


def test_dp_compute_proto_pads_chunks_broadcasts_and_unpads():
    plan = dispatch(spec(Dispatch.DP_COMPUTE_PROTO), "m", 3, (batch(7),), {"scale": 2})
    sizes = [len(args[0]) for args, _ in plan.calls]
    assert sizes == [3, 3, 3]
    assert [kwargs for _, kwargs in plan.calls] == [{"scale": 2}] * 3
    # padding rows repeat the first rows, at the end
    assert plan.calls[2][0][0].batch["x"].tolist() == [6, 0, 1]
    merged = plan.collect([args[0] for args, _ in plan.calls])
    assert merged.batch["x"].tolist() == list(range(7))
    assert list(merged.non_tensor_batch["uid"]) == [f"u{i}" for i in range(7)]


def test_dp_compute_proto_lists_every_rank_metrics_and_refuses_disagreeing_meta_info():
    plan = dispatch(spec(Dispatch.DP_COMPUTE_PROTO), "m", 2, (batch(3),), {})
    results = [
        DataProto(meta_info={"metrics": {"timing_s/update_weights": t}, "temperature": 0.7}) for t in (0.5, 0.25)
    ]
    assert plan.collect(results).meta_info == {"temperature": 0.7, "metrics": {"timing_s/update_weights": [0.5, 0.25]}}
    # A rank that reports no metrics (all-reduced values come from rank 0 only) adds no entry.
    only_rank_zero = [DataProto(meta_info={"metrics": {"pg_loss": [1.0, 2.0]}}), DataProto()]
    assert plan.collect(only_rank_zero).meta_info == {"metrics": {"pg_loss": [[1.0, 2.0]]}}
    with pytest.raises(MetaInfoConflictError, match="meta_info key 'seconds' is 0.5 in part 0 but 0.25 in part 1"):
        plan.collect([DataProto(meta_info={"seconds": 0.5}), DataProto(meta_info={"seconds": 0.25})])


def test_dp_compute_proto_keeps_non_proto_results_as_a_list():
    plan = dispatch(spec(Dispatch.DP_COMPUTE_PROTO), "m", 2, (batch(3),), {})
    assert plan.collect([{"loss": 1.0}, {"loss": 2.0}]) == [{"loss": 1.0}, {"loss": 2.0}]
