"""Where per-step metrics go: any mix of console, jsonl, tensorboard, mlflow, wandb and swanlab (``trainer.logger``).

Every backend takes a flat ``{name: float}`` dict and a step. ``jsonl`` writes one line per step to
``<run_dir>/metrics.jsonl`` and is the record the tests and resumes rely on. The hosted trackers keep their runs
under the run folder unless the user configured them: ``mlflow`` a SQLite store (unless ``MLFLOW_TRACKING_URI``),
``wandb`` and ``swanlab`` offline files (unless ``WANDB_MODE``/``WANDB_API_KEY``, ``SWANLAB_MODE``/``SWANLAB_API_KEY``),
and a resumed run goes on logging to the same tracker run (``TrackerRun``). Every backend also takes a table of
validation samples, (input, output, score) rows, under verl's name ``val/generations``
(``trainer.log_val_generations``).
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
from hybridflow.tracking import metric_names as names

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
OPTIONAL_BACKEND_PACKAGES = {
    "mlflow": ("mlflow", "mlflow"),
    "wandb": ("wandb", "wandb"),
    "swanlab": ("swanlab", "swanlab"),
}


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


class TrackerRun:
    """A hosted tracker's run as ``<run_dir>/<backend>_run.json`` records it: its id and the last step logged to it.

    A resumed process (``first_step > 1``) reopens the recorded run and skips the steps it already holds. Resume is
    exact, so the steps redone after the checkpoint would only repeat them, and no tracker here replaces a step:
    mlflow keeps both values; wandb drops a step not after its last one with a warning, swanlab silently, but
    offline a resumed run's process knows nothing of the steps an earlier one logged.
    """

    def __init__(self, run: RunInfo, backend: str):
        run.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run.run_dir / f"{backend}_run.json"
        earlier = json.loads(self.path.read_text()) if run.first_step > 1 and self.path.exists() else {}
        self.resume_id: str | None = earlier.get("run_id")
        self.held_through: int = earlier.get("last_step", -1)
        self.run_id, self.last_step = self.resume_id, self.held_through

    def start(self, run_id: str) -> None:
        """Record the run this process logs to: the resumed one or a new one."""
        self.run_id = run_id
        self._write()

    def holds(self, step: int) -> bool:
        """Whether the run has ``step`` from an earlier process (so it is not logged again)."""
        return step <= self.held_through

    def logged(self, step: int) -> None:
        self.last_step = max(self.last_step, step)
        self._write()

    def _write(self) -> None:
        # Replaced whole: a kill mid-write leaves the previous record.
        partial = self.path.with_name(self.path.name + ".tmp")
        partial.write_text(json.dumps({"run_id": self.run_id, "last_step": self.last_step}))
        os.replace(partial, self.path)


@LOGGER_BACKENDS.register("mlflow")
class MlflowBackend:
    """An mlflow run in a SQLite store ``<run_dir>/mlflow.db`` (artifacts in ``<run_dir>/mlartifacts``) unless
    ``MLFLOW_TRACKING_URI`` is set; mlflow 3 refuses to start a ``./mlruns`` file store unless told to."""

    def __init__(self, run: RunInfo):
        self.mlflow = import_optional("mlflow")
        self.record = TrackerRun(run, "mlflow")
        uri, artifacts = os.environ.get("MLFLOW_TRACKING_URI"), None
        if not uri:
            uri = f"sqlite:///{(run.run_dir / 'mlflow.db').resolve()}"
            artifacts = (run.run_dir / "mlartifacts").resolve().as_uri()
        self.mlflow.set_tracking_uri(uri)
        experiment = self.mlflow.get_experiment_by_name(run.project_name)
        experiment_id = (
            experiment.experiment_id if experiment else self.mlflow.create_experiment(run.project_name, artifacts)
        )
        active = self.mlflow.start_run(
            run_id=self.record.resume_id, experiment_id=experiment_id, run_name=run.experiment_name
        )
        self.record.start(active.info.run_id)
        self.mlflow.log_dict(run.config, "config.json")

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.record.holds(step):
            return
        # mlflow refuses '@' in metric names ("mean@4").
        self.mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in _finite_floats(metrics).items()}, step=step)
        self.record.logged(step)

    def log_generations(self, samples: list[GenerationRow], step: int) -> None:
        """Rows appended to the run's table ``val/generations.json`` (step, input, output, score), which the UI
        shows as a table and ``MlflowClient().load_table`` reads."""
        if self.record.holds(step):
            return
        columns = {name: list(column) for name, column in zip(GENERATION_COLUMNS, zip(*samples))}
        self.mlflow.log_table({"step": [step] * len(samples), **columns}, artifact_file=f"{VAL_GENERATIONS}.json")

    def close(self) -> None:
        self.mlflow.end_run()


@LOGGER_BACKENDS.register("wandb")
class WandbBackend:
    """A wandb run, offline (``<run_dir>/wandb``, uploaded with ``wandb sync``) unless the user configured wandb
    (``WANDB_MODE`` or ``WANDB_API_KEY``).

    A resumed process logs to the same run id; offline, each process writes its own folder and ``wandb sync`` joins
    them into one run. Offline wandb writes its file at most every 15 s, so a kill -9 loses its last seconds of steps.
    """

    def __init__(self, run: RunInfo):
        self.wandb = import_optional("wandb")
        self.record = TrackerRun(run, "wandb")
        configured = os.environ.get("WANDB_MODE") or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self.run = self.wandb.init(
            project=run.project_name,
            name=run.experiment_name,
            config=run.config,
            dir=str(run.run_dir),
            mode=configured,
            id=self.record.resume_id,
            resume="allow",
        )
        self.record.start(self.run.id)
        self.generation_rows: list[list] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.record.holds(step):
            return
        # Committed now: wandb otherwise keeps a step's row in memory until a later step comes, and a kill loses it.
        self.run.log(_finite_floats(metrics), step=step, commit=True)
        self.record.logged(step)

    def log_generations(self, samples: list[GenerationRow], step: int) -> None:
        """verl's table: one row per validation (step, input_1, output_1, score_1, ...), all rows of this process;
        it joins the step's metrics, which come next and commit the row."""
        if self.record.holds(step):
            return
        columns = ["step"] + [f"{name}_{index}" for index in range(1, len(samples) + 1) for name in GENERATION_COLUMNS]
        self.generation_rows.append([step] + [value for sample in samples for value in sample])
        table = self.wandb.Table(columns=columns, data=self.generation_rows)
        self.run.log({VAL_GENERATIONS: table}, step=step, commit=False)

    def close(self) -> None:
        self.run.finish()


