"""The SFT dataset: parquet rows of {prompt, response} or multi-turn {messages}, tokenized once at load time.

Two row layouts, as in verl's SFT trainers:

- single turn: a prompt column (a string, or chat messages as in the RL schema) and a response string; either
  may sit inside a dict column (``prompt_dict_keys=["question"]`` reads ``row[prompt_key]["question"]``, so the
  RL parquet's ``extra_info.question`` / ``extra_info.answer`` serve for a warm-up SFT). The prompt goes
  through the chat template with the assistant header; the response and the EOS token follow it.
- multi-turn: a ``messages`` column of chat messages; every assistant turn is trained on. A row's ``tools``
  column (function schemas) and ``enable_thinking`` column reach the chat template, as in verl's
  ``MultiTurnSFTDataset``. ``multiturn=None`` picks this layout when the rows have a ``messages_key`` column
  (verl's current ``sft_trainer`` reads only conversations; its older ``fsdp_sft_trainer`` needed
  ``multiturn.enable``).

``max_samples`` keeps the first N rows (verl's ``train_max_samples`` / ``val_max_samples``). Each item holds
``input_ids`` and ``loss_mask`` (1-D, equal length): the loss mask is 1 exactly on response / assistant tokens
(their end-of-turn token included), never on the prompt, system or user turns. ``collate`` right-pads a batch
into ``input_ids``, ``attention_mask``, ``position_ids`` and ``loss_mask`` [B, L]: to its longest example
(``pad_mode="no_padding"``; the worker packs the tokens when ``use_remove_padding``) or to ``max_length``
(``"right"``). Differs from verl: verl's ``no_padding`` mode cuts an over-long example at its end whatever
``truncation`` says; here ``truncation`` holds in both modes.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Sequence

import pyarrow.parquet as pq
import torch

from hybridflow.data.rl_dataset import DatasetError, _as_messages, _as_paths, _sample
from hybridflow.protocol import DataProto

SFT_TRUNCATION_MODES = ("error", "left", "right", "filter")
SFT_PAD_MODES = ("no_padding", "right")


def _check_settings(tokenizer: Any, max_length: int, truncation: str, pad_mode: str) -> None:
    if truncation not in SFT_TRUNCATION_MODES:
        raise DatasetError(f"data.truncation={truncation!r} is not one of {list(SFT_TRUNCATION_MODES)}")
    if pad_mode not in SFT_PAD_MODES:
        raise DatasetError(f"data.pad_mode={pad_mode!r} is not one of {list(SFT_PAD_MODES)}")
    if not isinstance(max_length, int) or max_length < 2:
        raise DatasetError(f"data.max_length={max_length!r} must be an integer >= 2")
    if tokenizer.pad_token_id is None or tokenizer.eos_token_id is None:
        raise DatasetError("the tokenizer needs a pad and an eos token for SFT; set them in its tokenizer_config.json")


class SFTDataset:
    """Tokenized SFT examples from one or more parquet files; ``dataset[i]`` is a dict of two 1-D tensors.

    Examples longer than ``max_length`` tokens are refused (``truncation="error"``), cut keeping the end
    (``"left"``) or the start (``"right"``), or dropped (``"filter"``).
    """

    def __init__(
        self,
        parquet_files: str | pathlib.Path | Sequence[str | pathlib.Path],
        tokenizer: Any,
        max_length: int,
        prompt_key: str = "prompt",
        response_key: str = "response",
        prompt_dict_keys: Sequence[str] | None = None,
        response_dict_keys: Sequence[str] | None = None,
        multiturn: bool | None = None,
        messages_key: str = "messages",
        truncation: str = "error",
        tools_key: str = "tools",
        enable_thinking_key: str = "enable_thinking",
        enable_thinking_default: bool | None = None,
        apply_chat_template_kwargs: dict | None = None,
        max_samples: int = -1,
        pad_mode: str = "no_padding",
    ):
        _check_settings(tokenizer, max_length, truncation, pad_mode)
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.truncation = truncation
        self.pad_mode = pad_mode
        self.template_kwargs = dict(apply_chat_template_kwargs or {})
        self.files = _as_paths(parquet_files)
        rows, origins = _sample(*_read_all_rows(self.files), max_samples, shuffle=False, seed=0)
        self.multiturn = multiturn if multiturn is not None else bool(rows) and messages_key in rows[0]
        examples = []
        for row, (path, row_number) in zip(rows, origins):
            where = f"{path} row {row_number}"
            if self.multiturn:
                messages = _as_messages(_column(row, messages_key, (), where), path, row_number, messages_key)
                kwargs = self._row_template_kwargs(row, tools_key, enable_thinking_key, enable_thinking_default)
                examples.append((where, conversation_tokens(tokenizer, messages, where, **kwargs)))
            else:
                prompt = _column(row, prompt_key, prompt_dict_keys or (), where)
                response = _column(row, response_key, response_dict_keys or (), where)
                messages = _as_messages(prompt, path, row_number, prompt_key)
                tokens = prompt_response_tokens(tokenizer, messages, str(response), **self.template_kwargs)
                examples.append((where, tokens))
        self.num_rows_read = len(examples)
        self.examples, self.num_filtered, self.num_truncated = self._fit_to_length(examples)
        if not self.examples:
            raise DatasetError(f"no SFT examples left in {[str(f) for f in self.files]}: {self.summary()}")

    def _row_template_kwargs(
        self, row: dict, tools_key: str, enable_thinking_key: str, enable_thinking_default: bool | None
    ) -> dict[str, Any]:
        """The chat template's extra arguments for one conversation: the shared ones, its tools, its thinking."""
        kwargs = dict(self.template_kwargs)
        tools = row.get(tools_key)
        if isinstance(tools, str):
            tools = json.loads(tools)
        if tools:
            kwargs["tools"] = tools
        thinking = row.get(enable_thinking_key)
        thinking = enable_thinking_default if thinking is None else thinking
        if thinking is not None:
            kwargs["enable_thinking"] = bool(thinking)
        return kwargs

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        input_ids, loss_mask = self.examples[index]
        return {"input_ids": torch.tensor(input_ids), "loss_mask": torch.tensor(loss_mask)}

    def collate(self, items: list[dict[str, torch.Tensor]]) -> DataProto:
        width = self.max_length if self.pad_mode == "right" else None
        return collate_sft(items, self.tokenizer.pad_token_id, width)

    def num_loss_tokens(self) -> int:
        return sum(sum(mask) for _, mask in self.examples)

    def _fit_to_length(self, examples: list) -> tuple[list[tuple[list[int], list[int]]], int, int]:
        limit, kept, filtered, truncated = self.max_length, [], 0, 0
        for where, (input_ids, loss_mask) in examples:
            if len(input_ids) <= limit:
                kept.append((input_ids, loss_mask))
            elif self.truncation == "error":
                raise DatasetError(
                    f"{where}: {len(input_ids)} tokens exceed data.max_length={limit}; raise data.max_length or "
                    f"set data.truncation to left/right (cut) or filter (drop)"
                )
            elif self.truncation == "filter":
                filtered += 1
            else:
                cut = slice(-limit, None) if self.truncation == "left" else slice(0, limit)
                kept.append((input_ids[cut], loss_mask[cut]))
                truncated += 1
        return kept, filtered, truncated

    def summary(self) -> str:
        layout = "multi-turn messages" if self.multiturn else "prompt/response"
        return (
            f"SFTDataset: {self.num_rows_read} rows ({layout}) from {len(self.files)} file(s); {len(self)} kept; "
            f"{self.num_filtered} over-long dropped, {self.num_truncated} truncated "
            f"(data.max_length={self.max_length}, truncation={self.truncation})"
        )


