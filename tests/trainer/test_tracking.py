"""The tracking backends write what they promise, and the optional ones fail clearly when absent."""

import importlib.util

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
    with pytest.raises(ValueError, match=r"trainer.logger='tensorbord'.*console, jsonl"):
        Tracking(["tensorbord"], _run(tmp_path))
    assert {"console", "jsonl", "tensorboard", "mlflow", "wandb"} <= set(LOGGER_BACKENDS.names())
