"""The entry points' error boundary: a user's error is its own lines and an exit code; a bug keeps its traceback."""

import tempfile

import pytest

from hybridflow.config.load import ConfigError
from hybridflow.distributed.errors import WorkerError
from hybridflow.errors import HybridflowError, RunInterrupted
from hybridflow.trainer.error_boundary import FULL_ERROR_ENV, error_boundary


def _stopped(error, capsys):
    def body():
        raise error

    with pytest.raises(SystemExit) as stopped, error_boundary("test"):
        body()
    return stopped.value.code, capsys.readouterr()


def test_an_error_raised_on_purpose_is_one_line_and_its_traceback_goes_to_a_file(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv(FULL_ERROR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    code, out = _stopped(
        HybridflowError("data.train_files row 3: prompt is not a list of messages; fix the row"), capsys
    )
    assert code == 1
    assert out.err == "hybridflow: error: data.train_files row 3: prompt is not a list of messages; fix the row\n"
    log = next(tmp_path.glob("hybridflow_test_error_*.log"))
    assert "Traceback" in log.read_text() and str(log) in out.out


def test_the_full_traceback_is_shown_when_asked(capsys, monkeypatch):
    monkeypatch.setenv(FULL_ERROR_ENV, "1")
    code, out = _stopped(HybridflowError("bad thing; fix it"), capsys)
    assert code == 1 and "Traceback" in out.err and out.err.endswith("hybridflow: error: bad thing; fix it\n")


def test_config_errors_exit_2_without_a_traceback_file(capsys, monkeypatch):
    monkeypatch.delenv(FULL_ERROR_ENV, raising=False)
    code, out = _stopped(ConfigError(["a.b=1 must be > 1"]), capsys)
    assert (code, out.err, out.out) == (2, "hybridflow: error: invalid config: a.b=1 must be > 1\n", "")


def test_ctrl_c_exits_130(capsys, monkeypatch):
    monkeypatch.delenv(FULL_ERROR_ENV, raising=False)
    code, out = _stopped(RunInterrupted("stopped at step 3; the same command resumes from global_step_2"), capsys)
    assert code == 130 and out.err.startswith("hybridflow: error: stopped at step 3")
    code, out = _stopped(KeyboardInterrupt(), capsys)
    assert code == 130 and "interrupted (Ctrl-C)" in out.err


def test_a_workers_user_error_is_named_by_group_rank_and_method(capsys, monkeypatch):
    monkeypatch.delenv(FULL_ERROR_ENV, raising=False)
    error = WorkerError(
        "actor_rollout",
        1,
        "actor.init_model",
        "Traceback ...\nModelLoadError: x",
        "ModelLoadError",
        "model.safetensors is truncated; re-download it",
        user_facing=True,
    )
    code, out = _stopped(error, capsys)
    assert code == 1
    assert out.err == (
        "hybridflow: error: worker group 'actor_rollout' rank 1 (actor.init_model): "
        "model.safetensors is truncated; re-download it\n"
    )
    died = WorkerError("critic", 0, "critic.update_critic", "RayActorError", "ActorDiedError", "", process_died=True)
    assert "died or was killed" in _stopped(died, capsys)[1].err


def test_a_bug_keeps_its_traceback(capsys):
    with pytest.raises(ZeroDivisionError), error_boundary("test"):
        _ = 1 / 0
    bug = WorkerError("actor_rollout", 0, "actor.update_actor", "Traceback ...\nZeroDivisionError", "ZeroDivisionError")
    with pytest.raises(WorkerError), error_boundary("test"):
        raise bug
    assert capsys.readouterr().err == ""


def test_an_error_under_hydra_set_up_without_a_run_is_still_one_line(capsys, monkeypatch, tmp_path):
    """Hydra's compose API leaves no run output folder: the traceback goes to the temporary folder instead."""
    from hydra import compose, initialize_config_module
    from hydra.core.hydra_config import HydraConfig

    monkeypatch.delenv(FULL_ERROR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with initialize_config_module(config_module="hybridflow.config.yaml", version_base=None):
        HydraConfig.instance().set_config(compose(config_name="ppo_trainer", return_hydra_config=True))
        try:
            code, out = _stopped(HybridflowError("bad thing; fix it"), capsys)
        finally:
            HydraConfig.instance().cfg = None
    assert code == 1 and out.err == "hybridflow: error: bad thing; fix it\n"
    assert next(tmp_path.glob("hybridflow_test_error_*.log"))
