"""Collating dataset items into a DataProto of left-padded prompts (the rollout engine's input)."""

from __future__ import annotations

from typing import Any

import torch

from hybridflow.protocol import DataProto


def collate_to_dataproto(items: list[dict[str, Any]], pad_token_id: int, pad_to_length: int | None = None) -> DataProto:
    """Stack B items into ``input_ids``, ``attention_mask``, ``position_ids`` [B, P] plus numpy columns.

    Each item has ``input_ids`` (1-D tensor of its prompt tokens) and any non-tensor values, which become
    numpy ``object`` columns (numbers become typed arrays). Prompts are LEFT-padded with ``pad_token_id`` so
    generation continues right after every prompt; P is the longest prompt, or ``pad_to_length`` if given.
    ``position_ids`` count real tokens from 0 (``cumsum(attention_mask) - 1``, 0 on padding).
    """
    if not items:
        raise ValueError("cannot collate an empty list of items")
    keys = list(items[0])
    for position, item in enumerate(items):
        if list(item) != keys:
            raise ValueError(f"item {position} has keys {sorted(item)} but item 0 has {sorted(keys)}")
    lengths = [len(item["input_ids"]) for item in items]
    width = max(lengths) if pad_to_length is None else pad_to_length
    if width < max(lengths):
        raise ValueError(f"pad_to_length={pad_to_length} is shorter than the longest prompt ({max(lengths)} tokens)")
    input_ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, (item, length) in enumerate(zip(items, lengths)):
        if length:
            input_ids[row, width - length :] = item["input_ids"]
            attention_mask[row, width - length :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    non_tensors = {key: [item[key] for item in items] for key in keys if key != "input_ids"}
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}, non_tensors
    )
