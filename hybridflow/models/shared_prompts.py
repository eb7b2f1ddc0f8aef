"""Shared prompts: the samples of a batch whose prompts are equal run their prompt once.

GRPO-style rollouts draw ``n`` responses per prompt, and a padded or packed forward computes each prompt
``n`` times. Here the samples with one prompt run as one row ``[prompt, response_1, ..., response_m]``
under a mask that lets each response attend to the prompt and to its own earlier tokens only, with the
positions each token has in its own sample (Prefix Grouper, arXiv 2506.05433; verl's
``actor.use_prefix_grouper``). Every response token sees exactly the keys and values it sees alone, so
its log-prob is the unshared one up to float summation order, and the prompt's activations receive the
sum of the ``m`` samples' gradients, as the ``m`` copies' would add up in the weights.

The response's first token is predicted by the prompt's last position, which the group shares: its logits
are computed once and read by every member.

The row's mask is one ``[W, W]`` mask for every layer, so it cannot also hold a sliding window: models with
sliding-window layers (Gemma 2/3, Mistral) share only batches whose samples fit in their window, and say once
that the others run packed or padded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hybridflow.models.padding import (
    PackedBatch, attention_pair_cost, layout_cost, pack_for_model, uses_varlen_attention,
)

logger = logging.getLogger(__name__)

# The model types already told that their sliding window keeps some batches from sharing prompts.
_TOLD_WINDOW_TOO_SHORT: set[str] = set()


@dataclass(frozen=True)
class SharedPromptBatch:
    """One row per distinct prompt of a ``[B, L]`` batch whose last ``R`` columns are the responses.

    ``input_ids``/``position_ids`` ``[G, W]``; ``attention_mask`` ``[G, 1, W, W]`` bool (True: may attend);
    ``keep`` ``[G, W]`` bool marks the positions whose logits are needed. Per predicted response token
    (``K`` of them): ``logit_row`` indexes the kept logits (in row-major order), ``labels`` is the token,
    and ``rows``/``cols`` place it in ``[B, R]``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    keep: torch.Tensor
    logit_row: torch.Tensor
    labels: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    batch_size: int
    response_length: int

    @property
    def num_rows(self) -> int:
        return self.input_ids.shape[0]

    @property
    def width(self) -> int:
        return self.input_ids.shape[1]

    def place(self, values: torch.Tensor) -> torch.Tensor:
        """Per predicted token values ``[K]`` into ``[B, R]`` (0 where the response is padding)."""
        shape = (self.batch_size, self.response_length)
        return values.new_zeros(shape).index_put((self.rows, self.cols), values.reshape(-1))


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int) -> list[list[int]]:
    """Sample indices grouped by equal prompt (its real tokens), in order of first appearance."""
    prompt_ids = input_ids[:, :-response_length]
    prompt_real = attention_mask[:, :-response_length].bool()
    groups: dict[tuple[int, ...], list[int]] = {}
    for sample in range(input_ids.shape[0]):
        key = tuple(prompt_ids[sample][prompt_real[sample]].tolist())
        groups.setdefault(key, []).append(sample)
    return list(groups.values())


def _responses_are_right_padded(attention_mask: torch.Tensor, response_length: int) -> bool:
    response = attention_mask[:, -response_length:].long()
    lengths = response.sum(dim=1, keepdim=True)
    columns = torch.arange(response_length, device=response.device)
    return bool(torch.equal(response, (columns < lengths).long()))


def shared_prompt_layout(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int, pair_cost: float,
    alternative_cost: float | None,
) -> SharedPromptBatch | None:
    """The shared-prompt layout of the batch, or None where it cannot or should not run.

    None when no prompt repeats, when a response is not right-padded (real tokens, then padding), or when
    ``alternative_cost`` (the other layout's ``layout_cost``; None: share whenever a prompt repeats) is lower.
    """
    batch_size, seq_len = input_ids.shape
    groups = prompt_groups(input_ids, attention_mask, response_length)
    if len(groups) == batch_size or not _responses_are_right_padded(attention_mask, response_length):
        return None
    real = attention_mask.bool()
    prompt_lengths = real[:, :-response_length].sum(dim=1).tolist()
    response_lengths = real[:, -response_length:].sum(dim=1).tolist()
    widths = [prompt_lengths[members[0]] + sum(response_lengths[s] for s in members) for members in groups]
    width = max(widths)
    if alternative_cost is not None and layout_cost(len(groups), width, pair_cost) >= alternative_cost:
        return None
    return _build(input_ids, real, groups, prompt_lengths, response_lengths, width, response_length)


