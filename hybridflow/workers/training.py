"""The trained half of the actor and the critic: an FSDP2 model, its AdamW, LR schedule and update loop.

``ShardedTrainer.update`` runs the PPO-style loop (epochs x mini-batches x micro-batches) with a loss
function supplied by the caller, and keeps the gradient of a mini-batch independent of how it is split:
the loss function aggregates with the mini-batch's global counts (summed over ranks), so the micro-batch
losses of all ranks add up to the mini-batch loss; FSDP2 averages gradients over ranks, so each
micro-batch loss is multiplied by the world size before ``backward``. A caller that left out rows which
cannot change the gradient passes the whole batch's counts instead (``whole_batch_counts``).
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict
from typing import Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from hybridflow.protocol import DataProto
from hybridflow.workers.batching import (
    LossCounts,
    MicroBatching,
    all_reduce_sums,
    iter_mini_batches,
    loss_counts,
    split_micro_batches,
)
from hybridflow.workers.checkpoint import TrainingState
from hybridflow.workers.config import FSDPConfig, OptimConfig
from hybridflow.workers.fsdp import move_model, move_optimizer_state
from hybridflow.workers.optim import build_lr_scheduler, build_optimizer

# The metric of each optimizer step: 1.0 when its gradient norm was not finite and the step was not taken.
NONFINITE_SKIP_FRAC = "nonfinite_skip_frac"

# (micro-batch on device, mini-batch counts) -> (loss, metrics that add up over micro-batches and ranks)
LossFn = Callable[[DataProto, LossCounts], tuple[torch.Tensor, dict[str, float]]]


def metrics_output(metrics: dict, rank: int) -> DataProto:
    """What an update method returns: ``meta_info['metrics']`` on rank 0, nothing on the other ranks.

    ``ShardedTrainer.update``'s metrics are all-reduced, the same on every rank. ``DataProto.concat`` gathers
    each rank's metrics into per-rank lists, so a group call yields ``{name: [rank 0's value]}``; one copy keeps
    the driver's mean exact (the mean of world_size equal floats can differ from them in the last bit).
    """
    return DataProto(meta_info={"metrics": metrics} if rank == 0 else {})

CPU = torch.device("cpu")


class UpdateBatchError(ValueError):
    """An update call's batch asks to be trained in a way that is not exact for this trainer's settings."""


class ShardedTrainer:
    """An already sharded ``model`` with AdamW over its trainable parameters and a warmup schedule.

    With ``fsdp_config.param_offload`` / ``optimizer_offload`` the parameters / optimizer states live on
    CPU between calls and visit ``device`` inside :meth:`on_device` (no effect when ``device`` is CPU).
    """

    def __init__(self, model: torch.nn.Module, device: torch.device, fsdp_config: FSDPConfig, optim_config: OptimConfig):
        self.model = model
        self.device = device
        self.fsdp_config = fsdp_config
        self.optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], optim_config)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_config)
        self.world_size = dist.get_world_size()
        self._offload()

    @property
    def training_state(self) -> TrainingState:
        return TrainingState(self.model, self.optimizer, self.lr_scheduler)

    @property
    def update_count(self) -> int:
        """Completed update calls (the scheduler's step), restored by checkpoint loading."""
        return self.lr_scheduler.last_epoch

    def _offload(self) -> None:
        if self.fsdp_config.param_offload:
            move_model(self.model, CPU)
        if self.fsdp_config.optimizer_offload:
            move_optimizer_state(self.optimizer, CPU)

    @contextlib.contextmanager
    def on_device(self, with_optimizer: bool = False) -> Iterator[None]:
        """Bring offloaded parameters (and optimizer states) to the device for the block, then back."""
        if self.fsdp_config.param_offload:
            move_model(self.model, self.device)
        if with_optimizer and self.fsdp_config.optimizer_offload:
            move_optimizer_state(self.optimizer, self.device)
        try:
            yield
        finally:
            self._offload()

    def update(
        self,
        data: DataProto,
        loss_fn: LossFn,
        mini_batch_size: int,
        epochs: int,
        batching: MicroBatching,
        grad_clip: float,
        shuffle: bool = False,
        seed: int = 0,
        whole_batch_counts: LossCounts | None = None,
    ) -> dict[str, list[float] | float]:
        """One update call: ``epochs`` passes of mini-batch optimizer steps, then one scheduler step.

        ``whole_batch_counts``: ``data`` is the part of a larger batch whose other rows change the loss only
        through its counts (rows whose advantages are all 0 under a ``zero_at_zero_advantage`` policy loss),
        with the whole batch's :class:`LossCounts`. ``data`` is then a single mini-batch (at most
        ``mini_batch_size`` rows) and each epoch is one optimizer step with these counts, taken even when
        ``data`` is empty on every rank: zero gradients still move AdamW's moments and its weight decay.

        Returns, per mini-batch step, the summed ``loss_fn`` metrics (identical on every rank), ``grad_norm``
        and ``nonfinite_skip_frac`` (1.0 for a step skipped because its gradient norm was NaN or inf); and the
        ``lr`` the steps used.
        """
        # A shuffle stream per (seed, update call, rank): a resumed run draws the same permutations.
        stream = np.random.SeedSequence([seed, self.update_count, dist.get_rank()]).generate_state(1)[0]
        generator = torch.Generator().manual_seed(int(stream))
        if whole_batch_counts is None:
            mini_batches = iter_mini_batches(data, mini_batch_size, epochs, shuffle, generator)
            steps = ((mini_batch, None) for mini_batch in mini_batches)
        elif len(data) <= mini_batch_size:
            steps = ((data, whole_batch_counts) for _ in range(epochs))
        else:
            raise UpdateBatchError(
                f"an update with the whole batch's loss counts must be one mini-batch, but this rank got {len(data)} "
                f"rows for mini-batches of {mini_batch_size}; send every row or raise the mini-batch size"
            )
        metrics: dict[str, list[float]] = defaultdict(list)
        lr = self.lr_scheduler.get_last_lr()[0]
        self.model.train()
        with self.on_device(with_optimizer=True):
            for mini_batch, counts in steps:
                step_metrics = self._mini_batch_step(mini_batch, counts, loss_fn, batching, grad_clip)
                for key, value in step_metrics.items():
                    metrics[key].append(value)
        self.lr_scheduler.step()
        return {**metrics, "lr": lr}

    def _mini_batch_step(
        self, mini_batch: DataProto, counts: LossCounts | None, loss_fn: LossFn, batching: MicroBatching,
        grad_clip: float,
    ) -> dict[str, float]:
        """One optimizer step; ``counts`` None means the mini-batch's own counts over the group."""
        if counts is None:
            counts = loss_counts(mini_batch.batch["response_mask"].to(self.device))
        micro_batches = split_micro_batches(mini_batch, batching, self.device)[0] if len(mini_batch) else []
        summed: dict[str, float] = defaultdict(float)
        self.optimizer.zero_grad(set_to_none=True)
        for index, micro_batch in enumerate(micro_batches):
            if isinstance(self.model, FSDPModule):
                # Reduce-scatter gradients once per mini-batch, after the last micro-batch's backward.
                self.model.set_requires_gradient_sync(index == len(micro_batches) - 1)
            loss, micro_metrics = loss_fn(micro_batch.to(self.device), counts)
            (loss * self.world_size).backward()
            for key, value in micro_metrics.items():
                summed[key] += value
        if not micro_batches:
            self._zero_gradients()
        step_metrics = all_reduce_sums(dict(summed), self.device)
        step_metrics["grad_norm"] = self._clip_and_step(grad_clip)
        # Averaged over an update's steps by the driver: the share of them skipped.
        step_metrics[NONFINITE_SKIP_FRAC] = float(not math.isfinite(step_metrics["grad_norm"]))
        return step_metrics

    def _zero_gradients(self) -> None:
        """Zero gradients for a step without data: AdamW skips parameters whose gradient is None."""
        for param in self.model.parameters():
            if param.requires_grad and param.grad is None:
                param.grad = torch.zeros_like(param)

    def _clip_and_step(self, grad_clip: float) -> float:
        """Clip the global gradient norm and step; a non-finite norm skips the step (verl does the same)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm=grad_clip, foreach=True)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        grad_norm = float(grad_norm)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm
