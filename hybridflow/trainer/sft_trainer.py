"""The SFT driver: batches of examples to an ``SFTWorker`` group, validation loss, checkpoints, final export.

Same shape as the PPO driver (a single controller calling a worker group, arXiv 2409.19256), one phase
per step: ``metrics = sft_group.train_step(batch)``. The run folder (``trainer.default_local_dir``) holds
``metrics.jsonl``, resumable ``global_step_N`` checkpoints, and the final model as a Hugging Face folder in
``huggingface/``.
"""

from __future__ import annotations

import math
import pathlib
import time
from typing import Any, Protocol

from hybridflow.checkpoints.manager import CheckpointManager, capture_rng_state, restore_rng_state
from hybridflow.config.placement import make_resource_plan
from hybridflow.config.sft import SFTTrainerConfig, to_plain_dict
from hybridflow.distributed import RayClassWithInitArgs
from hybridflow.tracking.trackers import RunInfo, Tracking
from hybridflow.trainer.metrics import reduce_worker_metrics
from hybridflow.trainer.worker_groups import WorkerGroups, create_worker_groups
from hybridflow.workers.config import ModelConfig, OptimConfig
from hybridflow.workers.sft_worker import SFTWorker
from hybridflow.workers.training import MicroBatching

HF_EXPORT_DIR = "huggingface"
WORKER_STATE_DIR = "model"
TRAIN_PREFIX = "train/"
VAL_LOSS = "val/loss"


class SFTStepHook(Protocol):
    """Runs after every step, before the metrics are logged: it may add metrics, and returns True to stop
    the run after this step (e.g. early stopping on a generation-based score)."""

    def after_step(self, trainer: "SFTTrainer", metrics: dict[str, float]) -> bool: ...


def worker_model_config(config: SFTTrainerConfig) -> ModelConfig:
    """The workers' ``ModelConfig`` for the SFT ``model`` section."""
    model = config.model
    return ModelConfig(
        path=model.partial_pretrain,
        tokenizer_path=model.tokenizer_path,
        use_remove_padding=config.use_remove_padding,
        enable_gradient_checkpointing=model.enable_gradient_checkpointing,
        lora_rank=model.lora_rank,
        lora_alpha=model.lora_alpha,
        target_modules=model.target_modules,
        dtype=model.dtype,
        attn_implementation=model.attn_implementation,
        trust_remote_code=model.trust_remote_code,
        override_config=dict(model.override_config),
        custom_chat_template=model.custom_chat_template,
    )


def worker_optim_config(config: SFTTrainerConfig, total_training_steps: int) -> OptimConfig:
    """The workers' ``OptimConfig`` for the SFT ``optim`` section, spanning ``total_training_steps``.

    Warmup lasts ``lr_warmup_steps`` steps when that is positive, else ``warmup_steps_ratio`` of the run (verl's
    ``lr_warmup_steps`` / ``lr_warmup_steps_ratio``)."""
    optim = config.optim
    ratio_steps = int(optim.warmup_steps_ratio * total_training_steps)
    warmup = optim.lr_warmup_steps if optim.lr_warmup_steps > 0 else ratio_steps
    # A cosine schedule needs at least one step after warmup.
    warmup = min(warmup, total_training_steps - 1) if optim.lr_scheduler == "cosine" else warmup
    return OptimConfig(
        lr=optim.lr,
        lr_warmup_steps=max(warmup, 0),
        warmup_style=optim.lr_scheduler,
        min_lr_ratio=optim.min_lr_ratio,
        num_cycles=optim.num_cycles,
        weight_decay=optim.weight_decay,
        betas=list(optim.betas),
        total_training_steps=max(total_training_steps, 1),
    )


