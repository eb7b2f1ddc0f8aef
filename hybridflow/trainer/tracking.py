"""Where per-step metrics go: any mix of console, jsonl, tensorboard, mlflow and wandb (``trainer.logger``).

Every backend takes a flat ``{name: float}`` dict and a step. ``jsonl`` writes one line per step to
``<run_dir>/metrics.jsonl`` and is the record the tests and resumes rely on; ``mlflow`` writes to a local
file store under the run folder unless ``MLFLOW_TRACKING_URI`` is set; ``wandb`` runs offline unless
``WANDB_MODE`` or ``WANDB_API_KEY`` says otherwise.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from hybridflow.registry import Registry
from hybridflow.trainer import metric_names as names

METRICS_FILE = "metrics.jsonl"


class MissingExtraError(ImportError):
    """A logger backend was chosen whose optional package is not installed."""


@dataclass
class RunInfo:
    """What every backend needs to know about the run."""

    project_name: str
    experiment_name: str
    run_dir: pathlib.Path
    total_steps: int
    # The first step this process will log; earlier steps belong to the run this one resumed.
    first_step: int = 1
    config: dict[str, Any] = field(default_factory=dict)


class TrackingBackend(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


LOGGER_BACKENDS: Registry[type] = Registry("logger backend", "trainer.logger")
# Backends whose package is an optional extra of hybridflow: module to import, extra to install.
OPTIONAL_BACKEND_PACKAGES = {"mlflow": ("mlflow", "mlflow"), "wandb": ("wandb", "wandb")}


def import_optional(backend: str) -> Any:
    """Import the package behind an optional backend, or say which extra installs it."""
    module, extra = OPTIONAL_BACKEND_PACKAGES[backend]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(
            f"trainer.logger includes {backend!r} but the {module!r} package is not installed; "
            f"install it with `pip install 'hybridflow[{extra}]'` or remove {backend!r} from trainer.logger"
        ) from None


def _finite_floats(metrics: dict[str, Any]) -> dict[str, float]:
    """Keep the numeric entries as Python floats (numpy and torch scalars included)."""
    scalars = {}
    for name, value in metrics.items():
        try:
            scalars[name] = float(value)
        except (TypeError, ValueError):
            continue
    return scalars


@LOGGER_BACKENDS.register("jsonl")
class JsonlBackend:
    """``<run_dir>/metrics.jsonl``: one JSON object per step, ``{"step": N, <metric>: value, ...}``.

    A resumed run first drops the lines of steps it is about to redo, so the file reads as one history.
    """

    def __init__(self, run: RunInfo):
        run.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run.run_dir / METRICS_FILE
        if self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _step_of(line) < run.first_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self._file = self.path.open("a")

    def log(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step}
        for name, value in _finite_floats(metrics).items():
            record[name] = value if math.isfinite(value) else str(value)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _step_of(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf  # a line torn by a kill: drop it


def read_metrics(run_dir: str | pathlib.Path) -> list[dict[str, Any]]:
    """All records of ``<run_dir>/metrics.jsonl`` in order."""
    path = pathlib.Path(run_dir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@LOGGER_BACKENDS.register("console")
class ConsoleBackend:
    """A rich progress bar (step, score, tokens/s, ETA) with one summary line printed per step."""

    SHOWN = {
        "score": names.stat(names.SCORE, "mean"),
        "pg_loss": names.ACTOR_PREFIX + "pg_loss",
        "vf_loss": names.CRITIC_PREFIX + "vf_loss",
        "kl": names.ACTOR_PREFIX + "ppo_kl",
        "resp_len": names.stat(names.RESPONSE_LENGTH, "mean"),
        "tokens/s": names.PERF_THROUGHPUT,
        "s/step": names.PERF_TIME_PER_STEP,
    }

    def __init__(self, run: RunInfo):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.console = Console()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("score {task.fields[score]}  tokens/s {task.fields[throughput]}"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task(
            run.experiment_name, total=run.total_steps, completed=max(run.first_step - 1, 0), score="-", throughput="-"
        )
        self.progress.start()

    def log(self, metrics: dict[str, float], step: int) -> None:
        scalars = _finite_floats(metrics)
        shown = [f"{label} {scalars[key]:.4g}" for label, key in self.SHOWN.items() if key in scalars]
        shown += [f"{key} {value:.4g}" for key, value in scalars.items() if key.startswith(names.VAL_CORE_PREFIX)]
        self.progress.console.print(f"step {step}: " + "  ".join(shown), soft_wrap=True)
        score = scalars.get(self.SHOWN["score"])
        throughput = scalars.get(names.PERF_THROUGHPUT)
        self.progress.update(
            self.task,
            completed=max(step, 0),
            score="-" if score is None else f"{score:.3f}",
            throughput="-" if throughput is None else f"{throughput:.0f}",
        )

    def close(self) -> None:
        self.progress.stop()


@LOGGER_BACKENDS.register("tensorboard")
class TensorboardBackend:
    """Scalars under ``<run_dir>/tensorboard`` (or ``$TENSORBOARD_DIR``)."""

    def __init__(self, run: RunInfo):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=os.environ.get("TENSORBOARD_DIR", str(run.run_dir / "tensorboard")))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for name, value in _finite_floats(metrics).items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@LOGGER_BACKENDS.register("mlflow")
class MlflowBackend:
    """An mlflow run in a local file store ``<run_dir>/mlruns`` unless ``MLFLOW_TRACKING_URI`` is set."""

    def __init__(self, run: RunInfo):
        self.mlflow = import_optional("mlflow")
        local_store = (run.run_dir / "mlruns").resolve().as_uri()
        self.mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or local_store)
        self.mlflow.set_experiment(run.project_name)
        self.mlflow.start_run(run_name=run.experiment_name)
        self.mlflow.log_dict(run.config, "config.json")

    def log(self, metrics: dict[str, float], step: int) -> None:
        # mlflow refuses '@' in metric names ("mean@4").
        self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in _finite_floats(metrics).items()}, step=step)

    def close(self) -> None:
        self.mlflow.end_run()


@LOGGER_BACKENDS.register("wandb")
class WandbBackend:
    """A wandb run, offline (files under ``<run_dir>/wandb``) unless the user configured wandb."""

    def __init__(self, run: RunInfo):
        self.wandb = import_optional("wandb")
        configured = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.run = self.wandb.init(
            project=run.project_name,
            name=run.experiment_name,
            config=run.config,
            dir=str(run.run_dir),
            mode=configured,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(_finite_floats(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class Tracking:
    """Fans one metrics dict out to every chosen backend."""

    def __init__(self, backends: list[str], run: RunInfo):
        self.backends: list[TrackingBackend] = [LOGGER_BACKENDS.get(name)(run) for name in backends]

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for backend in self.backends:
            backend.log(metrics, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
