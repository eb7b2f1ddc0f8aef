"""Fully async training end to end (``async_training.enable=true``): the rollout on a pool of its own process
filling a bounded queue while the actor trains, the weights synced every ``trigger_parameter_sync_step`` steps,
and a kill -9 mid-run whose resumed steps equal an uninterrupted run's."""

import os

import pytest

from hybridflow.tracking import metric_names as names

from .cli import kill_9_at_first_checkpoint, run_cli
from .helpers import tiny_run_overrides
from .test_main_ppo import _steps, kill_9_then_resume
from .trained_prompts import COUNTED, DUMPS, assert_each_prompt_trained_once_per_epoch, prompts_by_step

pytestmark = pytest.mark.slow

STEPS = 4


@pytest.fixture(scope="module")
def fully_async_run(tiny_model_dir, tiny_parquet, tmp_path_factory):
    """An uninterrupted run: 8 prompts in steps of 2 (two mini-batches of 1, so the old-log-prob pass runs and the
    engine's log-probs can be compared with the trainer's), a sync every 2 steps, at most int(2 x 1.5 x 2) = 6
    prompts started per weight version, 3 per generation call; saved on every sync, validated every second."""
    work = tmp_path_factory.mktemp("fully_async")
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, work / "run", "grpo") + [
        "actor_rollout_ref.hybrid_engine=false",
        "async_training.enable=true",
        "async_training.partial_rollout=false",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "data.train_batch_size=0",
        "data.gen_batch_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "async_training.require_batches=2",
        "async_training.trigger_parameter_sync_step=2",
        "async_training.staleness_threshold=0.5",
        "async_training.concurrent_samples_per_replica=3",
        "rollout.total_rollout_steps=8",
        "trainer.save_freq=1",
        "trainer.test_freq=2",
        *COUNTED,  # the run's 8 prompts are one epoch
    ]
    run_cli(overrides, cwd=work)
    return work / "run", overrides


def test_steps_train_from_the_queue_with_bounded_staleness(fully_async_run):
    run_dir, _ = fully_async_run
    steps = _steps(run_dir)
    assert sorted(steps) == [0, 1, 2, 3, 4]
    assert sorted(path.name for path in run_dir.glob("global_step_*")) == ["global_step_2", "global_step_4"]
    assert [step for step in steps if "val-core/arithmetic/acc/mean@1" in steps[step]] == [0, 4]
    # Calls of 3, 3 and 2 prompts: the first version's budget of 6 is spent by step 1, the second version's
    # budget counts the 2 prompts still queued at its sync; step 3 trains on those (from the first weights).
    assert [steps[s][names.FULLY_ASYNC_GENERATED_SAMPLES] for s in range(1, 5)] == [6, 6, 8, 8]
    assert [steps[s][names.FULLY_ASYNC_PARAM_VERSION] for s in range(1, 5)] == [0, 0, 1, 1]
    assert [steps[s][names.FULLY_ASYNC_STALE_SAMPLES] for s in range(1, 5)] == [0, 0, 2, 2]
    assert [steps[s][names.FULLY_ASYNC_STALE_TRAJECTORIES] for s in range(1, 5)] == [0, 0, 4, 4]
    # Step 1 trains on samples of the model folder's weights, which it still holds: the engine's and the trainer's
    # log-probs agree up to float32 rounding of two forward paths (KV cache vs packed). Step 3's samples are two
    # updates older than the trainer's weights (lr 1e-3 moves them visibly).
    assert steps[1]["training/rollout_probs_diff_max"] < 1e-5
    assert steps[3]["training/rollout_probs_diff_max"] > 1e-3
    assert [step for step in steps if names.timing("sync_rollout_weights") in steps[step]] == [2]  # ends version 1
    for step in (1, 2, 3, 4):
        assert 0 <= steps[step][names.FULLY_ASYNC_TRAINER_IDLE_RATIO] <= 1
        assert steps[step]["actor/pg_loss"] != 0


def test_kill_9_then_resume_matches_an_uninterrupted_run(fully_async_run, tmp_path):
    """The checkpoint after step 2 holds the 2 queued prompts' samples: the resumed run trains on them at step 3."""
    kill_9_then_resume(*fully_async_run, tmp_path, steps=STEPS)