class SFTTrainer:
    """Fine-tunes ``config.model`` on ``train_loader``'s batches; call ``init_workers()``, then ``fit()``.

    ``train_loader``/``val_loader`` are ``StatefulDataLoader``s over ``SFTDataset``s (``val_loader`` may be None).
    """

    def __init__(self, config: SFTTrainerConfig, *, train_loader: Any, val_loader: Any = None):
        self.config = config
        self.train_loader = train_loader
        self.val_loader = val_loader
        trainer = config.trainer
        self.total_training_steps = trainer.total_training_steps or len(train_loader) * trainer.total_epochs
        self.run_dir = pathlib.Path(trainer.default_local_dir).expanduser()
        self.checkpoints = CheckpointManager(
            self.run_dir, trainer.resume_mode, trainer.resume_from_path, trainer.max_ckpt_to_keep
        )
        self.global_step = 0
        self.hooks: list[SFTStepHook] = []
        self.workers: WorkerGroups | None = None
        self._batches = self._iterate_batches()

    def init_workers(self) -> None:
        """Start the ``SFTWorker`` group (``nnodes x n_gpus_per_node`` processes) and load the model."""
        config, trainer = self.config, self.config.trainer
        data = config.data
        batching = MicroBatching(data.micro_batch_size_per_gpu, data.use_dynamic_bsz, data.max_token_len_per_gpu)
        worker = RayClassWithInitArgs(
            SFTWorker,
            model_config=worker_model_config(config),
            optim_config=worker_optim_config(config, self.total_training_steps),
            fsdp_config=config.model.fsdp_config,
            batching=batching,
            grad_clip=config.optim.clip_grad,
            checkpoint_config=config.checkpoint,
        )
        plan = make_resource_plan(
            "colocated",
            ["sft"],
            nnodes=trainer.nnodes,
            processes_per_node=trainer.n_gpus_per_node,
            use_gpu=trainer.device == "cuda",
            cpus_per_process=trainer.cpus_per_worker,
        )
        self.workers = create_worker_groups(plan, {"sft": worker})
        self.sft_group = self.workers.roles["sft"]
        self.num_trainable_parameters = self.sft_group.init_model()[0]

    def shutdown(self) -> None:
        if self.workers is not None:
            self.workers.shutdown()

    def fit(self) -> pathlib.Path:
        """Train for ``total_training_steps`` steps (or until a hook stops the run); returns the exported
        Hugging Face folder."""
        tracker = self._start_run()
        stop = False
        try:
            while not stop and self.global_step < self.total_training_steps:
                self.global_step += 1
                batch = next(self._batches)
                started = time.perf_counter()
                output = self.sft_group.train_step(batch)
                seconds = time.perf_counter() - started
                worker = reduce_worker_metrics(output.meta_info["metrics"])
                metrics = {f"{TRAIN_PREFIX}{name}": value for name, value in worker.items()}
                num_tokens = int(batch.batch["attention_mask"].sum())
                metrics.update(
                    {
                        "train/epoch": float(self.train_loader.epoch),
                        "perf/time_per_step": seconds,
                        "perf/total_num_tokens": float(num_tokens),
                        "perf/throughput": num_tokens / seconds,
                    }
                )
                stop = any([hook.after_step(self, metrics) for hook in self.hooks])
                self._end_step(metrics, tracker, last=stop or self.global_step == self.total_training_steps)
            return self.export_hf(self.run_dir / HF_EXPORT_DIR)
        finally:
            tracker.close()

    def _iterate_batches(self):
        """Training batches epoch after epoch (the loader's state says where a resumed run continues)."""
        while True:
            yield from self.train_loader

    def _end_step(self, metrics: dict[str, float], tracker: Tracking, last: bool) -> None:
        trainer = self.config.trainer
        scheduled = trainer.test_freq > 0 and self.global_step % trainer.test_freq == 0
        if self.val_loader is not None and (last or scheduled):
            metrics[VAL_LOSS] = self.validation_loss()
        tracker.log(metrics, self.global_step)
        if trainer.save_freq > 0 and (last or self.global_step % trainer.save_freq == 0):
            self.save_checkpoint()

    def export_hf(self, path: str | pathlib.Path) -> pathlib.Path:
        """The current model as a Hugging Face folder at ``path`` (LoRA merged)."""
        return pathlib.Path(self.sft_group.export_hf(str(path))[0])

    def validation_loss(self) -> float:
        """Mean negative log-likelihood per loss token over the whole validation set."""
        nll, tokens = 0.0, 0.0
        for batch in self.val_loader:
            output = self.sft_group.validation_nll(batch)
            nll += float(output.batch["nll_sum"].sum())
            tokens += float(output.batch["num_tokens"].sum())
        return nll / tokens if tokens else math.nan

    def _start_run(self) -> Tracking:
        resume_dir = self.checkpoints.resume_dir()
        if resume_dir is not None:
            self.load_checkpoint(resume_dir)
            print(f"resumed from {resume_dir} at step {self.global_step}")
        trainer = self.config.trainer
        run = RunInfo(
            trainer.project_name,
            trainer.experiment_name,
            self.run_dir,
            self.total_training_steps,
            first_step=self.global_step + 1,
            config=to_plain_dict(self.config),
        )
        return Tracking(trainer.logger, run)

    def save_checkpoint(self) -> None:
        """Worker states, then the driver's (step, data position, RNG), then the ``latest`` pointer."""
        with self.checkpoints.saving(self.global_step) as step_dir:
            self.sft_group.save_checkpoint(str(step_dir / WORKER_STATE_DIR), self.global_step)
            state = {
                "global_step": self.global_step,
                "train_loader": self.train_loader.state_dict(),
                "rng": capture_rng_state(),
            }
            self.checkpoints.save_driver_state(step_dir, state)

    def load_checkpoint(self, step_dir: pathlib.Path) -> None:
        state = self.checkpoints.load_driver_state(step_dir)
        self.sft_group.load_checkpoint(str(step_dir / WORKER_STATE_DIR))
        self.global_step = int(state["global_step"])
        self.train_loader.load_state_dict(state["train_loader"])
        restore_rng_state(state["rng"])
        self._batches = self._iterate_batches()
