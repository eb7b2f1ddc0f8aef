"""The rollout role: a generation engine, fed with the actor's weights when they change (hybrid engine).

HybridFlow's 3D-HybridEngine (arXiv 2409.19256, section 5) reshards the trained weights into the
generation model between training and generation. With one generation model per rank, the driver's weight sync
(``update_weights``, the phase that closes each step) gathers the actor's FSDP2 shards one parameter at a time
(``DTensor.full_tensor()``) and copies them into the engine's model in place, so no second full state dict
exists at any moment. Asleep after a rollout, an ``hf`` engine frees its weights as well (the actor holds them
and the next sync sends them all): they are dead memory while the actor trains. A generation with no sync since
(a validation after the step's sync) has them sent again first. With a tensor-parallel engine
(``rollout.tensor_model_parallel_size`` > 1) the shards go in as they are and each rank receives only the part
of its generation shard it lacks (the paper's scheme: no rank ever holds a whole weight). Generating with weights
older than the actor's is refused (``StaleRolloutError``), never silently done, and a sync or a wake that leaves
the engine other weights than it was sent stops the run (``workers/sync_check.py``). The engine sleeps (frees its
KV cache) between rollouts when asked.

A LoRA actor's base weights never change. Unless ``merge_lora`` (verl's ``model.lora.merge``), the engine
holds the same adapter structure on top of the base model and a sync copies the adapter tensors alone;
with ``merge_lora`` it copies every weight with the adapter merged in (``W + (alpha / r) B A``).
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from hybridflow.errors import HybridflowError
from hybridflow.models.loading import resolve_dtype
from hybridflow.models.weight_checksum import reduced
from hybridflow.protocol import DataProto, Part, join_parts
from hybridflow.rollout import RolloutConfig, create_rollout_engine
from hybridflow.rollout.partial_samples import PartialSample
from hybridflow.workers.actor import ActorPart
from hybridflow.workers.sync_check import WeightSyncCheck
from hybridflow.workers.training import return_freed_heap


class StaleRolloutError(HybridflowError, RuntimeError):
    """The rollout engine would generate with weights older than the actor's: no weight sync since an update."""


