"""Save and load a trained model's state with ``torch.distributed.checkpoint`` (DCP), atomically.

A checkpoint folder holds the DCP shards of the model and optimizer (every rank writes its own shards;
a different world size can load them), ``extra_state.pt`` (the LR scheduler, written by rank 0),
``rng_rank<r>.pt`` (each rank's random states) and ``manifest.json`` (what the folder holds). Everything
is written into ``<path>.tmp`` first and renamed to ``<path>`` only when every rank is done, so a crash
mid-save never leaves a folder at ``<path>`` that looks complete: the previous checkpoint stays usable.

A policy's checkpoint also describes its model, so it can be turned into a Hugging Face folder later
without the training config (``python -m hybridflow.model_merger``): ``huggingface/`` holds the model's
``config.json``, generation config and tokenizer (as in verl), and a LoRA model's folder holds its peft
``adapter_config.json``. ``load_model_offline`` reads the model part back into an unsharded module in one
process. ``export_hf`` writes a plain Hugging Face folder (config, safetensors, tokenizer) from the sharded
model, LoRA merged, that ``from_pretrained`` loads.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import random
import shutil
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint import CheckpointException, FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hybridflow.checkpoints.integrity import CONTENTS, MANIFEST_FILE
from hybridflow.errors import HybridflowError

EXTRA_STATE_FILE = "extra_state.pt"
HF_DIR = "huggingface"


class CheckpointContentError(HybridflowError, ValueError):
    """A checkpoint was asked to save or load a part it does not know or does not hold."""


@dataclass
class TrainingState:
    """What a checkpoint captures of one trained model; ``optimizer``/``lr_scheduler`` are None for frozen ones."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler | None = None


def _check_contents(contents: Iterable[str], key: str) -> list[str]:
    contents = list(contents)
    unknown = [item for item in contents if item not in CONTENTS]
    if unknown:
        raise CheckpointContentError(f"checkpoint.{key} has unknown parts {unknown}; choose from {list(CONTENTS)}")
    return contents


