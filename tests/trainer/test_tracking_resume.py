"""Through the command line: ``main_ppo`` logging to jsonl, mlflow and wandb is killed with -9 after a step its
checkpoint does not hold, and the same command goes on with the same mlflow run and the same wandb run id, every
step logged once and every prompt of an epoch trained once (local mode's counting test)."""

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from hybridflow.tracking.trackers import METRICS_FILE, read_metrics

from .cli import HANG_GUARD_S, cli_env
from .helpers import tiny_run_overrides
from .tracker_files import mlflow_runs, mlflow_table, offline_trackers, wandb_offline_runs
from .trained_prompts import COUNTED, DUMPS, assert_each_prompt_trained_once_per_epoch

pytestmark = pytest.mark.slow

STALL_REWARD = pathlib.Path(__file__).with_name("stall_reward.py")
SCORE = "critic/score/mean"


def _command(overrides):
    reward = f"custom_reward_function.path={STALL_REWARD}"
    return [sys.executable, "-m", "hybridflow.trainer.main_ppo", *overrides, reward]


def _wandb_holds(run_dir, step):
    return any(row.get("_step") == step for _, rows in wandb_offline_runs(run_dir) for row in rows)


def _kill_9_in_the_step_after(step, overrides, run_dir, cwd):
    """Start the trainer, stall it in the reward of the step after ``step``, and kill -9 it there once its wandb
    file holds ``step``."""
    env = {**cli_env(), "HYBRIDFLOW_TEST_STALL_AT": f"{run_dir / METRICS_FILE}:{step}"}
    process = subprocess.Popen(
        _command(overrides),
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + HANG_GUARD_S
        while not _wandb_holds(run_dir, step):
            assert process.poll() is None, f"the run ended (exit {process.returncode}) before step {step}"
            assert time.monotonic() < deadline, f"wandb never held step {step}"
            time.sleep(0.1)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what the run started (wandb's service), nothing else
        except ProcessLookupError:
            pass


def test_kill_9_then_resume_continues_the_same_mlflow_and_wandb_runs(
    tiny_model_dir, tiny_parquet, tmp_path, monkeypatch
):
    offline_trackers(monkeypatch)
    # Offline wandb writes its file at most every 15 s, when a record comes (a kill -9 loses its last seconds).
    # Here every 0.1 s, with a system-stats record every 0.1 s, so the killed process's steps reach the disk.
    monkeypatch.setenv("WANDB_X_TRANSACTION_LOG_FLUSH_INTERVAL", "0.1")
    monkeypatch.setenv("WANDB_X_STATS_SAMPLING_INTERVAL", "0.1")
    run_dir = tmp_path / "run"
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, run_dir) + [
        "trainer.local_mode=true",
        "trainer.total_training_steps=4",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
        "trainer.log_val_generations=1",
        "trainer.logger=[jsonl,mlflow,wandb]",
        # Counted, in epochs of 12 prompts (3 steps): step 2's checkpoint is mid-epoch, where a skipped batch shows
        *[override for override in COUNTED if not override.startswith("data.train_max_samples=")],
        "data.train_max_samples=12",
    ]
    # Step 3 is logged but never saved: the resumed run redoes it from step 2's checkpoint.
    _kill_9_in_the_step_after(3, overrides, run_dir, cwd=tmp_path)
    assert (run_dir / "latest").read_text().strip() == "global_step_2"
    resumed = subprocess.run(
        _command(overrides), cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]

    assert [record["step"] for record in read_metrics(run_dir)] == [0, 1, 2, 3, 4]  # 0: validation before training
    ((run_id, metrics),) = mlflow_runs(run_dir, "hybridflow").items()
    assert [step for step, _ in metrics[SCORE]] == [1, 2, 3, 4]
    assert [step for step, _ in metrics["val-core/arithmetic/acc/mean_at_1"]] == [0, 2, 4]
    assert mlflow_table(run_dir, "hybridflow", run_id, "val/generations.json")["step"].tolist() == [0, 2, 4]
    # Offline, each process writes a folder of the same run id; `wandb sync` uploads both into that one run.
    (killed_id, killed), (resumed_id, resumed) = wandb_offline_runs(run_dir)
    assert killed_id == resumed_id
    assert [row["_step"] for row in killed if SCORE in row] == [1, 2, 3]
    assert [row["_step"] for row in resumed if SCORE in row] == [4]
    assert_each_prompt_trained_once_per_epoch(tmp_path / DUMPS, overrides, steps=4)
