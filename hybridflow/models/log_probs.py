"""Log-probs (and entropy, and the sum of squared probabilities) of the response tokens under a causal LM:
the one path for actor, reference and rollout log-prob calls.

The batch runs in the layout its pass chose (:mod:`hybridflow.models.layouts`: padded, packed or shared
prompts). The model projects to the vocabulary only at the positions that predict response tokens
(``logits_to_keep``), never at the prompt, and computes the last decoder layer's query, output projection and
MLP only there (:func:`kept_positions_only`). The log-softmax statistics are taken chunk by chunk with a
hand-written backward (:func:`log_probs_and_entropy`), so no ``[tokens, vocab]`` log-softmax is materialised.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, NamedTuple

import torch
from torch.autograd.function import once_differentiable

from hybridflow.algos.distillation import log_probs_at, topk_log_probs
from hybridflow.distributed.sequence_parallel import SequenceParallelGroup
from hybridflow.models.layouts import Layout, PackedBatch, SharedPromptBatch, choose_layout, pack_values
from hybridflow.models.sequence_parallel import SequenceSplit, gather_predictions

# 4 MiB of float32 per chunk: on CPU, blocks this small are reused from the heap and stay in cache
# (64 MiB blocks measured ~2x slower, mostly page faults). On GPU a larger chunk_size is faster.
DEFAULT_CHUNK_ELEMENTS = 2**20

# The position-wise parts of a decoder layer that only its own position reads (Llama, Qwen2/3, Mistral, Gemma).
POSITION_WISE = ("self_attn.q_proj", "self_attn.o_proj", "mlp")


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
    # ``[B, R, k]``: a teacher's top-k log-probs and ids (``topk``), or a student's log-probs at given ids and its
    # own top-k ids (``at_ids``), for on-policy distillation (``algos/distillation.py``)
    topk_log_probs: torch.Tensor | None = None
    topk_ids: torch.Tensor | None = None


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
    """Log-probs (and entropy) of the response tokens of one batch under ``model``: ``[B, R]`` float32 each.

    ``input_ids``, ``attention_mask``, ``position_ids`` are ``[B, L]`` with the response in the last
    ``R = response_length`` columns. Entries whose response token is padding are 0. The batch runs in the
    layout :func:`~hybridflow.models.layouts.choose_layout` picks for it from ``share_prompts`` and
    ``use_remove_padding``; a pass of several micro-batches chooses once and calls
    :func:`forward_token_statistics`. Gradients flow when enabled.
    """
    layout = choose_layout(model, input_ids, attention_mask, response_length, share_prompts, use_remove_padding)
    statistics = forward_token_statistics(
        model,
        input_ids,
        attention_mask,
        position_ids,
        response_length,
        layout,
        temperature,
        calculate_entropy=calculate_entropy,
        chunk_size=chunk_size,
    )
    return statistics.log_probs, statistics.entropy


def forward_token_statistics(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    layout: Layout,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    calculate_sum_pi_squared: bool = False,
    chunk_size: int | None = None,
    sequence_parallel: SequenceParallelGroup | None = None,
    topk: int | None = None,
    at_ids: torch.Tensor | None = None,
) -> TokenStatistics:
    """:func:`forward_log_probs` of a batch run in ``layout``, and with ``calculate_sum_pi_squared`` also
    ``sum_v pi_v^2`` of each position's next-token distribution (at ``temperature``; no gradient), from the
    same forward pass. With ``sequence_parallel`` every rank of that group passes the same batch and gets the
    same statistics, each rank running ``1/k`` of every row (:mod:`hybridflow.models.sequence_parallel`).
    ``topk``: also the top-k log-probs and ids per response token (no gradient); ``at_ids [B, R, k]``: also the
    log-probs at those ids (differentiable) and the model's own top-k ids."""
    predicts = response_prediction_mask(attention_mask, response_length)
    statistics = dict(temperature=temperature, calculate_entropy=calculate_entropy, chunk_size=chunk_size)
    arranged = layout.arrange(input_ids, attention_mask, response_length)
    if isinstance(arranged, SharedPromptBatch):
        rows = _shared_rows(arranged)
    elif isinstance(arranged, PackedBatch):
        rows = _packed_rows(arranged, input_ids, response_length, predicts)
    else:
        rows = _padded_rows(input_ids, attention_mask, position_ids, response_length, predicts)
    if sequence_parallel is None:
        logits, labels, place = _kept_logits(model, rows), rows.labels, rows.place
    else:
        logits, labels, place = _kept_logits_in_slices(model, rows, sequence_parallel)
    log_probs, entropy = log_probs_and_entropy(logits, labels, **statistics)
    sum_pi_squared = None
    if calculate_sum_pi_squared:
        sum_pi_squared = place(sum_pi_squared_from_logits(logits, temperature, chunk_size))
    top = _top_statistics(logits, labels, place, temperature, topk, at_ids, sequence_parallel)
    return TokenStatistics(place(log_probs), None if entropy is None else place(entropy), sum_pi_squared, *top)


