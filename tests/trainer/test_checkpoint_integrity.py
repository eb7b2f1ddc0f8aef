"""Checkpoints you can trust: a manifest per checkpoint, a damaged latest falls back to the newest intact one,
and a full disk while saving is named as such with the previous checkpoint kept."""

import errno
import json
import os
import shutil

import pytest

from hybridflow.checkpoints.integrity import checkpoint_damage, free_space
from hybridflow.checkpoints.manager import CheckpointError, CheckpointManager
from hybridflow.distributed.errors import WorkerError

# Every write to /dev/full fails with ENOSPC: a real full disk, one file at a time.
FULL = "/dev/full"
needs_dev_full = pytest.mark.skipif(not os.path.exists(FULL), reason="needs /dev/full (Linux)")


def _save(manager, step, weights=b"w" * 1000):
    with manager.saving(step) as step_dir:
        (step_dir / "actor").mkdir()
        (step_dir / "actor" / "model.distcp").write_bytes(weights)
        manager.save_driver_state(step_dir, {"global_step": step})
    return step_dir


def test_the_manifest_records_every_file_with_its_size(tmp_path):
    step_dir = _save(CheckpointManager(tmp_path), 1)
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert sorted(manifest) == ["actor/model.distcp", "driver_state.pt"]
    assert manifest["actor/model.distcp"][0] == 1000
    assert checkpoint_damage(step_dir) is None


@pytest.mark.parametrize(
    "damage, expected",
    [
        (
            lambda d: (d / "actor" / "model.distcp").write_bytes(b"w" * 10),
            "global_step_3/actor/model.distcp has 10 bytes, 1000 recorded",
        ),
        (
            lambda d: (d / "actor" / "model.distcp").write_bytes(b"x" * 1000),
            "global_step_3/actor/model.distcp differs from its recorded checksum",
        ),
        (lambda d: (d / "driver_state.pt").unlink(), "global_step_3/driver_state.pt is missing"),
    ],
)
def test_a_damaged_latest_falls_back_to_the_newest_intact_checkpoint_and_says_so(tmp_path, capsys, damage, expected):
    manager = CheckpointManager(tmp_path, "auto")
    for step in (1, 2, 3):
        _save(manager, step)
    damage(tmp_path / "global_step_3")
    assert manager.resume_dir() == tmp_path / "global_step_2"
    assert (
        f"checkpoint global_step_3 is damaged ({expected}); resuming from global_step_2 instead"
        in capsys.readouterr().out
    )


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
    with pytest.raises(
        CheckpointError,
        match=r"points at global_step_1, which is damaged \(global_step_1/actor/model.distcp is missing\)"
        r".*resume_mode=disable",
    ):
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


DISK_FULL = (
    r"disk full while writing checkpoint .*global_step_2 \(\d+ MiB free on /.*\); "
    r"the previous checkpoint global_step_1 is kept"
)


@needs_dev_full
@pytest.mark.parametrize("full_file", ["driver_state.pt", ".manifest.json.tmp"])
def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(tmp_path, full_file):
    """torch.save of the driver state, or the manifest written last, meets a real ENOSPC."""
    manager = CheckpointManager(tmp_path, "auto")
    _save(manager, 1)
    with pytest.raises(CheckpointError, match=DISK_FULL) as raised:
        with manager.saving(2) as step_dir:
            (step_dir / full_file).symlink_to(FULL)
            manager.save_driver_state(step_dir, {"global_step": 2})
    assert "\n" not in str(raised.value)
    assert not step_dir.exists()
    assert (tmp_path / "latest").read_text().strip() == "global_step_1"
    assert CheckpointManager(tmp_path, "auto").resume_dir() == tmp_path / "global_step_1"


def test_a_full_disk_in_a_worker_is_named_from_its_traceback(tmp_path):
    manager = CheckpointManager(tmp_path, "auto")
    failure = WorkerError(
        "actor_rollout",
        1,
        "actor.save_checkpoint",
        "Traceback ...\nOSError: [Errno 28] No space left on device",
        "CheckpointException",
    )
    with pytest.raises(CheckpointError, match=r"global_step_1 .*; no earlier checkpoint exists;"):
        with manager.saving(1):
            raise failure
    assert not (tmp_path / "global_step_1").exists() and not (tmp_path / "latest").exists()


def test_free_space_names_the_mount_point(tmp_path):
    assert free_space(tmp_path / "not" / "yet").endswith(f" MiB free on {_mount_of(tmp_path)}")


def _mount_of(path):
    path = path.resolve()
    while not os.path.ismount(path):
        path = path.parent
    return path


def test_the_fallback_is_checked_and_said_once(tmp_path, capsys):
    manager = CheckpointManager(tmp_path, "auto")
    _save(manager, 1)
    _save(manager, 2)
    (tmp_path / "global_step_2" / "driver_state.pt").write_bytes(b"")
    assert manager.resume_dir(announce=False) == tmp_path / "global_step_1"
    assert capsys.readouterr().out == ""
    (tmp_path / "global_step_1" / "driver_state.pt").write_bytes(b"")  # not looked at again
    assert manager.resume_dir() == manager.resume_dir() == tmp_path / "global_step_1"
    assert capsys.readouterr().out.count("resuming from global_step_1 instead") == 1


def test_other_errors_while_saving_pass_through(tmp_path):
    manager = CheckpointManager(tmp_path, "auto")
    with pytest.raises(PermissionError), manager.saving(1):
        raise PermissionError(errno.EACCES, "denied")
