"""verl's V1 ``colocate_async`` end to end (``trainer.v1.trainer_mode=colocate_async``): two actor ranks on Ray
generating by partial rollout between their updates, verl's off-policy metrics, and a kill -9 mid-run whose
resumed steps equal an uninterrupted run's (the groups in flight, as far as they got, are in the checkpoint)."""

import pytest

from hybridflow.tracking import metric_names as names

from .test_main_ppo import grpo_kill_9_then_resume

pytestmark = pytest.mark.slow

COLOCATE_ASYNC = [
    "trainer.v1.trainer_mode=colocate_async",
    "trainer.v1.colocate_async.num_warmup_batches=1",
    "trainer.n_gpus_per_node=2",
    # Three rows decode at a time per rank: a prompt's samples are admitted in different decode steps, so the
    # stop catches some part way.
    "actor_rollout_ref.rollout.max_num_seqs=3",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
]


def test_colocate_async_trains_on_finished_groups_and_resumes_exactly_after_kill_9(
    tiny_model_dir, tiny_parquet, tmp_path
):
    resumed, steps = grpo_kill_9_then_resume(tiny_model_dir, tiny_parquet, tmp_path, COLOCATE_ASYNC)
    spans = [steps[step][names.stat(names.OFF_POLICY_SPANS, "max")] for step in sorted(steps) if step > 0]
    assert spans[0] == 1.0, "step 1's samples are all of the model folder's weights"
    assert max(spans) >= 2.0, "some sample went on after a weight sync"
    for step in (2, 3):
        assert steps[step]["actor/pg_loss"] != 0
        assert steps[step][names.stat(names.OFF_POLICY_STALENESS_WORST, "max")] >= 1.0
