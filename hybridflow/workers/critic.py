"""The critic: a value per response token, trained with PPO's clipped value loss (arXiv:1707.06347).

``CriticPart`` holds the FSDP2 value model and its optimizer; ``CriticWorker`` exposes it to the driver.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any

import torch

from hybridflow.algos import masked_mean
from hybridflow.algos.value_loss import compute_value_loss
from hybridflow.distributed import Dispatch, Worker, register
from hybridflow.distributed.profiler import Profiled
from hybridflow.models.layouts import Layout, choose_layout
from hybridflow.models.value_model import forward_values, load_value_model
from hybridflow.protocol import DataProto
from hybridflow.protocol.columns import CRITIC_UPDATE_INPUTS, VALUE_INPUTS
from hybridflow.workers import checkpoint
from hybridflow.workers.config import CriticConfig, as_config
from hybridflow.workers.fsdp import build_device_mesh
from hybridflow.workers.model_setup import shard_for_training
from hybridflow.workers.training import (
    LossCounts,
    ShardedTrainer,
    metrics_output,
    mini_batch_size_per_rank,
    row_group,
    run_in_micro_batches,
)


class CriticPart:
    """The value model (``critic.model.path``: a causal LM gets a fresh scalar head) and its update; with
    ``ulysses_sequence_parallel_size`` > 1 each rank computes its group's rows (``workers/training.py``)."""

    def __init__(self, config: CriticConfig, device: torch.device):
        model_config = config.model
        self.config = config
        self.device = device
        model = load_value_model(
            model_config.path,
            model_config.dtype,
            model_config.attn_implementation,
            model_config.trust_remote_code,
            override_config=dict(model_config.override_config),
        )
        fsdp = model_config.fsdp_config
        mesh = build_device_mesh(fsdp.fsdp_size, device, fsdp.tensor_parallel_size)
        self.module = shard_for_training(model, model_config, fsdp, mesh, device)
        self.rows = row_group(config.ulysses_sequence_parallel_size, device, mesh)
        self.trainer = ShardedTrainer(
            self.module, device, model_config.fsdp_config, config.optim, data_parallel_rank=self.rows.data_parallel_rank
        )
        self.mini_batch_size = mini_batch_size_per_rank(
            config.ppo_mini_batch_size, config.rollout_n, self.rows.data_parallel_size, "critic.ppo_mini_batch_size"
        )
        dynamic = config.use_dynamic_bsz
        self.forward_batching = self.rows.micro_batching(
            config.forward_micro_batch_size_per_gpu,
            config.forward_micro_batch_size,
            dynamic,
            config.forward_max_token_len_per_gpu,
            "critic.forward_micro_batch_size",
        )
        self.update_batching = self.rows.micro_batching(
            config.ppo_micro_batch_size_per_gpu,
            config.ppo_micro_batch_size,
            dynamic,
            config.ppo_max_token_len_per_gpu,
            "critic.ppo_micro_batch_size",
        )

    def _layout(self, data: DataProto) -> Layout:
        """The layout of every micro-batch of a pass over ``data``, chosen once for the pass."""
        batch = data.batch
        return choose_layout(
            self.module,
            batch["input_ids"],
            batch["attention_mask"],
            batch["responses"].shape[1],
            self.config.use_prefix_grouper,
            self.config.model.use_remove_padding,
        )

    def _values(self, micro: DataProto, layout: Layout) -> torch.Tensor:
        batch = micro.batch
        return forward_values(
            self.module,
            batch["input_ids"],
            batch["attention_mask"],
            batch["position_ids"],
            batch["responses"].shape[1],
            layout,
            self.rows.sequence_parallel,
        )

    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values ``[B, R]`` (0 where the response is padding), on CPU."""
        self.module.eval()
        inputs = self.rows.gather(data.select(batch_keys=list(VALUE_INPUTS)))
        layout = self._layout(inputs)
        with self.trainer.on_device():
            (values,) = run_in_micro_batches(
                inputs, self.forward_batching, self.device, lambda micro: self._values(micro, layout)
            )
        return self.rows.own({"values": values.cpu()}, len(data))["values"]

    def update(self, data: DataProto) -> dict[str, Any]:
        """PPO value epochs over ``data``; metrics vf_loss, vf_clipfrac, vpred_mean, grad_norm (per step), lr."""
        rows_per_step = self.mini_batch_size // self.rows.size
        data = self.rows.gather(data.select(batch_keys=list(CRITIC_UPDATE_INPUTS)), rows_per_step)
        layout = self._layout(data)
        return self.trainer.update(
            data,
            lambda micro, counts: self._loss(micro, counts, layout),
            mini_batch_size=self.mini_batch_size,
            epochs=self.config.ppo_epochs,
            batching=self.update_batching,
            grad_clip=self.config.grad_clip,
            shuffle=self.config.shuffle,
            seed=self.config.seed,
        )

    def _loss(self, micro: DataProto, counts: LossCounts, layout: Layout) -> tuple[torch.Tensor, dict[str, float]]:
        batch = micro.batch
        response_mask = batch["response_mask"]
        vpreds = self._values(micro, layout)
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds,
            batch["returns"],
            batch["values"],
            response_mask,
            cliprange_value=self.config.cliprange_value,
            loss_agg_mode=self.config.loss_agg_mode,
            loss_scale_factor=self.config.loss_scale_factor,
            **dataclasses.asdict(counts),
        )
        # vf_loss is already this micro-batch's share; the means are weighed by its share of the tokens.
        token_share = float(response_mask.sum()) / max(counts.global_token_count, 1.0)
        metrics = {
            "vf_loss": float(vf_loss.detach()),
            "vf_clipfrac": float(vf_clipfrac) * token_share,
            "vpred_mean": float(masked_mean(vpreds.detach(), response_mask)) * token_share,
        }
        return vf_loss, metrics

    def save_checkpoint(self, path: str | pathlib.Path, global_step: int) -> None:
        contents = [item for item in self.config.checkpoint.save_contents if item != "hf_model"]
        checkpoint.save_checkpoint(path, self.trainer.training_state, contents, global_step=global_step)

    def load_checkpoint(self, path: str | pathlib.Path) -> dict[str, Any]:
        with self.trainer.on_device(with_optimizer=True):
            return checkpoint.load_checkpoint(path, self.trainer.training_state, self.config.checkpoint.load_contents)


class CriticWorker(Worker, Profiled):
    """SPMD worker over the ``critic`` config section."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = as_config(CriticConfig, config)
        self.critic: CriticPart | None = None

    def _critic(self) -> CriticPart:
        if self.critic is None:
            raise RuntimeError("CriticWorker: call init_model before using the critic")
        return self.critic

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        self.critic = CriticPart(self.config, self.device)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` [B, R]: V of the state before each response token."""
        return DataProto.from_dict({"values": self._critic().compute_values(data)})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        """Clipped value-loss update; ``meta_info['metrics']``: vf_loss, vf_clipfrac, vpred_mean, grad_norm, lr."""
        return metrics_output(self._critic().update(data), self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0) -> None:
        self._critic().save_checkpoint(local_path, global_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict:
        return self._critic().load_checkpoint(local_path)
