"""A resume that could not continue the saved run exactly is refused by the config check, one line per key.

The checkpoint is a real one: the driver's own ``save_checkpoint`` (with in-process fake workers) writes it.
"""

import shutil

import pytest

from hybridflow.checkpoints.manager import CheckpointManager
from hybridflow.config.load import load_config
from hybridflow.config.resume_checks import STATE_KEY, WORLD_SIZE, ResumeMismatchError
from hybridflow.trainer.main_ppo import build_trainer
from tests.trainer.fake_workers import FakeWorkers
from tests.trainer.helpers import compose_config, config_errors, tiny_run_overrides


@pytest.fixture()
def saved(tiny_model_dir, tiny_parquet, tmp_path):
    """The overrides of a run that saved global_step_1 in its run folder (1 step, fake workers)."""
    overrides = tiny_run_overrides(tiny_model_dir, tiny_parquet, tmp_path / "run") + [
        "trainer.total_training_steps=1",
        "trainer.save_freq=1",
        "trainer.val_before_train=false",
    ]
    trainer = build_trainer(load_config(compose_config(overrides)))
    trainer.init_workers(start_workers=FakeWorkers())
    try:
        trainer.fit()
    finally:
        trainer.shutdown()
    return overrides


def test_a_resume_that_changes_saved_sizes_names_each_key_and_both_values(saved, tmp_path):
    step_dir = tmp_path / "run" / "global_step_1"
    assert load_config(compose_config(saved + ["trainer.total_training_steps=2"]))  # a longer run resumes
    errors = config_errors(saved + ["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4"])
    assert errors == [
        f"resuming from {step_dir} would change {key} (saved {old}, now {new}), and the run could not continue "
        "exactly; restore the saved value, or start a new run: a new trainer.default_local_dir, or "
        "trainer.resume_mode=disable"
        for key, old, new in [("data.train_batch_size", 4, 8), ("actor_rollout_ref.rollout.n", 2, 4)]
    ]
    assert load_config(compose_config(saved + ["data.train_batch_size=8", "trainer.resume_mode=disable"]))


def test_resuming_with_a_critic_the_saved_run_had_not_is_refused(saved):
    errors = config_errors(saved + ["algorithm.adv_estimator=gae"])
    assert len(errors) == 1 and "would change critic (" in errors[0] and "saved False, now True" in errors[0]


def test_resuming_a_synchronous_run_one_step_off_is_refused(saved):
    """A one-step-off checkpoint holds the next step's samples and a synchronous one does not: neither continues
    the other exactly."""
    errors = config_errors(saved + ["actor_rollout_ref.hybrid_engine=false"])
    assert len(errors) == 1 and "would change actor_rollout_ref.hybrid_engine (saved True, now False)" in errors[0]


def test_resuming_a_synchronous_run_in_a_v1_async_mode_is_refused(saved):
    """verl's V1 colocate_async checkpoint holds the prompt groups in flight; a synchronous one has none."""
    errors = config_errors(saved + ["trainer.v1.trainer_mode=colocate_async"])
    assert len(errors) == 1 and "would change trainer.v1.trainer_mode (saved 'sync', now 'colocate_async')" in errors[0]


def test_a_checkpoint_from_before_the_keys_were_saved_is_compared_on_its_data_loader_state(saved, tmp_path):
    manager = CheckpointManager(tmp_path / "run")
    step_dir = manager.latest_step_dir()
    state = manager.load_driver_state(step_dir)
    assert state[STATE_KEY][WORLD_SIZE] == 1
    del state[STATE_KEY]
    manager.save_driver_state(step_dir, state)
    (step_dir / "manifest.json").unlink()  # as old: written before manifests were either
    errors = config_errors(saved + ["data.seed=7", "actor_rollout_ref.rollout.n=4"])
    assert len(errors) == 1 and "would change data.seed (saved 1, now 7)" in errors[0]


def test_an_unreadable_driver_state_is_one_line_naming_the_folder(saved, tmp_path):
    driver_state = tmp_path / "run" / "global_step_1" / "driver_state.pt"
    driver_state.write_bytes(driver_state.read_bytes()[:100])
    errors = config_errors(saved)
    assert len(errors) == 1 and "global_step_1/driver_state.pt has 100 bytes" in errors[0], errors
    (driver_state.parent / "manifest.json").unlink()  # a checkpoint from before manifests: torch.load finds it
    errors = config_errors(saved)
    assert len(errors) == 1 and f"{driver_state} cannot be read (RuntimeError: " in errors[0], errors


def test_a_latest_pointer_to_a_deleted_checkpoint_is_one_line_before_start(saved, tmp_path):
    shutil.rmtree(tmp_path / "run" / "global_step_1")
    errors = config_errors(saved)
    assert len(errors) == 1 and "global_step_1" in errors[0], errors


def test_a_training_set_of_another_size_is_refused_once_it_is_loaded(saved):
    with pytest.raises(ResumeMismatchError, match=r"has 12 prompts now .* and had 16 when the checkpoint was saved"):
        build_trainer(load_config(compose_config(saved + ["data.train_max_samples=12"])))


def test_a_damaged_checkpoint_given_as_the_resume_path_is_one_line(saved, tmp_path):
    step_dir = tmp_path / "run" / "global_step_1"
    (step_dir / "actor" / "version").write_text("changed after the manifest was written")
    errors = config_errors(saved + [f"trainer.resume_mode={step_dir}"])
    assert len(errors) == 1 and f"asks to resume from {step_dir}, which is damaged" in errors[0], errors


def test_a_part_to_load_that_the_checkpoint_did_not_save_is_refused_before_start(saved, tmp_path):
    """The role's manifest (as ``workers/checkpoint.save_checkpoint`` writes it) says which parts it holds."""
    actor_dir = tmp_path / "run" / "global_step_1" / "actor"
    actor_dir.mkdir(parents=True, exist_ok=True)
    (actor_dir / "manifest.json").write_text('{"contents": ["model"], "world_size": 1}')
    assert config_errors(saved) == [
        f"actor_rollout_ref.actor.checkpoint.load_contents asks for ['extra'], but {actor_dir} holds ['model']; drop "
        "them from actor_rollout_ref.actor.checkpoint.load_contents, or start a new run: a new "
        "trainer.default_local_dir, or trainer.resume_mode=disable"
    ]
    assert load_config(compose_config(saved + ["actor_rollout_ref.actor.checkpoint.load_contents=[model]"]))
