"""One rank's share of a batch, cut and trained: the actor's and the critic's update loop over an FSDP2 model,
its AdamW and learning-rate schedule, and the mini-/micro-batches and loss counts both use.

Every rank gets an equal chunk of the batch (``Dispatch.DP_COMPUTE_PROTO``). ``ShardedTrainer.update`` runs
``epochs`` passes over the chunk in mini-batches (one optimizer step each), each cut into micro-batches (one
forward/backward each), with a loss function supplied by the caller; the log-prob and value passes run the
same micro-batches without gradients (:func:`run_in_micro_batches`). FSDP2 gathers parameters collectively
in every forward, so all ranks must run the same number of micro-batches: with token budgets the count is
agreed over the group first.

The gradient of a mini-batch does not depend on how it is split: the loss function aggregates with the
mini-batch's global counts (summed over ranks), so the micro-batch losses of all ranks add up to the
mini-batch loss; FSDP2 averages gradients over ranks, so each micro-batch loss is multiplied by the world
size before ``backward``. A caller that left out rows which cannot change the gradient passes the whole
batch's counts instead (``whole_batch_counts``). The learning-rate scheduler steps once per update call
(one trainer step), like verl, so ``total_training_steps`` counts trainer steps, not optimizer steps.

Which rows a rank computes (:class:`RowGroup`): its own chunk, or with Ulysses sequence parallelism its
group's. With ``ulysses_sequence_parallel_size=k`` the ``k`` ranks of a group first gather their chunks, so each
holds the group's rows and runs ``1/k`` of every row's columns (:mod:`hybridflow.models.sequence_parallel`); each rank
then returns the outputs of its own chunk. This is verl's arrangement (its Ulysses sharding manager): the
groups are the data-parallel ranks, so mini- and micro-batch sizes per rank count ``world / k`` ranks, and a
row's ``k`` copies count it ``k`` times in the loss counts summed over all ranks. Differs from verl: an update's
mini-batches take every chunk's rows step by step (:meth:`RowGroup.gather`), so a run with Ulysses takes the
optimizer steps of the same run without it, not those of a different split of its rows
(``tests/trainer/test_sequence_parallel_runs.py``).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import resource
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator

import numpy as np
import psutil
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from hybridflow.data.micro_batches import restore_order, split_by_token_budget
from hybridflow.distributed.rank_groups import MeshGroup, gather_objects
from hybridflow.distributed.sequence_parallel import SequenceParallelGroup, sequence_parallel_group
from hybridflow.models.tensor_parallel import is_training_split
from hybridflow.protocol import DataProto
from hybridflow.tracking import metric_names as names
from hybridflow.workers.checkpoint import TrainingState
from hybridflow.workers.config import (
    WARMUP_STYLES,
    FSDPConfig,
    OptimConfig,
    WorkerConfigError,
    micro_batch_size_per_rank,
    warmup_steps,
)
from hybridflow.workers.fsdp import move_model, move_optimizer_state

# The metric of each optimizer step: 1.0 when its gradient norm was not finite and the step was not taken.
NONFINITE_SKIP_FRAC = "nonfinite_skip_frac"

CPU = torch.device("cpu")


@dataclass(frozen=True)
class MicroBatching:
    """Micro-batches of ``micro_batch_size`` rows, or (``use_dynamic_bsz``) of at most ``max_token_len``
    real tokens. ``micro_batch_size=None`` without a token budget runs the whole mini-batch at once."""

    micro_batch_size: int | None = None
    use_dynamic_bsz: bool = False
    max_token_len: int = 16384


@dataclass(frozen=True)
class LossCounts:
    """Loss tokens and sequences of a whole mini-batch over all ranks: the denominators of ``agg_loss``."""

    global_token_count: float
    global_seq_count: float


@dataclass(frozen=True)
class RowGroup:
    """This rank's rows: ``shared`` None computes the rank's own chunk (``k = 1``); else the ``k`` ranks of
    ``shared`` compute the group's rows, each ``1/k`` of every row (a :class:`SequenceParallelGroup`: Ulysses) or
    each with ``1/k`` of every weight (a tensor-parallel model, ``fsdp_config.tensor_parallel_size``)."""

    shared: MeshGroup | None
    data_parallel_size: int
    data_parallel_rank: int

    @property
    def splits_sequences(self) -> bool:
        """Whether the ranks split the rows' columns (Ulysses) rather than the weights."""
        return self.shared is None or isinstance(self.shared, SequenceParallelGroup)

    @property
    def size(self) -> int:
        """Ranks that compute the same rows (``k``)."""
        return 1 if self.shared is None else self.shared.size

    def matches(self, ulysses_sequence_parallel_size: int, tensor_parallel_size: int) -> bool:
        """Whether these are the groups of a role with these sizes (so that it can share them)."""
        if ulysses_sequence_parallel_size > 1:
            return self.splits_sequences and self.size == ulysses_sequence_parallel_size
        if tensor_parallel_size > 1:
            return not self.splits_sequences and self.size == tensor_parallel_size
        return self.size == 1

    @property
    def sequence_parallel(self) -> SequenceParallelGroup | None:
        """The Ulysses group a forward splits its rows over, or None."""
        return self.shared if self.splits_sequences else None

    def gather(self, data: DataProto, rows_per_step: int | None = None) -> DataProto:
        """The rows this rank computes: ``data`` itself, or its group's chunks in rank order.

        With ``rows_per_step`` (a chunk's rows per optimizer step) the group's rows are ordered step by step
        instead: each mini-batch holds the next ``rows_per_step`` rows of every chunk, the rows the group's ``k``
        ranks would train together without Ulysses, so the two layouts take the same optimizer steps.
        """
        if self.shared is None:
            return data
        gathered = DataProto.concat(gather_objects(data, self.shared))
        if rows_per_step is None:
            return gathered
        chunk = len(data)
        order = [
            rank * chunk + row
            for start in range(0, chunk, rows_per_step)
            for rank in range(self.size)
            for row in range(start, min(start + rows_per_step, chunk))
        ]
        return gathered[torch.tensor(order, dtype=torch.long)]

    def own(self, outputs: dict[str, torch.Tensor], chunk: int) -> dict[str, torch.Tensor]:
        """This rank's ``chunk`` rows of outputs computed for :meth:`gather`'s rows."""
        if self.shared is None:
            return outputs
        start = self.shared.rank * chunk
        return {name: value[start : start + chunk] for name, value in outputs.items()}

    def micro_batching(
        self, per_gpu: int | None, global_size: int | None, use_dynamic_bsz: bool, max_token_len: int, key: str
    ) -> MicroBatching:
        """Micro-batches of the rows this rank computes: verl's per-rank size, or its deprecated global form over
        the data-parallel ranks; under Ulysses a token budget ``k`` times ``max_token_len`` (each row runs 1/k
        here), as in verl."""
        size = micro_batch_size_per_rank(per_gpu, global_size, self.data_parallel_size, key)
        return MicroBatching(size, use_dynamic_bsz, max_token_len * (self.size if self.splits_sequences else 1))

    def counts(self, counts: LossCounts | None) -> LossCounts | None:
        """Loss counts of the batch as the ranks count it: each row ``k`` times (the driver counts it once)."""
        if counts is None or self.size == 1:
            return counts
        return replace(
            counts,
            global_token_count=counts.global_token_count * self.size,
            global_seq_count=counts.global_seq_count * self.size,
        )