class RolloutPart:
    """Wraps one rollout engine; ``weight_source`` (the actor, in the same process) makes it a hybrid engine.

    ``synced_version`` is the actor ``weights_version`` the engine's weights equal (None: not yet synced).
    The engine starts in sync when the actor still holds the model folder's weights and the engine holds
    nothing else (a fresh LoRA adapter adds zero); an engine given adapter layers or an actor that loaded
    a saved adapter needs ``update_weights`` before its first generation.
    """

    def __init__(
        self,
        config: RolloutConfig,
        model_path: str,
        tokenizer: Any,
        device: torch.device,
        weight_source: ActorPart | None = None,
        merge_lora: bool = False,
        loads_in_flight: bool = False,
    ):
        self.config = config
        self.device = device
        self.engine = create_rollout_engine(config, model_path, tokenizer=tokenizer, device=str(device))
        if loads_in_flight:
            self.engine.land_loads_in_flight()
        self.weight_source = weight_source
        lora_config = weight_source.lora_config if weight_source is not None else None
        self.syncs_adapter_only = lora_config is not None and not merge_lora
        if self.syncs_adapter_only:
            self.engine.add_lora_adapter(lora_config)
        mode = "hybrid engine" if weight_source is not None else "rollout pool"
        if lora_config is not None:
            mode += ", adapter-only LoRA" if self.syncs_adapter_only else ", merged LoRA"
        self.check = WeightSyncCheck(
            self.engine, config.weight_sync_check_freq, mode, resolve_dtype(config.dtype), self.syncs_adapter_only
        )
        in_sync = weight_source is not None and weight_source.matches_model_folder and not self.syncs_adapter_only
        self.synced_version = weight_source.weights_version if in_sync else None
        self.sleep_between_rollouts = config.free_cache_engine
        # A hybrid engine's full syncs send every weight: asleep, it may free them (the actor holds them).
        self.may_discard = weight_source is not None and not self.syncs_adapter_only
        self.discarded_version: int | None = None
        self.asleep = False
        if self.sleep_between_rollouts:
            self._sleep()

    @property
    def is_stale(self) -> bool:
        return self.weight_source is not None and self.synced_version != self.weight_source.weights_version

    def update_weights(self) -> float:
        """Stream the actor's weights (full, or the adapter alone) into the engine, one tensor at a time, unless
        it holds them already, and check the due syncs; returns the seconds the checks took since the last call.
        Every rank of the group calls it together (each gather is a collective)."""
        if self.is_stale:
            self._sync(self.weight_source)
        return self.check.take_seconds()

    def _sync(self, source: ActorPart) -> None:
        sharded = self.engine.takes_sharded_weights and source.lora_config is None and not self.syncs_adapter_only
        if self.syncs_adapter_only:
            weights = source.lora_weights()
        else:
            weights = source.sharded_weights() if sharded else source.hf_weights()
        checked = self.check.due()
        if checked:  # the shards' parts add up over every rank; gathered weights are whole on each
            weights = self.check.sent(weights, 0 if sharded else None)
        with source.trainer.on_device():
            self.engine.load_weights(weights)
        self.synced_version, self.discarded_version = source.weights_version, None
        if checked:
            checksum = reduced(weights.part, None, self.device) if sharded else weights.part
            self.check.after_sync(source.weights_version, checksum)

    def load_weight_buckets(
        self, buckets: Iterable[list[tuple[str, torch.Tensor]]], version: int = 0, checksum: int | None = None
    ) -> float:
        """A rollout on its own pool (no ``weight_source``): one ``load_weights`` over every bucket's ``(name,
        tensor)`` pairs, each bucket read as the engine reaches it (so one is held at a time), all landing as
        weight version ``version``, checked against the sender's ``checksum`` when due; returns the seconds the
        checks took since the last call. One call, because vLLM reloads the whole model per call."""
        with self.engine.loading_weights(version):
            self.engine.load_weights(itertools.chain.from_iterable(buckets))
        if self.check.due() and checksum is not None:
            self.check.after_sync(version, checksum)
        return self.check.take_seconds()

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``engine.generate_sequences`` with the actor's current weights."""
        return join_parts(list(self.generate_sequences_stream(prompts)))

    def generate_sequences_stream(self, prompts: DataProto) -> Iterator[Part]:
        """``generate_sequences``'s rows in parts as the engine finishes them."""
        with self._generating():
            yield from self.engine.generate_sequences_stream(prompts)

    def continue_samples(
        self, samples: list[PartialSample], groups_needed: int, meta: dict[str, Any]
    ) -> list[PartialSample]:
        """The engine's partial rollout (``rollout/partial_samples.py``) with the actor's current weights."""
        with self._generating():
            return self.engine.continue_samples(samples, groups_needed, meta)

    @contextmanager
    def _generating(self) -> Iterator[None]:
        """Awake, with the actor's current weights, for one generation call (asleep after it, when asked)."""
        if self.discarded_version is not None and self.discarded_version == self.weight_source.weights_version:
            self._sync(self.weight_source)  # weights freed while asleep, the actor's unchanged since (a validation)
        if self.is_stale:
            raise StaleRolloutError(
                f"the rollout engine holds the actor's weights of version {self.synced_version}, the actor is at "
                f"{self.weight_source.weights_version}: call update_weights (the weight sync) before generating"
            )
        self._wake()
        try:
            yield
        finally:
            if self.sleep_between_rollouts:
                self._sleep(discard=self.may_discard)
            return_freed_heap()  # the decode's activations and KV cache

    def _sleep(self, discard: bool = False) -> None:
        if not self.asleep:
            self.engine.sleep()
            self.asleep = True
            if discard and self.engine.discard_weights():
                self.discarded_version, self.synced_version = self.synced_version, None

    def _wake(self) -> None:
        if self.asleep:
            self.engine.wake()
            self.asleep = False
            self.check.after_wake()