def prompt_response_tokens(
    tokenizer: Any, messages: list[dict], response: str, **template_kwargs: Any
) -> tuple[list[int], list[int]]:
    """Templated prompt (with the assistant header), then ``response`` + EOS; loss mask on the latter.

    ``template_kwargs`` go to the chat template (verl's ``apply_chat_template_kwargs``)."""
    prompt_ids = _template_ids(tokenizer, messages, add_generation_prompt=True, **template_kwargs)
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt_ids + response_ids, [0] * len(prompt_ids) + [1] * len(response_ids)


def conversation_tokens(
    tokenizer: Any, messages: list[dict], where: str = "conversation", **template_kwargs: Any
) -> tuple[list[int], list[int]]:
    """The templated conversation and a loss mask on every assistant turn (up to its EOS token).

    ``template_kwargs`` (``tools``, ``enable_thinking``, ...) go to every rendering of the chat template.

    Each assistant turn's tokens are found as the difference between the templated conversation up to it
    (with the assistant header) and up to its end, so any chat template works whose renderings of a
    conversation's prefixes are token prefixes of each other (ChatML, Llama 3, ...).
    """
    if not any(message["role"] == "assistant" for message in messages):
        raise DatasetError(f"{where}: the messages have no assistant turn to train on")
    input_ids: list[int] = []
    loss_mask: list[int] = []
    for end, message in enumerate(messages, start=1):
        if message["role"] != "assistant":
            continue
        header = _template_ids(tokenizer, messages[: end - 1], add_generation_prompt=True, **template_kwargs)
        turn = _template_ids(tokenizer, messages[:end], add_generation_prompt=False, **template_kwargs)
        if turn[: len(header)] != header or header[: len(input_ids)] != input_ids:
            raise DatasetError(
                f"{where}: the chat template does not render message {end - 1} as an extension of the messages "
                f"before it, so assistant tokens cannot be located; use a template whose prefixes are stable"
            )
        answer = turn[len(header) :]
        # Tokens the template adds after the end-of-turn token (ChatML's newline) are never generated.
        if tokenizer.eos_token_id in answer:
            answer = answer[: len(answer) - answer[::-1].index(tokenizer.eos_token_id)]
        loss_mask += [0] * (len(header) - len(input_ids)) + [1] * len(answer)
        input_ids = header + answer
    return input_ids, loss_mask


