"""Continuous batching on a plain transformers model: rows leave the batch at their own end, new rows join.

Why not ``model.generate`` or transformers' ``generate_batch`` (bench/bench_rollout.py, 64 prompts x 128 tokens,
3M-parameter Qwen2, 1 thread, CPU-seconds): ``generate`` keeps decoding finished rows until the longest ends
(2.5 s whether lengths vary or not); the built-in continuous batching stops rows at their EOS but, with SDPA,
attends every query over all rows' cached tokens (7.2 s at fixed lengths, 1.6 s with varied); this decoder
took 2.5 s and 1.2 s. Here a batch is a left-padded ``DynamicCache`` whose layers keep spare room for the next
tokens (``kv_cache.RoomyLayer``: a decode step writes its column in place):

- a row that ends (EOS, stop token, stop string, length) is dropped from the cache at once (``reorder_cache``:
  every transformers cache layer selects its rows by it, recurrent states included, where only attention layers
  have ``batch_select_indices``), and cache columns that became padding for every row are trimmed;
- new requests are prefilled in their own forward (at most ``max_batch_tokens`` padded tokens each) and
  concatenated to the running batch after left-padding the shorter cache, so they share every later decode step;
  requests with the same prompt (the n samples of a GRPO group) prefill it once and copy its cache rows.

Positions are explicit per row, so padding never shifts RoPE. Caches whose layers are not plain ``DynamicLayer``
(e.g. sliding-window) are not merged: new rows then wait until the running batch has drained.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from hybridflow.rollout.kv_cache import cache_bytes, roomy_cache
from hybridflow.rollout.requests import FINISH_EOS, FINISH_LENGTH, FINISH_STOP, GenerationRequest, GenerationResult
from hybridflow.rollout.sampling import RowSampling, sample_next_tokens

# Spare KV-cache columns a batch keeps (up to its rows' token budget): it grows, copying, once per this many steps.
CACHE_HEADROOM = 128


@dataclass
class Sequence:
    """One request while it decodes."""

    request: GenerationRequest
    generator: torch.Generator
    stop_ids: frozenset[int]
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    weight_versions: list[int] = field(default_factory=list)  # the weights that drew each token
    finish_reason: str | None = None

    def result(self) -> GenerationResult:
        return GenerationResult(
            self.token_ids, self.log_probs, self.finish_reason, self.request.request_id, self.weight_versions
        )


class BatchedDecoder:
    """Holds the running batch: its KV cache, attention mask, positions and the rows' sequences."""

    def __init__(
        self,
        model: torch.nn.Module,
        eos_token_ids: set[int],
        max_batch_tokens: int,
        decode_text: Callable[[list[int]], str] | None = None,
        agree: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None,
    ):
        self.model = model
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_batch_tokens = max_batch_tokens
        self.decode_text = decode_text
        self.agree = agree  # tensor-parallel groups: every rank keeps the group's first rank's tokens
        self.sequences: list[Sequence] = []
        self.weights_version = 0  # the weights the model holds, as numbered by whoever loads them
        self._cache: DynamicCache | None = None
        # transformers 5 renamed the forward's KV cache argument (the old name warns on every call)
        self._cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        self._attention_mask = torch.zeros(0, 0, dtype=torch.long)  # [b, T]
        self._next_positions = torch.zeros(0, dtype=torch.long)  # [b] position of the token fed next
        self._next_tokens = torch.zeros(0, dtype=torch.long)  # [b] last sampled token, fed next
        self._sampling: RowSampling | None = None
        self._mergeable = roomy_cache(model.config, 0) is not None

    def new_sequence(self, request: GenerationRequest) -> Sequence:
        seed = request.sampling.seed if request.sampling.seed is not None else random.SystemRandom().getrandbits(62)
        generator = torch.Generator().manual_seed(seed)
        stop_ids = self.eos_token_ids | frozenset(request.sampling.stop_token_ids)
        return Sequence(request=request, generator=generator, stop_ids=stop_ids)

    @property
    def can_merge(self) -> bool:
        """Whether new rows may join now (always when empty; otherwise only for plain dynamic caches)."""
        return self._cache is None or self._mergeable

    def cache_bytes(self) -> int:
        return 0 if self._cache is None else cache_bytes(self._cache)

    def release(self) -> None:
        """Drop the KV cache and every row (their futures are the caller's business)."""
        self.sequences = []
        self._cache = None
        self._sampling = None
        self._attention_mask = torch.zeros(0, 0, dtype=torch.long)
        self._next_positions = self._next_tokens = torch.zeros(0, dtype=torch.long)

    @torch.no_grad()
    def add(self, sequences: list[Sequence]) -> list[Sequence]:
        """Prefill ``sequences`` and join the running batch; returns those already finished by their first token."""
        if not self.can_merge:
            raise RuntimeError("this model's cache cannot take new rows while others decode; wait until it drains")
        finished = []
        for chunk in self._prefill_chunks(sequences):
            finished += self._prefill(chunk)
        return finished

    @torch.no_grad()
    def step(self) -> list[Sequence]:
        """One decode step for every row; returns the sequences that finished in it."""
        if not self.sequences:
            return []
        device = self._device()
        ones = self._attention_mask.new_ones(len(self.sequences), 1)
        self._attention_mask = torch.cat([self._attention_mask, ones], dim=1)
        logits = self.model(
            input_ids=self._next_tokens[:, None].to(device),
            attention_mask=self._attention_mask.to(device),
            position_ids=self._next_positions[:, None].to(device),
            use_cache=True,
            **{self._cache_argument: self._cache},
        ).logits[:, -1]
        self._next_positions = self._next_positions + 1
        return self._sample_and_compact(logits)

    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _prefill_chunks(self, sequences: list[Sequence]) -> list[list[Sequence]]:
        """Chunks of at most ``max_batch_tokens`` padded prompt tokens, counting each distinct prompt once."""
        if not self._mergeable:
            return [sequences]
        chunks, current, prompts, longest = [], [], set(), 0
        for seq in sequences:
            prompt = tuple(seq.request.prompt_ids)
            if prompt not in prompts:
                length = max(longest, len(prompt))
                if prompts and length * (len(prompts) + 1) > self.max_batch_tokens:
                    chunks.append(current)
                    current, prompts, length = [], set(), len(prompt)
                prompts.add(prompt)
                longest = length
            current.append(seq)
        return chunks + ([current] if current else [])

    def _prefill(self, chunk: list[Sequence]) -> list[Sequence]:
        """Prefill each distinct prompt of ``chunk`` once; its cache rows and next-token logits are then copied
        to every sequence that has it (the n samples of one prompt), each sampling with its own generator."""
        distinct: dict[tuple[int, ...], int] = {}
        source = [distinct.setdefault(tuple(s.request.prompt_ids), len(distinct)) for s in chunk]
        width = max(len(prompt) for prompt in distinct)
        input_ids = torch.zeros(len(distinct), width, dtype=torch.long)
        attention_mask = torch.zeros(len(distinct), width, dtype=torch.long)
        for row, ids in enumerate(distinct):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, width - len(ids) :] = 1
        positions = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
        headroom = min(max(s.request.sampling.max_new_tokens for s in chunk), CACHE_HEADROOM)
        cache = roomy_cache(self.model.config, headroom) if self._mergeable else DynamicCache(config=self.model.config)
        device = self._device()
        logits = self.model(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            position_ids=positions.to(device),
            use_cache=True,
            logits_to_keep=1,
            **{self._cache_argument: cache},
        ).logits[:, -1]
        if len(distinct) < len(chunk):
            rows = torch.tensor(source, dtype=torch.long)
            cache.reorder_cache(rows.to(device))
            logits, attention_mask, positions = logits[rows.to(device)], attention_mask[rows], positions[rows]
        sampling = RowSampling.from_params([s.request.sampling for s in chunk])
        self._join(chunk, cache, attention_mask, positions[:, -1] + 1, sampling)
        return self._sample_and_compact(logits, first_row=len(self.sequences) - len(chunk))

    def _join(self, chunk, cache, attention_mask, next_positions, sampling) -> None:
        if self._cache is None:
            self._cache, self._attention_mask, self._sampling = cache, attention_mask, sampling
        else:
            width = max(self._attention_mask.shape[1], attention_mask.shape[1])
            for old, new in zip(self._cache.layers, cache.layers):
                old.headroom = max(old.headroom, new.headroom)
                old.set_states(
                    torch.cat([_left_pad(old.keys, width), _left_pad(new.keys, width)]),
                    torch.cat([_left_pad(old.values, width), _left_pad(new.values, width)]),
                )
            self._attention_mask = torch.cat(
                [
                    F.pad(self._attention_mask, (width - self._attention_mask.shape[1], 0)),
                    F.pad(attention_mask, (width - attention_mask.shape[1], 0)),
                ]
            )
            self._sampling = RowSampling.concat([self._sampling, sampling])
        self.sequences += chunk
        self._next_positions = torch.cat([self._next_positions, next_positions])
        self._next_tokens = torch.cat([self._next_tokens, torch.zeros(len(chunk), dtype=torch.long)])

    def _sample_and_compact(self, logits: torch.Tensor, first_row: int = 0) -> list[Sequence]:
        """Sample for rows ``first_row:`` (all rows in a decode step), record, then drop finished rows."""
        rows = self.sequences[first_row:]
        sampling = self._sampling.select(torch.arange(first_row, len(self.sequences)))
        tokens, log_probs = sample_next_tokens(logits, sampling, [s.generator for s in rows])
        if self.agree is not None:
            tokens, log_probs = self.agree(tokens, log_probs)
        tokens, log_probs = tokens.cpu(), log_probs.cpu()
        self._next_tokens[first_row:] = tokens
        for seq, token, log_prob in zip(rows, tokens.tolist(), log_probs.tolist()):
            seq.token_ids.append(token)
            seq.log_probs.append(log_prob)
            seq.weight_versions.append(self.weights_version)
            seq.finish_reason = self._finish_reason(seq, token)
        finished = [s for s in rows if s.finish_reason is not None]
        if finished:
            self._drop_finished()
        return finished

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        if token in seq.stop_ids:
            return FINISH_EOS
        stops = seq.request.sampling.stop
        if stops and self.decode_text is not None:
            tail = self.decode_text(seq.token_ids[-(max(map(len, stops)) + 2) :])
            if any(stop in tail for stop in stops):
                return FINISH_STOP
        if len(seq.token_ids) >= seq.request.sampling.max_new_tokens:
            return FINISH_LENGTH
        return None

    def _drop_finished(self) -> None:
        keep = [i for i, s in enumerate(self.sequences) if s.finish_reason is None]
        if not keep:
            self.release()
            return
        index = torch.tensor(keep, dtype=torch.long)
        self.sequences = [self.sequences[i] for i in keep]
        self._cache.reorder_cache(index.to(self._device()))
        self._attention_mask = self._attention_mask[index]
        self._next_positions = self._next_positions[index]
        self._next_tokens = self._next_tokens[index]
        self._sampling = self._sampling.select(index)
        self._trim_padding()

    def _trim_padding(self) -> None:
        """Cut cache columns that are padding for every remaining row (left by rows that ended)."""
        if not self._mergeable:
            return
        first_used = int(self._attention_mask.any(dim=0).long().argmax())
        if first_used == 0:
            return
        self._attention_mask = self._attention_mask[:, first_used:]
        for layer in self._cache.layers:
            layer.drop_left(first_used)


def _left_pad(states: torch.Tensor, width: int) -> torch.Tensor:
    """[b, heads, T, d] -> [b, heads, width, d] with zeros on the left of the time axis."""
    return F.pad(states, (0, 0, width - states.shape[2], 0))
