"""What a reward manager reads from a rollout batch, and how it writes scores back as token-level tensors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

if TYPE_CHECKING:  # DataProto loads tensordict (~2 s): not needed to check a config
    from hybridflow.protocol import DataProto


class RewardInputError(ValueError):
    """The batch handed to a reward manager lacks a column that scoring needs."""


@dataclass
class ResponseBatch:
    """The decoded responses of a batch of B samples and what each is scored against."""

    solution_strs: list[str]
    data_sources: list[str]
    ground_truths: list[Any]
    extra_infos: list[dict | None]
    valid_response_lengths: list[int]
    response_width: int
    prompt_strs: list[str] | None = None  # read only for a manager that asks (with_prompts)

    def __len__(self) -> int:
        return len(self.solution_strs)


def join_response_batches(batches: list[ResponseBatch], order: np.ndarray) -> ResponseBatch:
    """The samples of ``batches`` one after another, then taken in ``order``."""

    def joined(field: str) -> list:
        values = [value for batch in batches for value in getattr(batch, field)]
        return [values[i] for i in order]

    return ResponseBatch(
        solution_strs=joined("solution_strs"),
        data_sources=joined("data_sources"),
        ground_truths=joined("ground_truths"),
        extra_infos=joined("extra_infos"),
        valid_response_lengths=joined("valid_response_lengths"),
        response_width=batches[0].response_width,
        prompt_strs=joined("prompt_strs") if all(batch.prompt_strs is not None for batch in batches) else None,
    )


def valid_response_lengths(data: DataProto) -> torch.Tensor:
    """[B] number of response tokens before the right padding.

    Read from the response part of ``attention_mask`` when present (it also covers tool-result tokens of a
    multi-turn rollout, which ``response_mask`` zeroes out), else from ``response_mask``.
    """
    response_width = data.batch["responses"].shape[-1]
    keys = data.batch.keys()
    if "attention_mask" in keys:
        return data.batch["attention_mask"][:, -response_width:].sum(-1)
    if "response_mask" in keys:
        return data.batch["response_mask"].sum(-1)
    raise RewardInputError("the batch has neither 'attention_mask' nor 'response_mask'; rollout output carries both")


def read_response_batch(
    data: DataProto, tokenizer: Any, reward_fn_key: str = "data_source", with_prompts: bool = False
) -> ResponseBatch:
    """Decode each response (special tokens skipped) and gather its data_source, ground truth and extra_info;
    ``with_prompts``: each prompt too (:func:`prompt_strs`)."""
    for key in (reward_fn_key, "reward_model"):
        if key not in data.non_tensor_batch:
            raise RewardInputError(
                f"the batch has no non-tensor column {key!r} (it has {sorted(data.non_tensor_batch)}); "
                f"rows from RLDataset carry it, so keep it when building the batch"
            )
    if "responses" not in data.batch.keys():
        raise RewardInputError("the batch has no 'responses' tensor; score it after generate_sequences")
    responses = data.batch["responses"]
    lengths = valid_response_lengths(data).tolist()
    token_lists = [row[:length].tolist() for row, length in zip(responses, lengths)]
    extra_infos = data.non_tensor_batch.get("extra_info")
    return ResponseBatch(
        solution_strs=tokenizer.batch_decode(token_lists, skip_special_tokens=True),
        data_sources=[str(source) for source in data.non_tensor_batch[reward_fn_key]],
        ground_truths=[_ground_truth(row) for row in data.non_tensor_batch["reward_model"]],
        extra_infos=list(extra_infos) if extra_infos is not None else [None] * len(lengths),
        valid_response_lengths=[int(length) for length in lengths],
        response_width=responses.shape[-1],
        prompt_strs=prompt_strs(data, tokenizer) if with_prompts else None,
    )


def prompt_strs(data: DataProto, tokenizer: Any) -> list[str]:
    """Each prompt as the model saw it: its tokens under ``attention_mask`` (no padding), special tokens kept."""
    keys = data.batch.keys()
    if "prompts" not in keys or "attention_mask" not in keys:
        raise RewardInputError("the batch lacks 'prompts' or 'attention_mask'; rollout output carries both")
    prompts = data.batch["prompts"]
    mask = data.batch["attention_mask"][:, : prompts.shape[-1]].bool()
    return tokenizer.batch_decode([row[keep].tolist() for row, keep in zip(prompts, mask)], skip_special_tokens=False)


def _ground_truth(reward_model: Any) -> Any:
    if isinstance(reward_model, dict):
        return reward_model.get("ground_truth")
    raise RewardInputError(f"reward_model entries must be dicts with 'ground_truth', got {reward_model!r}")


def scores_on_last_token(scores: list[float], valid_lengths: list[int], response_width: int) -> torch.Tensor:
    """[B, R] float32 zeros with each sample's score at its last response token (index length - 1)."""
    token_level_scores = torch.zeros(len(scores), response_width, dtype=torch.float32)
    if scores:
        rows = torch.arange(len(scores))
        # An empty response has no last token; its score goes to index 0, which response_mask hides.
        last = (torch.tensor(valid_lengths, dtype=torch.long) - 1).clamp(min=0)
        token_level_scores[rows, last] = torch.tensor(scores, dtype=torch.float32)
    return token_level_scores
