"""The RL prompt dataset: parquet rows in verl's schema, chat-templated and tokenized once at load time.

A row holds ``data_source`` (picks the scoring function), ``prompt`` (chat messages
``[{"role": ..., "content": ...}]``; a plain string is taken as one user message), ``ability``,
``reward_model`` (``{"style": ..., "ground_truth": ...}``) and ``extra_info`` (``index``, ``tools_kwargs``,
anything else). Prompts longer than ``max_prompt_length`` tokens are dropped (``filter_overlong_prompts`` or
``truncation="filter"``), cut (``"left"`` keeps the end, ``"right"`` the start, ``"middle"`` both ends), or
refused (``"error"``); the counts are kept in ``num_filtered`` / ``num_truncated`` and logged.
"""

from __future__ import annotations

import copy
import logging
import pathlib
from typing import Any, Sequence

import numpy as np
import pyarrow.parquet as pq
import torch

from hybridflow.data.collate import collate_to_dataproto
from hybridflow.data.truncation import TRUNCATION_MODES, truncate_prompt
from hybridflow.errors import HybridflowError
from hybridflow.protocol import DataProto

logger = logging.getLogger(__name__)


class DatasetError(HybridflowError, ValueError):
    """A data file, row or data option cannot be used; the message names the file, row and column."""


class PromptTooLongError(DatasetError):
    """Prompts exceed ``data.max_prompt_length`` while ``data.truncation='error'``."""


class RLDataset:
    """Prompts for RL from one or more parquet files; ``dataset[i]`` is a dict, ``collate`` batches them.

    Each item holds ``input_ids`` (a 1-D LongTensor of the chat-templated prompt, ending in the
    assistant-turn header) and the non-tensor columns ``data_source``, ``reward_model``, ``extra_info``,
    ``ability``, ``index`` (``extra_info["index"]`` or the row's position), ``tools_kwargs``
    (``extra_info["tools_kwargs"]`` or ``{}``) and, with ``return_raw_chat``, ``raw_prompt`` (the messages).
    ``tools`` (JSON schemas) are passed to the chat template for tool-calling prompts.
    """

    def __init__(
        self,
        parquet_files: str | pathlib.Path | Sequence[str | pathlib.Path],
        tokenizer: Any,
        max_prompt_length: int,
        prompt_key: str = "prompt",
        truncation: str = "error",
        filter_overlong_prompts: bool = False,
        return_raw_chat: bool = True,
        tools: list[dict] | None = None,
        apply_chat_template_kwargs: dict | None = None,
        max_samples: int = -1,
        shuffle: bool = False,
        seed: int = 0,
    ):
        if truncation not in TRUNCATION_MODES:
            raise DatasetError(f"data.truncation={truncation!r} is not one of {list(TRUNCATION_MODES)}")
        if not isinstance(max_prompt_length, int) or max_prompt_length < 1:
            raise DatasetError(f"data.max_prompt_length={max_prompt_length!r} must be a positive integer")
        self.tokenizer = tokenizer
        self.max_prompt_length = max_prompt_length
        self.prompt_key = prompt_key
        self.truncation = "filter" if filter_overlong_prompts else truncation
        self.return_raw_chat = return_raw_chat
        self.tools = tools
        self.apply_chat_template_kwargs = dict(apply_chat_template_kwargs or {})
        self.files = _as_paths(parquet_files)
        rows, origins = _sample(*self._read_rows(), max_samples, shuffle, seed)
        self.num_rows_read = len(rows)
        token_ids = self._tokenize([row[prompt_key] for row in rows])
        self.rows, self.token_ids, self.num_filtered, self.num_truncated = self._fit_to_length(rows, origins, token_ids)
        logger.log(logging.WARNING if self.num_filtered or self.num_truncated else logging.INFO, self.summary())
        if not self.rows:
            raise DatasetError(f"no prompts left in {[str(f) for f in self.files]}: {self.summary()}")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        # A copy, so a batch that edits its extra_info or messages cannot change the dataset for later epochs.
        row = copy.deepcopy(self.rows[index])
        extra_info = row.get("extra_info") or {}
        item = {
            "input_ids": torch.tensor(self.token_ids[index], dtype=torch.long),
            "data_source": row["data_source"],
            "reward_model": row["reward_model"],
            "extra_info": extra_info,
            "ability": row.get("ability") or "",
            "index": extra_info["index"] if extra_info.get("index") is not None else row["_position"],
            "tools_kwargs": extra_info.get("tools_kwargs") or {},
        }
        if self.return_raw_chat:
            item["raw_prompt"] = row[self.prompt_key]
        return item

    def collate(self, items: list[dict[str, Any]]) -> DataProto:
        """Items -> one DataProto with left-padded ``input_ids``, ``attention_mask``, ``position_ids``."""
        return collate_to_dataproto(items, pad_token_id=self.tokenizer.pad_token_id)

    def data_sources(self) -> list[str]:
        """Every data_source in the dataset, so reward functions can be checked before training starts."""
        return sorted({str(row["data_source"]) for row in self.rows})

    def field_values(self, field: str) -> list[str]:
        """Each row's string column ``field`` (``data_source``, ``ability``), in the dataset's order."""
        return [str(row.get(field) or "") for row in self.rows]

    def _read_rows(self) -> tuple[list[dict], list[tuple[pathlib.Path, int]]]:
        rows, origins = [], []
        for path in self.files:
            for row_number, row in enumerate(_read_parquet(path, self.prompt_key)):
                _check_row(row, path, row_number, self.prompt_key)
                row[self.prompt_key] = _as_messages(row[self.prompt_key], path, row_number, self.prompt_key)
                row["_position"] = len(rows)
                rows.append(row)
                origins.append((path, row_number))
        return rows, origins

    def _tokenize(self, conversations: list[list[dict]]) -> list[list[int]]:
        template_options = {**self.apply_chat_template_kwargs, **({"tools": self.tools} if self.tools else {})}
        texts = [
            self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_options)
            for messages in conversations
        ]
        return self.tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []

    def _fit_to_length(
        self, rows: list[dict], origins: list[tuple[pathlib.Path, int]], token_ids: list[list[int]]
    ) -> tuple[list[dict], list[list[int]], int, int]:
        limit = self.max_prompt_length
        overlong = [i for i, ids in enumerate(token_ids) if len(ids) > limit]
        if overlong and self.truncation == "error":
            path, row_number = origins[overlong[0]]
            raise PromptTooLongError(
                f"{len(overlong)} of {len(rows)} prompts are longer than data.max_prompt_length={limit} tokens "
                f"(first: {path} row {row_number}, {len(token_ids[overlong[0]])} tokens); raise "
                f"data.max_prompt_length, set data.filter_overlong_prompts=True to drop them, or set "
                f"data.truncation to one of left/right/middle to cut them"
            )
        if self.truncation == "filter":
            dropped = set(overlong)
            kept = [i for i in range(len(rows)) if i not in dropped]
            return [rows[i] for i in kept], [token_ids[i] for i in kept], len(overlong), 0
        for i in overlong:
            token_ids[i] = truncate_prompt(token_ids[i], limit, self.truncation)
        return rows, token_ids, 0, len(overlong)

    def summary(self) -> str:
        """One line with the counts of rows read, kept, filtered and truncated."""
        return (
            f"RLDataset: {self.num_rows_read} rows from {len(self.files)} file(s); {len(self)} kept; "
            f"{self.num_filtered} over-long prompts filtered, {self.num_truncated} truncated "
            f"(data.max_prompt_length={self.max_prompt_length}, truncation={self.truncation})"
        )


