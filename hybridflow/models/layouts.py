"""How a batch of ``[B, L]`` rows (left-padded prompt + right-padded response) runs through a model: padded,
packed, or with shared prompts. :func:`choose_layout` picks one for the whole batch of a pass (an update, a
log-prob or value pass) by estimated cost, once; :meth:`Layout.arrange` lays out each micro-batch in it. Every
layout is exact: a token sees the keys and values it sees alone, at its own positions.

Packed: the real tokens laid end to end in rows, positions restarting at 0 per sample, so the linear layers
cost the real tokens, not ``B * L``. With ``attention_mask=None`` and ``use_cache=False``, transformers
(>= 4.56) keeps the samples apart: a block-diagonal causal mask per row for sdpa/eager, variable-length
kernels for flash attention (one row: they cost ``sum(len**2)`` whatever the rows). sdpa/eager pay for every
entry of a dense ``[W, W]`` mask per row, so the samples are dealt into the ``N`` balanced rows minimising
``N * W * (1 + W * pair_cost)`` (``attention_pair_cost``), or run padded where packing is not estimated
``MIN_PACKED_SAVING`` cheaper: samples of similar length run padded, ragged ones packed.

Shared prompts (Prefix Grouper, arXiv 2506.05433; verl's ``actor.use_prefix_grouper``): the ``n`` samples of
one prompt run as one row ``[prompt, response_1, ..., response_m]`` under a mask that lets each response see
the prompt and its own earlier tokens only; the prompt runs once and receives the sum of the samples'
gradients, and its last position's logits predict every member's first token. One ``[W, W]`` mask serves every
layer, so models with sliding-window layers (Gemma 2/3, Mistral) share only batches that fit in the window,
and say once that the others run packed or padded.
"""

from __future__ import annotations

import heapq
import logging
import math
from dataclasses import dataclass
from fractions import Fraction

import torch

logger = logging.getLogger(__name__)

# Pack only when the estimate beats the padded rectangle by this share: the estimate tracked measured CPU
# time within about 10% (bench/bench_models.py), and the padded path needs no gather/scatter.
MIN_PACKED_SAVING = 0.05

# The model types already told that their sliding window keeps some batches from sharing prompts.
_TOLD_WINDOW_TOO_SHORT: set[str] = set()
# The model types already told that their recurrent layers keep their samples padded, one a row.
_TOLD_RECURRENT: set[str] = set()
# The layer types of transformers' configs that attend by a mask; any other (Qwen3-Next's "linear_attention", a
# gated delta rule) carries a state along the whole row, across the samples a packed or shared row holds.
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


