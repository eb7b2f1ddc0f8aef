"""``SFTWorker``: one SPMD rank of supervised fine-tuning, on the same model/FSDP2/optimizer stack as the actor.

The loss is the mean negative log-likelihood of the loss-masked tokens (response / assistant tokens), over
the whole global batch: ``-sum(mask * log p(x_t | x_<t)) / sum(mask)``. Token log-probs come from
``hybridflow.models.log_probs.forward_log_probs`` with every token after the first treated as a target, so
packing (``use_remove_padding``) and the chunked log-softmax are the actor's; the update loop (micro-batches,
gradient accumulation, clipping, LR schedule) is ``ShardedTrainer``'s, checkpoints and the Hugging Face export
are the workers' ``checkpoint`` module.
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import torch

from hybridflow.algos import agg_loss
from hybridflow.distributed import Dispatch, Worker, register
from hybridflow.models.loading import load_tokenizer
from hybridflow.models.log_probs import forward_log_probs
from hybridflow.protocol import DataProto
from hybridflow.workers import checkpoint
from hybridflow.workers.config import CheckpointConfig, FSDPConfig, ModelConfig, OptimConfig
from hybridflow.workers.fsdp import build_device_mesh, iter_hf_weights
from hybridflow.workers.model_setup import load_policy_model, shard_for_training
from hybridflow.workers.training import LossCounts, MicroBatching, ShardedTrainer, metrics_output, run_in_micro_batches

SFT_INPUTS = ("input_ids", "attention_mask", "position_ids", "loss_mask")


def with_target_mask(data: DataProto) -> DataProto:
    """``response_mask`` [B, L-1]: the loss mask shifted onto the positions that predict each target token.

    ``ShardedTrainer`` counts loss tokens from ``response_mask``; here the "response" is every token after
    the first, and the mask keeps only the loss-masked ones.
    """
    batch = data.select(batch_keys=list(SFT_INPUTS))
    batch.batch["response_mask"] = batch.batch["loss_mask"][:, 1:] * batch.batch["attention_mask"][:, 1:]
    return batch


def target_log_probs(model: torch.nn.Module, data: DataProto, use_remove_padding: bool) -> torch.Tensor:
    """``log p(x_t | x_<t)`` for t = 1..L-1: [B, L-1] (0 where the target is padding)."""
    batch = data.batch
    log_probs, _ = forward_log_probs(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch["position_ids"],
        response_length=batch["input_ids"].shape[1] - 1,
        use_remove_padding=use_remove_padding,
    )
    return log_probs


class SFTWorker(Worker):
    """Fine-tunes ``model_config.path`` with a masked next-token loss; every method runs on every rank."""

    def __init__(
        self,
        model_config: ModelConfig,
        optim_config: OptimConfig,
        fsdp_config: FSDPConfig,
        batching: MicroBatching,
        grad_clip: float,
        checkpoint_config: CheckpointConfig | None = None,
    ):
        super().__init__()
        self.model_config = model_config
        self.optim_config = optim_config
        self.fsdp_config = fsdp_config
        self.batching = batching
        self.grad_clip = grad_clip
        self.checkpoint_config = checkpoint_config or CheckpointConfig()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> int:
        """Load, (LoRA-)wrap and shard the model and build its optimizer; returns the trainable parameter count."""
        config = self.model_config
        self.tokenizer = load_tokenizer(
            config.tokenizer_dir, trust_remote_code=config.trust_remote_code, chat_template=config.custom_chat_template
        )
        model = load_policy_model(self.model_config)
        self.hf_config = copy.deepcopy(model.config)
        self.generation_config = copy.deepcopy(model.generation_config)
        mesh = build_device_mesh(self.fsdp_config.fsdp_size, self.device)
        self.module = shard_for_training(model, self.model_config, self.fsdp_config, mesh, self.device)
        self.trainer = ShardedTrainer(self.module, self.device, self.fsdp_config, self.optim_config)
        return sum(p.numel() for p in model.parameters() if p.requires_grad)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def train_step(self, data: DataProto) -> DataProto:
        """One optimizer step on this rank's share of the global batch.

        ``meta_info['metrics']``: ``loss`` (the global batch's mean token NLL), ``grad_norm``, ``lr``.
        """
        metrics = self.trainer.update(
            with_target_mask(data),
            self._loss,
            mini_batch_size=len(data),
            epochs=1,
            batching=self.batching,
            grad_clip=self.grad_clip,
        )
        return metrics_output(metrics, self.rank)

    def _loss(self, micro: DataProto, counts: LossCounts) -> tuple[torch.Tensor, dict[str, float]]:
        log_probs = target_log_probs(self.module, micro, self.model_config.use_remove_padding)
        response_mask = micro.batch["response_mask"]
        loss = agg_loss(-log_probs, response_mask, "token-mean", global_token_count=counts.global_token_count)
        return loss, {"loss": float(loss.detach())}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def validation_nll(self, data: DataProto) -> DataProto:
        """Per example: ``nll_sum`` (summed negative log-likelihood of its loss tokens) and ``num_tokens``."""
        batch = with_target_mask(data)
        self.module.eval()
        with self.trainer.on_device():
            (log_probs,) = run_in_micro_batches(
                batch,
                self.batching,
                self.device,
                lambda micro: target_log_probs(self.module, micro, self.model_config.use_remove_padding),
            )
        mask = batch.batch["response_mask"].to(log_probs.dtype)
        return DataProto.from_dict({"nll_sum": -(log_probs.cpu() * mask).sum(-1), "num_tokens": mask.sum(-1)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0) -> None:
        """The ``checkpoint.save_contents`` parts (model, optimizer, scheduler and RNG states, a Hugging Face
        folder) into ``local_path``, atomically; every rank writes its shards."""
        checkpoint.save_checkpoint(
            local_path,
            self.trainer.training_state,
            self.checkpoint_config.save_contents,
            export=self._export_hf,
            global_step=global_step,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict[str, Any]:
        with self.trainer.on_device(with_optimizer=True):
            return checkpoint.load_checkpoint(
                local_path, self.trainer.training_state, self.checkpoint_config.load_contents
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> str:
        """Write the model (LoRA merged) and tokenizer as a Hugging Face folder that ``from_pretrained`` loads."""
        return str(self._export_hf(pathlib.Path(path)))

    def _export_hf(self, path: pathlib.Path) -> pathlib.Path:
        """:meth:`export_hf` from inside this rank (every rank of the group must call it)."""
        return checkpoint.export_hf(
            path, iter_hf_weights(self.module), self.hf_config, self.generation_config, self.tokenizer
        )
