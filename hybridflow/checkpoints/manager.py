"""The driver's side of checkpointing: the run folder layout, the ``latest`` pointer, and what to resume.

Layout under ``trainer.default_local_dir``::

    global_step_4/
        actor/              written by the actor workers (model, optimizer, scheduler, worker RNG)
        critic/             written by the critic workers, when there is a critic
        driver_state.pt     global step, data position, driver RNG, KL controller, rollout seed
        manifest.json       every file above with its size and BLAKE2b checksum, written once they are all on disk
    latest                  "global_step_4": written last, atomically, once every part above is on disk

A run killed mid-save leaves a folder without a ``latest`` pointing at it, so a resume ignores it. Resume
checks the manifest (``checkpoint_integrity``): when the latest checkpoint is damaged (a file missing,
truncated or changed) or has no manifest, the run says which file and resumes from the newest intact one.
A checkpoint that ``latest`` points at and that has no manifest at all was written before manifests existed
and is trusted as before (only a folder with a manifest is ever a fallback). A full disk while saving (here
or in a worker) removes the partial folder and says so; ``latest`` keeps pointing at the previous checkpoint.
``trainer.max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep`` keep the newest N ``actor/`` / ``critic/``
folders; a ``global_step_N`` folder left with neither is deleted.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import re
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hybridflow.errors import HybridflowError
from hybridflow.checkpoints.integrity import (
    DRIVER_STATE_FILE,
    checkpoint_damage,
    free_space,
    is_disk_full,
    write_manifest,
)

LATEST_FILE = "latest"
STEP_DIR_PATTERN = re.compile(r"^global_step_(\d+)$")
RESUME_MODES = ("auto", "disable", "resume_path")
ACTOR_DIR, CRITIC_DIR = "actor", "critic"
ROLE_DIRS = (ACTOR_DIR, CRITIC_DIR)


class CheckpointError(HybridflowError, RuntimeError):
    """A checkpoint to resume from is missing or incomplete."""


def step_dir_name(global_step: int) -> str:
    return f"global_step_{global_step}"


def capture_rng_state() -> dict[str, Any]:
    """The driver process's Python, numpy and torch random states."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


