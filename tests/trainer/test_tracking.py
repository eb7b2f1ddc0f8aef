"""The tracking backends write what they promise, read back through each package's own files, and the optional
ones fail clearly when absent; a resumed process goes on with the same mlflow, wandb and swanlab run."""

import json
import sys

import pytest

from hybridflow.tracking.trackers import LOGGER_BACKENDS, MissingExtraError, RunInfo, Tracking, read_metrics

from .tracker_files import mlflow_runs, mlflow_table, offline_trackers, swanlab_offline_runs, wandb_offline_runs


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    offline_trackers(monkeypatch)


def _run(tmp_path, first_step=1):
    return RunInfo("proj", "exp", tmp_path, total_steps=4, first_step=first_step, config={"a": 1})


def test_jsonl_writes_one_line_per_step(tmp_path):
    tracker = Tracking(["jsonl"], _run(tmp_path))
    tracker.log({"critic/score/mean": 0.5, "val-core/gsm8k/acc/mean@1": 1, "text": "skipped"}, step=1)
    tracker.log({"critic/score/mean": 0.75}, step=2)
    tracker.close()
    assert read_metrics(tmp_path) == [
        {"step": 1, "critic/score/mean": 0.5, "val-core/gsm8k/acc/mean@1": 1.0},
        {"step": 2, "critic/score/mean": 0.75},
    ]


def test_resumed_jsonl_drops_the_steps_it_redoes_and_torn_lines(tmp_path):
    tracker = Tracking(["jsonl"], _run(tmp_path))
    for step in (1, 2, 3):
        tracker.log({"x": step}, step=step)
    tracker.close()
    with (tmp_path / "metrics.jsonl").open("a") as torn:
        torn.write('{"step": 4, "x"')  # a kill mid-write
    resumed = Tracking(["jsonl"], _run(tmp_path, first_step=3))
    resumed.log({"x": 30}, step=3)
    resumed.close()
    assert [(r["step"], r["x"]) for r in read_metrics(tmp_path)] == [(1, 1), (2, 2), (3, 30)]


def test_console_and_tensorboard(tmp_path, capsys):
    tracker = Tracking(["console", "tensorboard"], _run(tmp_path))
    tracker.log({"critic/score/mean": 0.5, "perf/throughput": 123.0}, step=1)
    tracker.close()
    assert "score 0.5" in capsys.readouterr().out
    event_files = list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert event_files and event_files[0].stat().st_size > 0


def test_the_console_line_shows_nan_losses_and_the_nonfinite_steps_once_there_is_one(tmp_path, capsys):
    tracker = Tracking(["console"], _run(tmp_path))
    tracker.log({"actor/pg_loss": 0.25, "training/nonfinite_steps": 0}, step=1)
    tracker.log({"actor/pg_loss": float("nan"), "training/nonfinite_steps": 2}, step=2)
    tracker.close()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert lines == ["step 1: pg_loss 0.25", "step 2: pg_loss nan  nonfinite_steps 2"]


@pytest.mark.parametrize("backend", ["mlflow", "wandb", "swanlab"])
def test_optional_backend_names_its_extra_when_missing(tmp_path, monkeypatch, backend):
    monkeypatch.setitem(sys.modules, backend, None)  # what `import` finds when the package is absent
    with pytest.raises(MissingExtraError, match=rf"hybridflow\[{backend}\]"):
        Tracking([backend], _run(tmp_path))


def test_unknown_backend_lists_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.logger='tensorbord'.*console, file, jsonl"):
        Tracking(["tensorbord"], _run(tmp_path))
    assert {"console", "jsonl", "tensorboard", "mlflow", "wandb", "swanlab"} <= set(LOGGER_BACKENDS.names())


SAMPLES = [("What is [2+2]?", "4", 1.0), ("What is 3*3?", "nine", 0.0)]


