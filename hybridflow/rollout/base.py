"""The rollout engine interface and the registry that picks an engine by ``actor_rollout_ref.rollout.name``.

An engine owns one generation model. The hybrid-engine cycle (arXiv 2409.19256 §5) is:
``wake()`` -> ``generate_sequences(prompts)`` -> ``sleep()`` -> [actor trains] -> ``load_weights(stream)``
-> ``wake()``.

``generate_sequences`` is implemented here once for every engine, as the join of ``generate_sequences_stream``
(its rows in parts, as the engine finishes them): single-turn prompts go through ``generate_batch_stream``;
with ``multi_turn.enable`` they go through the agent loop (rollout/agent_loop.py), whose requests reach the
engine through the async per-request ``generate``; the output then also carries the non-tensor columns
``num_turns`` and ``tool_rewards``. ``generate_sequences`` runs its own event loop, so it is called from
synchronous code (a worker method), never from inside a running event loop.
"""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from hybridflow.errors import HybridflowError
from hybridflow.protocol import DataProto, Part, join_parts
from hybridflow.protocol.columns import PROMPT_KEYS
from hybridflow.registry import Registry
from hybridflow.rollout.agent_loop import AgentLoop
from hybridflow.rollout.config import RolloutConfig, SamplingParams
from hybridflow.rollout.requests import GenerationRequest, GenerationResult
from hybridflow.rollout.sequences import build_requests, pack_outputs, prompt_token_lists

ROLLOUT_ENGINES: Registry[type["RolloutEngine"]] = Registry("rollout engine", "actor_rollout_ref.rollout.name")


class MissingExtraError(HybridflowError, ImportError):
    """An optional engine was chosen whose package is not installed; the message names the extra to install."""


class LoraAdapterUnsupportedError(HybridflowError, TypeError):
    """A LoRA adapter was asked of an engine that can only take full (merged) weights."""