class CheckpointManager:
    """Decides where checkpoints go and which one (if any) a run resumes from.

    ``resume_mode``: ``auto`` resumes from ``latest`` when there is one, ``disable`` always starts fresh,
    ``resume_path`` resumes from ``resume_from_path``; any other value is itself taken as the path.
    ``max_to_keep`` maps a role folder (``actor``, ``critic``) to how many of its newest checkpoints to keep;
    a missing role, None or a count below 1 keeps all (verl's meaning). Differs from verl: the count includes
    the checkpoints already in the run folder when a run resumes (verl counts only its own process's saves).
    """

    def __init__(
        self,
        root_dir: str | os.PathLike,
        resume_mode: str = "auto",
        resume_from_path: str | None = None,
        max_to_keep: dict[str, int | None] | None = None,
    ):
        self.root_dir = pathlib.Path(root_dir)
        self.resume_mode = resume_mode
        self.resume_from_path = resume_from_path
        self.max_to_keep = dict(max_to_keep or {})
        self._latest: tuple[pathlib.Path | None, str] | None = None  # (newest intact checkpoint, fallback warning)
        self._announced = False

    def step_dir(self, global_step: int) -> pathlib.Path:
        return self.root_dir / step_dir_name(global_step)

    def latest_step_dir(self, announce: bool = True) -> pathlib.Path | None:
        """The newest intact checkpoint: the one ``latest`` points at, or, when that one is damaged, the newest
        other whose manifest checks out; None when nothing was ever fully saved. Checked once per manager; the
        fallback is printed (once) when ``announce``."""
        if self._latest is None:
            self._latest = self._find_latest()
        step_dir, warning = self._latest
        if warning and announce and not self._announced:
            print(f"[hybridflow] warning: {warning}", flush=True)
            self._announced = True
        return step_dir

    def _find_latest(self) -> tuple[pathlib.Path | None, str]:
        pointer = self.root_dir / LATEST_FILE
        if not pointer.exists():
            return None, ""
        step_dir = self.root_dir / pointer.read_text().strip()
        damage = checkpoint_damage(step_dir, legacy_ok=True)
        if damage is None:
            return step_dir, ""
        intact = next((path for path in reversed(self._step_dirs()) if path != step_dir
                       and checkpoint_damage(path) is None), None)
        if intact is None:
            raise CheckpointError(
                f"{pointer} points at {step_dir.name}, which is damaged ({damage}), and no earlier checkpoint in "
                f"{self.root_dir} is intact; set trainer.resume_mode=disable (or a new trainer.default_local_dir) "
                "to start fresh"
            )
        return intact, f"checkpoint {step_dir.name} is damaged ({damage}); resuming from {intact.name} instead"

    def resume_hint(self) -> str:
        """What the same command would resume from, in words (for a run that stops early)."""
        pointer = self.root_dir / LATEST_FILE
        if self.resume_mode == "disable":
            return "trainer.resume_mode=disable, so the same command starts over"
        if self.resume_mode == "auto" and not pointer.exists():
            return f"no checkpoint was saved yet, so the same command starts over (in {self.root_dir})"
        if self.resume_mode == "auto":
            return f"the same command resumes from {self.root_dir / pointer.read_text().strip()}"
        return f"trainer.resume_mode={self.resume_mode!r} resumes from that checkpoint again"

    def resume_dir(self, announce: bool = True) -> pathlib.Path | None:
        """The checkpoint folder to resume from under the configured ``resume_mode``, or None (``announce``: see
        :meth:`latest_step_dir`)."""
        if self.resume_mode == "disable":
            return None
        if self.resume_mode == "auto":
            return self.latest_step_dir(announce)
        path = self.resume_from_path if self.resume_mode == "resume_path" else self.resume_mode
        step_dir = pathlib.Path(path)
        if not (step_dir / DRIVER_STATE_FILE).exists():
            raise CheckpointError(
                f"trainer.resume_mode={self.resume_mode!r} asks to resume from {step_dir}, which has no "
                f"{DRIVER_STATE_FILE}; point it at a global_step_N folder written by a previous run"
            )
        if (damage := checkpoint_damage(step_dir, legacy_ok=True)) is not None:
            raise CheckpointError(
                f"trainer.resume_mode={self.resume_mode!r} asks to resume from {step_dir}, which is damaged "
                f"({damage}); point it at an intact global_step_N folder"
            )
        return step_dir

    def prepare_step_dir(self, global_step: int) -> pathlib.Path:
        """An empty folder for step ``global_step`` (a half-written one from a killed run is removed)."""
        step_dir = self.step_dir(global_step)
        if step_dir.exists():
            shutil.rmtree(step_dir)
        step_dir.mkdir(parents=True)
        return step_dir

    def save_driver_state(self, step_dir: pathlib.Path, state: dict[str, Any]) -> None:
        # Through a Python file: torch's own file writer reports a full disk as "unexpected pos", with no errno.
        with open(step_dir / DRIVER_STATE_FILE, "wb") as handle:
            torch.save(state, handle)

    def load_driver_state(self, step_dir: pathlib.Path) -> dict[str, Any]:
        # Our own file, holding numpy RNG state and sampler state, so not a weights-only load.
        return torch.load(step_dir / DRIVER_STATE_FILE, weights_only=False)

    @contextlib.contextmanager
    def saving(self, global_step: int) -> Iterator[pathlib.Path]:
        """An empty folder for step ``global_step`` to write into; once the body is done, its manifest is written
        and ``latest`` points at it. A full disk (here or in a worker) removes the folder and raises one line
        saying so; ``latest`` still points at the previous checkpoint."""
        step_dir = self.step_dir(global_step)
        try:
            self.prepare_step_dir(global_step)
            yield step_dir
            self.mark_latest(global_step)
        except Exception as error:
            if not is_disk_full(error):
                raise
            shutil.rmtree(step_dir, ignore_errors=True)
            latest = self.root_dir / LATEST_FILE
            kept = (f"the previous checkpoint {latest.read_text().strip()} is kept" if latest.exists()
                    else "no earlier checkpoint exists")
            raise CheckpointError(
                f"disk full while writing checkpoint {step_dir} ({free_space(self.root_dir)}); {kept}; free space "
                "(or keep fewer checkpoints) and run the same command to resume"
            ) from error

    def mark_latest(self, global_step: int) -> None:
        """Record the step's manifest, point ``latest`` at it (temp file + os.replace, so a reader never sees
        half a name), then delete the oldest checkpoints beyond ``max_to_keep``."""
        write_manifest(self.step_dir(global_step))
        pointer = self.root_dir / LATEST_FILE
        temporary = self.root_dir / f".{LATEST_FILE}.tmp"
        temporary.write_text(step_dir_name(global_step) + "\n")
        os.replace(temporary, pointer)
        self._latest = None  # checked again if asked
        self._prune(keep=self.step_dir(global_step))

    def _prune(self, keep: pathlib.Path) -> None:
        """Delete each role's checkpoints beyond its count, oldest first (never ``keep``'s), then the step
        folders that hold no role's checkpoint any more."""
        pruned = set()
        for role, count in self.max_to_keep.items():
            if count is None or count < 1:
                continue
            saved = [path for path in self._step_dirs() if (path / role).is_dir()]
            for path in saved[: max(0, len(saved) - count)]:
                if path != keep:
                    shutil.rmtree(path / role, ignore_errors=True)
                    pruned.add(path)
        for path in pruned:
            if not any((path / role).exists() for role in ROLE_DIRS):
                shutil.rmtree(path, ignore_errors=True)

    def _step_dirs(self) -> list[pathlib.Path]:
        """The run folder's ``global_step_N`` folders, by step."""
        found = [
            (int(match.group(1)), path)
            for path in self.root_dir.iterdir()
            if path.is_dir() and (match := STEP_DIR_PATTERN.match(path.name))
        ]
        return [path for _, path in sorted(found)]