def _template_ids(
    tokenizer: Any, messages: list[dict], add_generation_prompt: bool, **template_kwargs: Any
) -> list[int]:
    if not messages:
        return []
    text = tokenizer.apply_chat_template(
        messages, add_generation_prompt=add_generation_prompt, tokenize=False, **template_kwargs
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def collate_sft(items: list[dict[str, torch.Tensor]], pad_token_id: int, width: int | None = None) -> DataProto:
    """Right-pad B examples to ``width`` tokens (None: the longest): ``input_ids``, ``attention_mask``,
    ``position_ids``, ``loss_mask`` [B, L]."""
    if not items:
        raise ValueError("cannot collate an empty list of SFT items")
    longest = max(len(item["input_ids"]) for item in items)
    if width is not None and width < longest:
        raise ValueError(f"cannot pad SFT items of {longest} tokens to width={width}")
    width = width or longest
    input_ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)
    loss_mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        length = len(item["input_ids"])
        input_ids[row, :length] = item["input_ids"]
        attention_mask[row, :length] = 1
        loss_mask[row, :length] = item["loss_mask"]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids, "loss_mask": loss_mask}
    )


def _read_all_rows(paths: list[pathlib.Path]) -> tuple[list[dict], list[tuple[pathlib.Path, int]]]:
    """Every row of every file, and where each came from (file, row number)."""
    rows, origins = [], []
    for path in paths:
        file_rows = _read_rows(path)
        rows += file_rows
        origins += [(path, number) for number in range(len(file_rows))]
    return rows, origins


def _read_rows(path: pathlib.Path) -> list[dict]:
    try:
        return pq.read_table(path).to_pylist()
    except Exception as error:  # pyarrow raises several types for a damaged or non-parquet file
        raise DatasetError(f"cannot read {path} as parquet: {type(error).__name__}: {error}") from error


def _column(row: dict, key: str, dict_keys: Sequence[str], where: str) -> Any:
    """``row[key]``, then down ``dict_keys`` into nested dicts (verl's ``prompt_dict_keys``)."""
    if key not in row:
        raise DatasetError(
            f"{where}: column {key!r} is missing (the row has {sorted(row)}); point data.prompt_key / "
            f"data.response_key / data.multiturn.messages_key at the columns that hold the text"
        )
    value = row[key]
    for depth, sub_key in enumerate(dict_keys):
        if not isinstance(value, dict) or sub_key not in value:
            path = ".".join([key, *dict_keys[: depth + 1]])
            raise DatasetError(f"{where}: {path!r} is missing (found {value!r:.120}); check the *_dict_keys settings")
        value = value[sub_key]
    if value is None:
        raise DatasetError(f"{where}: column {key!r} is empty")
    return value