class RolloutEngine(ABC):
    """One generation model behind a fixed interface. Subclasses register with ``@ROLLOUT_ENGINES.register``.

    An engine that can hold the base model and apply a LoRA adapter on top overrides ``add_lora_adapter``
    (and is listed in ``config.LORA_ADAPTER_ENGINES``), so a LoRA policy's weight sync copies the adapter alone.
    """

    config: RolloutConfig
    tokenizer: Any

    def __init__(self, config: RolloutConfig, tokenizer: Any):
        self.config = config.validate()
        self.tokenizer = tokenizer
        self._calls = 0  # generate_sequences calls so far: call k samples with seed + k
        self._agent_loop: AgentLoop | None = None

    @classmethod
    @abstractmethod
    def from_pretrained(
        cls, model_path: str | os.PathLike, config: RolloutConfig, tokenizer: Any = None, device: str | None = None
    ) -> "RolloutEngine":
        """Build the engine and its generation model from a local model folder (tokenizer: reuse the caller's;
        device: where the generation model lives, for engines that let the caller choose)."""

    @abstractmethod
    async def generate(self, request: GenerationRequest) -> GenerationResult:
        """Generate for one request; concurrent calls share the engine's batches."""

    @abstractmethod
    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generate for many requests at once (blocking); results in request order."""

    def generate_batch_stream(self, requests: list[GenerationRequest]) -> Iterator[list[tuple[int, GenerationResult]]]:
        """Generate for many requests at once, yielding ``(request index, result)`` lists as requests finish.
        This default yields once, when all are done; an engine that finishes requests one by one overrides it."""
        yield list(enumerate(self.generate_batch(requests)))

    @abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy new weights in place, tensor by tensor, into the one generation model."""

    @property
    def takes_sharded_weights(self) -> bool:
        """Whether ``load_weights`` should get the actor's parameters as they are sharded (DTensors), each rank
        then receiving only its own shard's part; otherwise every weight comes whole."""
        return False

    @property
    def generation_shard(self) -> int:
        """Which slice of every split weight this rank's generation model holds (its place in its tensor-parallel
        group): the buckets of a rollout pool's sync it loads (``weight_loading.shard_buckets``)."""
        return 0

    @property
    def shard_layouts(self) -> list[Any] | None:
        """How a sender outside this engine's processes (the actor, for a rollout pool of its own) cuts each weight
        for the ranks of a tensor-parallel group, one layout per rank (``weight_loading.shard_buckets``' slices);
        None: by the ``hf`` engine's split."""
        return None

    @contextmanager
    def loading_weights(self, version: int) -> Iterator[None]:
        """The ``load_weights`` calls inside land together, as weight version ``version``; an engine that can
        load weights while it generates (``hf``) holds its decode steps meanwhile and tags each token with the
        version that drew it (``GenerationResult.weight_versions``). Here: nothing to hold, no tags."""
        yield

    def land_loads_in_flight(self) -> None:
        """From now on loads may arrive while a generation runs (partial rollout on a rollout pool of its own):
        an engine split over a group gets ready to land each at a step all its ranks agree on. Every rank calls
        it before its first generation. Here: nothing to ready (``loading_weights`` holds the steps)."""
        return None

    def add_lora_adapter(self, lora_config: Any) -> None:
        """Give the generation model the adapter structure of ``lora_config`` (a peft ``LoraConfig``); from
        then on ``load_weights`` takes the adapter's tensors under peft's names."""
        raise LoraAdapterUnsupportedError(
            f"rollout engine {type(self).__name__} takes full weights only; set "
            "actor_rollout_ref.model.lora.merge=true to sync the adapter merged into the base weights"
        )

    # Whether weights_checksum reads the engine's weights back (else it returns None and syncs go unchecksummed).
    weights_readable = True

    @abstractmethod
    def weights_checksum(self, adapter_only: bool) -> int | None:
        """The exact checksum (``models/weight_checksum.py``) of the weights the engine serves, in its weight
        dtype: the LoRA adapter's alone with ``adapter_only``; None where the engine cannot read its weights
        (``weights_readable`` False). A tensor-parallel group's ranks call it together."""

    @abstractmethod
    def sleep(self) -> None:
        """Free the KV cache (and, on an accelerator, move weights off it) until ``wake()``."""

    def discard_weights(self) -> bool:
        """While asleep, free the weights' memory too, when the next ``load_weights`` will send every weight again
        (a hybrid engine's full sync); returns whether it did. Until that load the engine cannot generate. Here:
        kept."""
        return False

    @abstractmethod
    def wake(self) -> None:
        """Restore what ``sleep()`` freed; generation works again."""

    @property
    @abstractmethod
    def eos_token_ids(self) -> set[int]:
        """Token ids that end a sequence by default."""

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else min(self.eos_token_ids)

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for a batch of left-padded prompts; ``B`` prompts -> ``B * n`` rows, samples adjacent.

        Input ``batch``: ``input_ids``, ``attention_mask``, ``position_ids`` [B, P]. ``meta_info`` may set
        ``validate`` (use ``val_kwargs``: its n, temperature, top_p, top_k, do_sample), ``do_sample`` (False =
        greedy), ``eos_token_id`` and ``pad_token_id``, ``seed`` (this call's sampling seed; default ``seed`` + the
        call count) and ``first_prompt_index`` (the global index of the first prompt, so row seeds do not depend on
        sharding). Output ``batch``: ``prompts`` [B*n, P], ``responses`` and ``response_mask`` [B*n, R]
        (R = ``response_length``; mask 1 on generated tokens including the EOS, 0 on padding and tool-result
        tokens), ``input_ids``, ``attention_mask``, ``position_ids`` [B*n, P+R],
        and ``rollout_log_probs`` [B*n, R] when ``calculate_log_probs`` (or ``meta_info['calculate_log_probs']``);
        ``rollout_weight_versions`` [B*n, R] (the weights that drew each token, ``loading_weights``) when
        ``meta_info['record_weight_versions']``, from a single-turn rollout of an engine that tags them.
        """
        return join_parts(list(self.generate_sequences_stream(prompts)))

    def generate_sequences_stream(self, prompts: DataProto) -> Iterator[Part]:
        """``generate_sequences``'s rows as ``Part``s, yielded as the engine finishes them (all at once for an
        engine that finishes a batch together, and for the agent loop), so they can be scored meanwhile."""
        meta = prompts.meta_info
        validate = bool(meta.get("validate", False))
        n = self.config.val_kwargs.n if validate else self.config.n
        sampling = self.call_sampling(meta)
        # The driver sends the seed of each call so a resumed run samples as an uninterrupted one would;
        # first_prompt_index places this data-parallel shard's rows in the global batch.
        seed = int(meta["seed"]) if "seed" in meta else self.config.seed + self._calls
        self._calls += 1
        first_prompt = int(meta.get("first_prompt_index", 0))
        with_log_probs = bool(meta.get("calculate_log_probs", self.config.calculate_log_probs))
        record_versions = bool(meta.get("record_weight_versions", False))
        pad_id = meta.get("pad_token_id", self.pad_token_id)
        total = len(prompts) * n
        if self.config.multi_turn.enable:
            outputs, extras = asyncio.run(self.agent_loop.generate(prompts, n, sampling, seed, first_prompt))
            tensors = pack_outputs(prompts.batch, outputs, n, self.config.response_length, pad_id, with_log_probs)
            yield Part(DataProto.from_dict(tensors, non_tensors=extras), np.arange(total), total)
            return
        token_lists = prompt_token_lists(prompts.batch["input_ids"], prompts.batch["attention_mask"])
        requests = build_requests(token_lists, n, sampling, seed, first_prompt)
        for finished in self.generate_batch_stream(requests):
            rows = np.array([index for index, _ in finished], dtype=np.int64)
            outputs = [(r.token_ids, [1] * len(r.token_ids), r.log_probs) for _, r in finished]
            versions = [r.weight_versions for _, r in finished] if record_versions else None
            # Each sample packed alone (n=1) next to its own prompt row gives the rows of the whole batch's packing.
            prompt_rows = {key: prompts.batch[key][torch.from_numpy(rows // n)] for key in PROMPT_KEYS}
            tensors = pack_outputs(
                prompt_rows, outputs, 1, self.config.response_length, pad_id, with_log_probs, versions
            )
            yield Part(DataProto.from_dict(tensors), rows, total)

    def call_sampling(self, meta: dict[str, Any]) -> SamplingParams:
        """The sampling of a call with ``meta_info`` ``meta`` (``validate``, ``do_sample``, ``eos_token_id``)."""
        sampling = self.config.sampling(validate=bool(meta.get("validate", False)))
        if "do_sample" in meta:
            sampling.do_sample = bool(meta["do_sample"])
        if meta.get("eos_token_id") is not None:
            eos = meta["eos_token_id"]
            sampling.stop_token_ids += list(eos) if isinstance(eos, (list, tuple)) else [eos]
        return sampling

    @property
    def agent_loop(self) -> AgentLoop:
        """The agent loop used when ``multi_turn.enable`` (tools loaded once from ``tool_config_path``)."""
        if self._agent_loop is None:
            self._agent_loop = AgentLoop.from_engine(self)
        return self._agent_loop


def create_rollout_engine(config: RolloutConfig, model_path: str | os.PathLike, **kwargs: Any) -> RolloutEngine:
    """The engine named by ``config.name``, built from ``model_path`` (``tokenizer=``, ``device=`` go to its
    ``from_pretrained``)."""
    return ROLLOUT_ENGINES.get(config.name).from_pretrained(model_path, config, **kwargs)