def _sample(rows: list[dict], origins: list, max_samples: int, shuffle: bool, seed: int) -> tuple[list[dict], list]:
    """At most ``max_samples`` rows (-1: all): drawn without replacement with ``seed`` if ``shuffle``, else the
    first ones (verl's ``train_max_samples`` / ``val_max_samples``)."""
    if not 0 < max_samples < len(rows):
        return rows, origins
    if shuffle:
        keep = sorted(np.random.default_rng(seed).choice(len(rows), size=max_samples, replace=False).tolist())
    else:
        keep = range(max_samples)
    return [rows[i] for i in keep], [origins[i] for i in keep]


def _as_paths(parquet_files: str | pathlib.Path | Sequence[str | pathlib.Path]) -> list[pathlib.Path]:
    if isinstance(parquet_files, (str, pathlib.Path)):
        parquet_files = [parquet_files]
    paths = [pathlib.Path(file).expanduser() for file in parquet_files]
    if not paths:
        raise DatasetError("no parquet files given; set data.train_files / data.val_files")
    for path in paths:
        if not path.is_file():
            raise DatasetError(
                f"parquet file {str(path)!r} does not exist; check data.train_files / data.val_files "
                f"(examples/data_preprocess/ writes such files)"
            )
    return paths


def _read_parquet(path: pathlib.Path, prompt_key: str) -> list[dict]:
    try:
        table = pq.read_table(path)
    except Exception as error:  # pyarrow raises several types for a damaged or non-parquet file
        raise DatasetError(f"cannot read {path} as parquet: {type(error).__name__}: {error}") from error
    missing = [column for column in ("data_source", prompt_key, "reward_model") if column not in table.column_names]
    if missing:
        raise DatasetError(
            f"{path} row 0: required column(s) {missing} missing (the file has {table.column_names}); "
            f"rows need data_source, {prompt_key} (chat messages) and reward_model.ground_truth"
        )
    return table.to_pylist()


def _check_row(row: dict, path: pathlib.Path, row_number: int, prompt_key: str) -> None:
    for column in ("data_source", prompt_key, "reward_model"):
        if row.get(column) is None:
            raise DatasetError(f"{path} row {row_number}: required column {column!r} is empty")
    if not isinstance(row["reward_model"], dict) or "ground_truth" not in row["reward_model"]:
        raise DatasetError(
            f"{path} row {row_number}: required column 'reward_model.ground_truth' is missing "
            f"(reward_model is {row['reward_model']!r}); write reward_model as {{'style': ..., 'ground_truth': ...}}"
        )


def _as_messages(prompt: Any, path: pathlib.Path, row_number: int, prompt_key: str) -> list[dict]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in prompt)
    ):
        return prompt
    raise DatasetError(
        f"{path} row {row_number}: column {prompt_key!r} must be a non-empty list of chat messages "
        f"{{'role': ..., 'content': ...}} (or a string), got {prompt!r:.200}"
    )
