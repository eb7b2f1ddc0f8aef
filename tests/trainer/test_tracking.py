"""The tracking backends write what they promise, and the optional ones fail clearly when absent."""

import importlib.util
import json

import pytest

from hybridflow.trainer.tracking import (
    LOGGER_BACKENDS,
    MissingExtraError,
    RunInfo,
    Tracking,
    read_metrics,
)


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


@pytest.mark.parametrize("backend", ["mlflow", "wandb"])
def test_optional_backend_names_its_extra_when_missing(tmp_path, backend):
    if importlib.util.find_spec(backend) is not None:
        pytest.skip(f"{backend} is installed")
    with pytest.raises(MissingExtraError, match=rf"hybridflow\[{backend}\]"):
        Tracking([backend], _run(tmp_path))


def test_mlflow_local_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = Tracking(["mlflow"], _run(tmp_path))
    tracker.log({"val-core/x/acc/mean@2": 1.0}, step=1)
    tracker.close()
    assert (tmp_path / "mlruns").is_dir()


def test_unknown_backend_lists_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.logger='tensorbord'.*console, file, jsonl"):
        Tracking(["tensorbord"], _run(tmp_path))
    assert {"console", "jsonl", "tensorboard", "mlflow", "wandb"} <= set(LOGGER_BACKENDS.names())


SAMPLES = [("What is [2+2]?", "4", 1.0), ("What is 3*3?", "nine", 0.0)]


def test_validation_samples_go_to_console_jsonl_and_tensorboard(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracking(["console", "jsonl", "tensorboard"], _run(tmp_path))
    tracker.log_generations(SAMPLES, step=2)
    tracker.close()
    out = capsys.readouterr().out
    assert "val/generations (step 2)" in out and "What is [2+2]?" in out and "nine" in out
    (record,) = [json.loads(line) for line in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    assert record == {"step": 2, "val/generations": [
        {"input": "What is [2+2]?", "output": "4", "score": 1.0},
        {"input": "What is 3*3?", "output": "nine", "score": 0.0},
    ]}
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


class _FakeWandb:
    """The parts of wandb the backend uses, recording what it logs."""

    def __init__(self):
        self.logged = []

    def init(self, **kwargs):
        return self

    def log(self, data, step):
        self.logged.append((step, data))

    def Table(self, columns, data):  # noqa: N802 (wandb's name)
        return {"columns": columns, "data": [list(row) for row in data]}


class _FakeMlflow:
    def __init__(self):
        self.dicts = {}

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def log_dict(self, data, artifact_file):
        self.dicts[artifact_file] = data


def test_wandb_gets_verls_growing_table_and_mlflow_a_json_artifact(tmp_path, monkeypatch):
    fakes = {"wandb": _FakeWandb(), "mlflow": _FakeMlflow()}
    monkeypatch.setattr("hybridflow.trainer.tracking.import_optional", lambda backend: fakes[backend])
    tracker = Tracking(["wandb", "mlflow"], _run(tmp_path))
    tracker.log_generations(SAMPLES, step=1)
    tracker.log_generations(SAMPLES[::-1], step=3)
    step, logged = fakes["wandb"].logged[-1]
    assert step == 3 and logged["val/generations"] == {
        "columns": ["step", "input_1", "output_1", "score_1", "input_2", "output_2", "score_2"],
        "data": [[1, *SAMPLES[0], *SAMPLES[1]], [3, *SAMPLES[1], *SAMPLES[0]]],
    }
    assert fakes["mlflow"].dicts["val_step1.json"] == [
        {"input": "What is [2+2]?", "output": "4", "score": 1.0}, {"input": "What is 3*3?", "output": "nine", "score": 0.0},
    ]
