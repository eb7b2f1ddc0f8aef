"""What a training method hands back to its worker group (the update loop itself is tested via the actor)."""

from hybridflow.protocol import DataProto
from hybridflow.workers.training import metrics_output


def test_rank_zero_alone_reports_the_all_reduced_metrics():
    metrics = {"pg_loss": [0.5, 0.25], "lr": 1e-3}
    outputs = [metrics_output(metrics, rank) for rank in range(3)]
    assert outputs[0].meta_info == {"metrics": metrics}
    assert outputs[1].meta_info == {} and outputs[2].meta_info == {}
    assert DataProto.concat(outputs).meta_info == {"metrics": {"pg_loss": [[0.5, 0.25]], "lr": [1e-3]}}
