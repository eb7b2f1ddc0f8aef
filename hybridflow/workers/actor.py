"""The actor role: the policy under FSDP2, its old log-probs, and the PPO update (arXiv:1707.06347).

The policy loss is the registered ``policy_loss.loss_mode`` (``hybridflow.algos``) or, in rollout
correction's bypass mode, ``compute_bypass_policy_loss`` on the rollout's log-probs as old ones; minus
``entropy_coeff`` times the entropy bonus, plus ``kl_loss_coef`` times the KL to the reference policy
when ``use_kl_loss`` (GRPO's KL loss, arXiv:2402.03300). Every term is aggregated with the mini-batch's
global counts, so the update does not depend on the micro-batch split or the number of ranks.

Two arguments of an update, passed by the trainer only where they are exact, save work:
``old_log_probs_from_update`` (no ``old_log_probs`` column: an on-policy update takes the old log-probs
from its own forward) and ``whole_batch_counts`` (only the rows that can change the gradient were sent,
with the whole batch's loss counts).
"""

from __future__ import annotations

import copy
import dataclasses
import pathlib
from typing import Any, Iterator

import torch
from peft import LoraConfig
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from hybridflow.algos import KL_ESTIMATORS, BypassCorrection, compute_bypass_policy_loss, get_policy_loss_fn
from hybridflow.algos.distillation import (
    DistillationInputs,
    DistillationLossConfig,
    distillation_loss,
    policy_loss_config,
)
from hybridflow.distributed.sequence_parallel import SequenceParallelGroup
from hybridflow.models.layouts import Layout, choose_layout
from hybridflow.models.log_probs import TokenStatistics, forward_token_statistics
from hybridflow.models.lora import is_lora_model, lora_config
from hybridflow.models.training_options import compile_model
from hybridflow.protocol import DataProto
from hybridflow.protocol.columns import LOG_PROB_INPUTS, actor_update_columns
from hybridflow.workers import checkpoint
from hybridflow.workers.config import ActorConfig, PolicyModelConfig, RefConfig
from hybridflow.workers.fsdp import iter_hf_weights, iter_lora_weights
from hybridflow.workers.model_setup import load_policy_model, shard_for_training
from hybridflow.workers.training import (
    LossCounts,
    MicroBatching,
    RowGroup,
    ShardedTrainer,
    UpdateBatchError,
    loss_counts,
    mini_batch_size_per_rank,
    run_in_micro_batches,
)


def pass_layout(
    model: torch.nn.Module, data: DataProto, share_prompts: bool | None, use_remove_padding: bool
) -> Layout:
    """The layout every micro-batch of a pass over ``data`` (this rank's whole batch) runs, chosen once."""
    batch = data.batch
    response_length = batch["responses"].shape[1]
    return choose_layout(
        model, batch["input_ids"], batch["attention_mask"], response_length, share_prompts, use_remove_padding
    )


def log_prob_forward(
    model: torch.nn.Module,
    data: DataProto,
    layout: Layout,
    temperature: float,
    calculate_entropy: bool = False,
    calculate_sum_pi_squared: bool = False,
    chunk_size: int | None = None,
    sequence_parallel: SequenceParallelGroup | None = None,
    topk: int | None = None,
    at_ids: torch.Tensor | None = None,
) -> TokenStatistics:
    """``forward_token_statistics`` of a micro-batch (``input_ids``/``attention_mask``/``position_ids``,
    ``responses``) in its pass's ``layout``: ``[B, R]`` each (the top-k statistics ``[B, R, k]``); under Ulysses
    every rank of ``sequence_parallel`` passes the same micro-batch."""
    batch = data.batch
    return forward_token_statistics(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch["position_ids"],
        batch["responses"].shape[1],
        layout,
        temperature,
        calculate_entropy=calculate_entropy,
        calculate_sum_pi_squared=calculate_sum_pi_squared,
        chunk_size=chunk_size,
        sequence_parallel=sequence_parallel,
        topk=topk,
        at_ids=at_ids,
    )


