"""verl's V1 ``separate_async`` end to end (``trainer.v1.trainer_mode=separate_async``): the rollout on a pool of its
own process, each step two mini-batches trained as they arrive against the step's starting weights (verl's
decoupled PPO), one weight sync a step landing in the generation in flight, and a kill -9 that the same command
resumes."""

import pytest

from hybridflow.tracking import metric_names as names

from .cli import kill_9_at_first_checkpoint, run_cli
from .helpers import tiny_run_overrides
from .test_main_ppo import _steps
from .trained_prompts import COUNTED, DUMPS, assert_each_prompt_trained_once_per_epoch

pytestmark = pytest.mark.slow

STEPS = 4


def test_separate_async_trains_mini_batches_against_the_steps_weights_and_resumes_after_kill_9(
    tiny_model_dir, tiny_parquet, tmp_path
):
    """Steps of 4 prompts in 2 mini-batches of 2 (train_batch_size = parameter_sync_step x ppo_mini_batch_size),
    the pool at most one batch ahead; killed with -9 at its first checkpoint, then the same command finishes the
    run, every prompt of an epoch trained once."""
    run_dir = tmp_path / "run"
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir, "grpo") + [
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.parameter_sync_step=2",
        "trainer.v1.separate_async.num_warmup_batches=1",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        # 4 samples a prompt: step 1's first mini-batch has groups whose scores differ, so its update moves the
        # weights before the second mini-batch's old log-probs (with 2 its groups happen to tie)
        "actor_rollout_ref.rollout.n=4",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        *COUNTED,
    ]
    killed_at = kill_9_at_first_checkpoint(overrides, run_dir, cwd=tmp_path)
    assert killed_at < STEPS, "the run finished before it could be killed"
    run_cli(overrides, cwd=tmp_path)
    steps = _steps(run_dir)
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert (run_dir / "latest").read_text().strip() == f"global_step_{STEPS}"
    assert_each_prompt_trained_once_per_epoch(tmp_path / DUMPS, overrides, STEPS)
    # Step 1's two mini-batches were both sampled by the model folder's weights, and the second one's old
    # log-probs are taken under them again (swapped in from the CPU copy), not under the first mini-batch's
    # update: the engine's and the trainer's probabilities agree up to float32 rounding of two forward paths
    # (KV cache vs packed). Under the updated weights (lr 1e-3) they differed by 8e-3 (measured with the swap off).
    assert steps[1]["training/rollout_probs_diff_max"] < 1e-5, steps[1]
    for step in range(1, STEPS + 1):
        record = steps[step]
        assert record[names.GLOBAL_STEP] == step
        assert record[names.stat(names.OFF_POLICY_SPANS, "max")] <= 8  # trainer.v1.sampler's default threshold
        assert names.timing("gen") in record  # the trainer's wait for the pool (verl's trainer idle time)
    # A sync after every step but the last, under verl's V1 name
    assert [s for s in steps if names.timing("update_weights") in steps[s]] == list(range(1, STEPS))
    # Samples of step 2 on were generated before that step's weights: at least one version stale
    assert steps[STEPS][names.stat(names.OFF_POLICY_STALENESS_WORST, "max")] >= 1


def test_step_switching_lends_the_actors_processes_the_groups_a_step_lacks_and_resumes_after_kill_9(
    tiny_model_dir, tiny_parquet, tmp_path
):
    """Step switching with no warm-up and a threshold of the whole batch: step 1 trains on the pool's only call
    (the version's budget is one batch) and leaves nothing ready, so step 2 starts with the actor's processes
    generating its 4 groups with the actor's weights (version 1) and trains on them. Killed with -9 at step 1's
    checkpoint, the same command resumes with the decision to lend and finishes; every prompt of an epoch is
    trained once."""
    run_dir = tmp_path / "run"
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir, "grpo") + [
        "trainer.v1.trainer_mode=separate_async",
        "trainer.v1.separate_async.parameter_sync_step=2",
        "trainer.v1.separate_async.num_warmup_batches=0",
        "trainer.v1.separate_async.hybrid_rollout.enable_switch=true",
        "trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio=1.0",
        "trainer.v1.separate_async.hybrid_rollout.adaptive_switch_threshold=false",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        *COUNTED,
    ]
    assert kill_9_at_first_checkpoint(overrides, run_dir, cwd=tmp_path) < 3, "the run finished before it was killed"
    run_cli(overrides, cwd=tmp_path)
    steps = _steps(run_dir)
    assert sorted(steps) == [1, 2, 3]
    assert_each_prompt_trained_once_per_epoch(tmp_path / DUMPS, overrides, 3)
    assert steps[1][names.SWITCH_SHOULD_SWITCH] == 1 and steps[1][names.SWITCH_REMAINING] == 4
    for phase in ("switch_to_rollout", "switch_wait", "switch_to_trainer"):
        assert names.timing(phase) in steps[2], phase
    # drawn by the actor's weights after step 1, the trainer's version at step 2
    assert steps[2][names.stat(names.OFF_POLICY_STALENESS_WORST, "max")] == 0
    assert names.timing("switch_wait") not in steps[1]
