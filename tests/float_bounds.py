"""Tolerances from float32 rounding, for tests that compute one quantity two ways that differ only in the
order of float32 sums: 1 rank against 2 (gradients reduced across ranks), packed against padded rows, one
micro-batch split against another (matmul kernels block their sums by the number of rows).

The model: a sum or dot product of ``n`` terms, evaluated in any order, is within ``gamma_n * sum|terms|``
of the exact value, ``gamma_n ~ n * u`` with unit roundoff ``u = eps / 2`` (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2nd ed., eq. 3.5 and section 4.2). Two orders therefore differ by at
most ``n * eps * sum|terms|``. A model output passes through many such sums; we bound it by its longest
one (for the tiny model the log-sum-exp over the 263-entry vocabulary, longer than its 128 hidden and 256
MLP sums) at the output's own magnitude. This is a worst case for that sum: typical rounding grows like
``sqrt(n)``, so correct code passes with a wide margin on any CPU (AVX2 or AVX-512 blocking), while a real
bug (a wrong row, count or scale factor) moves the results by percent, not by ``1e-4``.
"""

from __future__ import annotations

import torch

F32_EPS = torch.finfo(torch.float32).eps  # 2**-23 = 2u


def reordered_sum_bound(magnitude: float, num_terms: int) -> float:
    """Largest difference between two float32 evaluations, in different orders, of a sum of ``num_terms``
    terms whose absolute values add up to at most ``magnitude``."""
    return num_terms * F32_EPS * float(magnitude)


def longest_reduction(config) -> int:
    """The most terms one float32 sum has in a forward of a Hugging Face model with ``config``: the
    vocabulary's log-sum-exp, a hidden-size projection or the MLP's down projection."""
    return max(config.vocab_size, config.hidden_size, config.intermediate_size)


def model_output_bound(outputs: torch.Tensor, num_terms: int) -> float:
    """Bound on the difference between two evaluations of per-token log-probs or entropies, at most
    ``max|outputs|`` in size, through sums of at most ``num_terms`` terms. A log-prob is ``z_y`` minus the
    log-sum-exp of the logits, whose terms are of its own size (the logits here are O(1))."""
    return reordered_sum_bound(outputs.detach().abs().max(), num_terms)


def score_head_bound(model: torch.nn.Module, num_terms: int) -> float:
    """Bound for a scalar head ``v = w . h`` on the final RMSNorm's output (critic values, reward scores).

    A dot product's rounding scales with ``sum|w_k h_k|``, not with ``|v|`` (the terms may cancel):
    ``sum|w_k h_k| <= ||w|| ||h||`` and ``||h|| <= sqrt(hidden) * max|gain|``, as RMSNorm scales ``h`` to
    unit root-mean-square before its gain.
    """
    norm = model.model.norm
    # The gain is what the norm makes of a unit-RMS input: its weight, or 1 + weight (Gemma's, Qwen3-Next's).
    gain = norm(torch.ones(1, model.config.hidden_size, dtype=norm.weight.dtype)).detach().abs().max()
    magnitude = model.score.weight.detach().norm(dim=-1).max() * model.config.hidden_size**0.5 * gain
    return reordered_sum_bound(magnitude, num_terms)
