"""The run's input files checked before anything starts: model folders, parquet files and the run folder.

Cheap on purpose: a model folder's ``config.json`` and its safetensors headers (not the weights), a parquet
file's footer and first rows (not the data). Each problem is one line naming the key, the file (and row) and
the fix, collected with the rest of the config check.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
from typing import Any, Callable

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
ROWS_LOOKED_AT = 8


def model_folder_errors(key: str, path: str) -> list[str]:
    """``config.json`` readable with a ``model_type``, weight files present and whole, tokenizer files present."""
    folder = pathlib.Path(path).expanduser()
    config_file = folder / "config.json"
    if not config_file.is_file():
        return []  # a hub id or a missing folder: environment.model_errors says so
    try:
        config = json.loads(config_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return [f"{key}: {config_file} is not valid JSON ({error}); restore the model's config.json"]
    if not isinstance(config, dict) or "model_type" not in config:
        return [f"{key}: {config_file} has no 'model_type'; it is not a transformers model config"]
    return weight_errors(key, folder) + tokenizer_file_errors(key, folder)


def weight_errors(key: str, folder: pathlib.Path) -> list[str]:
    """The weight files: present, every shard an index names present, each safetensors file as long as its header
    says."""
    safetensors = sorted(folder.glob("*.safetensors"))
    if not safetensors and not list(folder.glob("pytorch_model*.bin")):
        return [
            f"{key}: {folder} has no weight files (model.safetensors, model-*-of-*.safetensors or pytorch_model*.bin); "
            "copy the model's weights there"
        ]
    errors = []
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as error:
            return [f"{key}: {index} is not a valid safetensors index ({error}); restore it from the model"]
        errors += [
            f"{key}: {folder / shard} is missing (named in {index.name}); copy it there"
            for shard in sorted(shards)
            if not (folder / shard).is_file()
        ]
    return errors + [error for file in safetensors if (error := _safetensors_error(key, file))]


def _safetensors_error(key: str, file: pathlib.Path) -> str | None:
    """A safetensors file is an 8-byte header length, a JSON header, then the data its offsets describe."""
    size = file.stat().st_size
    fix = "download or copy it again"
    try:
        with file.open("rb") as handle:
            (header_length,) = struct.unpack("<Q", handle.read(8))
            if header_length > size - 8:
                return f"{key}: {file} is truncated ({size} bytes, shorter than its own header); {fix}"
            header = json.loads(handle.read(header_length))
    except (OSError, struct.error, ValueError) as error:
        return f"{key}: {file} is not a readable safetensors file ({error}); {fix}"
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"]
    expected = 8 + header_length + max(ends, default=0)
    if size < expected:
        return f"{key}: {file} is truncated ({size} bytes, its header describes {expected}); {fix}"
    return None


def tokenizer_file_errors(key: str, folder: pathlib.Path) -> list[str]:
    if any((folder / name).is_file() for name in TOKENIZER_FILES):
        return []
    if (folder / "tokenizer_config.json").is_file():
        return [
            f"{key}: {folder} has tokenizer_config.json but no vocabulary file "
            f"({', '.join(TOKENIZER_FILES[:2])}, ...): "
            "the tokenizer would load nearly empty; copy the model's tokenizer.json there"
        ]
    return [
        f"{key}: {folder} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...); "
        "copy the model's tokenizer there"
    ]


Columns = Callable[[list[str]], dict[str, str]]


def parquet_errors(
    key: str, files: Any, columns: Columns, chat_key: str | None = None, unread: dict[str, str] | None = None
) -> list[str]:
    """Each existing file of ``key`` readable as parquet, not empty, with the columns it needs.

    ``columns(names)``: the config key -> column name pairs a file with the columns ``names`` must have (what a
    file needs can depend on what it has, as for SFT's multi-turn rows). ``chat_key``: a column whose first rows
    must be chat messages. ``unread``: {column: what reading it needs} for columns a file must not have, since
    nothing here would read them (verl's image, video and audio columns).
    """
    if files is None or files == "":
        return []
    names = [str(files)] if isinstance(files, (str, os.PathLike)) else [str(f) for f in files]
    return [
        error
        for name in names
        if pathlib.Path(name).expanduser().is_file()
        for error in _parquet_file_errors(key, pathlib.Path(name).expanduser(), columns, chat_key, unread or {})
    ]


def _parquet_file_errors(
    key: str, path: pathlib.Path, columns: Columns, chat_key: str | None, unread: dict[str, str]
) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as error:
        return [
            f"{key}: {path} is not a readable parquet file ({error}); "
            "regenerate it (verl's preprocessing scripts write parquet)"
        ]
    if parquet.metadata.num_rows == 0:
        return [f"{key}: {path} has no rows; regenerate it"]
    names = parquet.schema_arrow.names
    missing = [(option, column) for option, column in columns(names).items() if column not in names]
    if missing:
        return [
            f"{option}={column!r} is not a column of {path} (columns: {names}); set {option}"
            for option, column in missing
        ]
    found = [column for column in unread if column in names]
    if found:
        return [f"{key}: {path} has a {column!r} column, which needs {unread[column]}" for column in found]
    if chat_key is None:
        return []
    try:
        first = next(parquet.iter_batches(batch_size=ROWS_LOOKED_AT, columns=[chat_key])).column(0).to_pylist()
    except (pa.ArrowException, OSError, StopIteration) as error:
        return [f"{key}: {path} cannot be read ({error}); regenerate it"]
    for row, prompt in enumerate(first):
        if not _is_chat(prompt):
            found = type(prompt).__name__
            return [
                f"{key}: {path} row {row}: {chat_key!r} is a {found}, not a list of {{'role', 'content'}} messages; "
                "write prompts as chat messages (verl's schema)"
            ]
    return []


def _is_chat(prompt: Any) -> bool:
    # parquet gives every struct in a column the same fields, so a missing role or content reads as None.
    return (
        isinstance(prompt, list)
        and bool(prompt)
        and all(
            isinstance(message, dict) and isinstance(message.get("role"), str) and message.get("content") is not None
            for message in prompt
        )
    )


def run_folder_errors(key: str, path: str) -> list[str]:
    """The run folder (checkpoints, metrics) exists and is writable, or can be created."""
    folder = pathlib.Path(path).expanduser().absolute()
    existing = next((parent for parent in (folder, *folder.parents) if parent.exists()), None)
    if existing is None:
        return []
    if not existing.is_dir():
        return [f"{key}={path!r} cannot be created: {existing} is a file; choose another folder"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"{key}={path!r} is not writable ({existing} is read-only for this user); choose a writable folder"]
    return []
