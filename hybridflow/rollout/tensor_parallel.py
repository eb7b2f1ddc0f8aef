"""The ``k`` ranks of a tensor-parallel generation group decode one batch together.

Each rank of the group holds its own prompts (the driver splits a batch over every rank); the group first
pools them (:meth:`GroupDecoding.pool`), every rank queues the same requests in the same order, and one decoder
per rank steps through them: the same rows in every forward, since admission and stopping depend only on the
requests and the tokens drawn. The tokens drawn (and their log-probs) are taken from the group's first rank
each step (:meth:`GroupDecoding.agree`), so a difference in the last bit of a logit can never split the group's
batches. Each rank returns its own requests' results.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hybridflow.rollout.requests import GenerationRequest


class GroupDecoding:
    """A rank's place in its tensor-parallel generation group (``group``, a torch process group)."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def pool(self, requests: list[GenerationRequest]) -> tuple[list[GenerationRequest], range]:
        """Every rank's requests in rank order, and where this rank's lie in them. Collective over the group."""
        everyone: list[list[GenerationRequest] | None] = [None] * self.size
        dist.all_gather_object(everyone, list(requests), group=self.group)
        start = sum(len(requests) for requests in everyone[: self.rank])
        return [request for requests in everyone for request in requests], range(start, start + len(requests))

    def agree(self, tokens: torch.Tensor, log_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The group's first rank's tokens and log-probs, on every rank of the group."""
        both = torch.stack([tokens.to(torch.float64), log_probs.to(torch.float64)])
        dist.broadcast(both, group_src=0, group=self.group)
        return both[0].to(tokens.dtype), both[1].to(log_probs.dtype)
