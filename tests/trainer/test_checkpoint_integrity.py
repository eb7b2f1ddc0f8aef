"""Checkpoints you can trust: a manifest per checkpoint, a damaged latest falls back to the newest intact one,
and a full disk while saving is named as such with the previous checkpoint kept."""

import errno
import json
import shutil

import pytest

from hybridflow.distributed.errors import WorkerError
from hybridflow.trainer.checkpoint_manager import CheckpointError, CheckpointManager, checkpoint_damage


def _save(manager, step, weights=b"w" * 1000):
    step_dir = manager.prepare_step_dir(step)
    with manager.saving(step_dir):
        (step_dir / "actor").mkdir()
        (step_dir / "actor" / "model.distcp").write_bytes(weights)
        manager.save_driver_state(step_dir, {"global_step": step})
    manager.mark_latest(step)
    return step_dir


def test_the_manifest_records_every_file_with_its_size(tmp_path):
    step_dir = _save(CheckpointManager(tmp_path), 1)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert sorted(manifest) == ["actor/model.distcp", "driver_state.pt"]
    assert manifest["actor/model.distcp"][0] == 1000
    assert checkpoint_damage(step_dir) is None


@pytest.mark.parametrize("damage, expected", [
    (lambda d: (d / "actor" / "model.distcp").write_bytes(b"w" * 10), "global_step_3/actor/model.distcp has 10 bytes, 1000 recorded"),
    (lambda d: (d / "actor" / "model.distcp").write_bytes(b"x" * 1000), "global_step_3/actor/model.distcp differs from its recorded checksum"),
    (lambda d: (d / "driver_state.pt").unlink(), "global_step_3/driver_state.pt is missing"),
])
def test_a_damaged_latest_falls_back_to_the_newest_intact_checkpoint_and_says_so(tmp_path, capsys, damage, expected):
    manager = CheckpointManager(tmp_path, "auto")
    for step in (1, 2, 3):
        _save(manager, step)
    damage(tmp_path / "global_step_3")
    assert manager.resume_dir() == tmp_path / "global_step_2"
    assert f"checkpoint global_step_3 is damaged ({expected}); resuming from global_step_2 instead" in capsys.readouterr().out


def test_a_folder_whose_save_did_not_finish_is_not_a_fallback(tmp_path, capsys):
    manager = CheckpointManager(tmp_path, "auto")
    _save(manager, 1)
    _save(manager, 2)
    (tmp_path / "global_step_3").mkdir()  # a later, unfinished save: no manifest
    (tmp_path / "global_step_2" / "driver_state.pt").write_bytes(b"")
    assert manager.resume_dir() == tmp_path / "global_step_1"


def test_no_intact_checkpoint_is_one_error_naming_the_damage(tmp_path):
    manager = CheckpointManager(tmp_path, "auto")
    _save(manager, 1)
    (tmp_path / "global_step_1" / "actor" / "model.distcp").unlink()
    with pytest.raises(CheckpointError, match=r"points at global_step_1, which is damaged \(global_step_1/actor/model.distcp is missing\).*resume_mode=disable"):
        manager.resume_dir()


def test_a_latest_pointing_at_a_deleted_step_falls_back(tmp_path, capsys):
    manager = CheckpointManager(tmp_path, "auto")
    _save(manager, 1)
    _save(manager, 2)
    shutil.rmtree(tmp_path / "global_step_2")
    assert manager.resume_dir() == tmp_path / "global_step_1"
    assert "global_step_2 does not exist" in capsys.readouterr().out


def test_a_damaged_explicit_resume_path_is_refused(tmp_path):
    _save(CheckpointManager(tmp_path), 1)
    (tmp_path / "global_step_1" / "actor" / "model.distcp").write_bytes(b"")
    with pytest.raises(CheckpointError, match="which is damaged"):
        CheckpointManager(tmp_path, str(tmp_path / "global_step_1")).resume_dir()


@pytest.mark.parametrize("failure", [
    OSError(errno.ENOSPC, "No space left on device"),
    WorkerError("actor_rollout", 0, "actor.save_checkpoint", "Traceback ...\nOSError: [Errno 28] No space left on device", "OSError"),
])
def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(tmp_path, failure):
    manager = CheckpointManager(tmp_path, "auto")
    _save(manager, 1)
    step_dir = manager.prepare_step_dir(2)
    with pytest.raises(CheckpointError, match=r"disk full while writing checkpoint .*global_step_2 .*the previous checkpoint is kept: global_step_1"):
        with manager.saving(step_dir):
            (step_dir / "actor").mkdir()
            raise failure
    assert not step_dir.exists()
    assert manager.resume_dir() == tmp_path / "global_step_1"


def test_other_errors_while_saving_pass_through(tmp_path):
    manager = CheckpointManager(tmp_path, "auto")
    step_dir = manager.prepare_step_dir(1)
    with pytest.raises(PermissionError), manager.saving(step_dir):
        raise PermissionError(errno.EACCES, "denied")
