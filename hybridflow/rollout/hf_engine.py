"""The default rollout engine ("hf"): one transformers model, continuous batching on a background thread.

Runs wherever transformers runs (CPU here, GPU too). Decoding is done by ``BatchedDecoder`` (rows stop at their
own EOS, new requests join running batches) driven by ``DecodeScheduler``; see bench/bench_rollout.py for the
measurements against ``model.generate`` and transformers' own ``generate_batch`` that chose this design.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch
from torch.distributed.tensor import DTensor

from hybridflow.models.loading import load_causal_lm, load_tokenizer, resolve_dtype
from hybridflow.models.log_probs import forward_log_probs
from hybridflow.models.lora import add_lora_layers, is_lora_weight
from hybridflow.models.tensor_parallel import TensorParallelError, generation_mesh, shard_for_generation
from hybridflow.models.weight_checksum import group_checksum
from hybridflow.rollout.base import ROLLOUT_ENGINES, RolloutEngine
from hybridflow.rollout.batched_decoder import BatchedDecoder
from hybridflow.rollout.config import SPLIT_ENGINE_REFUSES_REQUESTS, RolloutConfig
from hybridflow.rollout.partial_samples import PartialSample, continue_samples
from hybridflow.rollout.requests import GenerationRequest, GenerationResult
from hybridflow.rollout.scheduler import DecodePool, DecodeScheduler
from hybridflow.rollout.tensor_parallel import GroupDecoding
from hybridflow.rollout.weight_loading import IncompleteSyncError, load_weights_in_place, model_tensors

# A streamed rollout comes in about this many parts (see generate_batch_stream).
STREAM_PARTS = 8
# decode_threads=0 on a CPU: one decoder per torch thread, up to this many, for models up to this size.
AUTO_DECODE_THREADS = 4
SMALL_MODEL_PARAMETERS = 50_000_000


@ROLLOUT_ENGINES.register("hf")
class HFRolloutEngine(RolloutEngine):
    """Generates with ``model`` (kept for the engine's lifetime; new weights are copied into it in place).

    With a LoRA adapter added, the model computes ``W x + (alpha / r) B A x`` in each adapted layer (peft's
    LoRA layers inside the plain model), as the actor does; weight syncs then copy only ``A`` and ``B``.

    With ``tensor_model_parallel_size`` k > 1 the model is split over groups of k ranks
    (``models/tensor_parallel.py``) and ``group`` decodes each group's pooled requests together
    (``rollout/tensor_parallel.py``) on one decoder per rank; every rank of the worker group builds the engine
    together.
    """

    def __init__(
        self, model: torch.nn.Module, tokenizer: Any, config: RolloutConfig, group: GroupDecoding | None = None
    ):
        super().__init__(config, tokenizer)
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.group = group
        self._eos_token_ids = _eos_ids(model, tokenizer)
        stop_ids = set() if config.ignore_eos else self._eos_token_ids
        decoders = 1 if group is not None else decode_threads(config, model, self.device)
        threads_each = max(1, torch.get_num_threads() // decoders) if decoders > 1 else None
        agree = group.agree if group is not None else None
        self._scheduler = DecodePool(
            [
                DecodeScheduler(
                    BatchedDecoder(model, stop_ids, config.max_batch_tokens, decode_text=self._decode, agree=agree),
                    -(-config.max_num_seqs // decoders),
                    torch_threads=threads_each,
                )
                for _ in range(decoders)
            ]
        )
        self._discarded: dict[str, torch.Size] = {}
        self._scheduler.start()

    @classmethod
    def from_pretrained(
        cls, model_path: str | os.PathLike, config: RolloutConfig, tokenizer: Any = None, device: str | None = None
    ) -> "HFRolloutEngine":
        model = load_causal_lm(model_path, dtype=config.dtype, attn_implementation="sdpa")
        if device is not None:
            model.to(device)
        group = None
        if config.tensor_model_parallel_size > 1:
            node_size = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or None  # a worker's ranks on its node
            mesh = generation_mesh(config.tensor_model_parallel_size, next(model.parameters()).device.type, node_size)
            shard_for_generation(model, mesh)
            group = GroupDecoding(mesh.get_group("tp"))
        return cls(model, tokenizer if tokenizer is not None else load_tokenizer(model_path), config, group)

    @property
    def takes_sharded_weights(self) -> bool:
        return self.group is not None

    @property
    def generation_shard(self) -> int:
        return 0 if self.group is None else self.group.rank

    @property
    def eos_token_ids(self) -> set[int]:
        return set(self._eos_token_ids)

    @property
    def is_awake(self) -> bool:
        return self._scheduler.running

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self.group is not None:
            raise TensorParallelError(SPLIT_ENGINE_REFUSES_REQUESTS)
        return await asyncio.wrap_future(self._scheduler.submit(request))

    def generate_batch(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        futures, own = self._submit(requests)
        concurrent.futures.wait(futures)
        return [futures[i].result() for i in own]

    def generate_batch_stream(self, requests: list[GenerationRequest]) -> Iterator[list[tuple[int, GenerationResult]]]:
        """Yields the finished requests once at least 1/``STREAM_PARTS`` of them are waiting (and the rest at the
        end): each part costs a transfer to the driver, which a part per decode step would pay too often."""
        futures, own = self._submit(requests)
        try:
            index = {futures[i]: i - own.start for i in own}
            part_size = max(1, len(index) // STREAM_PARTS)
            pending, finished = set(index), []
            while pending:
                done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                finished += done
                if len(finished) >= part_size or not pending:
                    yield sorted(((index[future], future.result()) for future in finished), key=lambda pair: pair[0])
                    finished = []
        finally:
            concurrent.futures.wait(futures)  # a group's pooled batch: the decoder idle before the caller goes on

    def continue_samples(
        self, samples: list[PartialSample], groups_needed: int, meta: dict[str, Any]
    ) -> list[PartialSample]:
        """Partial rollout (``rollout/partial_samples.py``): the unfinished ``samples`` go on until
        ``groups_needed`` of their prompt groups (and every required one) have finished; the rest are aborted at
        the decode step where that holds and keep what they drew. ``meta``: the call's ``meta_info`` (its sampling)."""
        if self.group is not None:
            raise TensorParallelError(SPLIT_ENGINE_REFUSES_REQUESTS)
        return continue_samples(samples, self.call_sampling(meta), groups_needed, self._scheduler.schedulers)

    def _submit(self, requests: list[GenerationRequest]) -> tuple[list[concurrent.futures.Future], range]:
        """Queue ``requests`` (pooled with the rest of a tensor-parallel group's); the futures and where this
        rank's own requests lie among them."""
        if self.group is None:
            return self._scheduler.submit_all(list(requests)), range(len(requests))
        pooled, own = self.group.pool(list(requests))
        return self._scheduler.submit_all(pooled), own

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy each ``(name, tensor)`` into the generation model between decode steps; see weight_loading.py.
        After ``discard_weights`` the load must bring every weight back; one left out stops the run."""
        with self._scheduler.paused():
            discarded, self._discarded = self._discarded, {}
            if discarded:
                self._refill(discarded, named_tensors)
            else:
                load_weights_in_place(self.model, named_tensors)

    def _refill(self, discarded: dict[str, torch.Size], named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Allocate the discarded parameters again and load the stream, which must write every one of them."""
        parameters = dict(self.model.named_parameters())
        for name, shape in discarded.items():
            # Where sleep left it: on CPU while an accelerator's engine sleeps; wake moves it back.
            parameter = parameters[name]
            parameter.data = torch.empty(shape, dtype=parameter.dtype, device=parameter.device)
        loaded = load_weights_in_place(self.model, named_tensors)
        targets = model_tensors(self.model)  # tied weights: one parameter under several names
        written = {id(targets[name]) for name in loaded}
        missing = sorted(name for name in discarded if id(parameters[name]) not in written)
        if missing:
            raise IncompleteSyncError(
                f"the hf rollout engine freed its weights while asleep and this sync sent {len(loaded)} of "
                f"{len(discarded)}; missing {missing[:3]}: a discarding engine needs full syncs"
            )

    def discard_weights(self) -> bool:
        """Free every parameter's storage until the next ``load_weights`` (the hybrid engine's next sync): in
        training the generation model's weights are dead memory. Not for a tensor-parallel model's DTensors."""
        parameters = dict(self.model.named_parameters())
        if self.group is not None or any(isinstance(p, DTensor) for p in parameters.values()):
            return False
        for name, parameter in parameters.items():
            self._discarded.setdefault(name, parameter.shape)
            parameter.data = torch.empty(0, dtype=parameter.dtype, device=parameter.device)
        return True

    @contextmanager
    def loading_weights(self, version: int) -> Iterator[None]:
        """Hold the decode steps while the weights inside load (requests in flight go on after, with them); every
        token decoded from then on is tagged ``version``."""
        with self._scheduler.paused():
            yield
            for decoder in self._scheduler.decoders:
                decoder.weights_version = version

    def add_lora_adapter(self, lora_config: Any) -> None:
        with self._scheduler.paused():
            add_lora_layers(self.model, lora_config)
        self.model.eval()

    def weights_checksum(self, adapter_only: bool) -> int:
        with self._scheduler.paused():
            named = self.model.named_parameters()
            weights = [param for name, param in named if not adapter_only or is_lora_weight(name)]
            group = self.group.group if self.group is not None else None
            return group_checksum(weights, resolve_dtype(self.config.dtype), group, self.device)

    def sleep(self) -> None:
        """Finish in-flight requests, drop the KV cache and stop the decode thread; off-CPU, park weights on CPU."""
        self._scheduler.stop()
        if self.device.type != "cpu":
            self.model.to("cpu")
            torch.get_device_module(self.device).empty_cache()

    def wake(self) -> None:
        if self.device.type != "cpu":
            self.model.to(self.device)
        self._scheduler.start()

    def kv_cache_bytes(self) -> int:
        """Bytes held by the running batch's KV cache (0 when idle or asleep)."""
        return sum(decoder.cache_bytes() for decoder in self._scheduler.decoders)

    def compute_log_probs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        response_length: int,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """Teacher-forced log-probs of the last ``response_length`` tokens under the generation model: [B, R].
        A tensor-parallel group's ranks call it together, with the same rows."""
        device = self.device
        with self._scheduler.paused(), torch.no_grad():
            log_probs, _ = forward_log_probs(
                self.model,
                input_ids.to(device),
                attention_mask.to(device),
                position_ids.to(device),
                response_length,
                temperature=temperature,
                use_remove_padding=False,
            )
        return log_probs.cpu()

    def close(self) -> None:
        """Stop the decode thread for good (the model stays usable by its other owners)."""
        self._scheduler.stop()

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)


def decode_threads(config: RolloutConfig, model: torch.nn.Module, device: torch.device) -> int:
    """``config.decode_threads``, or when 0: on a CPU, one decoder per torch thread (at most
    ``AUTO_DECODE_THREADS``) for a model of at most ``SMALL_MODEL_PARAMETERS``; one otherwise. A larger model's
    ops carry enough work to keep every thread busy in one batch, which reads its weights once per step."""
    if config.decode_threads:
        return config.decode_threads
    small = sum(p.numel() for p in model.parameters()) <= SMALL_MODEL_PARAMETERS
    return min(torch.get_num_threads(), AUTO_DECODE_THREADS) if device.type == "cpu" and small else 1


def _eos_ids(model: torch.nn.Module, tokenizer: Any) -> set[int]:
    """EOS ids from the model's generation config (int or list) and the tokenizer."""
    ids = set()
    generation_config = getattr(model, "generation_config", None)
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is not None:
        ids |= set(configured) if isinstance(configured, (list, tuple)) else {configured}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
