"""Running ``python -m hybridflow.trainer.main_ppo`` in a subprocess the way a user would."""

import atexit
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DENSE_REWARD = pathlib.Path(__file__).with_name("dense_reward.py")

# How long the suite waits on a process it started before calling it hung: a guard, never a speed claim. On
# 2026-12-05 a busy 2-core AVX2 CI VM took over 240 s for a run of four calibrations that takes 91 s there alone.
HANG_GUARD_S = 900


def cli_env() -> dict[str, str]:
    quiet = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    return {**os.environ, **quiet}


class RayTempDir:
    """A short per-run Ray session folder (Ray's socket paths must stay under ~100 characters)."""

    def __enter__(self) -> str:
        self.path = tempfile.mkdtemp(prefix="hfray", dir="/tmp")
        return self.path

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


# What each run's own cluster would get: the suite's runs are sized for it.
RUN_CPUS = 2


class SharedRayCluster:
    """The one Ray cluster of ``RUN_CPUS`` CPUs that this test process's trainer runs join, one after another,
    through ``RAY_ADDRESS``: starting a cluster is ~6 of a tiny run's ~22 seconds on a 2-core machine. Started at
    the first run, ended when the test process exits (its host process reads stdin until then)."""

    _address: str | None = None

    @classmethod
    def address(cls) -> str:
        if cls._address is None:
            temp_dir = RayTempDir()
            host_script = pathlib.Path(__file__).with_name("ray_cluster_host.py")
            host = subprocess.Popen(
                [sys.executable, str(host_script), str(RUN_CPUS), temp_dir.__enter__()],
                env=cli_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            atexit.register(cls._end, host, temp_dir)
            cls._address = host.stdout.readline().strip()
            if not cls._address:
                raise AssertionError(f"the shared Ray cluster did not start (exit {host.wait()})")
        return cls._address

    @staticmethod
    def _end(host: subprocess.Popen, temp_dir: RayTempDir) -> None:
        host.stdin.close()
        host.wait(timeout=60)
        temp_dir.__exit__()


def run_env(overrides: list[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """A run's environment: ``env`` added, and the shared cluster joined unless the run sets its workers'
    environment or Ray's options, which only a cluster of its own takes."""
    own_cluster = env or any(override.lstrip("+").startswith(("ray_init.", "ray_kwargs.")) for override in overrides)
    return {**cli_env(), **(env or {}), **({} if own_cluster else {"RAY_ADDRESS": SharedRayCluster.address()})}


def command(overrides: list[str], ray_temp_dir: str) -> list[str]:
    """main_ppo with ``overrides``, scored by the dense reward unless they name a reward file."""
    own_reward = any(override.startswith("custom_reward_function.path=") for override in overrides)
    return [
        sys.executable,
        "-m",
        "hybridflow.trainer.main_ppo",
        *([] if own_reward else [f"custom_reward_function.path={DENSE_REWARD}"]),
        *overrides,
        f"ray_init.num_cpus={RUN_CPUS}",
        f"ray_init.temp_dir={ray_temp_dir}",
    ]


def run_demo(run_dir: pathlib.Path, *overrides: str, steps: int = 12) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """``python -m hybridflow.demo`` for ``steps`` steps, validating before and after them, into ``run_dir``: the
    finished process (not checked) and the logged records."""
    import json

    command = [sys.executable, "-m", "hybridflow.demo", "--steps", str(steps), "--test_freq", str(steps)]
    completed = subprocess.run(
        [*command, "--run_dir", str(run_dir), *overrides], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return completed, rows


def assert_demo_learned(completed: subprocess.CompletedProcess, rows: list[dict]) -> None:
    """A ``run_demo`` run finished and its validation accuracy rose by at least 5 points."""
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    accuracy = [row["val-core/sorting/acc/mean@1"] for row in rows if "val-core/sorting/acc/mean@1" in row]
    assert len(accuracy) == 2 and accuracy[1] >= accuracy[0] + 0.05, accuracy


def run_cli(overrides: list[str], cwd: pathlib.Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run the trainer to completion (``env`` added to its environment); raises with its output if it fails."""
    with RayTempDir() as ray_temp_dir:
        result = subprocess.run(
            command(overrides, ray_temp_dir),
            cwd=cwd,
            env=run_env(overrides, env),
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
    if result.returncode != 0:
        raise AssertionError(
            f"main_ppo exited with {result.returncode}\n"
            f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-6000:]}"
        )
    return result


def _wait_for_first_checkpoint(run_dir: pathlib.Path, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < deadline:
        if (run_dir / "latest").exists():
            return
        if process.poll() is not None:
            raise AssertionError(f"the run ended (exit {process.returncode}) before its first checkpoint")
        time.sleep(0.05)
    raise AssertionError("no checkpoint within the timeout")


def sft_command(overrides: list[str], ray_temp_dir: str) -> list[str]:
    return [sys.executable, "-m", "hybridflow.trainer.main_sft", *overrides, f"ray_init.temp_dir={ray_temp_dir}"]


def kill_9_at_first_checkpoint(overrides: list[str], run_dir: pathlib.Path, cwd: pathlib.Path, trainer=command) -> int:
    """Start the trainer (``command``, or ``sft_command``), kill -9 it once its first checkpoint is written;
    returns the step that checkpoint saved."""
    with RayTempDir() as ray_temp_dir:
        process = subprocess.Popen(
            trainer(overrides, ray_temp_dir),
            cwd=cwd,
            env=run_env(overrides),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            _wait_for_first_checkpoint(run_dir, process)
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        finally:
            # The Ray processes this run started share its session; end them, not anyone else's.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return int((run_dir / "latest").read_text().strip().removeprefix("global_step_"))