def _top_statistics(logits, labels, place, temperature, topk, at_ids, sequence_parallel) -> tuple:
    """:func:`forward_token_statistics`' ``topk_log_probs`` and ``topk_ids`` ``[B, R, k]`` (None, None unasked)."""
    if topk is None and at_ids is None:
        return None, None
    if sequence_parallel is not None:
        raise ValueError("top-k statistics (on-policy distillation) are not computed under Ulysses sequence parallel")
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)
    if at_ids is None:
        top = topk_log_probs(flat, topk, temperature)
        return _place_columns(top.log_probs, labels, place), _place_columns(top.ids, labels, place).long()
    # Each prediction's ids: the [B, R] positions numbered in prediction order by the layout's own ``place``
    order = place(torch.arange(1, labels.numel() + 1, dtype=torch.float32, device=flat.device).view(labels.shape))
    predicted = order > 0
    ids = at_ids.new_zeros(labels.numel(), at_ids.shape[-1])
    ids[order[predicted].long() - 1] = at_ids[predicted]
    gathered = log_probs_at(flat, ids, temperature)
    own = topk_log_probs(flat, at_ids.shape[-1], temperature).ids
    return _place_columns(gathered, labels, place), _place_columns(own, labels, place).long()


def _place_columns(values: torch.Tensor, labels: torch.Tensor, place) -> torch.Tensor:
    """``[P, k]`` per-prediction values placed into ``[B, R, k]`` (``place`` takes one column at a time)."""
    columns = values.float() if not values.is_floating_point() else values
    return torch.stack([place(columns[:, j].reshape(labels.shape)) for j in range(values.shape[-1])], -1)


class _ModelRows(NamedTuple):
    """The rows a layout runs, the positions whose logits are read, and what each predicted token reads.

    ``keep`` ``[N, W]`` bool marks the kept positions; ``logits_to_keep`` is what the model is given for them
    (``keep`` itself, or an int for the padded rows' last columns). ``logit_row`` ``[P]`` indexes the kept
    positions (row-major) per predicted token, None when each kept position predicts one token in order;
    ``labels`` the predicted tokens; ``place`` puts per-prediction values into ``[B, R]``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    keep: torch.Tensor
    logits_to_keep: torch.Tensor | int
    logit_row: torch.Tensor | None
    labels: torch.Tensor
    place: Callable[[torch.Tensor], torch.Tensor]


def _kept_logits(model: torch.nn.Module, rows: _ModelRows) -> torch.Tensor:
    """The logits of every predicted token, projected to the vocabulary only at the kept positions."""
    with kept_positions_only(model, rows.keep):
        output = model(
            input_ids=rows.input_ids,
            position_ids=rows.position_ids,
            attention_mask=rows.attention_mask,
            use_cache=False,
            logits_to_keep=rows.logits_to_keep,
        )
    if rows.logit_row is None:
        return output.logits
    return output.logits.reshape(-1, output.logits.shape[-1])[rows.logit_row]


def _kept_logits_in_slices(model: torch.nn.Module, rows: _ModelRows, group: SequenceParallelGroup):
    """:func:`_kept_logits` under Ulysses: the logits of the predictions this rank's slice holds, their labels,
    and the ``place`` that gathers every rank's per-prediction values first."""
    split = SequenceSplit(group, rows.input_ids.shape[1])
    owner, index = split.owners(rows.keep)
    if rows.logit_row is not None:
        owner, index = owner[rows.logit_row], index[rows.logit_row]
    mine = owner == group.rank
    local_keep = split.local(rows.keep)
    with kept_positions_only(model, local_keep):
        output = split.run(model, rows.input_ids, rows.position_ids, rows.attention_mask, logits_to_keep=local_keep)
    logits = output.logits.reshape(-1, output.logits.shape[-1])[index[mine]]
    labels = rows.labels.reshape(-1)[mine]

    def place(values: torch.Tensor) -> torch.Tensor:
        return rows.place(gather_predictions(values, owner, group).view(rows.labels.shape))

    return logits, labels, place


