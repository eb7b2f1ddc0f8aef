"""Next-token sampling for a batch of rows, each with its own temperature, top-k, top-p and random generator.

Every row draws its uniform number from its own ``torch.Generator``, so a request's samples depend only on its
seed, never on which other requests share its batch (requests join and leave the batch at any step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybridflow.rollout.config import SamplingParams


@dataclass
class RowSampling:
    """Per-row sampling parameters of a batch, as tensors of shape [b]."""

    temperature: torch.Tensor  # float, 1.0 on greedy rows
    top_k: torch.Tensor  # long, 0 = off
    top_p: torch.Tensor  # float, 1.0 = off
    greedy: torch.Tensor  # bool

    @classmethod
    def from_params(cls, params: list[SamplingParams]) -> "RowSampling":
        return cls(
            temperature=torch.tensor([1.0 if p.greedy else p.temperature for p in params]),
            top_k=torch.tensor([max(p.top_k, 0) for p in params], dtype=torch.long),
            top_p=torch.tensor([p.top_p for p in params]),
            greedy=torch.tensor([p.greedy for p in params], dtype=torch.bool),
        )

    def select(self, rows: torch.Tensor) -> "RowSampling":
        return RowSampling(self.temperature[rows], self.top_k[rows], self.top_p[rows], self.greedy[rows])

    def to(self, device: torch.device) -> "RowSampling":
        return RowSampling(
            self.temperature.to(device), self.top_k.to(device), self.top_p.to(device), self.greedy.to(device)
        )

    @staticmethod
    def concat(parts: list["RowSampling"]) -> "RowSampling":
        return RowSampling(
            *(torch.cat([getattr(p, k) for p in parts]) for k in ("temperature", "top_k", "top_p", "greedy"))
        )


def sample_next_tokens(
    logits: torch.Tensor, rows: RowSampling, generators: list[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row. ``logits`` [b, V] -> (tokens [b] long, log_probs [b] float32).

    ``log_probs`` is log softmax(logits / temperature) of the chosen token, before top-k/top-p filtering, so it
    equals what the actor computes for the same sequence at the same temperature.
    """
    rows = rows.to(logits.device)
    log_probs = torch.log_softmax(logits.float() / rows.temperature[:, None], dim=-1)
    # The generators live on the CPU; only the b uniforms move to the logits' device.
    uniforms = torch.stack([torch.rand((), generator=g) for g in generators]).to(logits.device)
    sampled = _inverse_cdf(log_probs.exp(), uniforms)
    # Only rows that filter pay for the sort, and a row's draw never depends on its neighbours' settings.
    filtered = ((rows.top_k > 0) | (rows.top_p < 1.0)).nonzero().squeeze(1)
    if filtered.numel():
        sampled[filtered] = _sample_filtered(log_probs[filtered], rows.select(filtered), uniforms[filtered])
    tokens = torch.where(rows.greedy, log_probs.argmax(dim=-1), sampled)
    return tokens, log_probs.gather(1, tokens[:, None]).squeeze(1)


def _inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Index i with cdf[i-1] <= u * total < cdf[i]; one uniform per row. probs [b, V] (need not sum to 1)."""
    cdf = probs.cumsum(dim=-1)
    targets = (uniforms * cdf[:, -1])[:, None]
    return torch.searchsorted(cdf, targets, right=True).squeeze(1).clamp(max=probs.shape[-1] - 1)


def _sample_filtered(log_probs: torch.Tensor, rows: RowSampling, uniforms: torch.Tensor) -> torch.Tensor:
    """Top-k then top-p (nucleus, arXiv 1904.09751) on the sorted distribution; one sort per step."""
    sorted_log_probs, order = log_probs.sort(dim=-1, descending=True)
    sorted_probs = sorted_log_probs.exp()
    ranks = torch.arange(log_probs.shape[-1], device=log_probs.device)[None, :]
    top_k = torch.where(rows.top_k > 0, rows.top_k, log_probs.shape[-1])
    keep = ranks < top_k[:, None]
    # A token stays when the mass before it is still below top_p, so the most likely token always stays.
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep &= mass_before < rows.top_p[:, None]
    picked = _inverse_cdf(sorted_probs * keep, uniforms)
    return order.gather(1, picked[:, None]).squeeze(1)
