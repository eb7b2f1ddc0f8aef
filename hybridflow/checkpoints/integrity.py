"""Whether a checkpoint on disk is whole, and whether a failed save failed because the disk is full.

``manifest.json`` lists every file of a ``global_step_N`` folder with its size and BLAKE2b checksum; it is
written (atomically) once every other file is on disk, so a folder without one never finished saving.
BLAKE2b because it is the fastest strong hash in ``hashlib`` on CPU; a checksum here guards against
truncation and damage, not tampering.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pathlib
import shutil

MANIFEST_FILE = "manifest.json"  # a role's folder has one too, listing the parts it holds (CONTENTS)
CONTENTS = ("model", "optimizer", "extra", "hf_model")
DRIVER_STATE_FILE = "driver_state.pt"
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_CHUNK = 1 << 22


def checksum(path: pathlib.Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(step_dir: pathlib.Path) -> None:
    """``manifest.json``: each file of ``step_dir`` (relative path) with its size and checksum; written atomically."""
    files = sorted(path for path in step_dir.rglob("*") if path.is_file() and path.name != MANIFEST_FILE)
    manifest = {str(path.relative_to(step_dir)): [path.stat().st_size, checksum(path)] for path in files}
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
    for name, (size, recorded) in manifest.items():
        path = step_dir / name
        if not path.is_file():
            return f"{step_dir.name}/{name} is missing"
        if path.stat().st_size != size:
            return f"{step_dir.name}/{name} has {path.stat().st_size} bytes, {size} recorded"
        if checksum(path) != recorded:
            return f"{step_dir.name}/{name} differs from its recorded checksum"
    return None


def is_disk_full(error: BaseException | None) -> bool:
    """``error``, or an error it was raised from, is a full disk or quota: an ``OSError`` with ENOSPC/EDQUOT, or
    one whose text says so (a worker's error carries the remote traceback as text; DCP wraps the OSError)."""
    texts = tuple(os.strerror(code) for code in DISK_FULL_ERRNOS)
    visited: set[int] = set()
    while error is not None and id(error) not in visited:
        visited.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return True
        if any(needle in f"{error} {getattr(error, 'remote_traceback', '')}" for needle in texts):
            return True
        error = error.__cause__ or error.__context__
    return False


def free_space(path: pathlib.Path) -> str:
    """``"<free> MiB free on <mount point>"`` for the filesystem holding ``path``."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    free = shutil.disk_usage(path).free
    while not os.path.ismount(path):
        path = path.parent
    return f"{free / 2**20:.0f} MiB free on {path}"
