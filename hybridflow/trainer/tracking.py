"""Where per-step metrics go: any mix of console, jsonl, tensorboard, mlflow and wandb (``trainer.logger``).

Every backend takes a flat ``{name: float}`` dict and a step. ``jsonl`` writes one line per step to
``<run_dir>/metrics.jsonl`` and is the record the tests and resumes rely on; ``mlflow`` writes to a local
file store under the run folder unless ``MLFLOW_TRACKING_URI`` is set; ``wandb`` runs offline unless
``WANDB_MODE`` or ``WANDB_API_KEY`` says otherwise. Every backend also takes a table of validation samples,
(input, output, score) rows, under verl's name ``val/generations`` (``trainer.log_val_generations``).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pathlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from hybridflow.errors import HybridflowError
from hybridflow.registry import Registry
from hybridflow.trainer import metric_names as names

METRICS_FILE = "metrics.jsonl"
VAL_GENERATIONS_FILE = "val_generations.jsonl"
VAL_GENERATIONS = "val/generations"
GENERATION_COLUMNS = ("input", "output", "score")
GenerationRow = tuple[str, str, float]


class MissingExtraError(HybridflowError, ImportError):
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

    def log_generations(self, samples: list[GenerationRow], step: int) -> None: ...

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


@LOGGER_BACKENDS.register("jsonl", "file")
class JsonlBackend:
    """``<run_dir>/metrics.jsonl``: one JSON object per step, ``{"step": N, <metric>: value, ...}``. verl's
    ``file`` logger (also one JSON line per step) is this backend.

    A resumed run first drops the lines of steps it is about to redo, so the file reads as one history.
    """

    def __init__(self, run: RunInfo):
        run.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run.run_dir / METRICS_FILE
        self.generations_path = run.run_dir / VAL_GENERATIONS_FILE
        for path in (self.path, self.generations_path):
            _drop_steps_from(path, run.first_step)
        self._file = self.path.open("a")

    def log(self, metrics: dict[str, float], step: int) -> None:
        record = {"step": step}
        for name, value in _finite_floats(metrics).items():
            record[name] = value if math.isfinite(value) else str(value)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def log_generations(self, samples: list[GenerationRow], step: int) -> None:
        """One line of ``<run_dir>/val_generations.jsonl``: ``{"step": N, "val/generations": [{input, output,
        score}, ...]}`` (a file of its own, so ``metrics.jsonl`` keeps one line of numbers per step)."""
        record = {"step": step, VAL_GENERATIONS: [dict(zip(GENERATION_COLUMNS, sample)) for sample in samples]}
        with self.generations_path.open("a") as out:
            out.write(json.dumps(record, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._file.close()


def _drop_steps_from(path: pathlib.Path, first_step: int) -> None:
    """Keep the lines of ``path`` logged before ``first_step`` (a resumed run redoes the later ones)."""
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if _step_of(line) < first_step]
        path.write_text("".join(line + "\n" for line in kept))


def _step_of(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf  # a line torn by a kill: drop it


def _code_block(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines() or [""])


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
        if scalars.get(names.NONFINITE_STEPS):  # steps skipped for NaN/inf so far; shown once there is one
            shown.append(f"nonfinite_steps {scalars[names.NONFINITE_STEPS]:.0f}")
        self.progress.console.print(f"step {step}: " + "  ".join(shown), soft_wrap=True)
        score = scalars.get(self.SHOWN["score"])
        throughput = scalars.get(names.PERF_THROUGHPUT)
        self.progress.update(
            self.task,
            completed=max(step, 0),
            score="-" if score is None else f"{score:.3f}",
            throughput="-" if throughput is None else f"{throughput:.0f}",
        )

    def log_generations(self, samples: list[GenerationRow], step: int) -> None:
        from rich.table import Table
        from rich.text import Text

        table = Table(*GENERATION_COLUMNS, title=f"{VAL_GENERATIONS} (step {step})", show_lines=True)
        for input_text, output_text, score in samples:
            # Text, not markup: a model's "[...]" must print as written.
            table.add_row(Text(input_text), Text(output_text), f"{score:.4g}")
        self.progress.console.print(table)

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

    def log_generations(self, samples: list[GenerationRow], step: int) -> None:
        """One markdown text entry; the texts are indented as code blocks so they show as generated."""
        sections = [
            f"**sample {index}**, score {score:.4g}\n\ninput:\n\n{_code_block(input_text)}\n\n"
            f"output:\n\n{_code_block(output_text)}"
            for index, (input_text, output_text, score) in enumerate(samples, start=1)
        ]
        self.writer.add_text(VAL_GENERATIONS, "\n\n---\n\n".join(sections), global_step=step)
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

    def log_generations(self, samples: list[GenerationRow], step: int) -> None:
        """An artifact ``val_step<N>.json`` of [{input, output, score}, ...], as verl writes it."""
        self.mlflow.log_dict([dict(zip(GENERATION_COLUMNS, sample)) for sample in samples], f"val_step{step}.json")

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
        self.generation_rows: list[list] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(_finite_floats(metrics), step=step)

    def log_generations(self, samples: list[GenerationRow], step: int) -> None:
        """verl's table: one row per validation (step, input_1, output_1, score_1, ...), all rows so far."""
        columns = ["step"] + [f"{name}_{index}" for index in range(1, len(samples) + 1) for name in GENERATION_COLUMNS]
        self.generation_rows.append([step] + [value for sample in samples for value in sample])
        self.run.log({VAL_GENERATIONS: self.wandb.Table(columns=columns, data=self.generation_rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracking:
    """Fans one metrics dict out to every chosen backend."""

    def __init__(self, backends: list[str], run: RunInfo):
        self.backends: list[TrackingBackend] = [LOGGER_BACKENDS.get(name)(run) for name in backends]

    def log(self, metrics: dict[str, Any], step: int) -> None:
        for backend in self.backends:
            backend.log(metrics, step)

    def log_generations(self, samples: list[GenerationRow], step: int) -> None:
        """(input, output, score) rows of validation samples, as a table to every backend."""
        for backend in self.backends:
            backend.log_generations(samples, step)

    def close(self) -> None:
        for backend in self.backends:
            backend.close()