def choose_layout(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    share_prompts: bool | None,
    use_remove_padding: bool,
) -> tuple[SharedPromptBatch | None, PackedBatch | None]:
    """The layout a forward over the batch runs: shared prompts, packed rows, or (both None) the padded rectangle.

    ``share_prompts``: True shares wherever a prompt repeats, None where ``layout_cost`` finds it cheaper than the
    layout that would run otherwise (the packing is then computed for the comparison), False never. Models with
    variable-length attention keep their packed path; a sample longer than a sliding window runs unshared
    (``fits_sliding_window``).
    """
    can_share = (
        share_prompts is not False and not uses_varlen_attention(model) and fits_sliding_window(model, attention_mask)
    )
    shared = packed = None
    if share_prompts is True and can_share:
        shared = shared_prompt_layout(input_ids, attention_mask, response_length, attention_pair_cost(model.config), None)
    if shared is None and use_remove_padding:
        packed = pack_for_model(model, input_ids, attention_mask)
    if share_prompts is None and can_share:
        pair_cost = attention_pair_cost(model.config)
        rows, width = packed.input_ids.shape if packed is not None else input_ids.shape
        shared = shared_prompt_layout(input_ids, attention_mask, response_length, pair_cost, layout_cost(rows, width, pair_cost))
    return shared, packed


def sliding_window(config) -> int | None:
    """How many tokens (itself included) a query of a sliding-window layer sees; None when every layer attends
    to the whole sequence. Qwen2/3 configs name a window their layers do not use unless ``use_sliding_window``;
    transformers then leaves ``sliding_window`` None, or ``layer_types`` lists no sliding layer."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None or (layer_types is not None and "sliding_attention" not in layer_types):
        return None
    return window


def fits_sliding_window(model: torch.nn.Module, attention_mask: torch.Tensor) -> bool:
    """Whether every sample of the batch fits in the model's sliding window (or it has none): only then is the
    shared layout's mask, which lets a token see its whole sample, the mask of every layer. Logs once per
    model type when not."""
    window = sliding_window(model.config)
    if window is None:
        return True
    longest = int(attention_mask.sum(dim=1).max())
    if longest <= window:
        return True
    model_type = model.config.model_type
    if model_type not in _TOLD_WINDOW_TOO_SHORT:
        _TOLD_WINDOW_TOO_SHORT.add(model_type)
        logger.warning(
            "%s: samples longer than its sliding window (%d tokens; this batch has one of %d) do not share prompts "
            "(use_prefix_grouper): one mask for all layers cannot hold the window; they run packed or padded",
            model_type, window, longest,
        )
    return False


def _build(input_ids, real, groups, prompt_lengths, response_lengths, width, response_length) -> SharedPromptBatch:
    device = input_ids.device
    num_rows = len(groups)
    ids = input_ids.new_zeros(num_rows, width)
    positions = torch.zeros(num_rows, width, dtype=torch.long, device=device)
    # Segment of each slot: 0 the prompt, j the group's j-th response, -1 padding.
    segment = torch.full((num_rows, width), -1, dtype=torch.long, device=device)
    keep = torch.zeros(num_rows, width, dtype=torch.bool, device=device)
    predictor_slots, labels, rows, cols = [], [], [], []
    for row, members in enumerate(groups):
        first = members[0]
        prompt = input_ids[first, :-response_length][real[first, :-response_length]]
        prompt_length = prompt_lengths[first]
        ids[row, :prompt_length] = prompt
        positions[row, :prompt_length] = torch.arange(prompt_length, device=device)
        segment[row, :prompt_length] = 0
        start = prompt_length
        for index, sample in enumerate(members, start=1):
            length = response_lengths[sample]
            if length == 0:
                continue
            end = start + length
            ids[row, start:end] = input_ids[sample, -response_length:][:length]
            positions[row, start:end] = torch.arange(prompt_length, prompt_length + length, device=device)
            segment[row, start:end] = index
            # Token t is predicted by the prompt's last position (t = 0) or by the sample's token t - 1.
            predictors = [prompt_length - 1] + list(range(start, end - 1))
            predictor_slots += [row * width + slot for slot in predictors]
            labels.append(ids[row, start:end])
            rows += [sample] * length
            cols += list(range(length))
            start = end
    flat_keep = keep.view(-1)
    slots = torch.tensor(predictor_slots, dtype=torch.long, device=device)
    flat_keep[slots] = True
    # The model returns the kept positions' logits in row-major order: their rank among the kept slots.
    logit_row = (torch.cumsum(flat_keep.long(), dim=0) - 1)[slots]
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    query, key = segment.unsqueeze(2), segment.unsqueeze(1)
    mask = causal & (key >= 0) & ((key == 0) | (key == query))
    # A padding slot attends to itself only, so no row of the mask is empty (softmax over nothing is NaN).
    mask |= torch.eye(width, dtype=torch.bool, device=device) & (query < 0)
    return SharedPromptBatch(
        input_ids=ids, position_ids=positions, attention_mask=mask.unsqueeze(1), keep=keep,
        logit_row=logit_row, labels=torch.cat(labels), rows=torch.tensor(rows, device=device),
        cols=torch.tensor(cols, device=device), batch_size=input_ids.shape[0], response_length=response_length,
    )