@dataclass(frozen=True)
class PackedBatch:
    """The real tokens of a ``[B, L]`` batch laid end to end in ``N`` rows of width ``W``.

    ``input_ids`` and ``position_ids`` are ``[N, W]`` (the tail of a short row holds token 0 at
    position 0, each such slot a sequence of its own); ``token_index`` ``[T]`` holds each real token's
    flat index ``b * L + col`` in the rectangle (row-major order) and ``slot_index`` ``[T]`` the same
    token's flat index ``n * W + col`` in the packed rows; ``batch_size`` and ``seq_len`` are ``B`` and ``L``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    token_index: torch.Tensor
    slot_index: torch.Tensor
    batch_size: int
    seq_len: int

    @property
    def num_tokens(self) -> int:
        return self.token_index.numel()


@dataclass(frozen=True)
class SharedPromptBatch:
    """One row per distinct prompt of a ``[B, L]`` batch whose last ``R`` columns are the responses.

    ``input_ids``/``position_ids`` ``[G, W]``; ``attention_mask`` ``[G, 1, W, W]`` bool (True: may attend);
    ``keep`` ``[G, W]`` bool marks the positions whose logits are needed. Per predicted response token
    (``K`` of them): ``logit_row`` indexes the kept logits (in row-major order), ``labels`` is the token,
    and ``rows``/``cols`` place it in ``[B, R]``. ``last_token`` ``[B]``: each sample's last real token as a flat
    slot (``row * W + column``; the prompt's last where the response is empty), where a reward model scores it.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor
    keep: torch.Tensor
    logit_row: torch.Tensor
    labels: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    last_token: torch.Tensor
    batch_size: int
    response_length: int

    def place(self, values: torch.Tensor) -> torch.Tensor:
        """Per predicted token values ``[K]`` into ``[B, R]`` (0 where the response is padding)."""
        shape = (self.batch_size, self.response_length)
        return values.new_zeros(shape).index_put((self.rows, self.cols), values.reshape(-1))


@dataclass(frozen=True)
class Layout:
    """How every micro-batch of one pass runs, chosen once for the pass's batch by :func:`choose_layout`.

    ``share_prompts``: one row per distinct prompt (:class:`SharedPromptBatch`). Otherwise ``rows_per_sample``:
    the real tokens packed into ``ceil(samples * rows_per_sample)`` balanced rows (:class:`PackedBatch`), the
    share of rows of the cheapest packing of the pass's batch (one row under flash attention); None: the padded
    rectangle.
    """

    share_prompts: bool = False
    rows_per_sample: Fraction | None = None

    def arrange(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
    ) -> SharedPromptBatch | PackedBatch | None:
        """The rows of one micro-batch in this layout; None for the padded rectangle (run as it is)."""
        if self.share_prompts:
            return shared_prompt_rows(input_ids, attention_mask, response_length)
        return self.pack(input_ids, attention_mask)

    def pack(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> PackedBatch | None:
        """The micro-batch's real tokens in its share of balanced rows; None where the layout runs padded."""
        if self.rows_per_sample is None:
            return None
        num_rows = max(1, math.ceil(input_ids.shape[0] * self.rows_per_sample))
        return pack_padded(input_ids, attention_mask, num_rows)


PADDED = Layout()


def choose_layout(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    share_prompts: bool | None,
    use_remove_padding: bool,
) -> Layout:
    """The layout of a pass over this batch (``[B, L]``, every row the pass will run).

    Unshared, the batch runs packed with ``use_remove_padding`` (:func:`choose_packing`), else padded.
    ``share_prompts``: True shares where a prompt of the batch repeats, None where sharing's ``layout_cost`` is
    below the unshared layout's, False never. Models with variable-length attention keep their packed path; a
    batch with a sample longer than the sliding window (``fits_sliding_window``) or a response that is not
    right-padded (real tokens, then padding) runs unshared; a model with recurrent layers runs padded
    (``can_pack_samples``).
    """
    if not can_pack_samples(model):
        return PADDED
    unshared, shape = choose_packing(model, attention_mask) if use_remove_padding else (PADDED, attention_mask.shape)
    can_share = (
        share_prompts is not False and not uses_varlen_attention(model) and fits_sliding_window(model, attention_mask)
    )
    if not can_share or not _responses_are_right_padded(attention_mask, response_length):
        return unshared
    groups, _, _, widths = _prompt_groups_and_widths(input_ids, attention_mask, response_length)
    if len(groups) == input_ids.shape[0]:
        return unshared
    pair_cost = attention_pair_cost(model.config)
    shared_cost = layout_cost(len(groups), max(widths), pair_cost)
    if share_prompts is None and shared_cost >= layout_cost(*shape, pair_cost):
        return unshared
    return Layout(share_prompts=True)


def choose_packing(model: torch.nn.Module, attention_mask: torch.Tensor) -> tuple[Layout, tuple[int, int]]:
    """The packed layout cheapest for ``model``'s attention kernel, or :data:`PADDED` where packing is not
    ``MIN_PACKED_SAVING`` cheaper (one row under flash attention, else the ``cheapest_rows`` count) or the model
    has recurrent layers (``can_pack_samples``), and the ``[rows, width]`` the batch then runs as."""
    if not can_pack_samples(model):
        return PADDED, tuple(attention_mask.shape)
    lengths = attention_mask.bool().sum(dim=1).tolist()
    if uses_varlen_attention(model):
        return Layout(rows_per_sample=Fraction(1, max(len(lengths), 1))), (1, sum(lengths))
    rows = cheapest_rows(lengths, attention_mask.shape[1], attention_pair_cost(model.config))
    if rows is None:
        return PADDED, tuple(attention_mask.shape)
    width = max(sum(lengths[sample] for sample in members) for members in rows)
    return Layout(rows_per_sample=Fraction(len(rows), len(lengths))), (len(rows), width)


def balanced_rows(lengths: list[int], num_rows: int) -> list[list[int]]:
    """Deal sample indices into ``num_rows`` rows, longest sample first onto the currently shortest row.

    Graham's LPT rule: the longest row is at most 4/3 of the best possible (Graham 1969). Rows that get
    no sample are dropped.
    """
    rows: list[list[int]] = [[] for _ in range(num_rows)]
    loads = [(0, row) for row in range(num_rows)]
    for sample in sorted(range(len(lengths)), key=lambda index: -lengths[index]):
        load, row = heapq.heappop(loads)
        rows[row].append(sample)
        heapq.heappush(loads, (load + lengths[sample], row))
    return [members for members in rows if members]


def pack_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor, num_rows: int = 1) -> PackedBatch:
    """Pack ``input_ids [B, L]``'s real tokens (``attention_mask [B, L]`` is 1 on them) into rows.

    ``num_rows=1`` lays all ``T`` real tokens in one row; more rows are filled by ``balanced_rows``.
    Positions count real tokens within each sample (0, 1, 2, ...), which equals the padded batch's
    ``position_ids = cumsum(attention_mask) - 1`` on every real token.
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must both be [B, L]"
        )
    if num_rows < 1:
        raise ValueError(f"num_rows={num_rows} must be at least 1")
    lengths = attention_mask.bool().sum(dim=1).tolist()
    return pack_into_rows(input_ids, attention_mask, balanced_rows(lengths, num_rows))


def pack_into_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: list[list[int]]) -> PackedBatch:
    """Pack the samples listed in each of ``rows`` (sample indices, in order) end to end into that row."""
    batch_size, seq_len = input_ids.shape
    real = attention_mask.bool()
    lengths = real.sum(dim=1).tolist()
    row_of, start_of = [0] * batch_size, [0] * batch_size
    width = 0
    for row, members in enumerate(rows):
        start = 0
        for sample in members:
            row_of[sample], start_of[sample] = row, start
            start += lengths[sample]
        width = max(width, start)
    positions = torch.cumsum(real.long(), dim=1) - 1
    token_index = real.flatten().nonzero(as_tuple=True)[0]
    sample = token_index // seq_len
    real_positions = positions.flatten()[token_index]
    device = input_ids.device
    slot_index = (
        torch.tensor(row_of, device=device)[sample] * width + torch.tensor(start_of, device=device)[sample]
    ) + real_positions
    flat_shape = (len(rows) * width,)
    packed_ids = input_ids.new_zeros(flat_shape).index_copy(0, slot_index, input_ids.flatten()[token_index])
    packed_positions = positions.new_zeros(flat_shape).index_copy(0, slot_index, real_positions)
    return PackedBatch(
        input_ids=packed_ids.view(len(rows), width),
        position_ids=packed_positions.view(len(rows), width),
        token_index=token_index,
        slot_index=slot_index,
        batch_size=batch_size,
        seq_len=seq_len,
    )


def uses_varlen_attention(model: torch.nn.Module) -> bool:
    """Whether ``model`` attends with a variable-length kernel (flash attention), read from its config."""
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    return "flash" in implementation


def attention_pair_cost(config) -> float:
    """FLOPs of one (query, key) pair in a dense-masked attention layer, per FLOP of one token's linear layers.

    Linear layers per token: q/o projections ``2 * H * heads * head_dim``, k/v ``2 * H * kv_heads * head_dim``
    and a gated MLP ``3 * H * intermediate``; a pair costs ``2 * heads * head_dim`` (scores and values).
    Layers, embeddings and the vocabulary projection are the same in every layout and cancel out.
    """
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    linear = 2 * hidden * (heads + kv_heads) * head_dim + 3 * hidden * intermediate
    return 2 * heads * head_dim / linear


def layout_cost(num_rows: int, width: int, pair_cost: float) -> float:
    """Estimated cost of running ``[num_rows, width]`` with a dense mask, in token-linear-layer units."""
    return num_rows * width * (1 + width * pair_cost)


def cheapest_rows(lengths: list[int], padded_width: int, pair_cost: float) -> list[list[int]] | None:
    """The ``balanced_rows`` layout of lowest ``layout_cost``, or None unless it beats ``[B, padded_width]``
    by ``MIN_PACKED_SAVING``.

    Branch and bound over the row count ``N``: no layout is narrower than the longest sample nor than
    ``ceil(T / N)``, so the search walks away from ``N = ceil(T / longest)`` until that bound loses.
    """
    total, longest = sum(lengths), max(lengths, default=0)
    if total == 0:
        return None
    best_rows = None
    best_cost = (1 - MIN_PACKED_SAVING) * layout_cost(len(lengths), padded_width, pair_cost)
    start = math.ceil(total / longest)
    for direction in (range(start, len(lengths) + 1), range(start - 1, 0, -1)):
        for num_rows in direction:
            bound = layout_cost(num_rows, max(longest, math.ceil(total / num_rows)), pair_cost)
            if bound >= best_cost:
                break
            rows = balanced_rows(lengths, num_rows)
            width = max(sum(lengths[sample] for sample in members) for members in rows)
            cost = layout_cost(len(rows), width, pair_cost)
            if cost < best_cost:
                best_rows, best_cost = rows, cost
    return best_rows


def pack_values(values: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Take a ``[B, L, ...]`` tensor's entries at the packed tokens: ``[T, ...]``."""
    return values.flatten(0, 1)[packed.token_index]


def packed_outputs(outputs: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """Take the model's ``[N, W, ...]`` outputs at the real tokens: ``[T, ...]``, aligned with ``pack_values``."""
    return outputs.flatten(0, 1)[packed.slot_index]


def unpack(values: torch.Tensor, packed: PackedBatch, fill_value: float = 0.0) -> torch.Tensor:
    """Scatter per-token results ``[T, ...]`` back to the rectangle ``[B, L, ...]``; padding gets ``fill_value``.

    Differentiable: gradients flow from the rectangle back to ``values``.
    """
    if values.shape[0] != packed.num_tokens:
        raise ValueError(f"values has {values.shape[0]} rows but the packed batch has {packed.num_tokens} tokens")
    flat_shape = (packed.batch_size * packed.seq_len, *values.shape[1:])
    flat = values.new_full(flat_shape, fill_value).index_copy(0, packed.token_index, values)
    return flat.view(packed.batch_size, packed.seq_len, *values.shape[1:])


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


def shared_prompt_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
) -> SharedPromptBatch:
    """One row per distinct prompt of the batch (a prompt that does not repeat gets a row of its own sample)."""
    groups, prompt_lengths, response_lengths, widths = _prompt_groups_and_widths(
        input_ids, attention_mask, response_length
    )
    real = attention_mask.bool()
    return _build(input_ids, real, groups, prompt_lengths, response_lengths, max(widths), response_length)


def _prompt_groups_and_widths(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int
) -> tuple[list[list[int]], list[int], list[int], list[int]]:
    """The prompt groups, each sample's prompt and response lengths, and each group's row width."""
    groups = prompt_groups(input_ids, attention_mask, response_length)
    real = attention_mask.bool()
    prompt_lengths = real[:, :-response_length].sum(dim=1).tolist()
    response_lengths = real[:, -response_length:].sum(dim=1).tolist()
    widths = [prompt_lengths[members[0]] + sum(response_lengths[s] for s in members) for members in groups]
    return groups, prompt_lengths, response_lengths, widths


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


def recurrent_layer_types(config) -> list[str]:
    """The model's layer types that do not attend by a mask (``ATTENTION_LAYER_TYPES``), e.g. linear attention."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return sorted(set(getattr(config, "layer_types", None) or ()) - set(ATTENTION_LAYER_TYPES))


def can_pack_samples(model: torch.nn.Module) -> bool:
    """Whether a row may hold several samples (packed, or a shared prompt's responses): not for a model with
    recurrent layers, whose state would run from one sample into the next (transformers' CPU kernels of the gated
    delta rule take no sample boundaries). Such a model runs padded, one sample a row; logs once per model type."""
    recurrent = recurrent_layer_types(model.config)
    if not recurrent:
        return True
    _warn_once(
        _TOLD_RECURRENT,
        model,
        "%s: its %s layers carry a state along the row, so its samples neither pack (use_remove_padding) nor share "
        "prompts (use_prefix_grouper); they run padded, one a row",
        "/".join(recurrent),
    )
    return False


def fits_sliding_window(model: torch.nn.Module, attention_mask: torch.Tensor) -> bool:
    """Whether every sample of the batch fits in the model's sliding window (or it has none): only then is the
    shared layout's mask, which lets a token see its whole sample, the mask of every layer. Logs once per
    model type when not."""
    window = sliding_window(model.config)
    if window is None:
        return True
    longest = max(attention_mask.sum(dim=1).tolist(), default=0)
    if longest <= window:
        return True
    _warn_once(
        _TOLD_WINDOW_TOO_SHORT,
        model,
        "%s: samples longer than its sliding window (%d tokens; this batch has one of %d) do not share prompts "
        "(use_prefix_grouper): one mask for all layers cannot hold the window; they run packed or padded",
        window,
        longest,
    )
    return False


def _warn_once(told: set[str], model: torch.nn.Module, message: str, *args) -> None:
    """Log ``message`` (its first ``%s`` the model type) the first time a model of that type reaches it."""
    model_type = model.config.model_type
    if model_type not in told:
        told.add(model_type)
        logger.warning(message, model_type, *args)


def _build(input_ids, real, groups, prompt_lengths, response_lengths, width, response_length) -> SharedPromptBatch:
    """Lay each group's prompt and responses into its row, marking the slots whose logits predict a token."""
    device = input_ids.device
    num_rows = len(groups)
    ids = input_ids.new_zeros(num_rows, width)
    positions = torch.zeros(num_rows, width, dtype=torch.long, device=device)
    # Segment of each slot: 0 the prompt, j the group's j-th response, -1 padding.
    segment = torch.full((num_rows, width), -1, dtype=torch.long, device=device)
    keep = torch.zeros(num_rows, width, dtype=torch.bool, device=device)
    predictor_slots, labels, rows, cols = [], [], [], []
    last_token = [0] * input_ids.shape[0]
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
            last_token[sample] = row * width + (start + length - 1 if length else prompt_length - 1)
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
    laid_out = (ids, positions, segment, keep, last_token)
    return _shared_batch(laid_out, predictor_slots, labels, rows, cols, input_ids.shape[0], response_length)


def _shared_batch(laid_out, predictor_slots, labels, rows, cols, batch_size, response_length) -> SharedPromptBatch:
    """The rows laid out by ``_build`` (ids, positions, segments, keep, last tokens) as the forward's inputs and
    index maps."""
    ids, positions, segment, keep, last_token = laid_out
    device = ids.device
    flat_keep = keep.view(-1)
    slots = torch.tensor(predictor_slots, dtype=torch.long, device=device)
    flat_keep[slots] = True
    # The model returns the kept positions' logits in row-major order: their rank among the kept slots.
    logit_row = (torch.cumsum(flat_keep.long(), dim=0) - 1)[slots]
    return SharedPromptBatch(
        input_ids=ids,
        position_ids=positions,
        attention_mask=_segment_mask(segment),
        keep=keep,
        logit_row=logit_row,
        labels=torch.cat(labels) if labels else ids.new_zeros(0),
        rows=torch.tensor(rows, dtype=torch.long, device=device),
        cols=torch.tensor(cols, dtype=torch.long, device=device),
        last_token=torch.tensor(last_token, dtype=torch.long, device=device),
        batch_size=batch_size,
        response_length=response_length,
    )


def _segment_mask(segment: torch.Tensor) -> torch.Tensor:
    """``[G, 1, W, W]`` bool: a slot of segment ``s`` (0 the prompt, j a response, -1 padding) attends causally to
    the prompt and to segment ``s``; a padding slot to itself only, so no row is empty (softmax over nothing is
    NaN)."""
    width = segment.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=segment.device).tril()
    query, key = segment.unsqueeze(2), segment.unsqueeze(1)
    mask = causal & (key >= 0) & ((key == 0) | (key == query))
    mask |= torch.eye(width, dtype=torch.bool, device=segment.device) & (query < 0)
    return mask.unsqueeze(1)