def row_group(ulysses_sequence_parallel_size: int, device: torch.device, mesh: DeviceMesh | None = None) -> RowGroup:
    """This rank's :class:`RowGroup` for ``ulysses_sequence_parallel_size``, or for the ``tp`` groups of a model
    sharded on the ``(dp, tp)`` ``mesh`` (every rank must call it)."""
    if mesh is not None and is_training_split(mesh):
        if ulysses_sequence_parallel_size > 1:
            raise WorkerConfigError(
                f"ulysses_sequence_parallel_size={ulysses_sequence_parallel_size} with fsdp_config.tensor_parallel_size"
                f"={mesh['tp'].size()}: choose one of the two"
            )
        shared = MeshGroup.of(mesh, "tp")
        return RowGroup(shared, shared.data_parallel_size, shared.data_parallel_rank)
    if ulysses_sequence_parallel_size <= 1:
        return RowGroup(None, dist.get_world_size(), dist.get_rank())
    group = sequence_parallel_group(ulysses_sequence_parallel_size, device)
    return RowGroup(group, group.data_parallel_size, group.data_parallel_rank)


def mini_batch_size_per_rank(ppo_mini_batch_size: int, rollout_n: int, world_size: int, key: str) -> int:
    """verl's convention: ``ppo_mini_batch_size`` counts prompts; a rank's mini-batch holds
    ``ppo_mini_batch_size * rollout_n / world_size`` samples."""
    samples = ppo_mini_batch_size * rollout_n
    if ppo_mini_batch_size < 1 or samples % world_size:
        raise WorkerConfigError(
            f"{key}={ppo_mini_batch_size} (x rollout.n={rollout_n} = {samples} samples) must be a positive "
            f"multiple of the group's {world_size} ranks; change {key}"
        )
    return samples // world_size