def _partial_rollout_overrides(tiny_model_dir, tiny_parquet, run_dir):
    """8 prompts in steps of 2, a sync every step, calls of 2 prompts: each call runs while its step trains and is
    in flight at the next step's sync."""
    return tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir, "grpo") + [
        "actor_rollout_ref.hybrid_engine=false",
        "async_training.enable=true",
        "async_training.partial_rollout=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.bypass_mode=true",
        "data.gen_batch_size=1",
        "async_training.require_batches=1",
        "async_training.trigger_parameter_sync_step=1",
        "async_training.staleness_threshold=1.0",
        "async_training.concurrent_samples_per_replica=2",
        "rollout.total_rollout_steps=8",
        "trainer.val_before_train=false",
        *COUNTED,  # the run's 8 prompts are one epoch
    ]


# Imported by every Ray worker of the run: from the rollout engine's second call on, the sequences wait after their
# 2nd token until new weights land, and a weight load waits until the call's sequences hold a token, each once and
# for 120 s at most (a run whose syncs wait for the call ends, and fails; a training step on a slow machine takes
# tens of seconds). Without the second wait a starved decode thread could let the sync land before the call's
# first token, and no sample would span two versions.
HOLD_FOR_A_SYNC = """
import time
from contextlib import contextmanager
from hybridflow.rollout.scheduler import DecodeScheduler

calls = []
submit_all, admit, paused = DecodeScheduler.submit_all, DecodeScheduler._admit, DecodeScheduler.paused


def counted_submit_all(self, requests):
    calls.append(len(requests))
    return submit_all(self, requests)


def held_admit(self):
    running = [seq for seq in self.decoder.sequences if not getattr(seq, "held", False)]
    if len(calls) > 1 and running and all(len(seq.weight_versions) >= 2 for seq in running):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.decoder.weights_version == running[0].weight_versions[0]:
            self._condition.wait(0.01)
        for seq in running:
            seq.held = True
    return admit(self)


@contextmanager
def paused_after_first_tokens(self):
    deadline = time.monotonic() + 120
    while len(calls) > 1 and time.monotonic() < deadline and (
        self._waiting or any(not seq.weight_versions for seq in self.decoder.sequences)
    ):
        time.sleep(0.01)
    with paused(self):
        yield


DecodeScheduler.submit_all, DecodeScheduler._admit = counted_submit_all, held_admit
DecodeScheduler.paused = paused_after_first_tokens
"""


HOOK_LOADER = """
import os
import sys
import traceback

if any(arg.endswith("default_worker.py") for arg in sys.argv):
    try:
        import held_calls  # noqa: F401
    except BaseException:
        traceback.print_exc()
        os._exit(1)
"""


