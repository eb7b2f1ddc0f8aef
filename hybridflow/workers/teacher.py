"""The on-policy distillation teachers: frozen models of other folders, on a pool of their own, that score the
student's responses token by token (``compute_teacher_log_probs``). A teacher reads the student's token ids, so it
shares the student's tokenizer; each is sharded over the whole pool and micro-batched like the reference
(``actor_rollout_ref.ref.*``) and runs the same frozen forward (``RefPart``). With several teachers (verl's MOPD) the
driver sends each one its own rows, one call per teacher, so every rank runs the same teacher's forward together."""

from __future__ import annotations

import dataclasses
from typing import Any

from hybridflow.distributed import Dispatch, Worker, register
from hybridflow.protocol import DataProto
from hybridflow.workers.config import ActorRolloutRefConfig, ModelConfig, WorkerConfigError, as_config
from hybridflow.workers.fsdp import build_device_mesh
from hybridflow.workers.ref import RefPart
from hybridflow.workers.training import row_group


class TeacherWorker(Worker):
    """SPMD worker of the ``teacher`` role: ``models``, each a ``(model_path, dtype)``, loaded with the policy's
    loading options (``config``: the ``actor_rollout_ref`` section); ``topk``: log-probs kept per position (None:
    the sampled token's)."""

    def __init__(self, config: Any, models: list[tuple[str, str]], topk: int | None):
        super().__init__()
        self.config = as_config(ActorRolloutRefConfig, config)
        policy = self.config.model
        self.model_configs = [
            ModelConfig(
                path=model_path,
                dtype=dtype,
                use_remove_padding=policy.use_remove_padding,
                attn_implementation=policy.attn_implementation,
                trust_remote_code=policy.trust_remote_code,
            )
            for model_path, dtype in models
        ]
        self.topk = topk
        self.parts: list[RefPart] = []

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        ref = dataclasses.replace(self.config.ref, ulysses_sequence_parallel_size=1)
        mesh = build_device_mesh(ref.fsdp_config.fsdp_size, self.device, ref.fsdp_config.tensor_parallel_size)
        rows = row_group(1, self.device, mesh)
        # A prompt shared by its samples is computed once, as the actor's passes do (actor.use_prefix_grouper)
        share_prompts = self.config.actor.use_prefix_grouper
        self.parts = [
            RefPart.load(model_config, ref, mesh, self.device, rows, share_prompts=share_prompts)
            for model_config in self.model_configs
        ]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_teacher_log_probs(self, data: DataProto, teacher: int = 0) -> DataProto:
        """Teacher ``teacher``'s (an index into ``models``) ``teacher_logprobs`` ``[B, R]`` of the sampled tokens, or
        with ``topk`` ``teacher_logprobs`` and ``teacher_ids`` ``[B, R, k]`` (verl's names); raw log-probs, at
        temperature 1."""
        if not self.parts:
            raise WorkerConfigError("compute_teacher_log_probs before init_model")
        part = self.parts[teacher]
        if self.topk is None:
            return DataProto.from_dict({"teacher_logprobs": part.compute_ref_log_prob(data, 1.0)})
        return DataProto.from_dict(part.compute_top_log_probs(data, self.topk))
