"""verl's ``fully_async/partial/*`` metrics from the weight version of each response token, by hand."""

import torch

from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names
from hybridflow.trainer.fully_async_collection import partial_metrics


def test_partial_samples_are_those_drawn_by_more_than_one_weight_version():
    versions = torch.tensor([[0, 0, 1, -1], [1, 1, 1, 1], [-1, -1, -1, -1], [0, 2, 2, -1]])  # -1: padding
    metrics = partial_metrics(DataProto.from_dict({"rollout_weight_versions": versions}))
    # spans 1, 0, 0 (no token), 2
    assert metrics == {
        names.FULLY_ASYNC_PARTIAL_SAMPLES: 2.0,
        names.FULLY_ASYNC_PARTIAL_RATIO: 0.5,
        names.FULLY_ASYNC_MAX_PARTIAL_SPAN: 2.0,
    }
    assert partial_metrics(DataProto.from_dict({"responses": versions})) == {}
