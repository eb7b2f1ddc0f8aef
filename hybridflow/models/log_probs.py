"""Log-probs (and entropy, and the sum of squared probabilities) of the response tokens under a causal LM:
the one path for actor, reference and rollout log-prob calls.

The model projects to the vocabulary only at the positions that predict response tokens
(``logits_to_keep``), never at the prompt, and the log-softmax statistics are taken chunk by chunk
(``hybridflow.models.chunked_softmax``), so no ``[tokens, vocab]`` log-softmax is ever materialised.
With ``use_remove_padding`` the batch's real tokens run packed, in rows laid out for the model's attention
kernel (``hybridflow.models.padding.pack_for_model``). With ``share_prompts`` the samples of one prompt run
it once (``hybridflow.models.shared_prompts``): ``None`` where that is estimated cheaper than the padded or
packed layout, ``True`` wherever a prompt repeats.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hybridflow.models.chunked_softmax import log_probs_and_entropy, sum_pi_squared_from_logits
from hybridflow.models.last_layer import kept_positions_only
from hybridflow.models.padding import PackedBatch, pack_values
from hybridflow.models.shared_prompts import SharedPromptBatch, choose_layout


def response_prediction_mask(attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """``[B, L]`` bool: positions that are real and whose next token is a real response token.

    The logit at column ``c`` predicts the token at ``c + 1``, so the response's ``R`` tokens (the last
    ``R`` columns) are predicted by columns ``L-R-1 .. L-2``.
    """
    seq_len = attention_mask.shape[1]
    if not 0 < response_length < seq_len:
        raise ValueError(
            f"response_length={response_length} must be in [1, {seq_len - 1}] for sequences of length {seq_len}"
        )
    real = attention_mask.bool()
    mask = torch.zeros_like(real)
    start = seq_len - response_length - 1
    mask[:, start : seq_len - 1] = real[:, start : seq_len - 1] & real[:, start + 1 :]
    return mask


class TokenStatistics(NamedTuple):
    """Per response token ``[B, R]`` float32, 0 where the response is padding; None where not asked for."""

    log_probs: torch.Tensor
    entropy: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None


def forward_log_probs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    use_remove_padding: bool = True,
    calculate_entropy: bool = False,
    chunk_size: int | None = None,
    share_prompts: bool | None = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response tokens under ``model``: ``[B, R]`` float32 each.

    ``input_ids``, ``attention_mask``, ``position_ids`` are ``[B, L]`` with the response in the last
    ``R = response_length`` columns. Entries whose response token is padding are 0. With
    ``use_remove_padding`` the real tokens are packed (``position_ids`` are then derived from
    ``attention_mask``) unless ``pack_for_model`` finds the padded rectangle cheaper; otherwise the
    padded rectangle is run as is. Gradients flow when enabled.
    """
    statistics = forward_token_statistics(
        model, input_ids, attention_mask, position_ids, response_length, temperature, use_remove_padding,
        calculate_entropy=calculate_entropy, chunk_size=chunk_size, share_prompts=share_prompts,
    )
    return statistics.log_probs, statistics.entropy


def forward_token_statistics(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    temperature: float = 1.0,
    use_remove_padding: bool = True,
    calculate_entropy: bool = False,
    calculate_sum_pi_squared: bool = False,
    chunk_size: int | None = None,
    share_prompts: bool | None = False,
) -> TokenStatistics:
    """:func:`forward_log_probs`, and with ``calculate_sum_pi_squared`` also ``sum_v pi_v^2`` of each
    position's next-token distribution (at ``temperature``; no gradient), from the same forward pass."""
    predicts = response_prediction_mask(attention_mask, response_length)
    statistics = dict(temperature=temperature, calculate_entropy=calculate_entropy, chunk_size=chunk_size)
    shared, packed = choose_layout(model, input_ids, attention_mask, response_length, share_prompts, use_remove_padding)
    if shared is not None:
        logits, labels, place = _shared_logits(model, shared)
    elif packed is not None:
        logits, labels, place = _packed_logits(model, packed, input_ids, response_length, predicts)
    else:
        logits, labels, place = _padded_logits(
            model, input_ids, attention_mask, position_ids, response_length, predicts
        )
    log_probs, entropy = log_probs_and_entropy(logits, labels, **statistics)
    sum_pi_squared = None
    if calculate_sum_pi_squared:
        sum_pi_squared = place(sum_pi_squared_from_logits(logits, temperature, chunk_size))
    return TokenStatistics(place(log_probs), None if entropy is None else place(entropy), sum_pi_squared)


def _packed_logits(model, packed: PackedBatch, input_ids, response_length, predicts):
    """Run the packed rows, projecting to the vocabulary only at the K predicting positions: their logits,
    labels, and the function that places K per-position values into ``[B, R]``."""
    keep = pack_values(predicts, packed).nonzero(as_tuple=True)[0]
    # A boolean logits_to_keep returns the kept positions in row-major slot order: label them in that order.
    keep = keep[torch.argsort(packed.slot_index[keep])]
    keep_slots = torch.zeros(packed.input_ids.numel(), dtype=torch.bool, device=input_ids.device)
    keep_slots[packed.slot_index[keep]] = True
    next_tokens = torch.roll(input_ids, shifts=-1, dims=1)
    labels = pack_values(next_tokens, packed)[keep]
    keep_slots = keep_slots.view_as(packed.input_ids)
    with kept_positions_only(model, keep_slots):
        output = model(
            input_ids=packed.input_ids,
            position_ids=packed.position_ids,
            attention_mask=None,
            use_cache=False,
            logits_to_keep=keep_slots,
        )
    flat_index = packed.token_index[keep]
    rows = flat_index // packed.seq_len
    cols = flat_index % packed.seq_len - (packed.seq_len - response_length - 1)
    shape = (packed.batch_size, response_length)

    def place(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(shape).index_put((rows, cols), values.reshape(-1))

    return output.logits, labels, place


def _shared_logits(model, shared: SharedPromptBatch):
    """Run one row per prompt, projecting to the vocabulary only at the predicting positions: the logits of
    every predicted token (the prompt's last position's read by each member), labels, and ``place``."""
    with kept_positions_only(model, shared.keep):
        output = model(
            input_ids=shared.input_ids,
            position_ids=shared.position_ids,
            attention_mask=shared.attention_mask,
            use_cache=False,
            logits_to_keep=shared.keep,
        )
    logits = output.logits.reshape(-1, output.logits.shape[-1])[shared.logit_row]
    return logits, shared.labels, shared.place


def _padded_logits(model, input_ids, attention_mask, position_ids, response_length, predicts):
    """Run the padded rectangle, projecting to the vocabulary at its last R + 1 columns: their logits,
    labels, and the function that keeps the R predicting columns (0 where the response is padding)."""
    last_columns = torch.zeros_like(input_ids, dtype=torch.bool)
    last_columns[:, -response_length - 1 :] = True
    with kept_positions_only(model, last_columns):
        output = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            logits_to_keep=response_length + 1,
        )
    # The last column predicts past the end; label it 0 to keep the logits a contiguous view.
    labels = torch.nn.functional.pad(input_ids[:, -response_length:], (0, 1))
    keep = predicts[:, -response_length - 1 : -1]

    def place(values: torch.Tensor) -> torch.Tensor:
        return torch.where(keep, values[:, :-1], 0.0)

    return output.logits, labels, place
