"""The rollout role: a generation engine, fed with the actor's weights when they change (hybrid engine).

HybridFlow's 3D-HybridEngine (arXiv 2409.19256, section 5) reshards the trained weights into the
generation model between training and generation. Here every rank holds a full generation model: before
generating with stale weights, the actor's FSDP2 shards are gathered one parameter at a time
(``DTensor.full_tensor()``) and copied into the engine's model in place, so no second full state dict
exists at any moment. The engine sleeps (frees its KV cache) between rollouts when asked.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from hybridflow.protocol import DataProto
from hybridflow.rollout import RolloutConfig, create_rollout_engine
from hybridflow.workers.actor import ActorPart


class RolloutPart:
    """Wraps one rollout engine; ``weight_source`` (the actor, in the same process) makes it a hybrid engine.

    ``synced_version`` is the actor ``weights_version`` the engine's weights equal. At start both are the
    model folder's weights (a fresh LoRA adapter adds zero), so the engine starts in sync.
    """

    def __init__(
        self,
        config: RolloutConfig,
        model_path: str,
        tokenizer: Any,
        device: torch.device,
        weight_source: ActorPart | None = None,
    ):
        self.config = config
        self.engine = create_rollout_engine(config, model_path, tokenizer=tokenizer, device=str(device))
        self.weight_source = weight_source
        self.synced_version = weight_source.weights_version if weight_source is not None else None
        self.sleep_between_rollouts = config.free_cache_engine
        self.asleep = False
        if self.sleep_between_rollouts:
            self._sleep()

    @property
    def is_stale(self) -> bool:
        return self.weight_source is not None and self.synced_version != self.weight_source.weights_version

    def sync_weights(self) -> float:
        """Stream the actor's full weights into the engine, one parameter at a time; returns seconds taken.

        Every rank of the group must call it together (each gather is a collective).
        """
        start = time.perf_counter()
        with self.weight_source.trainer.on_device():
            self.engine.load_weights(self.weight_source.hf_weights())
        self.synced_version = self.weight_source.weights_version
        return time.perf_counter() - start

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``engine.generate_sequences`` after syncing stale weights.

        ``meta_info['metrics']['timing_s/update_weights']`` is this rank's sync time: a per-rank value, so it
        travels as a metric (``DataProto.concat`` lists every rank's) and the driver picks the slowest.
        """
        update_seconds = self.sync_weights() if self.is_stale else 0.0
        self._wake()
        try:
            output = self.engine.generate_sequences(prompts)
        finally:
            if self.sleep_between_rollouts:
                self._sleep()
        output.meta_info.setdefault("metrics", {})["timing_s/update_weights"] = update_seconds
        return output

    def _sleep(self) -> None:
        if not self.asleep:
            self.engine.sleep()
            self.asleep = True

    def _wake(self) -> None:
        if self.asleep:
            self.engine.wake()
            self.asleep = False
