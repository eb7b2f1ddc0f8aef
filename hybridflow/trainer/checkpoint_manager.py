"""The driver's side of checkpointing: the run folder layout, the ``latest`` pointer, and what to resume.

Layout under ``trainer.default_local_dir``::

    global_step_4/
        actor/              written by the actor workers (model, optimizer, scheduler, worker RNG)
        critic/             written by the critic workers, when there is a critic
        driver_state.pt     global step, data position, driver RNG, KL controller, rollout seed
        manifest.json       every file above with its size and BLAKE2b checksum, written once they are all on disk
    latest                  "global_step_4": written last, atomically, once every part above is on disk

A run killed mid-save leaves a folder without a ``latest`` pointing at it, so a resume ignores it. Resume
checks the manifest: when the latest checkpoint is damaged (a file missing, truncated or changed) or has no
manifest, the run says which file and resumes from the newest intact one. A checkpoint that ``latest`` points
at and that has no manifest at all was written before manifests existed and is trusted as before. A full disk
while saving removes the partial folder and says so; ``latest`` keeps pointing at the previous checkpoint.
``trainer.max_actor_ckpt_to_keep`` / ``max_critic_ckpt_to_keep`` keep the newest N ``actor/`` / ``critic/``
folders; a ``global_step_N`` folder left with neither is deleted.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pathlib
import random
import re
import shutil
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from hybridflow.distributed.errors import WorkerError
from hybridflow.errors import HybridflowError

LATEST_FILE = "latest"
DRIVER_STATE_FILE = "driver_state.pt"
MANIFEST_FILE = "manifest.json"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
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

    def step_dir(self, global_step: int) -> pathlib.Path:
        return self.root_dir / step_dir_name(global_step)

    def latest_step_dir(self) -> pathlib.Path | None:
        """The newest intact checkpoint: the one ``latest`` points at, or, when that one is damaged, the newest
        other whose manifest checks out (saying so); None when nothing was ever fully saved."""
        pointer = self.root_dir / LATEST_FILE
        if not pointer.exists():
            return None
        step_dir = self.root_dir / pointer.read_text().strip()
        damage = checkpoint_damage(step_dir, legacy_ok=True)
        if damage is None:
            return step_dir
        intact = next((path for path in reversed(self._step_dirs()) if path != step_dir
                       and checkpoint_damage(path) is None), None)
        if intact is None:
            raise CheckpointError(
                f"{pointer} points at {step_dir.name}, which is damaged ({damage}), and no earlier checkpoint in "
                f"{self.root_dir} is intact; set trainer.resume_mode=disable (or a new trainer.default_local_dir) "
                "to start fresh"
            )
        print(f"[hybridflow] warning: checkpoint {step_dir.name} is damaged ({damage}); resuming from {intact.name} instead",
              flush=True)
        return intact

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

    def resume_dir(self) -> pathlib.Path | None:
        """The checkpoint folder to resume from under the configured ``resume_mode``, or None."""
        if self.resume_mode == "disable":
            return None
        if self.resume_mode == "auto":
            return self.latest_step_dir()
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
        torch.save(state, step_dir / DRIVER_STATE_FILE)

    def load_driver_state(self, step_dir: pathlib.Path) -> dict[str, Any]:
        # Our own file, holding numpy RNG state and sampler state, so not a weights-only load.
        return torch.load(step_dir / DRIVER_STATE_FILE, weights_only=False)

    @contextlib.contextmanager
    def saving(self, step_dir: pathlib.Path) -> Iterator[None]:
        """Writing ``step_dir``: a full disk (here or in a worker) removes it and says so; ``latest`` is untouched."""
        try:
            yield
        except (OSError, WorkerError) as error:
            if not _disk_full(error):
                raise
            shutil.rmtree(step_dir, ignore_errors=True)
            usage = shutil.disk_usage(self.root_dir)
            latest = self.root_dir / LATEST_FILE
            kept = latest.read_text().strip() if latest.exists() else "none (no checkpoint was saved before)"
            raise CheckpointError(
                f"disk full while writing checkpoint {step_dir} ({usage.free / 2**20:.0f} MiB free of "
                f"{usage.total / 2**30:.1f} GiB); the previous checkpoint is kept: {kept}; free space (or lower "
                "trainer.max_actor_ckpt_to_keep) and run the same command to resume"
            ) from error

    def mark_latest(self, global_step: int) -> None:
        """Record the step's manifest, point ``latest`` at it (temp file + os.replace, so a reader never sees
        half a name), then delete the oldest checkpoints beyond ``max_to_keep``."""
        write_manifest(self.step_dir(global_step))
        pointer = self.root_dir / LATEST_FILE
        temporary = self.root_dir / f".{LATEST_FILE}.tmp"
        temporary.write_text(step_dir_name(global_step) + "\n")
        os.replace(temporary, pointer)
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


def _disk_full(error: BaseException) -> bool:
    if isinstance(error, OSError):
        return error.errno in DISK_FULL
    return any(os.strerror(code) in error.remote_traceback for code in DISK_FULL)


def _checksum(path: pathlib.Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(step_dir: pathlib.Path) -> None:
    """``manifest.json``: each file of ``step_dir`` (relative path) with its size and checksum; written atomically."""
    files = sorted(path for path in step_dir.rglob("*") if path.is_file() and path.name != MANIFEST_FILE)
    manifest = {str(path.relative_to(step_dir)): [path.stat().st_size, _checksum(path)] for path in files}
    temporary = step_dir / f".{MANIFEST_FILE}.tmp"
    temporary.write_text(json.dumps(manifest, indent=0))
    os.replace(temporary, step_dir / MANIFEST_FILE)


def checkpoint_damage(step_dir: pathlib.Path, legacy_ok: bool = False) -> str | None:
    """What is wrong with the checkpoint in ``step_dir`` (the first file that differs from its manifest), or None.

    ``legacy_ok``: a folder with ``driver_state.pt`` but no manifest was written before manifests existed."""
    manifest_file = step_dir / MANIFEST_FILE
    if not step_dir.is_dir():
        return f"{step_dir} does not exist"
    if not manifest_file.is_file():
        if legacy_ok and (step_dir / DRIVER_STATE_FILE).is_file():
            return None
        return f"{step_dir.name} has no {MANIFEST_FILE}: its save did not finish"
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as error:
        return f"{manifest_file} is unreadable ({error})"
    for name, (size, checksum) in manifest.items():
        path = step_dir / name
        if not path.is_file():
            return f"{step_dir.name}/{name} is missing"
        if path.stat().st_size != size:
            return f"{step_dir.name}/{name} has {path.stat().st_size} bytes, {size} recorded"
        if _checksum(path) != checksum:
            return f"{step_dir.name}/{name} differs from its recorded checksum"
    return None