def entropy_chunk_size(config: ActorConfig | RefConfig) -> int | None:
    """Rows of logits per chunk of the log-prob and entropy statistics: verl's
    ``entropy_from_logits_chunk_size`` when ``entropy_from_logits_with_chunking``, else hybridflow's own
    default (about 4 MiB of float32 per chunk; the statistics are chunked either way)."""
    return config.entropy_from_logits_chunk_size if config.entropy_from_logits_with_chunking else None


class ActorPart:
    """The policy model (FSDP2-sharded, optionally with a LoRA adapter) and its PPO optimizer.

    ``weights_version`` increases whenever the weights change (update, checkpoint load), so a rollout
    engine fed from this actor knows when its copy is stale. ``matches_model_folder``: the weights are
    still those of ``model_config.path`` (a fresh LoRA adapter adds zero; a loaded one does not).
    ``bypass`` switches the policy loss to rollout correction's bypass mode (``old_log_probs`` are then the
    rollout's, and the correction metrics ``rollout_corr/*`` join the update's). ``rows``: the rows each rank
    computes (its own, or with Ulysses its group's; ``workers/training.py``); ``log_prob_batching`` counts
    the same data-parallel ranks. ``column_sharded``: linear layers FSDP splits by input columns
    (``fsdp.shard_model``), for a tensor-parallel rollout fed from this actor.
    """

    def __init__(
        self,
        model_config: PolicyModelConfig,
        config: ActorConfig,
        rollout_n: int,
        log_prob_batching: MicroBatching,
        mesh: DeviceMesh,
        device: torch.device,
        rows: RowGroup,
        bypass: BypassCorrection | None = None,
        column_sharded: tuple[str, ...] = (),
        distillation: DistillationLossConfig | None = None,
    ):
        self.model_config = model_config
        self.config = config
        self.device = device
        self.log_prob_batching = log_prob_batching
        model = load_policy_model(model_config)
        self.hf_config = copy.deepcopy(model.config)
        self.generation_config = copy.deepcopy(model.generation_config)
        self.module = shard_for_training(
            model,
            model_config,
            config.fsdp_config,
            mesh,
            device,
            lora_adapter_path=model_config.lora_adapter_path,
            column_sharded=column_sharded,
        )
        if config.use_torch_compile:
            compile_model(self.module)
        self.matches_model_folder = model_config.lora_adapter_path is None
        self.rows = rows
        self.trainer = ShardedTrainer(
            self.module, device, config.fsdp_config, config.optim, data_parallel_rank=rows.data_parallel_rank
        )
        self.mini_batch_size, self.update_batching = self._update_batches(config, rollout_n, rows)
        self._resolve_losses(config, bypass, distillation)
        self.weights_version = 0
        self.cpu_weights: dict[int, list[torch.Tensor]] = {}

    def _resolve_losses(
        self, config: ActorConfig, bypass: BypassCorrection | None, distillation: DistillationLossConfig | None
    ) -> None:
        """Resolved once: the loss, its options and aggregation, the KL loss's estimator, bypass mode's and
        on-policy distillation's terms."""
        self.policy_loss_config = config.policy_loss_config()
        self.policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
        self.kl_estimator = KL_ESTIMATORS.get(config.kl_loss_type) if config.use_kl_loss else None
        self.bypass = bypass
        self.distillation = distillation
        self.distillation_pg_config = (
            policy_loss_config(distillation, self.policy_loss_config) if distillation else None
        )

    @staticmethod
    def _update_batches(config: ActorConfig, rollout_n: int, rows: RowGroup) -> tuple[int, MicroBatching]:
        """A rank's mini-batch (samples) and its micro-batches, over the data-parallel ranks."""
        mini_batch_size = mini_batch_size_per_rank(
            config.ppo_mini_batch_size,
            rollout_n,
            rows.data_parallel_size,
            "actor_rollout_ref.actor.ppo_mini_batch_size",
        )
        update_batching = rows.micro_batching(
            config.ppo_micro_batch_size_per_gpu,
            config.ppo_micro_batch_size,
            config.use_dynamic_bsz,
            config.ppo_max_token_len_per_gpu,
            "actor_rollout_ref.actor.ppo_micro_batch_size",
        )
        return mini_batch_size, update_batching

    def compute_log_prob(self, data: DataProto, temperature: float, calculate_entropy: bool) -> dict[str, torch.Tensor]:
        """``old_log_probs`` ``[B, R]`` under the current policy, ``entropys`` when asked, and ``sum_pi_squared``
        when ``actor.calculate_sum_pi_squared`` (the optimal token baseline's input), on CPU."""
        chunk = len(data)
        inputs = self.rows.gather(data.select(batch_keys=list(LOG_PROB_INPUTS)))
        # In TokenStatistics' field order: forward returns the fields that were asked for.
        sum_pi_squared = self.config.calculate_sum_pi_squared
        asked = {"old_log_probs": True, "entropys": calculate_entropy, "sum_pi_squared": sum_pi_squared}
        names = [name for name, wanted in asked.items() if wanted]
        self.module.eval()
        layout = self._layout(inputs)

        def forward(micro: DataProto) -> tuple[torch.Tensor, ...]:
            statistics = log_prob_forward(
                self.module,
                micro,
                layout,
                temperature,
                calculate_entropy,
                sum_pi_squared,
                entropy_chunk_size(self.config),
                self.rows.sequence_parallel,
            )
            return tuple(value for value in statistics if value is not None)

        with self.trainer.on_device():
            outputs = run_in_micro_batches(inputs, self.log_prob_batching, self.device, forward)
        return self.rows.own({name: output.cpu() for name, output in zip(names, outputs)}, chunk)

    def update(
        self,
        data: DataProto,
        temperature: float,
        old_log_probs_from_update: bool = False,
        whole_batch_counts: LossCounts | None = None,
    ) -> dict[str, Any]:
        """PPO epochs over ``data`` (this rank's share); returns verl's actor metrics, un-prefixed.

        ``old_log_probs_from_update``: the update is on-policy (one epoch of one mini-batch, so the weights it
        starts from sampled the batch) and ``data`` has no ``old_log_probs``; the update's own log-probs,
        detached, stand in for them, which makes the ratio exactly 1 (as verl's actor does when
        ``ppo_epochs == 1`` with one mini-batch). With ``whole_batch_counts``, ``pg_loss`` is the whole batch's
        loss while ``pg_clipfrac``, ``ppo_kl`` and ``entropy`` describe the rows trained on; an update of no
        rows reports ``pg_loss`` 0 (every left-out row has advantage 0) and no entropy.
        """
        on_policy = old_log_probs_from_update
        rows_per_step = self.mini_batch_size // self.rows.size
        data = self.rows.gather(data.select(batch_keys=self._update_inputs(data, on_policy)), rows_per_step)
        whole_batch_counts = self.rows.counts(whole_batch_counts)
        layout = self._layout(data)
        # Diagnostics describe the rows present; the loss is normalised by the whole batch.
        rows_present = None if whole_batch_counts is None else loss_counts(data.batch["response_mask"].to(self.device))
        metrics = self.trainer.update(
            data,
            lambda micro, counts: self._loss(micro, counts, layout, temperature, on_policy, rows_present),
            mini_batch_size=self.mini_batch_size,
            epochs=self.config.ppo_epochs,
            batching=self.update_batching,
            grad_clip=self.config.grad_clip,
            shuffle=self.config.shuffle,
            seed=self.config.seed,
            whole_batch_counts=whole_batch_counts,
        )
        metrics.setdefault("pg_loss", [0.0] * len(metrics["grad_norm"]))
        self.weights_version += 1
        if self.config.use_kl_loss:
            metrics["kl_coef"] = self.config.kl_loss_coef
        return metrics

    def _layout(self, data: DataProto) -> Layout:
        """The layout of every micro-batch of a pass over ``data``, chosen once for the pass."""
        return pass_layout(self.module, data, self.config.use_prefix_grouper, self.model_config.use_remove_padding)

    def _update_inputs(self, data: DataProto, on_policy: bool) -> list[str]:
        """The batch keys the update reads; raises when ``data`` lacks one or cannot be trained as it asks."""
        if on_policy and (self.config.ppo_epochs != 1 or len(data) * self.rows.size > self.mini_batch_size):
            raise UpdateBatchError(
                "update_actor got no old_log_probs (old_log_probs_from_update=True), which is exact only for one "
                f"epoch of one mini-batch; got actor.ppo_epochs={self.config.ppo_epochs} and {len(data)} rows on this "
                f"rank for mini-batches of {self.mini_batch_size}; run compute_log_prob first"
            )
        present = data.batch.keys()
        if self.config.use_kl_loss and "ref_log_prob" not in present:
            raise KeyError("actor.use_kl_loss=True needs 'ref_log_prob' in the batch: run compute_ref_log_prob first")
        if self.distillation is not None and "teacher_logprobs" not in present:
            raise KeyError("distillation needs 'teacher_logprobs' in the batch: run compute_teacher_log_probs first")
        if not on_policy and "old_log_probs" not in present:
            raise KeyError(
                "update_actor needs 'old_log_probs' (run compute_log_prob first) or old_log_probs_from_update=True"
            )
        return actor_update_columns(present, on_policy)

    def _loss(
        self,
        micro: DataProto,
        counts: LossCounts,
        layout: Layout,
        temperature: float,
        on_policy: bool,
        rows_present: LossCounts | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Policy loss - entropy bonus + KL loss of one micro-batch run in its update's ``layout``, and its
        additive metrics. ``counts`` normalise the loss; ``rows_present`` (default ``counts``) the diagnostics.
        """
        batch, config = micro.batch, self.config
        statistics = log_prob_forward(
            self.module,
            micro,
            layout,
            temperature,
            calculate_entropy=True,
            chunk_size=entropy_chunk_size(config),
            sequence_parallel=self.rows.sequence_parallel,
            at_ids=batch["teacher_ids"] if self.distillation and self.distillation.uses_topk else None,
        )
        log_prob, entropy = statistics.log_probs, statistics.entropy
        response_mask = batch["response_mask"]
        counts_kwargs = dataclasses.asdict(counts)
        pg_loss, pg_metrics = self._policy_loss(batch, log_prob, on_policy, counts_kwargs)
        aggregate = self.policy_loss_config.aggregate
        entropy_loss = aggregate(entropy, response_mask, **counts_kwargs)
        loss = pg_loss - config.entropy_coeff * entropy_loss
        rows_present = rows_present or counts
        if rows_present != counts:
            entropy_loss = aggregate(entropy, response_mask, **dataclasses.asdict(rows_present))
        # The losses above are this micro-batch's share of the mini-batch value; the loss's own metrics
        # are means over the micro-batch's tokens, so weigh them by its share of the tokens.
        token_share = float(response_mask.sum()) / max(rows_present.global_token_count, 1.0)
        metrics = {key: value * token_share for key, value in pg_metrics.items()}
        metrics.update(pg_loss=float(pg_loss.detach()), entropy=float(entropy_loss.detach()))
        if self.kl_estimator is not None:
            kl_loss = aggregate(self.kl_estimator(log_prob, batch["ref_log_prob"]), response_mask, **counts_kwargs)
            loss = loss + config.kl_loss_coef * kl_loss
            metrics["kl_loss"] = float(kl_loss.detach())
        if self.distillation is not None:
            loss = self._with_distillation(loss, batch, statistics, on_policy, counts_kwargs, token_share, metrics)
        return loss, metrics

    def _with_distillation(
        self, task_loss, batch, statistics: TokenStatistics, on_policy: bool, counts: dict, share: float, metrics: dict
    ) -> torch.Tensor:
        """The PPO loss combined with on-policy distillation's as verl does: ``distillation_loss_coef`` x the
        distillation loss, plus the PPO loss (entropy and KL terms included) only with ``use_task_rewards``."""
        settings = self.distillation
        student = DistillationInputs(
            statistics.log_probs,
            statistics.log_probs.detach() if on_policy else batch["old_log_probs"],
            statistics.topk_log_probs,
            statistics.topk_ids,
        )
        distill, distill_metrics = distillation_loss(
            settings,
            self.distillation_pg_config,
            student,
            batch["teacher_logprobs"],
            batch.get("teacher_ids", None),
            batch["response_mask"],
            counts,
            batch.get("rollout_is_weights", None),
        )
        metrics.update({name: value * share for name, value in distill_metrics.items()})
        metrics["distillation/loss"] = float(distill.detach())
        if not settings.use_task_rewards:
            return distill
        return task_loss + settings.distillation_loss_coef * distill

    def _policy_loss(
        self, batch: Any, log_prob: torch.Tensor, on_policy: bool, counts_kwargs: dict
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The configured policy loss, or bypass mode's (whose ``old_log_probs`` are the rollout's)."""
        common = dict(
            log_prob=log_prob,
            advantages=batch["advantages"],
            response_mask=batch["response_mask"],
            config=self.policy_loss_config,
            **counts_kwargs,
        )
        if self.bypass is not None:
            return compute_bypass_policy_loss(rollout_log_prob=batch["old_log_probs"], bypass=self.bypass, **common)
        return self.policy_loss_fn(
            old_log_prob=log_prob.detach() if on_policy else batch["old_log_probs"],
            rollout_is_weights=batch.get("rollout_is_weights", None),
            **common,
        )

    @property
    def lora_config(self) -> LoraConfig | None:
        """The peft config of the trained adapter; None when every weight trains."""
        return lora_config(self.module) if is_lora_model(self.module) else None

    def hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full weights under Hugging Face names (LoRA merged), gathered one at a time."""
        return iter_hf_weights(self.module)

    def sharded_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each parameter as FSDP2 holds it (a DTensor shard, nothing gathered), for an engine that reshards."""
        return ((name, param.detach()) for name, param in self.module.named_parameters())

    def lora_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The LoRA adapter's tensors alone under peft's names, gathered one at a time."""
        return iter_lora_weights(self.module)

    def export_hf(self, path: str | pathlib.Path, tokenizer: Any = None) -> pathlib.Path:
        """Write the policy as a plain Hugging Face folder (rank 0 writes; every rank must call)."""
        return checkpoint.export_hf(path, self.hf_weights(), self.hf_config, self.generation_config, tokenizer)

    def save_checkpoint(self, path: str | pathlib.Path, global_step: int, tokenizer: Any = None) -> None:
        checkpoint.save_checkpoint(
            path,
            self.trainer.training_state,
            self.config.checkpoint.save_contents,
            export=lambda hf_path: self.export_hf(hf_path, tokenizer),
            describe=lambda folder: checkpoint.save_model_description(
                folder, self.hf_config, self.generation_config, tokenizer, self.lora_config
            ),
            global_step=global_step,
        )

    def save_weights_to_cpu(self, slot: int) -> None:
        """A CPU copy of this rank's shards of the trainable weights, kept as ``slot``."""
        self.cpu_weights[slot] = [_local(param).detach().to("cpu", copy=True) for param in self._trainable()]

    def restore_weights_from_cpu(self, slot: int) -> None:
        """The trainable weights set back to the copy kept as ``slot`` (the optimizer's state is untouched)."""
        with torch.no_grad():
            for param, saved in zip(self._trainable(), self.cpu_weights[slot], strict=True):
                _local(param).copy_(saved)
        self.weights_version += 1

    def clear_cpu_weights(self, slot: int) -> None:
        self.cpu_weights.pop(slot, None)

    def _trainable(self) -> list[torch.nn.Parameter]:
        return [param for param in self.module.parameters() if param.requires_grad]

    def load_checkpoint(self, path: str | pathlib.Path) -> dict[str, Any]:
        with self.trainer.on_device(with_optimizer=True):
            manifest = checkpoint.load_checkpoint(
                path, self.trainer.training_state, self.config.checkpoint.load_contents
            )
        self.weights_version += 1
        return manifest


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's shard of an FSDP2 parameter (the tensor itself when it is not sharded)."""
    return param.to_local() if isinstance(param, DTensor) else param
