"""Between ``DataProto`` prompts and per-request generation: unpad, fan out n samples, pack responses back."""

from __future__ import annotations

import dataclasses

import torch

from hybridflow.rollout.config import SamplingParams
from hybridflow.rollout.requests import GenerationRequest

# One sample's output: response token ids, its loss mask (1 = generated, 0 = tool result), per-token log-probs.
SampleOutput = tuple[list[int], list[int], list[float]]


def prompt_token_lists(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The real (unpadded) tokens of each prompt row: [B, P] -> B lists."""
    return [row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask)]


def sample_seed(seed: int, row: int) -> int:
    """A distinct, reproducible seed for output row ``row`` of a call seeded with ``seed``."""
    return (seed * 1_000_003 + row) % (2**62)


def build_requests(
    prompts: list[list[int]], n: int, sampling: SamplingParams, seed: int, first_prompt: int = 0
) -> list[GenerationRequest]:
    """``n`` requests per prompt, samples of one prompt adjacent, each seeded by its global row."""
    requests = []
    for index, prompt in enumerate(prompts, start=first_prompt):
        for sample in range(n):
            row = index * n + sample
            params = dataclasses.replace(sampling, seed=sample_seed(seed, row))
            requests.append(GenerationRequest(prompt_ids=prompt, sampling=params, request_id=str(row)))
    return requests


def pack_outputs(
    prompt_batch,
    outputs: list[SampleOutput],
    n: int,
    response_length: int,
    pad_token_id: int,
    with_log_probs: bool,
    weight_versions: list[list[int]] | None = None,
) -> dict[str, torch.Tensor]:
    """Right-pad the ``B * n`` outputs to ``response_length`` and join them to their (repeated) prompts.

    ``prompt_batch`` holds ``input_ids``, ``attention_mask``, ``position_ids`` [B, P]. Returns verl's keys:
    ``prompts`` [B*n, P]; ``responses``, ``response_mask`` (and ``rollout_log_probs``) [B*n, R];
    ``input_ids``, ``attention_mask``, ``position_ids`` [B*n, P+R]. Response positions continue from each
    prompt's last position; the response attention mask is 1 on every real token, tool results included.
    With ``weight_versions`` (per output, per token), ``rollout_weight_versions`` [B*n, R] (-1 on padding).
    """
    responses, response_mask, response_attention, log_probs = _padded_responses(outputs, response_length, pad_token_id)
    prompts = prompt_batch["input_ids"].repeat_interleave(n, dim=0)
    prompt_attention = prompt_batch["attention_mask"].repeat_interleave(n, dim=0)
    prompt_positions = prompt_batch["position_ids"].repeat_interleave(n, dim=0)
    steps = torch.arange(1, response_length + 1, dtype=prompt_positions.dtype)
    response_positions = prompt_positions[:, -1:] + steps[None, :]
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": torch.cat([prompt_attention, response_attention], dim=1),
        "position_ids": torch.cat([prompt_positions, response_positions], dim=1),
    }
    if with_log_probs:
        tensors["rollout_log_probs"] = log_probs
    if weight_versions is not None:
        versions = torch.full((len(outputs), response_length), -1, dtype=torch.long)
        for row, row_versions in enumerate(weight_versions):
            length = min(len(row_versions), response_length)
            versions[row, :length] = torch.tensor(row_versions[:length], dtype=torch.long)
        tensors["rollout_weight_versions"] = versions
    return tensors


def _padded_responses(
    outputs: list[SampleOutput], response_length: int, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The outputs right-padded to ``response_length``: tokens, loss mask, attention mask, log-probs [B*n, R]."""
    rows = len(outputs)
    responses = torch.full((rows, response_length), pad_token_id, dtype=torch.long)
    response_mask = torch.zeros(rows, response_length, dtype=torch.long)
    response_attention = torch.zeros(rows, response_length, dtype=torch.long)
    log_probs = torch.zeros(rows, response_length, dtype=torch.float32)
    for row, (token_ids, loss_mask, token_log_probs) in enumerate(outputs):
        length = min(len(token_ids), response_length)
        responses[row, :length] = torch.tensor(token_ids[:length], dtype=torch.long)
        response_mask[row, :length] = torch.tensor(loss_mask[:length], dtype=torch.long)
        response_attention[row, :length] = 1
        log_probs[row, :length] = torch.tensor(token_log_probs[:length], dtype=torch.float32)
    return responses, response_mask, response_attention, log_probs