def iter_mini_batches(
    data: DataProto, mini_batch_size: int, epochs: int, shuffle: bool, generator: torch.Generator
) -> Iterator[DataProto]:
    """``epochs`` passes over ``data`` in mini-batches of ``mini_batch_size`` rows (the last may be
    shorter); with ``shuffle`` each pass uses a fresh permutation drawn from ``generator``."""
    for _ in range(epochs):
        epoch_data = data[torch.randperm(len(data), generator=generator)] if shuffle else data
        yield from epoch_data.split(mini_batch_size)


def _agreed_max(value: int, device: torch.device) -> int:
    count = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return int(count.item())


def split_micro_batches(
    data: DataProto, batching: MicroBatching, device: torch.device
) -> tuple[list[DataProto], list[list[int]] | None]:
    """Cut ``data`` into micro-batches; returns them and, for token budgets, the row indices each holds
    (for :func:`restore_order`), else None (micro-batches are consecutive rows)."""
    if batching.use_dynamic_bsz:
        micro_batches, indices = split_by_token_budget(data, batching.max_token_len)
        count = _agreed_max(len(micro_batches), device)
        if count != len(micro_batches):
            micro_batches, indices = split_by_token_budget(data, batching.max_token_len, min_num_micro_batches=count)
        return micro_batches, indices
    if batching.micro_batch_size is None:
        return [data], None
    return data.split(batching.micro_batch_size), None


def _count_tensor(response_mask: torch.Tensor) -> torch.Tensor:
    return torch.stack([response_mask.sum(), (response_mask.sum(dim=-1) > 0).sum()]).to(torch.float64)


def local_loss_counts(response_mask: torch.Tensor) -> LossCounts:
    """Masked tokens and non-empty sequences of ``response_mask [B, R]`` in this process only."""
    local = _count_tensor(response_mask)
    return LossCounts(global_token_count=float(local[0]), global_seq_count=float(local[1]))


def loss_counts(response_mask: torch.Tensor) -> LossCounts:
    """Masked tokens and non-empty sequences of ``response_mask [B, R]``, summed over the group."""
    summed = _count_tensor(response_mask)
    dist.all_reduce(summed)
    return LossCounts(global_token_count=float(summed[0]), global_seq_count=float(summed[1]))


