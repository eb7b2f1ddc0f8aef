"""Failures that appear only once a run is going, through the real command line in a subprocess: the run stops
with one line naming the culprit and a non-zero exit, after the workers started, and leaves its metrics."""

import os
import signal
import subprocess
import sys
import time

import pytest

from hybridflow.tracking import metric_names as names
from hybridflow.tracking.trackers import read_metrics

from .cli import DENSE_REWARD, HANG_GUARD_S, RayTempDir, cli_env
from .failure_harness import Outcome, assert_refused, run_subprocess
from .helpers import tiny_run_overrides

pytestmark = pytest.mark.slow


def test_a_nan_reward_is_skipped_counted_and_stops_the_run_past_the_limit(tiny_model_dir, tiny_parquet, tmp_path):
    reward = tmp_path / "nan_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return float('nan')\n"
    )
    run_dir = tmp_path / "run"
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir) + [
        f"custom_reward_function.path={reward}",
        "trainer.total_training_steps=3",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
        "trainer.max_nonfinite_steps=1",
    ]
    outcome = run_subprocess("main_ppo", overrides, cwd=tmp_path)
    error = assert_refused(
        outcome,
        "step 2: the reward of 8 of 8 samples is not finite",
        "data_source 'arithmetic'",
        "trainer.max_nonfinite_steps=1",
        code=1,
        workers_started=True,
    )
    assert "\n" not in error
    steps = {record["step"]: record for record in read_metrics(run_dir)}
    assert sorted(steps) == [1]  # step 1 trained nothing, was flagged and counted
    assert steps[1][names.NONFINITE_SKIP] == 1 and steps[1][names.NONFINITE_STEPS] == 1
    assert not list(run_dir.glob("global_step_*"))  # no step from the first NaN on is checkpointed


def test_ctrl_c_says_where_the_run_stopped_and_what_resumes(tiny_model_dir, tiny_parquet, tmp_path):
    run_dir = tmp_path / "run"
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir) + [
        # Steps of the tiny run take well under a second: enough of them (the prompts reused over epochs) that
        # the signal lands mid-run, not after it.
        f"custom_reward_function.path={DENSE_REWARD}",
        "trainer.total_training_steps=200",
        "trainer.total_epochs=100",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
    ]
    with RayTempDir() as ray_temp_dir:
        driver = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hybridflow.trainer.main_ppo",
                *overrides,
                "ray_init.num_cpus=2",
                f"ray_init.temp_dir={ray_temp_dir}",
            ],
            cwd=tmp_path,
            env=cli_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A test run started in the background of a non-interactive shell ignores SIGINT, and a child
            # inherits that; the driver must get Ctrl-C as a terminal would deliver it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        deadline = time.monotonic() + HANG_GUARD_S
        while not (run_dir / "latest").exists() and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        driver.send_signal(signal.SIGINT)
        stdout, stderr = driver.communicate(timeout=HANG_GUARD_S)
    error = assert_refused(
        Outcome(driver.returncode, stdout, stderr),
        "interrupted (Ctrl-C) during step",
        "the same command resumes from",
        str(run_dir / "global_step_"),
        code=130,
        workers_started=True,
    )
    assert "\n" not in error


def test_a_weight_sync_that_does_not_take_stops_the_run_in_one_line(tiny_model_dir, tiny_parquet, tmp_path):
    """The run's process imports a ``sitecustomize`` whose hf engine reads the weights it is sent and keeps its own:
    the first sync after an update is caught (local mode; a worker's error reaching the driver on Ray as one line is
    tests/config/test_worker_start_checks.py's and tests/distributed/test_errors.py's)."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(
        "from hybridflow.rollout.hf_engine import HFRolloutEngine\n"
        "HFRolloutEngine.load_weights = lambda self, named_tensors: [None for _ in named_tensors]\n"
    )
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run") + [
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.local_mode=true",
    ]
    python_path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    outcome = run_subprocess("main_ppo", overrides, cwd=tmp_path, env={"PYTHONPATH": python_path})
    error = assert_refused(
        outcome,
        "weight sync check: the hf rollout engine does not serve weight version 1 after the hybrid engine sync",
        "the run stops rather than train on samples of weights the actor never had",
        code=1,
        workers_started=True,
    )
    assert "\n" not in error