@LOGGER_BACKENDS.register("swanlab")
class SwanlabBackend:
    """A swanlab run, offline (``<run_dir>/swanlog``, uploaded with ``swanlab sync``) unless the user configured
    swanlab (``SWANLAB_MODE`` or ``SWANLAB_API_KEY``; ``SWANLAB_LOG_DIR`` moves the folder).

    A resumed process logs to the same run id; offline, each process writes its own folder and ``swanlab sync``
    joins them into one run. Offline swanlab writes its file when a buffer fills or the run finishes, so a kill -9
    loses the steps still in the buffer.
    """

    def __init__(self, run: RunInfo):
        self.swanlab = import_optional("swanlab")
        self.record = TrackerRun(run, "swanlab")
        self.run = self.swanlab.init(
            project=run.project_name,
            name=run.experiment_name,
            config=run.config,
            mode=os.environ.get("SWANLAB_MODE") or ("online" if os.environ.get("SWANLAB_API_KEY") else "offline"),
            log_dir=os.environ.get("SWANLAB_LOG_DIR") or str(run.run_dir / "swanlog"),
            id=self.record.resume_id,
            resume="allow",
        )
        self.record.start(self.run.id)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if self.record.holds(step):
            return
        self.run.log(_finite_floats(metrics), step=step)
        self.record.logged(step)

    def log_generations(self, samples: list[GenerationRow], step: int) -> None:
        """verl's table: an echarts table of this validation's rows (step, input, output, score)."""
        if self.record.holds(step):
            return
        table = self.swanlab.echarts.Table()
        table.add(headers=["step", *GENERATION_COLUMNS], rows=[[step, *sample] for sample in samples])
        self.run.log({VAL_GENERATIONS: table}, step=step)

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
