"""A resume that cannot continue the saved run exactly, found before anything starts.

A checkpoint records the values of :data:`RESUME_KEYS` (``driver_state.pt``, key ``resume_keys``). When the
run would resume (``trainer.resume_mode`` auto with a ``latest`` checkpoint, or a path), each of those values
that differs now is one line naming the key, both values and the three ways out. A checkpoint saved before
the keys were recorded is compared on what its data loader state holds (batch size, seed, shuffle).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

from hybridflow.checkpoints.integrity import MANIFEST_FILE
from hybridflow.checkpoints.manager import ACTOR_DIR, CRITIC_DIR, DRIVER_STATE_FILE, CheckpointError, CheckpointManager
from hybridflow.config.schema import PPOTrainerConfig
from hybridflow.errors import HybridflowError

STATE_KEY = "resume_keys"
WORLD_SIZE = "trainer.nnodes * trainer.n_gpus_per_node"
USES_CRITIC = "critic (critic.enable, or an estimator that needs values)"
# What a checkpoint's state depends on: the data position counts batches of train_batch_size prompts in the
# order data.seed/shuffle give; the optimizer and scheduler count mini-batches of responses; the worker states
# are per rank; the critic and LoRA states exist only with a critic and with that adapter rank; a one-step-off
# checkpoint (hybrid_engine=false) holds the next step's samples, which a synchronous run would not train on; a
# fully async one holds a queue of samples and the staleness budget its settings sized; verl's V1 modes hold the
# prompt groups in flight their warm-up sized (colocate_async) or a queue and a step of passes (separate_async).
RESUME_KEYS = (
    "data.train_batch_size",
    "data.seed",
    "data.shuffle",
    "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.hybrid_engine",
    "async_training.enable",
    "async_training.staleness_threshold",
    "async_training.trigger_parameter_sync_step",
    "async_training.require_batches",
    "async_training.concurrent_samples_per_replica",
    "trainer.v1.trainer_mode",
    "trainer.v1.colocate_async.num_warmup_batches",
    "trainer.v1.separate_async.num_warmup_batches",
    "trainer.v1.separate_async.parameter_sync_step",
    WORLD_SIZE,
    USES_CRITIC,
)
# An older checkpoint's data loader state: its key -> the config key it holds.
LOADER_KEYS = {"batch_size": "data.train_batch_size", "seed": "data.seed", "shuffle": "data.shuffle"}
FIX = "start a new run: a new trainer.default_local_dir, or trainer.resume_mode=disable"


def resume_keys(config: PPOTrainerConfig, uses_critic: bool) -> dict[str, Any]:
    """The values of :data:`RESUME_KEYS` in ``config``, as saved with a checkpoint."""
    values = {key: _value(config, key) for key in RESUME_KEYS[:-2]}
    values[WORLD_SIZE] = config.trainer.nnodes * config.trainer.n_gpus_per_node
    values[USES_CRITIC] = uses_critic
    return values


def resume_errors(config: PPOTrainerConfig, uses_critic: bool) -> list[str]:
    """One line per saved value the resumed run would change, or why the checkpoint cannot be read."""
    trainer = config.trainer
    if trainer.resume_mode == "disable" or (trainer.resume_mode == "resume_path" and not trainer.resume_from_path):
        return []  # nothing to resume from, or validate names the missing resume_from_path
    manager = CheckpointManager(trainer.default_local_dir, trainer.resume_mode, trainer.resume_from_path)
    try:
        step_dir = manager.resume_dir(announce=False)  # the run itself says which checkpoint it falls back to
    except CheckpointError as error:
        return [] if _named_by_validate(trainer) else [str(error)]
    if step_dir is None:
        return []
    try:
        state = manager.load_driver_state(step_dir)
    except Exception as error:  # torch.load of a damaged file raises whatever its unpickler meets
        reason = str(error).split(". ")[0]  # torch's zip errors go on for five sentences
        return [
            f"trainer.resume_mode={trainer.resume_mode}: {step_dir / DRIVER_STATE_FILE} cannot be read "
            f"({type(error).__name__}: {reason}); resume from another global_step_N folder, or {FIX}"
        ]
    saved = _saved_keys(state)
    now = resume_keys(config, uses_critic)
    return [
        f"resuming from {step_dir} would change {key} (saved {saved[key]!r}, now {now[key]!r}), and the run could "
        f"not continue exactly; restore the saved value, or {FIX}"
        for key in RESUME_KEYS
        if key in saved and saved[key] != now[key]
    ] + _missing_part_errors(config, uses_critic, step_dir)


def _missing_part_errors(config: PPOTrainerConfig, uses_critic: bool, step_dir: pathlib.Path) -> list[str]:
    """A ``load_contents`` part (model or extra) that a role's checkpoint did not save (its manifest says which
    it holds; a missing optimizer is left fresh, as the worker does)."""
    roles = {ACTOR_DIR: "actor_rollout_ref.actor.checkpoint.load_contents"}
    if uses_critic:
        roles[CRITIC_DIR] = "critic.checkpoint.load_contents"
    sections = {ACTOR_DIR: config.actor_rollout_ref.actor.checkpoint, CRITIC_DIR: config.critic.checkpoint}
    errors = []
    for folder, key in roles.items():
        manifest = step_dir / folder / MANIFEST_FILE
        if not manifest.is_file():
            continue  # the checkpoint's integrity check names a missing manifest
        held = set(json.loads(manifest.read_text()).get("contents", []))
        missing = [part for part in sections[folder].load_contents if part in ("model", "extra") and part not in held]
        if missing:
            errors.append(
                f"{key} asks for {missing}, but {step_dir / folder} holds {sorted(held)}; drop them from {key}, or "
                f"{FIX}"
            )
    return errors


class ResumeMismatchError(HybridflowError):
    """The checkpoint to resume from was saved by a run this one cannot continue exactly."""


def check_data_position(checkpoints: CheckpointManager, train_loader: Any) -> None:
    """The saved data position counts batches of a training set of the same size (after filtering and
    ``train_max_samples``), which only the loaded dataset knows; a different size would replay other batches."""
    step_dir = checkpoints.resume_dir()
    if step_dir is None:
        return
    saved = checkpoints.load_driver_state(step_dir)["data_loader"].get("num_samples")
    now = train_loader.state_dict()["num_samples"]
    if saved is not None and saved != now:
        raise ResumeMismatchError(
            f"resuming from {step_dir}: the training set has {now} prompts now (after filtering and "
            f"data.train_max_samples) and had {saved} when the checkpoint was saved, so the saved data position "
            f"would replay other batches; restore data.train_files and the data settings, or {FIX}"
        )


def _named_by_validate(trainer: Any) -> bool:
    """A resume path with no driver_state.pt at all: validate's check names it already."""
    if trainer.resume_mode == "auto":
        return False
    path = trainer.resume_from_path if trainer.resume_mode == "resume_path" else trainer.resume_mode
    return not (pathlib.Path(path) / DRIVER_STATE_FILE).exists()


def _saved_keys(state: dict[str, Any]) -> dict[str, Any]:
    if STATE_KEY in state:
        return dict(state[STATE_KEY])
    loader = state.get("data_loader", {})
    return {key: loader[name] for name, key in LOADER_KEYS.items() if name in loader}


def _value(config: Any, key: str) -> Any:
    for part in key.split("."):
        config = getattr(config, part)
    return config
