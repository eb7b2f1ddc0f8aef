"""Run-folder layout, the atomic ``latest`` pointer, resume modes and driver RNG state."""

import random

import numpy as np
import pytest
import torch

from hybridflow.checkpoints.manager import CheckpointError, CheckpointManager, capture_rng_state, restore_rng_state


def _save(manager, step):
    step_dir = manager.prepare_step_dir(step)
    manager.save_driver_state(step_dir, {"global_step": step})
    manager.mark_latest(step)
    return step_dir


def test_auto_resumes_from_latest_and_fresh_without_one(tmp_path):
    manager = CheckpointManager(tmp_path, "auto")
    assert manager.resume_dir() is None
    _save(manager, 1)
    _save(manager, 2)
    assert manager.resume_dir() == tmp_path / "global_step_2"
    assert manager.load_driver_state(manager.resume_dir())["global_step"] == 2
    assert (tmp_path / "latest").read_text().strip() == "global_step_2"
    assert not list(tmp_path.glob(".latest*"))


def test_a_half_written_step_is_ignored_and_replaced(tmp_path):
    manager = CheckpointManager(tmp_path, "auto")
    _save(manager, 1)
    half = manager.prepare_step_dir(2)
    (half / "actor").mkdir()  # killed before driver_state and latest
    assert manager.resume_dir() == tmp_path / "global_step_1"
    assert not (manager.prepare_step_dir(2) / "actor").exists()


def test_disable_and_explicit_path(tmp_path):
    manager = CheckpointManager(tmp_path, "auto")
    first = _save(manager, 1)
    _save(manager, 2)
    assert CheckpointManager(tmp_path, "disable").resume_dir() is None
    assert CheckpointManager(tmp_path, str(first)).resume_dir() == first
    assert CheckpointManager(tmp_path, "resume_path", resume_from_path=str(first)).resume_dir() == first
    with pytest.raises(CheckpointError, match="trainer.resume_mode="):
        CheckpointManager(tmp_path, str(tmp_path / "global_step_9")).resume_dir()


def _save_roles(manager, step, roles=("actor", "critic")):
    step_dir = manager.prepare_step_dir(step)
    for role in roles:
        (step_dir / role).mkdir()
    manager.save_driver_state(step_dir, {"global_step": step})
    manager.mark_latest(step)


def _saved(tmp_path):
    """{step folder: its role folders} of the run folder."""
    return {
        path.name: sorted(p.name for p in path.iterdir() if p.is_dir())
        for path in sorted(tmp_path.glob("global_step_*"))
    }


def test_max_to_keep_prunes_the_oldest_of_each_role_as_verl_does(tmp_path):
    manager = CheckpointManager(tmp_path, "auto", max_to_keep={"actor": 2, "critic": 1})
    for step in (1, 2, 3):
        _save_roles(manager, step)
    # Step 1 lost both roles, so the folder went; step 2 keeps its actor (and its driver state).
    assert _saved(tmp_path) == {"global_step_2": ["actor"], "global_step_3": ["actor", "critic"]}
    assert (tmp_path / "global_step_2" / "driver_state.pt").exists()


@pytest.mark.parametrize("count", [None, 0])
def test_no_count_or_zero_keeps_every_checkpoint(tmp_path, count):
    manager = CheckpointManager(tmp_path, "auto", max_to_keep={"actor": count, "critic": count})
    for step in (1, 2, 3):
        _save_roles(manager, step)
    assert len(_saved(tmp_path)) == 3


def test_a_run_without_critic_prunes_whole_folders_and_a_resumed_run_counts_the_old_ones(tmp_path):
    for steps in ((1, 2), (3,)):  # the second manager is a resumed run's
        manager = CheckpointManager(tmp_path, "auto", max_to_keep={"actor": 2, "critic": 1})
        for step in steps:
            _save_roles(manager, step, roles=("actor",))
    assert _saved(tmp_path) == {"global_step_2": ["actor"], "global_step_3": ["actor"]}


def test_rng_state_round_trip():
    state = capture_rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
