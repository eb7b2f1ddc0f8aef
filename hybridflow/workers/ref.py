"""The reference role: log-probs of the frozen initial policy, for the KL penalty or KL loss; and the same frozen
forward for an on-policy distillation teacher (another model folder, ``workers/teacher.py``).

Two ways to have one: load the base model a second time, frozen and sharded (``RefPart.load``); or, when
the actor trains a LoRA adapter, run the actor's own model with the adapter switched off
(``RefPart.from_lora_actor``): the base weights never change, so no second copy is needed.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, ContextManager

import torch
from torch.distributed.device_mesh import DeviceMesh

from hybridflow.models.lora import adapter_disabled
from hybridflow.models.training_options import compile_model
from hybridflow.protocol import DataProto
from hybridflow.protocol.columns import LOG_PROB_INPUTS
from hybridflow.workers.actor import ActorPart, entropy_chunk_size, log_prob_forward, pass_layout
from hybridflow.workers.config import ModelConfig, RefConfig
from hybridflow.workers.fsdp import move_model, parameters_on
from hybridflow.workers.model_setup import load_policy_model, shard_frozen
from hybridflow.workers.training import MicroBatching, RowGroup, run_in_micro_batches

CPU = torch.device("cpu")


def ref_batching(config: RefConfig, rows: RowGroup) -> MicroBatching:
    """The reference pass's micro-batches over the rows each rank computes."""
    return rows.micro_batching(
        config.log_prob_micro_batch_size_per_gpu,
        config.log_prob_micro_batch_size,
        config.log_prob_use_dynamic_bsz,
        config.log_prob_max_token_len_per_gpu,
        "actor_rollout_ref.ref.log_prob_micro_batch_size",
    )


class RefPart:
    """Computes ``ref_log_prob [B, R]``; ``scope()`` is entered around every forward (device placement,
    adapter switched off); ``rows``: the rows each rank computes (``workers/training.py``)."""

    def __init__(
        self,
        module: torch.nn.Module,
        batching: MicroBatching,
        use_remove_padding: bool,
        device: torch.device,
        scope: Callable[[], ContextManager],
        rows: RowGroup,
        chunk_size: int | None = None,
        share_prompts: bool | None = False,
    ):
        self.module = module
        self.rows = rows
        self.chunk_size = chunk_size
        self.share_prompts = share_prompts
        self.batching = batching
        self.use_remove_padding = use_remove_padding
        self.device = device
        self.scope = scope

    @classmethod
    def load(
        cls,
        model_config: ModelConfig,
        config: RefConfig,
        mesh: DeviceMesh,
        device: torch.device,
        rows: RowGroup,
        share_prompts: bool | None = False,
    ) -> "RefPart":
        """A frozen, sharded copy of the base model (no adapter even when the actor has one), computing ``rows``;
        ``share_prompts`` is the actor's ``use_prefix_grouper``."""
        module = shard_frozen(load_policy_model(model_config), config.fsdp_config, mesh, device)
        if config.use_torch_compile:
            compile_model(module)
        offload = config.fsdp_config.param_offload
        if offload:
            move_model(module, CPU)
        scope = functools.partial(parameters_on, module, device, offload)
        return cls(
            module,
            ref_batching(config, rows),
            model_config.use_remove_padding,
            device,
            scope,
            rows,
            entropy_chunk_size(config),
            share_prompts,
        )

    @classmethod
    def from_lora_actor(cls, actor: ActorPart, config: RefConfig) -> "RefPart":
        """The actor's model with its LoRA adapter switched off: exactly the base model."""

        @contextlib.contextmanager
        def base_model():
            with actor.trainer.on_device(), adapter_disabled(actor.module):
                yield

        return cls(
            actor.module,
            ref_batching(config, actor.rows),
            actor.model_config.use_remove_padding,
            actor.device,
            base_model,
            actor.rows,
            entropy_chunk_size(config),
            actor.config.use_prefix_grouper,
        )

    def compute_ref_log_prob(self, data: DataProto, temperature: float) -> torch.Tensor:
        """Reference log-probs ``[B, R]`` of the responses, on CPU."""
        return self._forward(data, {"ref_log_prob": 0}, temperature=temperature)["ref_log_prob"]

    def compute_top_log_probs(self, data: DataProto, topk: int) -> dict[str, torch.Tensor]:
        """``teacher_logprobs`` / ``teacher_ids`` ``[B, R, k]``: each response position's ``topk`` largest raw
        log-probs (temperature 1, as verl's teacher servers return them) and their ids, on CPU."""
        return self._forward(data, {"teacher_logprobs": 3, "teacher_ids": 4}, temperature=1.0, topk=topk)

    def _forward(self, data: DataProto, fields: dict[str, int], **statistics) -> dict[str, torch.Tensor]:
        """The frozen forward over ``data``'s rows: ``fields`` names the ``TokenStatistics`` outputs kept (by
        index); ``statistics`` are ``log_prob_forward``'s options."""
        inputs = self.rows.gather(data.select(batch_keys=list(LOG_PROB_INPUTS)))
        layout = pass_layout(self.module, inputs, self.share_prompts, self.use_remove_padding)
        group = self.rows.sequence_parallel
        was_training = self.module.training
        self.module.eval()

        def forward(micro: DataProto) -> tuple[torch.Tensor, ...]:
            outputs = log_prob_forward(
                self.module, micro, layout, chunk_size=self.chunk_size, sequence_parallel=group, **statistics
            )
            return tuple(outputs[index] for index in fields.values())

        with self.scope():
            outputs = run_in_micro_batches(inputs, self.batching, self.device, forward)
        self.module.train(was_training)
        return self.rows.own({name: output.cpu() for name, output in zip(fields, outputs)}, len(data))