def capture_rng_state() -> dict[str, Any]:
    """This process's Python, numpy, torch CPU (and CUDA) random states."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sharded_state(state: TrainingState, contents: list[str]) -> dict[str, Any]:
    """The DCP state dict of the requested parts (sharded tensors, views of the live ones)."""
    sharded = {}
    if "model" in contents:
        sharded["model"] = get_model_state_dict(state.model)
    if "optimizer" in contents and state.optimizer is not None:
        sharded["optimizer"] = get_optimizer_state_dict(state.model, state.optimizer)
    return sharded


def _savable(state: TrainingState, contents: list[str]) -> list[str]:
    # An optimizer that has not stepped has nothing to save; asking DCP for its state would initialise
    # it with a zero-gradient step, which moves Adam's step count.
    return [item for item in contents if item != "optimizer" or (state.optimizer is not None and state.optimizer.state)]


def save_checkpoint(
    path: str | os.PathLike,
    state: TrainingState,
    contents: Iterable[str],
    export: Callable[[pathlib.Path], Any] | None = None,
    describe: Callable[[pathlib.Path], Any] | None = None,
    **extra: Any,
) -> None:
    """Write the ``contents`` parts of ``state`` to ``path``; every rank of the group must call it.

    ``extra`` keyword values (e.g. ``global_step``) are recorded in the manifest. ``hf_model`` in
    ``contents`` calls ``export(<path>/huggingface)`` on every rank (e.g. a partial of :func:`export_hf`).
    ``describe(<path>)``, called on rank 0, writes what the checkpoint needs to be read without the
    training config (e.g. a partial of :func:`save_model_description`).
    """
    contents = _check_contents(contents, "save_contents")
    if "hf_model" in contents and export is None:
        raise CheckpointContentError("checkpoint.save_contents has 'hf_model' but this model cannot be exported")
    final = pathlib.Path(path)
    staging = final.with_name(final.name + ".tmp")
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        if describe is not None:
            describe(staging)
    dist.barrier()
    sharded = _sharded_state(state, _savable(state, contents))
    if sharded:
        with _full_disk_named(staging):
            dcp.save(sharded, checkpoint_id=str(staging))
    if "extra" in contents:
        _save_torch(capture_rng_state(), staging / f"rng_rank{rank}.pt")
        if rank == 0 and state.lr_scheduler is not None:
            _save_torch({"lr_scheduler": state.lr_scheduler.state_dict()}, staging / EXTRA_STATE_FILE)
    if "hf_model" in contents:
        export(staging / HF_DIR)
    if rank == 0:
        manifest = {"contents": sorted(set(sharded) | ({"extra"} & set(contents))), "world_size": dist.get_world_size()}
        (staging / MANIFEST_FILE).write_text(json.dumps({**manifest, **extra}, indent=1))
    dist.barrier()
    if rank == 0:
        _replace_dir(staging, final)
    dist.barrier()


# DCP's file writer goes through torch's zip writer, which reports a write that failed for want of space as one of
# these, with no errno; after such a failure the partial file holds what space was left.
_TORCH_WRITE_FAILURES = ("unexpected pos", "failed writing file", "file write failed")
_FULL_BELOW_BYTES = 1 << 20


@contextlib.contextmanager
def _full_disk_named(folder: pathlib.Path) -> Iterator[None]:
    """A torch write failure on a filesystem left with under a MiB is re-raised as the full disk it is (ENOSPC),
    which the checkpoint manager names in one line."""
    try:
        yield
    except (Exception, CheckpointException) as error:  # DCP's CheckpointException is a BaseException
        failed_write = any(text in str(error) for text in _TORCH_WRITE_FAILURES)
        if failed_write and shutil.disk_usage(folder).free < _FULL_BELOW_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder)) from error
        raise


def _save_torch(value: Any, path: pathlib.Path) -> None:
    # Through a Python file: torch's own file writer reports a full disk as "unexpected pos", with no errno.
    with open(path, "wb") as handle:
        torch.save(value, handle)


def _replace_dir(staging: pathlib.Path, final: pathlib.Path) -> None:
    """Move ``staging`` to ``final``; an existing ``final`` is moved aside first and deleted last."""
    retired = final.with_name(final.name + ".old")
    shutil.rmtree(retired, ignore_errors=True)
    if final.exists():
        os.replace(final, retired)
    os.replace(staging, final)
    shutil.rmtree(retired, ignore_errors=True)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    manifest = pathlib.Path(path) / MANIFEST_FILE
    if not manifest.is_file():
        raise CheckpointContentError(
            f"{path} is not a complete checkpoint (no {MANIFEST_FILE}); give a folder written by save_checkpoint"
        )
    return json.loads(manifest.read_text())


def load_checkpoint(path: str | os.PathLike, state: TrainingState, contents: Iterable[str]) -> dict[str, Any]:
    """Load the ``contents`` parts the checkpoint at ``path`` holds into ``state``; returns its manifest.

    Every rank must call it. A part asked for but not saved raises, except an optimizer that had not
    stepped when saved (it is left fresh).
    """
    contents = _check_contents(contents, "load_contents")
    folder = pathlib.Path(path)
    manifest = read_manifest(folder)
    saved = set(manifest["contents"])
    missing = [item for item in contents if item in ("model", "extra") and item not in saved]
    if missing:
        raise CheckpointContentError(f"{folder} holds {sorted(saved)}, not {missing}; drop them from load_contents")
    sharded = _sharded_state(state, [item for item in contents if item in saved])
    if sharded:
        dcp.load(sharded, checkpoint_id=str(folder))
    if "model" in sharded:
        set_model_state_dict(state.model, sharded["model"])
    if "optimizer" in sharded:
        set_optimizer_state_dict(state.model, state.optimizer, sharded["optimizer"])
    if "extra" in contents:
        _load_extra(folder, state)
    return manifest


def _load_extra(folder: pathlib.Path, state: TrainingState) -> None:
    # Our own files (numpy RNG state is not a tensor), so not a weights-only load.
    rng_file = folder / f"rng_rank{dist.get_rank()}.pt"
    if rng_file.is_file():
        restore_rng_state(torch.load(rng_file, weights_only=False))
    extra_file = folder / EXTRA_STATE_FILE
    if state.lr_scheduler is not None and extra_file.is_file():
        state.lr_scheduler.load_state_dict(torch.load(extra_file, weights_only=False)["lr_scheduler"])


def save_model_description(
    folder: pathlib.Path, hf_config: Any, generation_config: Any = None, tokenizer: Any = None, lora_config: Any = None
) -> None:
    """Write ``<folder>/huggingface/`` (config, generation config, tokenizer) and, for a LoRA model, its
    peft config as ``<folder>/adapter_config.json``: what a merger needs besides the weights."""
    hf_dir = folder / HF_DIR
    hf_config.save_pretrained(hf_dir)
    if generation_config is not None:
        generation_config.save_pretrained(hf_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(hf_dir)
    if lora_config is not None:
        lora_config.save_pretrained(folder)


def model_dtype_offline(path: str | os.PathLike) -> torch.dtype:
    """The dtype the checkpoint at ``path`` holds its model weights in (read from the DCP metadata)."""
    for key, item in FileSystemReader(str(path)).read_metadata().state_dict_metadata.items():
        if key.startswith("model.") and isinstance(item, TensorStorageMetadata):
            return item.properties.dtype
    raise CheckpointContentError(f"{path} holds no model weights; save with 'model' in checkpoint.save_contents")


def load_model_offline(path: str | os.PathLike, model: torch.nn.Module) -> dict[str, Any]:
    """Load the model part of the checkpoint at ``path`` into ``model``, an unsharded module built like the
    trained one (same class, same LoRA structure), in this process alone: no process group, no workers.

    Every tensor of ``model.state_dict()`` must be in the checkpoint (DCP raises otherwise). Returns the
    manifest.
    """
    manifest = read_manifest(path)
    if "model" not in manifest["contents"]:
        raise CheckpointContentError(
            f"{path} holds {manifest['contents']}, no model weights; save with 'model' in checkpoint.save_contents"
        )
    # In-place load into the module's own tensors; no_dist: a single process reads every rank's shards
    # (DCP warns that it assumes exactly that).
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": model.state_dict()}, checkpoint_id=str(path), no_dist=True)
    return manifest


def export_hf(
    path: str | os.PathLike,
    weights: Iterator[tuple[str, torch.Tensor]],
    hf_config: Any,
    generation_config: Any = None,
    tokenizer: Any = None,
) -> pathlib.Path:
    """Write a Hugging Face folder at ``path``: ``config.json``, ``model.safetensors`` (and tokenizer).

    ``weights`` yields ``(Hugging Face name, full tensor)`` pairs, gathered one at a time on every rank
    (``fsdp.iter_hf_weights``); rank 0 keeps CPU copies and writes them. Every rank must call it.
    Written into ``<path>.tmp`` and renamed, so a crash leaves no half-written folder at ``path``.
    """
    final = pathlib.Path(path)
    rank = dist.get_rank()
    collected = {}
    for name, tensor in weights:
        if rank == 0:
            collected[name] = tensor.detach().to("cpu", copy=True).contiguous()
    if rank == 0:
        staging = final.with_name(final.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        save_file(collected, staging / "model.safetensors", metadata={"format": "pt"})
        hf_config.save_pretrained(staging)
        if generation_config is not None:
            generation_config.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        _replace_dir(staging, final)
    dist.barrier()
    return final
