"""Reverse linear recurrences ``x_t = a_t + c_t * x_{t+1}`` along the token axis, in O(sqrt(T)) steps.

GAE, REINFORCE++ returns and "the next unmasked value" are all this recurrence with different ``a`` and
``c``. A loop over T positions costs T small kernel launches (1024 for a 1k-token response); splitting
the axis into chunks of about sqrt(T) costs sqrt(T) steps inside every chunk at once, plus sqrt(T) steps
to carry each chunk's start into the chunk before it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def reverse_linear_scan(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Solve ``x_t = a_t + c_t * x_{t+1}`` for ``t = T-1 .. 0`` with ``x_T = 0``; ``a, c, x`` are ``[B, T]``.

    Within a chunk ``[s, e]``, ``x_t = local_t + decay_t * x_{e+1}`` where ``local`` solves the chunk with
    ``x_{e+1} = 0`` and ``decay_t = c_t * ... * c_e``; the chunk boundaries are then chained right to left.
    ``a`` and ``c`` must be finite (0 * inf would poison the chain).
    """
    batch, length = a.shape
    chunk = max(1, math.isqrt(max(length - 1, 0)) + 1)
    padding = (-length) % chunk
    if padding:
        a, c = F.pad(a, (0, padding)), F.pad(c, (0, padding))
    num_chunks = a.shape[1] // chunk
    # [chunk, batch, num_chunks]: position-in-chunk first, so every step reads one contiguous slab.
    a_steps = a.reshape(batch, num_chunks, chunk).permute(2, 0, 1).contiguous()
    c_steps = c.reshape(batch, num_chunks, chunk).permute(2, 0, 1).contiguous()
    local = torch.empty_like(a_steps)
    decay = torch.empty_like(c_steps)
    running_local = torch.zeros_like(a_steps[0])
    running_decay = torch.ones_like(c_steps[0])
    for k in range(chunk - 1, -1, -1):
        running_local = a_steps[k] + c_steps[k] * running_local
        running_decay = c_steps[k] * running_decay
        local[k] = running_local
        decay[k] = running_decay
    incoming = torch.empty_like(a_steps[0])  # x at the first position of the next chunk
    carried = torch.zeros_like(a_steps[0, :, 0])
    for i in range(num_chunks - 1, -1, -1):
        incoming[:, i] = carried
        carried = local[0, :, i] + decay[0, :, i] * carried
    solution = local + decay * incoming.unsqueeze(0)
    return solution.permute(1, 2, 0).reshape(batch, num_chunks * chunk)[:, :length]


def shift_left(x: torch.Tensor) -> torch.Tensor:
    """``y_t = x_{t+1}`` along the last axis, with 0 after the end."""
    return F.pad(x[..., 1:], (0, 1))
