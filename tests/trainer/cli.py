"""Running ``python -m hybridflow.trainer.main_ppo`` in a subprocess the way a user would."""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

DENSE_REWARD = pathlib.Path(__file__).with_name("dense_reward.py")


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


def command(overrides: list[str], ray_temp_dir: str) -> list[str]:
    return [
        sys.executable, "-m", "hybridflow.trainer.main_ppo", *overrides,
        f"custom_reward_function.path={DENSE_REWARD}", "ray_init.num_cpus=2", f"ray_init.temp_dir={ray_temp_dir}",
    ]


def run_cli(overrides: list[str], cwd: pathlib.Path, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the trainer to completion; raises with its output if it fails."""
    with RayTempDir() as ray_temp_dir:
        result = subprocess.run(
            command(overrides, ray_temp_dir), cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=timeout
        )
    if result.returncode != 0:
        raise AssertionError(
            f"main_ppo exited with {result.returncode}\n"
            f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-6000:]}"
        )
    return result
