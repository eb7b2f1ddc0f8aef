"""One-step-off policy end to end (``actor_rollout_ref.hybrid_engine=false``): the rollout on a pool of its own
process generating a step ahead of the actor's, the weights synced into it after each update, and a kill -9
mid-run whose resumed steps equal an uninterrupted run's."""

import pytest

from hybridflow.tracking import metric_names as names

from .cli import run_cli
from .helpers import tiny_run_overrides
from .test_main_ppo import STEPS, _steps, kill_9_then_resume
from .trained_prompts import COUNTED

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def one_step_off_run(tiny_model_dir, tiny_parquet, tmp_path_factory):
    """An uninterrupted run (training and rollout one process each), checkpointing every step: its folder and
    its overrides. Two mini-batches a step, so the old-log-prob pass runs and the engine's log-probs of each
    sample can be compared with the trainer's."""
    work = tmp_path_factory.mktemp("one_step_off")
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, work / "run", "grpo") + [
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        "trainer.test_freq=2",
        "actor_rollout_ref.hybrid_engine=false",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        # Small buckets, so the sync travels in several.
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
        *COUNTED,
    ]
    run_cli(overrides, cwd=work)
    return work / "run", overrides


def test_each_step_trains_on_samples_of_the_weights_before_its_previous_update(one_step_off_run):
    run_dir, _ = one_step_off_run
    steps = _steps(run_dir)
    assert sorted(steps) == [0, 1, 2, 3]
    assert "val-core/arithmetic/acc/mean@1" in steps[2] and "val-core/arithmetic/acc/mean@1" in steps[3]
    # Step 1 trains on samples of the model folder's weights, which it still holds: the engine's and the
    # trainer's log-probs agree up to float32 rounding of two forward paths (KV cache vs packed). From step 2
    # the samples come from the weights one update older than the trainer's (lr 1e-3 moves them visibly).
    assert steps[1]["training/rollout_probs_diff_max"] < 1e-5
    for step in (2, 3):
        assert steps[step]["training/rollout_probs_diff_max"] > 1e-3, steps[step]
        assert steps[step]["actor/pg_loss"] != 0
    # Steps 1 and 2 end syncing their update's weights into the pool (loaded behind the generation in flight); the
    # pool generates nothing after the last step, so step 3 syncs nothing (a validation would sync first).
    assert steps[1][names.timing("sync_rollout_weights")] > 0
    assert steps[2][names.timing("sync_rollout_weights")] > 0
    assert names.timing("sync_rollout_weights") not in steps[3]
    for step in (1, 2, 3):
        assert names.timing("gen") in steps[step] and names.timing("update_actor") in steps[step]


def test_kill_9_then_resume_matches_an_uninterrupted_run(one_step_off_run, tmp_path):
    """The checkpoint holds the next step's samples (generated before the save): the resumed run trains on them."""
    kill_9_then_resume(*one_step_off_run, tmp_path)
