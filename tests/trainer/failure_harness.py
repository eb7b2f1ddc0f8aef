"""Running an entry point the way a user does and reading its verdict: exit code, error lines, workers started."""

from __future__ import annotations

import dataclasses
import importlib
import re
import subprocess
import sys

import pytest

from hybridflow.config.command_line import CONFIG_CHECK_ENV
from hybridflow.trainer.error_boundary import PREFIX, WORKERS_STARTING

from .cli import HANG_GUARD_S, RayTempDir, cli_env

# Ray's prefix on a line it forwards from a worker process (colored on a terminal, and under pytest too).
RAY_WORKER_LINE = re.compile(r"^(\x1b\[[0-9;]*m)?\([^()]*pid=\d+[^()]*\)")


@dataclasses.dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def workers_started(self) -> bool:
        return WORKERS_STARTING in self.stdout

    @property
    def error(self) -> str:
        """The error as printed: the line after ``hybridflow: error:`` (and its ``  - `` lines for several).
        Lines Ray forwards from a worker's output (``(role:rank0 pid=N) ...``) may land after it; they are not
        the driver's."""
        lines = [line for line in self.stderr.splitlines() if not RAY_WORKER_LINE.match(line)]
        starts = [i for i, line in enumerate(lines) if line.startswith(PREFIX)]
        if not starts:
            raise AssertionError(
                f"no {PREFIX!r} line (exit {self.code})\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-5000:]}"
            )
        return "\n".join(lines[starts[-1] :])[len(PREFIX) :]


def check_in_process(entry: str, argv: list[str], capsys, monkeypatch, tmp_path) -> Outcome:
    """``python -m hybridflow.trainer.<entry> <argv>`` up to its config check, in this process (fast)."""
    monkeypatch.setenv(CONFIG_CHECK_ENV, "full")
    monkeypatch.setattr(sys, "argv", [entry])
    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(tmp_path)  # Hydra's output folder
    module = importlib.import_module(f"hybridflow.trainer.{entry}")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        module.cli(list(argv))
    out = capsys.readouterr()
    return Outcome(stopped.value.code, out.out, out.err)


def run_subprocess(entry: str, argv: list[str], cwd, env: dict | None = None) -> Outcome:
    """The whole run in a subprocess, with its own Ray cluster (for failures that happen after start-up)."""
    with RayTempDir() as ray_temp_dir:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                f"hybridflow.trainer.{entry}",
                *argv,
                "ray_init.num_cpus=2",
                f"ray_init.temp_dir={ray_temp_dir}",
            ],
            cwd=cwd,
            env={**cli_env(), **(env or {})},
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
        )
    return Outcome(result.returncode, result.stdout, result.stderr)


def assert_refused(outcome: Outcome, *fragments: str, code: int = 2, workers_started: bool = False) -> str:
    """The run ended with ``code``, its error names every fragment, no traceback on the screen; returns the error."""
    error = outcome.error
    assert outcome.code == code, (outcome.code, error)
    assert "Traceback" not in outcome.stderr, outcome.stderr[-5000:]
    assert "HYDRA_FULL_ERROR" not in outcome.stderr, outcome.stderr[-3000:]
    for fragment in fragments:
        assert fragment in error, (fragment, error)
    assert outcome.workers_started == workers_started, (outcome.workers_started, outcome.stdout[-2000:])
    return error