def test_validation_samples_go_to_console_jsonl_and_tensorboard(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracking(["console", "jsonl", "tensorboard"], _run(tmp_path))
    tracker.log_generations(SAMPLES, step=2)
    tracker.close()
    out = capsys.readouterr().out
    assert "val/generations (step 2)" in out and "What is [2+2]?" in out and "nine" in out
    (record,) = [json.loads(line) for line in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert record == {
        "step": 2,
        "val/generations": [
            {"input": "What is [2+2]?", "output": "4", "score": 1.0},
            {"input": "What is 3*3?", "output": "nine", "score": 0.0},
        ],
    }
    assert read_metrics(tmp_path) == []  # metrics.jsonl keeps to numbers
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    (text,) = events.Tensors("val/generations/text_summary")
    markdown = text.tensor_proto.string_val[0].decode()
    assert text.step == 2 and "    What is [2+2]?" in markdown and "score 0" in markdown and "    nine" in markdown


def test_a_resumed_run_drops_the_validation_samples_it_redoes(tmp_path):
    tracker = Tracking(["jsonl"], _run(tmp_path))
    for step in (0, 2, 4):
        tracker.log_generations(SAMPLES[:1], step=step)
    tracker.close()
    Tracking(["jsonl"], _run(tmp_path, first_step=3)).close()
    lines = (tmp_path / "val_generations.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 2]


VERL_METRICS = {"critic/score/mean": 0.5, "actor/pg_loss": -0.25, "val-core/arithmetic/acc/mean@2": 1.0}


def _log_two_steps_and_two_validations(backends, run_dir):
    tracker = Tracking(backends, _run(run_dir))
    for step, samples in ((1, SAMPLES), (2, SAMPLES[::-1])):
        tracker.log_generations(samples, step=step)
        tracker.log({**VERL_METRICS, "critic/score/mean": step / 4}, step=step)
    tracker.close()


def test_mlflow_keeps_verls_names_in_a_local_store_and_the_generations_as_one_table(tmp_path):
    _log_two_steps_and_two_validations(["mlflow"], tmp_path)
    ((run_id, metrics),) = mlflow_runs(tmp_path, "proj").items()
    # mlflow refuses '@' in a metric name, so "mean@2" is logged as "mean_at_2".
    assert set(metrics) == {"critic/score/mean", "actor/pg_loss", "val-core/arithmetic/acc/mean_at_2"}
    assert metrics["critic/score/mean"] == [(1, 0.25), (2, 0.5)]
    table = mlflow_table(tmp_path, "proj", run_id, "val/generations.json")
    assert table[["step", "input", "output", "score"]].values.tolist() == [
        [1, *SAMPLES[0]],
        [1, *SAMPLES[1]],
        [2, *SAMPLES[1]],
        [2, *SAMPLES[0]],
    ]


def test_wandb_offline_keeps_verls_names_and_its_growing_table(tmp_path):
    _log_two_steps_and_two_validations(["wandb"], tmp_path)
    ((_, rows),) = wandb_offline_runs(tmp_path)
    metrics = [row for row in rows if "critic/score/mean" in row]
    assert [(row["_step"], row["critic/score/mean"], row["val-core/arithmetic/acc/mean@2"]) for row in metrics] == [
        (1, 0.25, 1.0),
        (2, 0.5, 1.0),
    ]
    # verl's table: a row per validation (step, input_1, output_1, score_1, ...), each logged table holds all so far.
    (table,) = [row["val/generations"] for row in rows if row["_step"] == 2 and "val/generations" in row]
    assert table["columns"] == ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"]
    assert table["data"] == [[1, *SAMPLES[0], *SAMPLES[1]], [2, *SAMPLES[1], *SAMPLES[0]]]


def test_swanlab_offline_keeps_verls_names_and_an_echarts_table_per_validation(tmp_path):
    _log_two_steps_and_two_validations(["swanlab"], tmp_path)
    ((_, logged),) = swanlab_offline_runs(tmp_path)
    scalars = {(key, step): value for key, step, value in logged if not isinstance(value, dict)}
    assert scalars[("critic/score/mean", 2)] == 0.5 and scalars[("val-core/arithmetic/acc/mean@2", 1)] == 1.0
    tables = {step: value for key, step, value in logged if key == "val/generations"}
    assert tables[2]["rowData"] == [dict(zip(["step", "input", "output", "score"], [2, *row])) for row in SAMPLES[::-1]]


def _end_as_a_kill_would(tracker):
    """End the tracker's run the way its package records a dead process, without ``Tracking.close``."""
    (backend,) = tracker.backends
    end = {
        "MlflowBackend": lambda: backend.mlflow.end_run(status="KILLED"),
        "WandbBackend": lambda: backend.run.finish(exit_code=137),
        "SwanlabBackend": lambda: backend.run.finish(state="crashed", error="killed"),
    }
    end[type(backend).__name__]()


def _steps_logged(backend, run_dir):
    """[(run id, [step, ...]), ...]: the steps of ``critic/score/mean`` in each run (mlflow) or run folder."""
    if backend == "mlflow":
        return [
            (run_id, [step for step, _ in metrics["critic/score/mean"]])
            for run_id, metrics in mlflow_runs(run_dir, "proj").items()
        ]
    if backend == "wandb":
        return [
            (run_id, [row["_step"] for row in rows if "critic/score/mean" in row])
            for run_id, rows in wandb_offline_runs(run_dir)
        ]
    return [
        (run_id, [step for key, step, _ in logged if key == "critic/score/mean"])
        for run_id, logged in swanlab_offline_runs(run_dir)
    ]


@pytest.mark.parametrize("backend", ["mlflow", "wandb", "swanlab"])
def test_a_resumed_process_continues_the_same_run_and_skips_the_steps_it_holds(tmp_path, backend):
    first = Tracking([backend], _run(tmp_path))
    for step in (1, 2, 3):
        first.log({"critic/score/mean": step}, step=step)
    _end_as_a_kill_would(first)
    # Resumed from the checkpoint of step 2: step 3 is redone, and the run already holds it.
    resumed = Tracking([backend], _run(tmp_path, first_step=3))
    for step in (3, 4):
        resumed.log({"critic/score/mean": step * 10}, step=step)
    resumed.close()
    logged = _steps_logged(backend, tmp_path)
    run_ids = {run_id for run_id, _ in logged}
    assert len(run_ids) == 1 and json.loads((tmp_path / f"{backend}_run.json").read_text()) == {
        "run_id": run_ids.pop(),
        "last_step": 4,
    }
    # mlflow has one run; offline wandb and swanlab a folder per process, which their `sync` joins into one run.
    assert [step for _, steps in logged for step in steps] == [1, 2, 3, 4]


def test_a_fresh_run_in_the_same_folder_starts_a_new_tracker_run(tmp_path):
    Tracking(["mlflow"], _run(tmp_path)).close()
    Tracking(["mlflow"], _run(tmp_path, first_step=1)).close()
    assert len(mlflow_runs(tmp_path, "proj")) == 2
