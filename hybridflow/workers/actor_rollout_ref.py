"""``ActorRolloutRefWorker``: one policy model played as actor, rollout and reference, in any mix.

The role string decides, once in ``init_model``, which parts exist (``workers/actor.py``,
``workers/rollout_part.py``, ``workers/ref.py``); every method delegates to its part. With actor and
rollout together the rollout engine is fed from the actor (hybrid engine, arXiv 2409.19256); with a LoRA
actor the reference is the actor's model with the adapter off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator

from hybridflow.algos import BypassCorrection
from hybridflow.algos.distillation import DistillationLossConfig
from hybridflow.distributed import Dispatch, Worker, register
from hybridflow.distributed.profiler import Profiled
from hybridflow.models.loading import load_tokenizer, resolve_dtype
from hybridflow.models.tensor_parallel import ROW_SPLIT
from hybridflow.models.weight_checksum import ChecksummedWeights
from hybridflow.protocol import DataProto, Part
from hybridflow.rollout.partial_samples import PartialSample
from hybridflow.rollout.vllm_shards import ShardLayout, pool_slices
from hybridflow.rollout.weight_loading import shard_buckets
from hybridflow.workers.actor import ActorPart
from hybridflow.workers.config import ActorRolloutRefConfig, WorkerConfigError, as_config
from hybridflow.workers.fsdp import build_device_mesh
from hybridflow.workers.ref import RefPart
from hybridflow.workers.rollout_part import RolloutPart
from hybridflow.workers.training import LossCounts, MicroBatching, RowGroup, memory_metrics, metrics_output, row_group

if TYPE_CHECKING:
    from hybridflow.distributed import SharedObject

ROLE_PARTS = {
    "actor": ("actor",),
    "rollout": ("rollout",),
    "ref": ("ref",),
    "actor_rollout": ("actor", "rollout"),
    "actor_rollout_ref": ("actor", "rollout", "ref"),
    "actor_ref": ("actor", "ref"),
}


class MissingPartError(RuntimeError):
    """A method was called on a worker whose role does not include the part it needs."""


class ActorRolloutRefWorker(Worker, Profiled):
    """SPMD worker over the ``actor_rollout_ref`` config section; ``role`` is a key of ``ROLE_PARTS``.

    ``bypass``: the actor trains with rollout correction's bypass-mode loss (``algorithm.rollout_correction``,
    which lives outside this section); None trains with ``actor.policy_loss.loss_mode``. ``distillation``: the
    actor's loss adds on-policy distillation's (``distillation.distillation_loss``, also outside this section).
    ``loads_in_flight``: weight loads reach the rollout while it generates (partial rollout on a pool of its own).
    """

    def __init__(
        self,
        config: Any,
        role: str,
        bypass: BypassCorrection | None = None,
        distillation: DistillationLossConfig | None = None,
        loads_in_flight: bool = False,
    ):
        super().__init__()
        if role not in ROLE_PARTS:
            raise WorkerConfigError(
                f"role={role!r} is not an ActorRolloutRefWorker role; choose one of {list(ROLE_PARTS)}"
            )
        self.config = as_config(ActorRolloutRefConfig, config)
        self.role = role
        self.bypass = bypass
        self.distillation = distillation
        self.loads_in_flight = loads_in_flight
        self.parts: dict[str, Any] = {}
        self.tokenizer = None

    def _part(self, name: str, method: str) -> Any:
        if name not in self.parts:
            raise MissingPartError(
                f"{method} needs the {name} part, but this worker has role={self.role!r} "
                f"(parts {list(self.parts) or 'none: call init_model first'})"
            )
        return self.parts[name]

    @property
    def temperature(self) -> float:
        """The training samples were drawn at the rollout's temperature: log-probs are taken at it (as in verl)."""
        return self.config.rollout.temperature

    def _log_prob_batching(self, rows: RowGroup) -> MicroBatching:
        # The old-log-prob pass runs on the actor but, as in verl, takes its micro-batching from the rollout keys.
        rollout = self.config.rollout
        return rows.micro_batching(
            rollout.log_prob_micro_batch_size_per_gpu,
            rollout.log_prob_micro_batch_size,
            rollout.log_prob_use_dynamic_bsz,
            rollout.log_prob_max_token_len_per_gpu,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size",
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the parts of this worker's role (every rank, collectively)."""
        config, wanted = self.config, ROLE_PARTS[self.role]
        self.tokenizer = load_tokenizer(
            config.model.tokenizer_dir,
            trust_remote_code=config.model.trust_remote_code,
            chat_template=config.model.custom_chat_template,
        )
        if "actor" in wanted:
            self.parts["actor"] = self._actor(config.rollout.tensor_model_parallel_size if "rollout" in wanted else 1)
        actor = self.parts.get("actor")
        if "ref" in wanted and actor is not None and config.model.uses_lora:
            self.parts["ref"] = RefPart.from_lora_actor(actor, config.ref)
        elif "ref" in wanted:
            fsdp = config.ref.fsdp_config
            mesh = build_device_mesh(fsdp.fsdp_size, self.device, fsdp.tensor_parallel_size)
            size = config.ref.ulysses_sequence_parallel_size
            # The actor's groups serve a reference split alike: no second set of process groups.
            alike = actor is not None and actor.rows.matches(size, fsdp.tensor_parallel_size)
            rows = actor.rows if alike else row_group(size, self.device, mesh)
            self.parts["ref"] = RefPart.load(
                config.model, config.ref, mesh, self.device, rows, share_prompts=config.actor.use_prefix_grouper
            )
        if "rollout" in wanted:
            self.parts["rollout"] = RolloutPart(
                config.rollout,
                config.model.path,
                self.tokenizer,
                self.device,
                weight_source=actor,
                merge_lora=config.model.merges_lora(config.rollout.name, config.rollout.tensor_model_parallel_size),
                loads_in_flight=self.loads_in_flight,
            )

    def _actor(self, rollout_split: int) -> ActorPart:
        """The actor part; ``rollout_split``: the tensor-parallel size of a rollout fed from it in this worker, for
        which FSDP splits the row-split layers by columns, as the rollout does."""
        config = self.config
        fsdp = config.actor.fsdp_config
        mesh = build_device_mesh(fsdp.fsdp_size, self.device, fsdp.tensor_parallel_size)
        rows = row_group(config.actor.ulysses_sequence_parallel_size, self.device, mesh)
        return ActorPart(
            config.model,
            config.actor,
            config.rollout.n,
            self._log_prob_batching(rows),
            mesh,
            self.device,
            rows,
            bypass=self.bypass,
            column_sharded=ROW_SPLIT if rollout_split > 1 else (),
            distillation=self.distillation,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self) -> float:
        """The hybrid engine's weight sync: the actor's weights into this worker's rollout engine, unless it holds
        them already (after an update, a checkpoint load, or for a LoRA adapter's engine before its first use).
        Returns the seconds the sync checks took since the last call (``rollout.weight_sync_check_freq``)."""
        return self._part("rollout", "update_weights").update_weights()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """``B`` prompts -> ``B * n`` samples, with the weights of the last ``update_weights``."""
        # DP_COMPUTE_PROTO hands each rank a contiguous shard: its rows start at rank * shard length.
        prompts.meta_info["first_prompt_index"] = self.rank * len(prompts)
        return self._part("rollout", "generate_sequences").generate_sequences(prompts)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, stream=True)
    def generate_sequences_stream(self, prompts: DataProto) -> Iterator[Part]:
        """``generate_sequences``'s samples in parts, yielded as they finish (the driver scores them meanwhile)."""
        prompts.meta_info["first_prompt_index"] = self.rank * len(prompts)
        yield from self._part("rollout", "generate_sequences_stream").generate_sequences_stream(prompts)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def continue_samples(
        self, samples: list[PartialSample], groups_needed: int, meta: dict[str, Any]
    ) -> list[PartialSample]:
        """The V1 trainers' partial rollout: each rank continues its own prompt groups' ``samples`` until
        ``groups_needed`` of them have finished, then aborts the rest (``rollout/partial_samples.py``)."""
        return self._part("rollout", "continue_samples").continue_samples(samples, groups_needed, meta)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def share_weights(
        self, bucket_megabytes: float, layouts: list[ShardLayout] | None = None
    ) -> tuple[list[list[SharedObject]], int]:
        """The actor's full weights (Hugging Face names, LoRA merged) put in the object store in buckets of about
        ``bucket_megabytes``, for a rollout pool of its own (``load_shared_weights``), and their checksum in the
        rollout's dtype (``models/weight_checksum.py``). A pool split ``rollout.tensor_model_parallel_size`` ways
        gets a list of buckets per shard, each of that shard's slices: cut as the ``hf`` engine splits, or as
        ``layouts`` say (the pool's ``shard_layouts``: vLLM's boxes). Every rank gathers (each parameter is a
        collective); rank 0 returns the buckets, the others an empty list."""
        from hybridflow.distributed import share  # loads Ray, which only a rollout pool of its own needs

        gathered = self._part("actor", "share_weights").hf_weights()
        weights = ((name, tensor.detach().cpu()) for name, tensor in gathered)
        if self.rank != 0:  # the gathers are collectives; only rank 0's buckets and checksum are used
            for _ in weights:
                pass
            return [], 0
        checksummed = ChecksummedWeights(weights, resolve_dtype(self.config.rollout.dtype))
        shards = len(layouts) if layouts else self.config.rollout.tensor_model_parallel_size
        slices = pool_slices(layouts) if layouts else None
        buckets: list[list[SharedObject]] = [[] for _ in range(shards)]
        for shard, bucket in shard_buckets(checksummed, bucket_megabytes, shards, slices):
            buckets[shard].append(share(bucket))
        return buckets, checksummed.part

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shard_layouts(self) -> list[ShardLayout] | None:
        """How ``share_weights`` cuts each weight for this rollout's tensor-parallel ranks (None: as the ``hf``
        engine splits)."""
        return self._part("rollout", "shard_layouts").engine.shard_layouts

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, concurrent=True)
    def load_shared_weights(
        self, buckets: list[list[SharedObject]], version: int = 0, checksum: int | None = None
    ) -> float:
        """Load ``share_weights``' buckets of this rank's shard into its rollout engine one at a time, as weight version
        ``version``, checked against their ``checksum``; returns the seconds the sync checks took since the
        last call. Concurrent: on a group started for it, the load lands between the decode steps of a
        generation in progress (fully async's partial rollout)."""
        rollout = self._part("rollout", "load_shared_weights")
        own = buckets[rollout.engine.generation_shard]
        return rollout.load_weight_buckets((bucket.get() for bucket in own), version, checksum)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False) -> DataProto:
        """``old_log_probs`` [B, R], ``entropys`` [B, R] when ``calculate_entropy``, and ``sum_pi_squared``
        [B, R] when ``actor.calculate_sum_pi_squared``."""
        tensors = self._part("actor", "compute_log_prob").compute_log_prob(data, self.temperature, calculate_entropy)
        return DataProto.from_dict(tensors)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` [B, R] under the reference policy."""
        log_probs = self._part("ref", "compute_ref_log_prob").compute_ref_log_prob(data, self.temperature)
        return DataProto.from_dict({"ref_log_prob": log_probs})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(
        self, data: DataProto, old_log_probs_from_update: bool = False, loss_counts: dict | None = None
    ) -> DataProto:
        """PPO update on the batch; ``meta_info['metrics']``: pg_loss, pg_clipfrac, pg_clipfrac_lower,
        ppo_kl, entropy, grad_norm (lists, one entry per optimizer step), kl_loss when used, lr.

        The exact shortcuts of ``workers/actor.py``: ``old_log_probs_from_update`` (the batch has no
        ``old_log_probs``; the update is on-policy) and ``loss_counts`` (the whole batch's, when only some of
        its rows were sent)."""
        counts = None if loss_counts is None else LossCounts(**loss_counts)
        metrics = self._part("actor", "update_actor").update(data, self.temperature, old_log_probs_from_update, counts)
        return metrics_output({**metrics, **memory_metrics(self.device)}, self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_model_to_cpu(self, slot: int) -> None:
        """Keep a CPU copy of the actor's weights as ``slot`` (verl's decoupled PPO keeps a step's starting
        weights, pi_old, while its mini-batches update them)."""
        self._part("actor", "save_model_to_cpu").save_weights_to_cpu(slot)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def restore_model_from_cpu(self, slot: int) -> None:
        """Set the actor's weights to the copy kept as ``slot``."""
        self._part("actor", "restore_model_from_cpu").restore_weights_from_cpu(slot)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def clear_cpu_model(self, slot: int) -> None:
        self._part("actor", "clear_cpu_model").clear_cpu_weights(slot)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, global_step: int = 0) -> None:
        """Model, optimizer, scheduler and RNG states of the actor into ``local_path`` (atomically)."""
        self._part("actor", "save_checkpoint").save_checkpoint(local_path, global_step, self.tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str) -> dict:
        """Restore what ``save_checkpoint`` wrote; returns its manifest (contents, world size, global_step)."""
        return self._part("actor", "load_checkpoint").load_checkpoint(local_path)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def export_hf(self, path: str) -> str:
        """Write the actor as a Hugging Face folder (LoRA merged) that ``from_pretrained`` loads."""
        return str(self._part("actor", "export_hf").export_hf(path, self.tokenizer))