def all_reduce_sums(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Sum each value over the group (every rank must pass the same keys)."""
    if not values:
        return {}
    keys = sorted(values)
    packed = torch.tensor([values[key] for key in keys], dtype=torch.float64, device=device)
    dist.all_reduce(packed)
    return dict(zip(keys, packed.tolist()))


def run_in_micro_batches(
    data: DataProto,
    batching: MicroBatching,
    device: torch.device,
    forward: Callable[[DataProto], torch.Tensor | tuple[torch.Tensor, ...]],
) -> tuple[torch.Tensor, ...]:
    """``forward`` on every micro-batch (no gradients), outputs joined in ``data``'s row order.

    ``forward`` returns one ``[b, ...]`` tensor or a tuple of them; the result is always a tuple.
    """
    micro_batches, indices = split_micro_batches(data, batching, device)
    outputs = []
    with torch.no_grad():
        for micro_batch in micro_batches:
            result = forward(micro_batch.to(device))
            outputs.append(result if isinstance(result, tuple) else (result,))
    joined = []
    for parts in zip(*outputs):
        if indices is None:
            joined.append(torch.cat(parts))
        else:
            joined.append(restore_order(parts, indices))
    return_freed_heap()  # the forwards' activations
    return tuple(joined)


def build_optimizer(params: Iterable[torch.nn.Parameter], config: OptimConfig) -> torch.optim.AdamW:
    """AdamW over the trainable ``params`` (frozen ones, e.g. a LoRA base, are left out by the caller).

    The fused kernel where every parameter is on a CPU or CUDA device: torch's default on CPU is a loop over
    the parameters, which on FSDP2's DTensors costs about 5x the fused step (74 ms against 15 ms for the
    benchmark's 4M-parameter model, 2 threads).
    """
    params = list(params)
    fused = bool(params) and all(p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.AdamW(
        params,
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        weight_decay=config.weight_decay,
        fused=fused or None,
    )


def lr_multiplier(config: OptimConfig) -> Callable[[int], float]:
    """``step -> lr / peak lr``: linear warmup to 1 over ``warmup_steps`` steps, then the chosen style.

    Warmup gives ``(step + 1) / warmup`` so the first update already moves the weights (Hugging Face's
    schedule gives 0 at step 0). Cosine decays from 1 to ``min_lr_ratio`` over the remaining
    ``total_training_steps - warmup`` steps, through ``num_cycles`` half-waves (0.5: one half cosine,
    SGDR arXiv:1608.03983), and stays at its end value afterwards.
    """
    style = config.warmup_style
    if style not in WARMUP_STYLES:
        raise WorkerConfigError(f"optim.warmup_style={style!r} is not supported; choose one of {list(WARMUP_STYLES)}")
    warmup = warmup_steps(config)
    # 0 steps (a validation-only run): the schedule is never read.
    if style == "cosine" and config.total_training_steps != 0 and config.total_training_steps <= warmup:
        raise WorkerConfigError(
            f"optim.warmup_style='cosine' needs optim.total_training_steps > warmup steps ({warmup}), got "
            f"{config.total_training_steps}; the trainer sets total_training_steps before building the worker"
        )
    min_ratio = config.min_lr_ratio

    def multiplier(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if style == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / (config.total_training_steps - warmup))
        cosine = 0.5 * (1.0 + math.cos(math.pi * 2.0 * config.num_cycles * progress))
        return min_ratio + (1.0 - min_ratio) * cosine

    return multiplier


def build_lr_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` applying :func:`lr_multiplier` to the optimizer's peak ``lr``."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_multiplier(config))


# (micro-batch on device, mini-batch counts) -> (loss, metrics that add up over micro-batches and ranks)
LossFn = Callable[[DataProto, LossCounts], tuple[torch.Tensor, dict[str, float]]]


def metrics_output(metrics: dict, rank: int) -> DataProto:
    """What an update method returns: ``meta_info['metrics']`` on rank 0, nothing on the other ranks.

    ``ShardedTrainer.update``'s metrics are all-reduced, the same on every rank. ``DataProto.concat`` gathers
    each rank's metrics into per-rank lists, so a group call yields ``{name: [rank 0's value]}``; one copy keeps
    the driver's mean exact (the mean of world_size equal floats can differ from them in the last bit).
    """
    return DataProto(meta_info={"metrics": metrics} if rank == 0 else {})


def memory_metrics(device: str) -> dict[str, float]:
    """Memory after an update: verl's ``perf/max_memory_allocated_gb`` and ``..._reserved_gb`` (GPU) and
    ``perf/cpu_memory_used_gb`` (the machine's), and this process's high-water resident memory, the number the
    config check's estimate is measured against (``config/memory_estimate.py``)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    metrics = {
        names.PERF_CPU_MEMORY_USED: psutil.virtual_memory().used / 2**30,
        names.PERF_MAX_RESIDENT_MEMORY: (peak if sys.platform == "darwin" else peak * 1024) / 2**30,
    }
    if device == "cuda":
        metrics[names.PERF_MAX_MEMORY_ALLOCATED] = torch.cuda.max_memory_allocated() / 2**30
        metrics[names.PERF_MAX_MEMORY_RESERVED] = torch.cuda.max_memory_reserved() / 2**30
    return metrics


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (macOS, musl): another allocator, with its own way of returning memory
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def return_freed_heap() -> None:
    """Hand the pages of glibc's free heap chunks back to the system (``malloc_trim(0)``) at a phase's end: the
    host-side counterpart of a GPU's ``empty_cache``.

    glibc raises its mmap threshold (up to 32 MiB) to the size of each mapped block freed, so from an update's
    first freed activations on, all of them come from its heap; freed, they stay resident around what outlives the
    phase, and the next phase grows the heap past them (a 30M fp32 run at 128 tokens held 1.66 GiB after one
    update, where its gradients and optimizer state need 0.34; issue 27). ``bench_scaling``'s hybridflow side,
    fp32, on a 2-core AVX2 VM (2026-12-05), peak GiB: 30M x 128 tokens 2.18-2.27 -> 1.92-2.01, 100M x 16
    3.43-3.54 -> 2.84-2.97, 30M x 16 1.58 -> 1.50, the steps' times within the runs' noise. A fixed 4 MiB mmap
    threshold (``mallopt``) cut more (1.78 and 2.48 GiB) but cost 1.5-7% of the step, likely in page faults: an
    FSDP2 layer's gathered weights and gradients then become fresh mappings the kernel zeroes, every micro-batch.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def hand_over_gradients(model: torch.nn.Module) -> None:
    """At one rank, make each parameter's summed unsharded gradient its sharded gradient, without a copy.

    With gradient sync off, FSDP2 sums the micro-batches' gradients on its unsharded parameters. At one rank its
    reduce-scatter is then two copies into fresh buffers, and glibc keeps the freed heap copy resident beside them.
    ``bench_scaling``'s hybridflow side at 100M parameters x 16 tokens, an A/B of 2 runs each (2026-12-06): peak
    fp32 2.96-3.07 -> 2.62-2.64 GiB, bf16 2.80-2.82 -> 2.46, the update no slower (fp32 9.4-10.4 -> 9.0-9.3 s). Reads
    FSDP2's per-parameter state, which is private: torch is pinned in constraints.txt, and
    tests/workers/test_fsdp.py checks the result against FSDP2's own reduce, bit for bit.
    """
    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        for fsdp_param in group.fsdp_params if group is not None else ():
            if not hasattr(fsdp_param, "_unsharded_param"):  # never gathered (no forward yet): no gradient
                continue
            # Accumulated in reduce_dtype when it differs from param_dtype, else on the parameter itself.
            grad = fsdp_param.unsharded_accumulated_grad
            if grad is None:
                grad = fsdp_param._unsharded_param.grad
            fsdp_param.unsharded_accumulated_grad = None
            fsdp_param._unsharded_param.grad = None
            if grad is None:
                continue
            sharded = fsdp_param.sharded_param
            local = grad.to(sharded.dtype).view(sharded.shape)
            sharded.grad = DTensor.from_local(
                local,
                sharded.device_mesh,
                sharded.placements,
                run_check=False,
                shape=sharded.shape,
                stride=sharded.stride(),
            )


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip ``params``' gradients to a global 2-norm of ``max_norm``; returns the norm before clipping.

    Under FSDP2 x TP the split weights' gradients live on the ``(dp, tp)`` mesh and the others' on ``dp`` alone,
    which torch's clipping cannot mix: each mesh's gradients are normed apart (in parameter order, the same on
    every rank), the norms combined, and each mesh's gradients scaled by the one factor."""
    by_mesh: dict[object, list[torch.nn.Parameter]] = {}
    for param in params:
        if param.grad is not None:
            by_mesh.setdefault(param.grad.device_mesh if isinstance(param.grad, DTensor) else None, []).append(param)
    if len(by_mesh) <= 1:
        total = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm, foreach=True)
        return float(total.full_tensor() if isinstance(total, DTensor) else total)
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([param.grad for param in group], foreach=True)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack(norms))
    for group in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return float(total)