def run_held_partial_rollout(hook_code: str, model_dir, parquet, tmp_path, extra=()) -> dict:
    """The partial-rollout run with ``hook_code`` imported by every Ray worker (it holds each call after the first
    until a sync lands); its steps, checked: none of step 1's samples spans a sync, some of every later step's do
    (samples of more than 2 tokens, which the untrained model rarely stops sooner), each across one sync only."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "held_calls.py").write_text(hook_code)
    # Ray's workers only: importing the engines costs each of Ray's own processes seconds, and on a slow machine
    # its node then times out starting. Python goes on past a sitecustomize that fails: a hook that does not load
    # ends the worker instead, and so the run.
    (hook / "sitecustomize.py").write_text(HOOK_LOADER)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))}
    overrides = _partial_rollout_overrides(model_dir, parquet, tmp_path / "run") + list(extra)
    run_cli(overrides, cwd=tmp_path, env=env)
    steps = _steps(tmp_path / "run")
    assert sorted(steps) == [1, 2, 3, 4]
    assert steps[1][names.FULLY_ASYNC_PARTIAL_SAMPLES] == 0
    for step in (2, 3, 4):
        assert steps[step][names.FULLY_ASYNC_PARTIAL_SAMPLES] > 0, steps[step]
        assert steps[step][names.FULLY_ASYNC_MAX_PARTIAL_SPAN] == 1
    return steps


def test_partial_rollout_tags_each_token_with_its_weights(tiny_model_dir, varied_parquet, tmp_path):
    """async_training.partial_rollout=true on real pools: the rollout pool's group takes the weight load beside a
    generation in progress and the engine tags every token, so each step reports verl's partial metrics. Each call
    after the first is held after its samples' 2nd token until a sync lands (the trainer waits for the first, so
    no sync could): the steps that train on them hold samples drawn by two weight versions. The prompts differ in
    length: single prompts, and calls, of different widths join in the queue."""
    steps = run_held_partial_rollout(HOLD_FOR_A_SYNC, tiny_model_dir, varied_parquet, tmp_path)
    # Calls of 2 prompts, each started during a step's training and in flight across the next step's sync
    assert [steps[s][names.FULLY_ASYNC_PARAM_VERSION] for s in range(1, 5)] == [0, 1, 2, 3]
    assert [steps[s][names.FULLY_ASYNC_STALE_SAMPLES] for s in range(1, 5)] == [0, 2, 4, 6]


def test_partial_rollout_resumes_after_kill_9_and_finishes(tiny_model_dir, tiny_parquet, tmp_path):
    """kill -9 at the first checkpoint, then the same command: the run resumes from it and finishes, every prompt
    generated and trained once (its steps are not compared with another run's: where a sync lands in a call is
    timing)."""
    run_dir = tmp_path / "run"
    overrides = _partial_rollout_overrides(tiny_model_dir, tiny_parquet, run_dir) + ["trainer.save_freq=1"]
    killed_at = kill_9_at_first_checkpoint(overrides, run_dir, cwd=tmp_path)
    assert killed_at < STEPS, "the run finished before it could be killed"
    run_cli(overrides, cwd=tmp_path)
    steps = _steps(run_dir)
    assert sorted(steps) == [1, 2, 3, 4]
    assert (run_dir / "latest").read_text().strip() == "global_step_4"
    assert [steps[s][names.FULLY_ASYNC_GENERATED_SAMPLES] for s in range(1, 5)] == [4, 6, 8, 8]
    assert_each_prompt_trained_once_per_epoch(tmp_path / DUMPS, overrides, STEPS)


def test_a_sync_every_step_without_staleness_trains_on_the_synchronous_runs_samples(grpo_run, tmp_path):
    """Fully async with a sync every step, staleness 0 and calls of a whole step's prompts is the synchronous
    algorithm on two pools: every step samples the same prompts with the same seeds from the weights after the
    previous update, so it trains on exactly the synchronous run's samples (tests/trainer/conftest.py), metric
    for metric, validations included (the async counters and timings aside)."""
    sync_dir, overrides = grpo_run
    sync = _steps(sync_dir)
    fully_async = [o for o in overrides if not o.startswith(("trainer.total_training_steps=", "trainer.default_"))]
    fully_async += [
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "actor_rollout_ref.hybrid_engine=false",
        "async_training.enable=true",
        "async_training.partial_rollout=false",
        "data.train_batch_size=0",
        "data.gen_batch_size=1",
        "async_training.require_batches=2",  # x ppo_mini_batch_size 2: the synchronous run's 4 prompts a step
        "async_training.trigger_parameter_sync_step=1",
        "async_training.staleness_threshold=0",
        "async_training.concurrent_samples_per_replica=4",
        f"rollout.total_rollout_steps={4 * max(sync)}",
    ]
    run_cli(fully_async, cwd=tmp_path)
    steps = _steps(tmp_path / "run")
    assert sorted(steps) == sorted(sync) == list(range(max(sync) + 1))
    assert prompts_by_step(tmp_path / DUMPS) == prompts_by_step(sync_dir.parent / DUMPS)
    for step in sorted(sync):
        assert steps[step].get(names.FULLY_ASYNC_STALE_SAMPLES, 0) == 0
        assert _learning_metrics(steps[step]) == _learning_metrics(sync[step]), f"step {step} differs"


def _learning_metrics(record):
    """A step's metrics less its timings and the async counters."""
    return {key: value for key, value in record.items() if not (names.is_timing(key) or key.startswith("fully_async/"))}