def _packed_rows(packed: PackedBatch, input_ids, response_length, predicts) -> _ModelRows:
    """The packed rows, read at the K predicting positions: one logit per response token."""
    keep = pack_values(predicts, packed).nonzero(as_tuple=True)[0]
    # A boolean logits_to_keep returns the kept positions in row-major slot order: label them in that order.
    keep = keep[torch.argsort(packed.slot_index[keep])]
    keep_slots = torch.zeros(packed.input_ids.numel(), dtype=torch.bool, device=input_ids.device)
    keep_slots[packed.slot_index[keep]] = True
    next_tokens = torch.roll(input_ids, shifts=-1, dims=1)
    labels = pack_values(next_tokens, packed)[keep]
    keep_slots = keep_slots.view_as(packed.input_ids)
    flat_index = packed.token_index[keep]
    rows = flat_index // packed.seq_len
    cols = flat_index % packed.seq_len - (packed.seq_len - response_length - 1)
    shape = (packed.batch_size, response_length)

    def place(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(shape).index_put((rows, cols), values.reshape(-1))

    return _ModelRows(packed.input_ids, packed.position_ids, None, keep_slots, keep_slots, None, labels, place)


def _shared_rows(shared: SharedPromptBatch) -> _ModelRows:
    """One row per prompt, read at the predicting positions; the prompt's last position read by each member."""
    return _ModelRows(
        shared.input_ids,
        shared.position_ids,
        shared.attention_mask,
        shared.keep,
        shared.keep,
        shared.logit_row,
        shared.labels,
        shared.place,
    )


def _padded_rows(input_ids, attention_mask, position_ids, response_length, predicts) -> _ModelRows:
    """The padded rectangle, read at its last R + 1 columns; ``place`` keeps the R predicting columns (0 where
    the response is padding)."""
    last_columns = torch.zeros_like(input_ids, dtype=torch.bool)
    last_columns[:, -response_length - 1 :] = True
    # The last column predicts past the end; label it 0 to keep the logits a contiguous view.
    labels = torch.nn.functional.pad(input_ids[:, -response_length:], (0, 1))
    keep = predicts[:, -response_length - 1 : -1]

    def place(values: torch.Tensor) -> torch.Tensor:
        return torch.where(keep, values[:, :-1], 0.0)

    return _ModelRows(input_ids, position_ids, attention_mask, last_columns, response_length + 1, None, labels, place)


def default_chunk_size(vocab_size: int) -> int:
    """Rows per chunk so that one ``[chunk, vocab]`` float32 block stays near 4 MiB."""
    return max(1, DEFAULT_CHUNK_ELEMENTS // vocab_size)


def log_probs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log_softmax(logits / temperature)`` at ``labels`` and, if asked, the entropy, per position.

    ``log_softmax`` over a batch would allocate a second ``[tokens, vocab]`` float32 tensor that autograd keeps
    for the backward; here only per-row statistics (log-normaliser, log-prob, entropy) are kept, and the forward
    and the hand-written backward go through the logits ``chunk_size`` rows at a time: the temporary memory is
    ``[chunk, vocab]``, the only full-size tensor created the logits' gradient.

    ``logits`` ``[..., V]`` (any float dtype; statistics are taken in float32), ``labels`` ``[...]``.
    Returns float32 tensors shaped like ``labels``; entropy is None unless ``calculate_entropy``.
    Differentiable with respect to ``logits``; ``chunk_size`` rows at a time (default
    ``default_chunk_size(V)``).
    """
    vocab_size = logits.shape[-1]
    rows = chunk_size or default_chunk_size(vocab_size)
    log_probs, entropy = _ChunkedLogSoftmaxStatistics.apply(
        logits.reshape(-1, vocab_size), labels.reshape(-1), temperature, calculate_entropy, rows
    )
    if not calculate_entropy:
        return log_probs.view(labels.shape), None
    return log_probs.view(labels.shape), entropy.view(labels.shape)


@torch.no_grad()
def sum_pi_squared_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """``sum_v softmax(logits / temperature)_v^2`` per position, ``[..., V] -> [...]`` float32, no gradient.

    Computed as ``exp(logsumexp(2 z) - 2 logsumexp(z))`` (verl's ``calculate_sum_pi_squared_from_logits``),
    which never forms the probabilities; chunk by chunk like the log-probs.
    """
    vocab_size = logits.shape[-1]
    flat = logits.reshape(-1, vocab_size)
    rows = chunk_size or default_chunk_size(vocab_size)
    result = flat.new_empty(flat.shape[0], dtype=torch.float32)
    for start in range(0, flat.shape[0], rows):
        scaled = _scaled(flat[start : start + rows], temperature)
        result[start : start + rows] = torch.exp(torch.logsumexp(2 * scaled, -1) - 2 * torch.logsumexp(scaled, -1))
    return result.view(logits.shape[:-1])


class _ChunkedLogSoftmaxStatistics(torch.autograd.Function):
    """``[N, V]`` logits -> log-prob ``[N]`` and entropy ``[N]`` (empty when not asked for)."""

    @staticmethod
    def forward(ctx, logits, labels, temperature, calculate_entropy, rows):
        num_rows = logits.shape[0]
        log_normalisers = logits.new_empty(num_rows, dtype=torch.float32)
        log_probs = torch.empty_like(log_normalisers)
        entropy = torch.empty_like(log_normalisers) if calculate_entropy else log_normalisers.new_empty(0)
        for start in range(0, num_rows, rows):
            chunk = slice(start, start + rows)
            scaled = _scaled(logits[chunk], temperature)
            log_normaliser = torch.logsumexp(scaled, dim=-1)
            log_normalisers[chunk] = log_normaliser
            log_probs[chunk] = scaled.gather(-1, labels[chunk, None]).squeeze(-1) - log_normaliser
            if calculate_entropy:
                # H = -sum_v p_v log p_v, from log p directly (no cancellation of two large terms)
                log_softmax = scaled - log_normaliser[:, None]
                entropy[chunk] = -(torch.exp(log_softmax) * log_softmax).sum(-1)
        ctx.save_for_backward(logits, labels, log_normalisers, entropy)
        ctx.temperature, ctx.rows = temperature, rows
        ctx.set_materialize_grads(False)
        return log_probs, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_log_probs, grad_entropy):
        logits, labels, log_normalisers, entropy = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.rows):
            chunk = slice(start, start + ctx.rows)
            log_softmax = _scaled(logits[chunk], ctx.temperature) - log_normalisers[chunk, None]
            if grad_entropy is not None and grad_entropy.numel():
                # dH / dz = -p * (log p + H); then d log p_y / d z = onehot(y) - p
                probs = torch.exp(log_softmax)
                grad = log_softmax.add_(entropy[chunk, None]).mul_(-grad_entropy[chunk, None])
                if grad_log_probs is not None:
                    grad.sub_(grad_log_probs[chunk, None])
                grad.mul_(probs)
            else:
                grad = log_softmax.exp_().mul_(-grad_log_probs[chunk, None])
            if grad_log_probs is not None:
                grad.scatter_add_(-1, labels[chunk, None], grad_log_probs[chunk, None])
            if ctx.temperature != 1.0:
                grad.div_(ctx.temperature)
            grad_logits[chunk] = grad
        return grad_logits, None, None, None, None


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = logits.float()
    return scaled if temperature == 1.0 else scaled / temperature


def last_decoder_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The last layer of a transformers causal LM's decoder stack (through peft wrappers), or None."""
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or not len(layers):
        return None
    return layers[-1]


@contextmanager
def kept_positions_only(model: torch.nn.Module, keep: torch.Tensor) -> Iterator[None]:
    """Within the block, the last decoder layer's position-wise parts run at ``keep``'s True positions only.

    The other positions' last-layer outputs are never read, and in that layer a position feeds the others only
    through its keys and values: its query projection, attention output projection and MLP are work for nothing
    (with shared prompts, about half the row). Exact: the kept positions compute what they compute without it.
    The parts run on the kept positions alone and leave zeros elsewhere (a query of zeros attends uniformly; its
    output is then dropped by ``o_proj``'s zeros).

    ``keep`` ``[rows, seq]`` bool is the ``logits_to_keep`` mask of the forward. Nothing changes for models
    whose last layer lacks those parts, under gradient checkpointing (its recomputation in the backward
    runs after the block), or in a tensor-parallel model.
    """
    layer = last_decoder_layer(model)
    parts = [_submodule(layer, name) for name in POSITION_WISE] if layer is not None else []
    if (
        not parts
        or any(part is None for part in parts)
        or getattr(model, "is_gradient_checkpointing", False)
        or any(_splits_inputs(part) for part in parts)
    ):
        yield
        return
    flat_keep = keep.reshape(-1)
    index = flat_keep.nonzero().squeeze(1)
    for part in parts:
        part.forward = _at_positions(part.forward, index, flat_keep.numel())
    try:
        yield
    finally:
        for part in parts:
            del part.forward


def _splits_inputs(module: torch.nn.Module) -> bool:
    # A tensor-parallel layer turns its input into a DTensor in a pre-hook, which the position index cannot take.
    return bool(module._forward_pre_hooks)


def _submodule(module: torch.nn.Module, dotted: str) -> torch.nn.Module | None:
    for name in dotted.split("."):
        module = getattr(module, name, None)
        if not isinstance(module, torch.nn.Module):
            return None
    return module


def _at_positions(forward, index: torch.Tensor, positions: int):
    """``forward`` of a position-wise module applied to ``index``'s rows of its flattened input, zeros elsewhere.
    The rows go in as one sequence of a batch of one: a mixture-of-experts block reads its input as ``[batch,
    seq, hidden]``."""

    def run(hidden: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        flat = hidden.reshape(positions, hidden.shape[-1])
        kept = forward(flat.index_select(0, index)[None], *args, **kwargs)[0]
        out = kept.new_zeros(positions, kept.shape[-1]).index_copy(0, index, kept)
        return out.view(*hidden.shape[:-1], kept.shape[-1])

    return run
