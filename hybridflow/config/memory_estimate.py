"""Each worker process's peak memory, estimated from the plan before any worker starts (issue 28, item 5).

A process holds its runtime (Python, torch, transformers, the data: taken as what the checking process holds now,
which has imported the same), the state of the roles it hosts for the whole run, and, one phase at a time, the
transient memory of that phase; its peak is the runtime, plus every role's state, plus the largest phase:

- training (actor, critic): weights, gradients and Adam's two moments in the weights' dtype, sharded by FSDP2 over
  the pool's processes; a LoRA run's gradients and moments are the adapter's alone;
- the training micro-batch's activations, per token as autograd saves them in a Llama/Qwen2 decoder layer: 8 x
  hidden + 2 x the key/value width + 4 x intermediate elements (both norms' inputs and outputs, the rotated queries
  and keys, the values, the attention's output and its reshaped copy; the MLP's gate, up, activation and product:
  counted with torch's saved-tensor hooks, within 2% on the demo's and the benchmark's models), 1 x hidden per layer
  with gradient checkpointing plus one layer recomputed; and the float32 logits, their log-softmax and the logits'
  gradient (3 x vocab). Korthikanti et al., arXiv 2205.05198, section 4, count the same tensors for GPT layers;
- a forward pass without gradients (old log-probs, the reference, values): the logits and their log-softmax;
- generation (the ``hf`` engine): a whole copy of the weights per process (the naive scheme issue 26 replaces),
  and the KV cache of the sequences it decodes at once at the longest prompt + response.

Lengths are the configured maxima (``data.max_prompt_length + data.max_response_length``), so the estimate bounds
a run whose samples are shorter. The refusal is one line naming the largest part and the key that shrinks it.
"""

from __future__ import annotations

import importlib
import os
import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hybridflow.config.batch_sizes import micro_batch_sizes
from hybridflow.config.distillation_options import TEACHER_ROLE
from hybridflow.config.phases import OLD_FROM_PASS
from hybridflow.config.placement import ROLLOUT_ROLE
from hybridflow.config.sequence_parallel_options import data_parallel_ranks
from hybridflow.models.dtypes import DTYPES

if TYPE_CHECKING:
    from hybridflow.config.plan import RunPlan

ACTOR = "actor_rollout_ref.actor"
GIB = 2**30
# A CUDA process's context and cuBLAS workspace before any tensor (torch's documented ~300-600 MiB; the upper end).
CUDA_CONTEXT_BYTES = 600 * 2**20
WORKER_MODULES = (
    "hybridflow.workers.actor_rollout_ref",
    "hybridflow.workers.critic",
    "hybridflow.workers.reward_model",
)


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads of a model: its parameter count (from its safetensors headers) and layer shape."""

    parameters: int
    layers: int
    hidden: int
    intermediate: int
    kv_width: int
    vocab: int

    @classmethod
    def read(cls, path: str, trust_remote_code: bool = False) -> ModelShape:
        from hybridflow.models.loading import load_model_config
        from hybridflow.rollout.vllm_memory import kv_width, weight_bytes

        text = load_model_config(path, trust_remote_code=trust_remote_code).get_text_config()
        intermediate = getattr(text, "intermediate_size", None) or 4 * text.hidden_size
        return cls(
            weight_bytes(path, "float32") // 4,
            text.num_hidden_layers,
            text.hidden_size,
            intermediate,
            kv_width(text),
            text.vocab_size,
        )

    def layer_activations(self) -> int:
        """Elements autograd saves per token in one decoder layer."""
        return 8 * self.hidden + 2 * self.kv_width + 4 * self.intermediate

    def training_bytes_per_token(self, dtype_bytes: int, checkpointing: bool, logits: bool = True) -> int:
        layers = (
            self.layers * self.hidden + self.layer_activations()
            if checkpointing
            else self.layers * self.layer_activations()
        )
        return dtype_bytes * (layers + 2 * self.hidden) + (4 * 3 * self.vocab if logits else 0)

    def forward_bytes_per_token(self, dtype_bytes: int, logits: bool = True) -> int:
        """One layer's temporaries at a time, and the float32 logits with their log-softmax."""
        return dtype_bytes * self.layer_activations() + (4 * 2 * self.vocab if logits else 0)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_width * dtype_bytes

    def adapter_parameters(self, rank: int) -> int:
        """A LoRA adapter on every linear of every layer (the most ``target_modules`` can pick)."""
        per_layer = rank * (8 * self.hidden + 2 * self.kv_width + 3 * self.intermediate)
        return self.layers * per_layer