class UpdateBatchError(ValueError):
    """An update call's batch asks to be trained in a way that is not exact for this trainer's settings."""


class ShardedTrainer:
    """An already sharded ``model`` with AdamW over its trainable parameters and a warmup schedule.

    With ``fsdp_config.param_offload`` / ``optimizer_offload`` the parameters / optimizer states live on
    CPU between calls and visit ``device`` inside :meth:`on_device` (no effect when ``device`` is CPU).
    ``data_parallel_rank`` (default: the rank) picks the mini-batch shuffle's stream: ranks that hold the
    same rows (a Ulysses group) must shuffle them alike.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        fsdp_config: FSDPConfig,
        optim_config: OptimConfig,
        data_parallel_rank: int | None = None,
    ):
        self.model = model
        self.device = device
        self.fsdp_config = fsdp_config
        self.optimizer = build_optimizer([p for p in model.parameters() if p.requires_grad], optim_config)
        self.lr_scheduler = build_lr_scheduler(self.optimizer, optim_config)
        self.world_size = dist.get_world_size()
        self.data_parallel_rank = dist.get_rank() if data_parallel_rank is None else data_parallel_rank
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
        steps = self._steps(data, mini_batch_size, epochs, shuffle, seed, whole_batch_counts)
        metrics: dict[str, list[float]] = defaultdict(list)
        lr = self.lr_scheduler.get_last_lr()[0]
        self.model.train()
        with self.on_device(with_optimizer=True):
            for mini_batch, counts in steps:
                step_metrics = self._mini_batch_step(mini_batch, counts, loss_fn, batching, grad_clip)
                for key, value in step_metrics.items():
                    metrics[key].append(value)
        self.lr_scheduler.step()
        return_freed_heap()  # the update's freed activations
        return {**metrics, "lr": lr}

    def _steps(
        self,
        data: DataProto,
        mini_batch_size: int,
        epochs: int,
        shuffle: bool,
        seed: int,
        whole_batch_counts: LossCounts | None,
    ) -> Iterator[tuple[DataProto, LossCounts | None]]:
        """The optimizer steps of an update: each step's mini-batch and the counts its loss is normalised by
        (None: the mini-batch's own)."""
        if whole_batch_counts is not None:
            if len(data) > mini_batch_size:
                raise UpdateBatchError(
                    f"an update with the whole batch's loss counts must be one mini-batch, but this rank got "
                    f"{len(data)} rows for mini-batches of {mini_batch_size}; send every row or raise the mini-batch "
                    "size"
                )
            return ((data, whole_batch_counts) for _ in range(epochs))
        # A shuffle stream per (seed, update call, rank): a resumed run draws the same permutations.
        stream = np.random.SeedSequence([seed, self.update_count, self.data_parallel_rank]).generate_state(1)[0]
        generator = torch.Generator().manual_seed(int(stream))
        mini_batches = iter_mini_batches(data, mini_batch_size, epochs, shuffle, generator)
        return ((mini_batch, None) for mini_batch in mini_batches)

    def _mini_batch_step(
        self,
        mini_batch: DataProto,
        counts: LossCounts | None,
        loss_fn: LossFn,
        batching: MicroBatching,
        grad_clip: float,
    ) -> dict[str, float]:
        """One optimizer step; ``counts`` None means the mini-batch's own counts over the group."""
        if counts is None:
            counts = loss_counts(mini_batch.batch["response_mask"].to(self.device))
        micro_batches = split_micro_batches(mini_batch, batching, self.device)[0] if len(mini_batch) else []
        summed: dict[str, float] = defaultdict(float)
        self.optimizer.zero_grad(set_to_none=True)
        sharded = isinstance(self.model, FSDPModule)
        for index, micro_batch in enumerate(micro_batches):
            if sharded:
                # Reduce-scatter gradients once per mini-batch, after the last micro-batch's backward; one rank
                # has nothing to reduce and takes its gradients over after the loop.
                self.model.set_requires_gradient_sync(self.world_size > 1 and index == len(micro_batches) - 1)
            loss, micro_metrics = loss_fn(micro_batch.to(self.device), counts)
            (loss * self.world_size).backward()
            for key, value in micro_metrics.items():
                summed[key] += value
        if sharded and self.world_size == 1:
            hand_over_gradients(self.model)
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
        grad_norm = clip_grad_norm([p for p in self.model.parameters() if p.requires_grad], grad_clip)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm
