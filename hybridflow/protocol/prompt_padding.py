"""Joining batches whose prompts were left-padded to different widths.

A batch's prompts are left-padded to its own longest (``data/collate.py``), so batches drawn or generated apart
(fully async's single prompts and its queue of calls, DAPO's generation batches, the V1 modes' groups and
passes) can differ in width. Before they are joined each is left-padded to the widest: the columns a prompt's
width enters (``input_ids`` and ``prompts`` with the pad token, ``attention_mask`` and ``position_ids`` with 0);
the response columns are ``response_length`` wide in every batch.
"""

from __future__ import annotations

import torch.nn.functional as F

from hybridflow.protocol.data_proto import DataProto

# Left-padded columns and the value their padding holds (None: the pad token)
PROMPT_ALIGNED = {"input_ids": None, "prompts": None, "attention_mask": 0, "position_ids": 0}


def concat_left_padded(batches: list[DataProto], pad_token_id: int) -> DataProto:
    """``DataProto.concat`` of ``batches`` after left-padding each one's prompt columns to the widest (batches
    without ``input_ids`` join as they are)."""
    if any("input_ids" not in batch.batch.keys() for batch in batches):
        return DataProto.concat(batches)
    widest = max(batch.batch["input_ids"].shape[-1] for batch in batches)
    return DataProto.concat([left_padded(batch, widest, pad_token_id) for batch in batches])


def left_padded(batch: DataProto, width: int, pad_token_id: int) -> DataProto:
    """``batch`` with its prompt columns left-padded to ``width`` tokens (itself when it has that width)."""
    extra = width - batch.batch["input_ids"].shape[-1]
    if extra == 0:
        return batch
    tensors = batch.batch.clone(recurse=False)
    for key, value in PROMPT_ALIGNED.items():
        if key in tensors.keys():
            tensors[key] = F.pad(tensors[key], (extra, 0), value=pad_token_id if value is None else value)
    return DataProto(batch=tensors, non_tensor_batch=batch.non_tensor_batch, meta_info=batch.meta_info)