@dataclass(frozen=True)
class Part:
    """One part of a process's memory: what it is, its bytes, the key that shrinks it, and whether it lives only
    during its phase (``phase``) or for the whole run (None)."""

    name: str
    bytes: int
    key: str
    phase: str | None = None


@dataclass(frozen=True)
class ProcessEstimate:
    """The peak of each process of one pool (``processes`` alike), by part."""

    pool: str
    processes: int
    runtime: int
    parts: tuple[Part, ...]

    @property
    def peak(self) -> int:
        return self.runtime + sum(part.bytes for part in self.counted())

    def counted(self) -> list[Part]:
        """The whole run's parts and the largest phase's."""
        phases: dict[str, int] = {}
        for part in self.parts:
            if part.phase is not None:
                phases[part.phase] = phases.get(part.phase, 0) + part.bytes
        largest = max(phases, key=phases.get, default=None)
        return [part for part in self.parts if part.phase in (None, largest)]

    def describe(self) -> str:
        shown = [part for part in sorted(self.counted(), key=lambda p: -p.bytes) if part.bytes >= GIB / 200]
        parts = "".join(f", {part.name} {_gib(part.bytes)}" for part in shown)
        return (
            f"memory per process of {self.pool} ({self.processes}): ~{_gib(self.peak)} GiB at its peak "
            f"(runtime {_gib(self.runtime)}{parts}; parts under 0.01 GiB not shown)"
        )


def estimate(plan: RunPlan, runtime_bytes: int) -> tuple[ProcessEstimate, ...] | None:
    """Each pool's process (the driver's one process in local mode); None where a model folder cannot be read
    here (a hub id, or a check for another machine)."""
    shapes = _shapes(plan)
    if shapes is None:
        return None
    by_pool = {
        pool: [part for role in plan.resources.roles_in(pool) for part in _role_parts(plan, role, shapes)]
        for pool in plan.resources.pools
    }
    if plan.local:
        parts = tuple(part for parts in by_pool.values() for part in parts)
        return (ProcessEstimate("the driver (trainer.local_mode=true)", 1, runtime_bytes, parts),)
    return tuple(
        ProcessEstimate(pool, plan.resources.pools[pool].world_size, runtime_bytes, tuple(parts))
        for pool, parts in by_pool.items()
    )


def _shapes(plan: RunPlan) -> dict[str, ModelShape] | None:
    models = {"actor": plan.actor_rollout_ref.model}
    if plan.uses_critic:
        models["critic"] = plan.critic.model
    if plan.reward_model.enable:
        models["reward_model"] = plan.reward_model.model
    paths = {role: model.path for role, model in models.items()}
    remote_code = {role: getattr(model, "trust_remote_code", False) for role, model in models.items()}
    for index, teacher in enumerate(plan.teacher.models if plan.teacher is not None else ()):
        paths[_teacher_shape(index)] = teacher.model_path
        remote_code[_teacher_shape(index)] = plan.actor_rollout_ref.model.trust_remote_code
    if not all((pathlib.Path(path).expanduser() / "config.json").is_file() for path in paths.values()):
        return None
    return {role: ModelShape.read(path, remote_code[role]) for role, path in paths.items()}


def _teacher_shape(index: int) -> str:
    return f"{TEACHER_ROLE}:{index}"


def _role_parts(plan: RunPlan, role: str, shapes: dict[str, ModelShape]) -> list[Part]:
    if role == "actor_rollout_ref":
        parts = _actor_parts(plan, shapes["actor"])
        if "rollout" in plan.worker_roles[role]:  # the hybrid engine (or separate_async's step switching)
            parts += _rollout_parts(plan, shapes["actor"], plan.world_size)
        return parts
    if role == ROLLOUT_ROLE:
        return _rollout_parts(plan, shapes["actor"], plan.resources.pools[plan.resources.role_pool[role]].world_size)
    if role == "critic":
        return _critic_parts(plan, shapes["critic"])
    if role == "ref":
        return _reference_parts(plan, shapes["actor"], _role_world(plan, role))
    if role == TEACHER_ROLE:
        return _teacher_parts(plan, shapes, _role_world(plan, role))
    return _reward_model_parts(plan, shapes["reward_model"])


