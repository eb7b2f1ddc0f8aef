"""Log-probability of the taken token and entropy from logits, one chunk of rows at a time.

``log_softmax(logits)`` over a batch allocates a second ``[tokens, vocab]`` float32 tensor, and autograd
keeps it for the backward pass; with a 150k vocabulary that dwarfs a small model's activations. Here
only per-row statistics (the log-normaliser, the log-prob, the entropy) are kept: the forward pass and
the hand-written backward pass each go through the logits ``chunk_size`` rows at a time, so the
temporary memory is ``[chunk, vocab]`` and the only full-size tensor created is the logits' gradient.
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

# 4 MiB of float32 per chunk: on CPU, blocks this small are reused from the heap and stay in cache
# (64 MiB blocks measured ~2x slower, mostly page faults). On GPU a larger chunk_size is faster.
DEFAULT_CHUNK_ELEMENTS = 2**20


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


def log_probs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """Chunked ``log_softmax(logits / temperature).gather(-1, labels)``: ``[..., V], [...] -> [...]``."""
    return log_probs_and_entropy(logits, labels, temperature, False, chunk_size)[0]


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int | None = None) -> torch.Tensor:
    """Chunked entropy of ``softmax(logits / temperature)``: ``[..., V] -> [...]``."""
    labels = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return log_probs_and_entropy(logits, labels, temperature, True, chunk_size)[1]


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