def _actor_parts(plan: RunPlan, shape: ModelShape) -> list[Part]:
    arr, world = plan.actor_rollout_ref, plan.world_size
    actor, model = arr.actor, arr.model
    width = _width(model.dtype)
    trainable = shape.adapter_parameters(model.lora_rank) if model.lora_rank > 0 else shape.parameters
    shards = _shards(actor.fsdp_config.fsdp_size, world)
    parts = _training_state("actor", shape.parameters, trainable, width, shards, "actor_rollout_ref.model.lora_rank")
    micro = micro_batch_sizes(arr, plan.critic, world)[0]
    ranks = data_parallel_ranks(world, actor.ulysses_sequence_parallel_size, actor.fsdp_config.tensor_parallel_size)
    compute = _width(actor.fsdp_config.mixed_precision.param_dtype)
    checkpointing = model.enable_gradient_checkpointing
    update = _batching(ACTOR, "ppo_micro_batch_size", actor.use_dynamic_bsz, "ppo_max_token_len_per_gpu", actor)
    tokens, key = update.tokens(plan, micro, actor.ppo_mini_batch_size, ranks)
    fix = f"{key}, or actor_rollout_ref.model.enable_gradient_checkpointing=true" if not checkpointing else key
    per_token = shape.training_bytes_per_token(compute, checkpointing)
    parts.append(Part("actor activations", tokens * per_token // actor.ulysses_sequence_parallel_size, fix, "update"))
    step_prompts = plan.prompts_per_step
    if plan.old_log_probs == OLD_FROM_PASS:
        tokens, key = _log_prob_batching(arr.rollout, "actor_rollout_ref.rollout").tokens(
            plan, micro, step_prompts, ranks
        )
        parts.append(
            Part("old-log-prob forward", tokens * shape.forward_bytes_per_token(compute), key, "old log-probs")
        )
    if plan.uses_reference and "ref" not in plan.worker_roles:
        parts += _reference_parts(plan, shape, world)
    return parts


def _reference_parts(plan: RunPlan, shape: ModelShape, world: int) -> list[Part]:
    """The reference's weights (none with LoRA: the actor with its adapter off) and its forward, on ``world``."""
    arr, parts = plan.actor_rollout_ref, []
    if not arr.model.uses_lora:
        ref_shards = _shards(arr.ref.fsdp_config.fsdp_size, world)
        width = _width(arr.model.dtype)
        parts.append(Part("reference weights", shape.parameters * width // ref_shards, "actor_rollout_ref.model.path"))
    actor = arr.actor
    micro = micro_batch_sizes(arr, plan.critic, world)[0]
    ranks = data_parallel_ranks(world, actor.ulysses_sequence_parallel_size, actor.fsdp_config.tensor_parallel_size)
    compute = _width(actor.fsdp_config.mixed_precision.param_dtype)
    tokens, key = _log_prob_batching(arr.ref, "actor_rollout_ref.ref").tokens(plan, micro, plan.prompts_per_step, ranks)
    parts.append(Part("reference forward", tokens * shape.forward_bytes_per_token(compute), key, "reference"))
    return parts


def _teacher_parts(plan: RunPlan, shapes: dict[str, ModelShape], world: int) -> list[Part]:
    """Each distillation teacher's weights, sharded over its pool, and the largest of their forwards (one teacher
    runs at a time), batched like the reference's."""
    ref = plan.actor_rollout_ref.ref
    shards = _shards(ref.fsdp_config.fsdp_size, world)
    key = "distillation.n_gpus_per_node (more processes, smaller shards)"
    micro = micro_batch_sizes(plan.actor_rollout_ref, plan.critic, world)[0]
    tokens, batch_key = _log_prob_batching(ref, "actor_rollout_ref.ref").tokens(
        plan, micro, plan.prompts_per_step, world
    )
    models = plan.teacher.models
    sized = [(model, shapes[_teacher_shape(index)], _width(model.dtype)) for index, model in enumerate(models)]
    weights = [
        Part(f"teacher weights{f' ({model.key})' if len(models) > 1 else ''}", shape.parameters * width // shards, key)
        for model, shape, width in sized
    ]
    forward = max(tokens * shape.forward_bytes_per_token(width) for _, shape, width in sized)
    return [*weights, Part("teacher forward", forward, batch_key, "teacher")]


def _role_world(plan: RunPlan, role: str) -> int:
    return plan.resources.pools[plan.resources.role_pool[role]].world_size


def _batching(prefix: str, micro: str, dynamic: bool, budget: str, section: Any) -> Batching:
    """The batching of ``section`` (at ``prefix``) by its ``micro`` key, or its token ``budget`` when ``dynamic``."""
    return Batching(f"{prefix}.{micro}", dynamic, f"{prefix}.{budget}", getattr(section, budget))


def _log_prob_batching(section: Any, prefix: str) -> Batching:
    return _batching(
        prefix, "log_prob_micro_batch_size", section.log_prob_use_dynamic_bsz, "log_prob_max_token_len_per_gpu", section
    )


def _shards(fsdp_size: int, world: int) -> int:
    """FSDP2 shards over ``fsdp_size`` processes (hybrid sharding: each group a whole copy), -1 meaning all."""
    return fsdp_size if 0 < fsdp_size < world else world


def _training_state(role: str, parameters: int, trainable: int, width: int, world: int, lora_key: str) -> list[Part]:
    """Weights, gradients and Adam's two moments, each sharded over ``world`` processes (FSDP2's shards), and the
    copy a checkpoint save makes of them."""
    shards = "trainer.n_gpus_per_node (more processes, smaller shards)"
    return [
        Part(f"{role} weights", parameters * width // world, shards),
        Part(f"{role} gradients", trainable * width // world, f"{shards}, or {lora_key}"),
        Part(f"{role} optimizer state", 2 * trainable * width // world, f"{shards}, or {lora_key}"),
        # DCP serialises each rank's shards of the weights and the moments into its write buffers
        Part(f"{role} checkpoint save", (parameters + 2 * trainable) * width // world, shards, f"{role} checkpoint"),
    ]


@dataclass(frozen=True)
class Batching:
    """How one pass cuts a rank's samples: ``micro_key`` (its per-rank size by ``micro_batch_sizes``), or, when
    ``dynamic``, a token budget of ``budget`` set by ``budget_key``."""

    micro_key: str
    dynamic: bool
    budget_key: str
    budget: int

    def tokens(self, plan: RunPlan, micro: dict, prompts: int, ranks: int) -> tuple[int, str]:
        """Tokens in one micro-batch of a rank holding ``prompts`` x n samples / ``ranks``, and the key setting it."""
        length = plan.data.max_prompt_length + plan.data.max_response_length
        rank_samples = max(1, prompts * plan.samples_per_prompt // ranks)
        if self.dynamic:
            return max(length, min(self.budget, rank_samples * length)), self.budget_key
        samples = min(micro.get(self.micro_key) or rank_samples, rank_samples)
        return samples * length, f"{self.micro_key}_per_gpu"


def _rollout_parts(plan: RunPlan, shape: ModelShape, processes: int) -> list[Part]:
    """A whole copy of the weights (1/tp of each split weight), and the KV cache and prefill of the sequences
    decoded at once (``max_num_seqs``, at most a rank's share of the step)."""
    rollout = plan.actor_rollout_ref.rollout
    width, split = _width(rollout.dtype), rollout.tensor_model_parallel_size
    length = plan.data.max_prompt_length + plan.data.max_response_length
    groups = max(1, processes // split)
    sequences = min(rollout.max_num_seqs, -(-plan.prompts_per_generation * plan.samples_per_prompt // groups))
    explicit = dict(rollout.engine_kwargs.get("vllm") or {}).get("kv_cache_memory_bytes")
    if rollout.name == "vllm" and explicit is not None:
        cache = Part(
            "rollout KV cache",
            int(explicit),
            "actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_memory_bytes",
            "generation",
        )
    else:
        cache_bytes = sequences * length * shape.kv_bytes_per_token(width) // split
        cache = Part("rollout KV cache", cache_bytes, "actor_rollout_ref.rollout.max_num_seqs", "generation")
    prefill_tokens = min(rollout.max_batch_tokens, sequences * plan.data.max_prompt_length)
    prefill = prefill_tokens * shape.forward_bytes_per_token(width, logits=False) + sequences * 4 * shape.vocab
    return [
        Part("rollout weights", shape.parameters * width // split, "actor_rollout_ref.rollout.dtype"),
        cache,
        Part("rollout prefill", prefill, "actor_rollout_ref.rollout.max_batch_tokens", "generation"),
    ]


def _critic_parts(plan: RunPlan, shape: ModelShape) -> list[Part]:
    critic, world = plan.critic, _role_world(plan, "critic")
    width = _width(critic.model.dtype)
    trainable = shape.adapter_parameters(critic.model.lora_rank) if critic.model.lora_rank > 0 else shape.parameters
    shards = _shards(critic.model.fsdp_config.fsdp_size, world)
    parts = _training_state("critic", shape.parameters, trainable, width, shards, "critic.model.lora_rank")
    micro = micro_batch_sizes(plan.actor_rollout_ref, critic, world)[0]
    ranks = data_parallel_ranks(
        world, critic.ulysses_sequence_parallel_size, critic.model.fsdp_config.tensor_parallel_size
    )
    compute = _width(critic.model.fsdp_config.mixed_precision.param_dtype)
    checkpointing = critic.model.enable_gradient_checkpointing
    update = _batching("critic", "ppo_micro_batch_size", critic.use_dynamic_bsz, "ppo_max_token_len_per_gpu", critic)
    tokens, key = update.tokens(plan, micro, critic.ppo_mini_batch_size, ranks)
    per_token = shape.training_bytes_per_token(compute, checkpointing, logits=False)
    parts.append(Part("critic activations", tokens * per_token, key, "critic update"))
    values = _batching(
        "critic", "forward_micro_batch_size", critic.use_dynamic_bsz, "forward_max_token_len_per_gpu", critic
    )
    tokens, key = values.tokens(plan, micro, plan.prompts_per_step, ranks)
    parts.append(Part("values forward", tokens * shape.forward_bytes_per_token(compute, logits=False), key, "values"))
    return parts


def _reward_model_parts(plan: RunPlan, shape: ModelShape) -> list[Part]:
    reward_model, world = plan.reward_model, _role_world(plan, "reward_model")
    width = _width(reward_model.model.dtype)
    length = plan.data.max_prompt_length + plan.data.max_response_length
    samples = reward_model.micro_batch_size_per_gpu or max(1, plan.prompts_per_step * plan.samples_per_prompt // world)
    return [
        Part("reward model weights", shape.parameters * width // world, "reward_model.model.path"),
        Part(
            "reward model forward",
            samples * length * shape.forward_bytes_per_token(width, logits=False),
            "reward_model.micro_batch_size_per_gpu",
            "reward",
        ),
    ]


def host_memory_available() -> int:
    import psutil

    return psutil.virtual_memory().available


def cuda_memory_total() -> int:
    """One GPU's memory here (a joined cluster's GPUs taken alike); 0 where this process sees none."""
    import torch

    return torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 0


def memory_errors(plan: RunPlan, estimates: tuple[ProcessEstimate, ...], own_bytes: int) -> list[str]:
    """One line where the run cannot fit: each GPU process's device memory, or on CPU every process of a local
    cluster (this driver's growth in local mode) against the memory this machine has available."""
    if plan.trainer.device == "cuda":
        return _gpu_errors(estimates, cuda_memory_total())
    if plan.ray_kwargs.ray_init.address or os.environ.get("RAY_ADDRESS"):
        return []  # the cluster's machines are not this one
    needed = sum(process.processes * process.peak for process in estimates) - (own_bytes if plan.local else 0)
    available = host_memory_available()
    if needed <= available:
        return []
    largest = max(estimates, key=lambda process: process.processes * process.peak)
    return [
        _refusal(largest, f"~{_gib(needed)} GiB more memory", f"the {_gib(available)} GiB this machine has available")
    ]


def _gpu_errors(estimates: tuple[ProcessEstimate, ...], total: int) -> list[str]:
    if not total:
        return []  # no GPU here to measure against
    for process in estimates:
        needed = process.peak - process.runtime + CUDA_CONTEXT_BYTES
        if needed > total:
            return [
                _refusal(
                    process, f"~{_gib(needed)} GiB of GPU memory per process", f"the {_gib(total)} GiB of this GPU"
                )
            ]
    return []


def _refusal(process: ProcessEstimate, needed: str, capacity: str) -> str:
    part = max(process.counted(), key=lambda p: p.bytes)
    return (
        f"the run needs {needed} at its peak, more than {capacity} ({process.describe()}); the largest part, "
        f"{part.name} ({_gib(part.bytes)} GiB), shrinks with {part.key}"
    )


def _width(dtype: str) -> int:
    """Bytes per element of a config's dtype name."""
    return DTYPES[dtype].itemsize


def _gib(size: int) -> str:
    return f"{size / GIB:.2f}"


def runtime_bytes() -> int:
    """A worker process's runtime: this process's resident memory once it has imported what a worker imports
    (the driver imports the worker classes to start them, so this costs it nothing)."""
    from hybridflow.rollout.vllm_memory import resident_bytes

    for module in WORKER_MODULES:
        importlib.import_module(module)
    return resident_bytes()
