"""The config sections the workers read, with verl's key names and a help string on every field.

The trainer composes these into its full schema and validates it; a worker receives its section (a
dataclass, a dict or an OmegaConf DictConfig) and turns it into the dataclass with :func:`as_config`,
which rejects keys the dataclass does not have.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, TypeVar

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybridflow.algos.policy_losses import PolicyLossConfig, PolicyLossModeConfig
from hybridflow.distributed.profiler import ProfilerConfig
from hybridflow.errors import HybridflowError
from hybridflow.help_fields import option, section
from hybridflow.rewards.judge_prompts import DEFAULT_SCORE_PATTERN, DEFAULT_TEMPLATE
from hybridflow.rollout.config import LORA_ADAPTER_ENGINES, RolloutConfig

T = TypeVar("T")

# verl's deprecated global micro-batch keys (``ppo_micro_batch_size``, ...) beside their ``*_per_gpu`` forms.
GLOBAL_MICRO_BATCH_HELP = "Deprecated: samples over all ranks; each rank takes this // ranks. Set it or *_per_gpu."


class WorkerConfigError(HybridflowError, ValueError):
    """A worker config section has a key or value the worker cannot use."""


@dataclass
class ModelOptions:
    """How a Hugging Face model is loaded and which of its weights train: the keys the PPO roles' ``model`` sections
    and the SFT trainer's ``model`` share."""

    tokenizer_path: Optional[str] = option(None, "Tokenizer folder; None means the model folder.")
    enable_gradient_checkpointing: bool = option(False, "Recompute activations in backward to save memory.")
    lora_rank: int = option(0, "LoRA rank (arXiv:2106.09685); 0 trains all weights.")
    lora_alpha: int = option(16, "LoRA scaling numerator: the adapter output is scaled by alpha / rank.")
    target_modules: Any = option("all-linear", "Modules that get LoRA adapters: a list of names or 'all-linear'.")
    override_config: dict = option({}, "Keys overriding the model's config.json (e.g. attention_dropout).")
    dtype: str = option("float32", "Dtype the weights are held in: float32, bfloat16 or float16.")
    attn_implementation: str = option("sdpa", "Attention kernel passed to transformers (sdpa, eager, ...).")
    trust_remote_code: bool = option(False, "Allow model code from the model folder.")
    custom_chat_template: Optional[str] = option(None, "A Jinja chat template replacing the tokenizer's own.")


@dataclass
class ModelConfig(ModelOptions):
    """Which Hugging Face model a worker loads and how (``actor_rollout_ref.model``, ``critic.model``)."""

    path: str = option("", "Local Hugging Face model folder (config.json + safetensors).")
    use_remove_padding: bool = option(True, "Pack the non-padding tokens of a micro-batch into one row.")
    exclude_modules: Any = option(
        None, "Modules kept without a LoRA adapter: a regex on the full module name, or a list of names (suffixes)."
    )

    @property
    def tokenizer_dir(self) -> str:
        return self.tokenizer_path or self.path


@dataclass
class LoraOptionsConfig:
    """``actor_rollout_ref.model.lora``: of verl's ``model.lora.*`` keys, the one its FSDP path reads; the
    others configure Megatron-Bridge's LoRA, and hybridflow trains with FSDP2 only."""

    merge: Optional[bool] = option(
        None,
        "Sync the adapter into the rollout engine merged into full weights (true) or as adapter tensors alone "
        "(false); None: adapter tensors where the engine applies adapters (hf, vllm) to a whole model, merged "
        "weights otherwise (a tensor-parallel rollout included).",
    )


@dataclass
class PolicyModelConfig(ModelConfig):
    """The policy model (``actor_rollout_ref.model``): ``ModelConfig`` plus the keys about its rollout copy
    and about starting from a saved adapter."""

    lora_adapter_path: Optional[str] = option(
        None, "Saved peft LoRA adapter to start from; its adapter_config.json sets rank, alpha and modules."
    )
    lora: LoraOptionsConfig = section(LoraOptionsConfig, "LoRA weight sync into the rollout engine.")

    def merges_lora(self, engine: str, tensor_parallel_size: int = 1) -> bool:
        """Whether the weight sync into ``engine`` sends the adapter merged into full weights: as set, else
        unless the engine holds adapters, which a tensor-parallel (split) generation model does not."""
        if self.lora.merge is not None:
            return self.lora.merge
        return engine not in LORA_ADAPTER_ENGINES or tensor_parallel_size > 1

    @property
    def uses_lora(self) -> bool:
        """A LoRA adapter trains (fresh with ``lora_rank > 0``, or loaded from ``lora_adapter_path``)."""
        return self.lora_rank > 0 or self.lora_adapter_path is not None


@dataclass
class OptimConfig:
    """AdamW and its learning-rate schedule (``actor.optim``, ``critic.optim``)."""

    lr: float = option(1e-6, "Peak learning rate.")
    lr_warmup_steps: int = option(-1, "Warmup steps; <= 0 means use lr_warmup_steps_ratio.")
    lr_warmup_steps_ratio: float = option(0.0, "Warmup as a fraction of total_training_steps.")
    warmup_style: str = option("constant", "After warmup: 'constant' or 'cosine' decay to min_lr_ratio * lr.")
    min_lr_ratio: float = option(0.0, "Cosine schedule's final lr as a fraction of lr.")
    num_cycles: float = option(0.5, "Cosine half-waves over the decay (0.5: decay once, no restart).")
    weight_decay: float = option(0.01, "AdamW decoupled weight decay (arXiv:1711.05101).")
    betas: list = option([0.9, 0.999], "AdamW betas.")
    eps: float = option(1e-8, "AdamW epsilon.")
    total_training_steps: int = option(-1, "Steps of the lr schedule; -1 means the run's training steps.")


WARMUP_STYLES = ("constant", "cosine")


def warmup_steps(config: OptimConfig) -> int:
    """``lr_warmup_steps`` when set (> 0), else ``lr_warmup_steps_ratio * total_training_steps``."""
    if config.lr_warmup_steps > 0:
        return config.lr_warmup_steps
    return int(config.lr_warmup_steps_ratio * max(config.total_training_steps, 0))


@dataclass
class MixedPrecisionConfig:
    """FSDP2 mixed precision: compute dtype of the gathered parameters and dtype of the gradient reduction."""

    param_dtype: str = option("float32", "Dtype parameters are cast to for forward/backward (bfloat16 on GPU).")
    reduce_dtype: str = option("float32", "Dtype gradients are reduced in across ranks.")


@dataclass
class FSDPConfig:
    """FSDP2 sharding options (``actor.fsdp_config``, ``ref.fsdp_config``, ``critic.model.fsdp_config``)."""

    param_offload: bool = option(False, "Keep parameters and gradients on CPU between calls (GPU only effect).")
    optimizer_offload: bool = option(False, "Keep optimizer states on CPU between updates (GPU only effect).")
    mixed_precision: MixedPrecisionConfig = section(MixedPrecisionConfig, "FSDP2 mixed precision policy.")
    fsdp_size: int = option(-1, "Ranks each parameter is sharded over; -1 means all ranks of the group.")
    reshard_after_forward: bool = option(True, "Free gathered parameters after forward (ZeRO-3) or keep them.")
    tensor_parallel_size: int = option(
        1,
        "Tensor parallelism in training, the name and meaning of verl's torchtitan engine key (arXiv 1909.08053): "
        "groups of this many ranks (strided within a node) share their rows, each holding 1/t of every attention "
        "and MLP weight, and FSDP2 shards over the other ranks' (data_parallel_shard_size = ranks / t); must divide "
        "the ranks and the model's attention and KV heads.",
    )


@dataclass
class CheckpointConfig:
    """What ``save_checkpoint`` writes and ``load_checkpoint`` reads."""

    save_contents: list = option(
        ["model", "optimizer", "extra"],
        "Parts to save: model, optimizer, extra (lr scheduler and RNG states), hf_model (a Hugging Face folder).",
    )
    load_contents: list = option(["model", "optimizer", "extra"], "Parts to load from a checkpoint.")


ULYSSES_HELP = (
    "Ulysses sequence parallelism (arXiv 2309.14509): groups of this many ranks share their rows and each runs "
    "1/k of every row's columns, attention's heads exchanged all-to-all (Qwen3-Next's linear attention's too); "
    "must divide the ranks, the model's attention heads and its linear-attention key heads."
)


@dataclass
class ActorConfig:
    """The policy's PPO update (``actor_rollout_ref.actor``). Batch sizes follow verl's conventions."""

    ppo_mini_batch_size: int = option(256, "Prompts per optimizer step (multiplied by rollout.n inside).")
    ppo_micro_batch_size: Optional[int] = option(None, GLOBAL_MICRO_BATCH_HELP)
    ppo_micro_batch_size_per_gpu: Optional[int] = option(None, "Samples per forward/backward on one rank.")
    use_dynamic_bsz: bool = option(False, "Form micro-batches by a token budget instead of a sample count.")
    ppo_max_token_len_per_gpu: int = option(16384, "Token budget of a micro-batch when use_dynamic_bsz.")
    ppo_epochs: int = option(1, "Passes over the batch per update_actor call.")
    shuffle: bool = option(False, "Shuffle samples between mini-batches each epoch.")
    seed: int = option(1, "Seed of the mini-batch shuffle.")
    clip_ratio: float = option(0.2, "PPO clip epsilon (arXiv:1707.06347).")
    clip_ratio_low: Optional[float] = option(None, "Lower clip epsilon; None means clip_ratio.")
    clip_ratio_high: Optional[float] = option(None, "Upper clip epsilon (DAPO clip-higher); None means clip_ratio.")
    clip_ratio_c: float = option(3.0, "Dual-clip bound for negative advantages (arXiv:1912.09729).")
    loss_agg_mode: str = option("token-mean", "How the per-token loss becomes a scalar (algos.agg_loss).")
    loss_scale_factor: Optional[float] = option(None, "Constant divisor of seq-mean-token-sum-norm.")
    entropy_coeff: float = option(0.0, "Weight of the entropy bonus subtracted from the loss.")
    calculate_sum_pi_squared: bool = option(
        False,
        "Also compute sum_v pi_v^2 per response token in the old-log-prob pass (batch key sum_pi_squared): the "
        "optimal token baseline estimators need it, and it adds the variance_proxy/* metrics.",
    )
    use_rollout_log_probs: bool = option(
        False, "verl's fully async flag, read nowhere (in verl too): algorithm.rollout_correction.bypass_mode decides."
    )
    use_kl_loss: bool = option(False, "Add a KL(actor || ref) loss term (GRPO, arXiv:2402.03300).")
    kl_loss_coef: float = option(0.001, "Weight of the KL loss.")
    kl_loss_type: str = option("low_var_kl", "KL estimator of the KL loss (algos kl_penalty names).")
    grad_clip: float = option(1.0, "Clip the global gradient norm to this value.")
    skip_old_log_prob: Optional[bool] = option(
        None,
        "Skip the old-log-prob forward, using the update's own log-probs (exact on-policy: "
        "ppo_epochs=1, one mini-batch per step, no KL in reward). null: where exact; true: required; false: never.",
    )
    use_torch_compile: bool = option(
        False,
        "Compile the model's forward with torch.compile (verl's default is true; compiling costs minutes on CPU).",
    )
    use_prefix_grouper: Optional[bool] = option(
        None,
        "Run each prompt once for all its samples in the policy's and reference's forward and backward (exact; "
        "arXiv 2506.05433). null: where estimated cheaper than the padded/packed layout; true: wherever a prompt "
        "repeats; false: never.",
    )
    entropy_from_logits_with_chunking: bool = option(
        False,
        "Take log-prob and entropy statistics entropy_from_logits_chunk_size rows at a time (else ~4 MiB chunks).",
    )
    entropy_from_logits_chunk_size: int = option(
        2048, "Rows of logits per chunk when entropy_from_logits_with_chunking."
    )
    ulysses_sequence_parallel_size: int = option(1, ULYSSES_HELP)
    policy_loss: PolicyLossModeConfig = section(
        PolicyLossModeConfig, "Which policy loss and its own options; the clip keys above apply to every loss."
    )
    optim: OptimConfig = section(OptimConfig, "Optimizer and learning-rate schedule.")
    fsdp_config: FSDPConfig = section(FSDPConfig, "FSDP2 sharding, offload and mixed precision.")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "What checkpoints hold.")
    profiler: ProfilerConfig = section(ProfilerConfig, "torch.profiler traces of the actor's processes.")

    def policy_loss_config(self) -> PolicyLossConfig:
        """What the policy loss reads, resolved and checked (raises ``PolicyLossConfigError`` listing every
        problem): the ``policy_loss`` section plus the clip and aggregation keys beside it."""
        return PolicyLossConfig.resolve(
            self.policy_loss,
            self.clip_ratio,
            self.clip_ratio_low,
            self.clip_ratio_high,
            self.clip_ratio_c,
            self.loss_agg_mode,
            self.loss_scale_factor,
        )


@dataclass
class RefConfig:
    """The frozen reference policy (``actor_rollout_ref.ref``)."""

    log_prob_micro_batch_size: Optional[int] = option(None, GLOBAL_MICRO_BATCH_HELP)
    log_prob_micro_batch_size_per_gpu: Optional[int] = option(
        None, "Samples per reference forward on one rank; None: the rank's whole batch."
    )
    log_prob_use_dynamic_bsz: bool = option(False, "Form micro-batches by a token budget.")
    log_prob_max_token_len_per_gpu: int = option(16384, "Token budget of a micro-batch when dynamic.")
    use_torch_compile: bool = option(False, "Compile the reference model's forward (a separate reference only).")
    entropy_from_logits_with_chunking: bool = option(
        False, "Take log-prob statistics entropy_from_logits_chunk_size rows at a time (else ~4 MiB chunks)."
    )
    entropy_from_logits_chunk_size: int = option(
        2048, "Rows of logits per chunk when entropy_from_logits_with_chunking."
    )
    ulysses_sequence_parallel_size: int = option(1, ULYSSES_HELP + " Follows the actor's.")
    fsdp_config: FSDPConfig = section(FSDPConfig, "FSDP2 sharding of the reference model.")
    profiler: ProfilerConfig = section(ProfilerConfig, "torch.profiler traces of the reference's processes.")


@dataclass
class ActorRolloutRefConfig:
    """The ``actor_rollout_ref`` section: one model, played as actor, rollout and reference."""

    model: PolicyModelConfig = section(PolicyModelConfig, "The policy model.")
    actor: ActorConfig = section(ActorConfig, "PPO update of the policy.")
    rollout: RolloutConfig = section(RolloutConfig, "Generation engine and sampling.")
    ref: RefConfig = section(RefConfig, "Reference policy for the KL term.")
    hybrid_engine: bool = option(
        True,
        "Actor and rollout share processes (the hybrid engine); false: the rollout runs on its own pool (the "
        "top-level rollout section), one step ahead of training (one-step-off policy) or fully async "
        "(async_training.enable).",
    )
    nccl_timeout: int = option(
        600,
        "Seconds a collective of these workers waits for a rank that stopped or is stuck; then the run stops "
        "naming the ranks and the call (verl's key; torch's own default is 30 minutes).",
    )


@dataclass
class CriticModelConfig(ModelConfig):
    """The value model (``critic.model``); verl keeps the critic's FSDP options here."""

    fsdp_config: FSDPConfig = section(FSDPConfig, "FSDP2 sharding, offload and mixed precision.")


@dataclass
class CriticConfig:
    """The value model and its update (``critic``)."""

    model: CriticModelConfig = section(CriticModelConfig, "The value model (a causal LM gets a fresh value head).")
    enable: Optional[bool] = option(
        None, "Train a critic: None decides by the estimator (gae needs one), true/false force it."
    )
    rollout_n: int = option(1, "Samples per prompt (follows actor_rollout_ref.rollout.n).")
    ppo_mini_batch_size: int = option(256, "Prompts per optimizer step (multiplied by rollout_n inside).")
    ppo_micro_batch_size: Optional[int] = option(None, GLOBAL_MICRO_BATCH_HELP)
    ppo_micro_batch_size_per_gpu: Optional[int] = option(None, "Samples per forward/backward on one rank.")
    forward_micro_batch_size: Optional[int] = option(None, GLOBAL_MICRO_BATCH_HELP)
    forward_micro_batch_size_per_gpu: Optional[int] = option(None, "Samples per compute_values forward.")
    nccl_timeout: int = option(
        600,
        "Seconds a collective of these workers waits for a rank that stopped or is stuck; then the run stops "
        "naming the ranks and the call (verl's key; torch's own default is 30 minutes).",
    )
    use_dynamic_bsz: bool = option(False, "Form micro-batches by a token budget.")
    ppo_max_token_len_per_gpu: int = option(32768, "Token budget of an update micro-batch when dynamic.")
    forward_max_token_len_per_gpu: int = option(32768, "Token budget of a compute_values micro-batch.")
    use_prefix_grouper: Optional[bool] = option(
        None,
        "Run each prompt once for all its samples in the critic's forward and backward (exact; arXiv 2506.05433); "
        "follows the actor's key. null: where estimated cheaper than the padded/packed layout; true: wherever a "
        "prompt repeats; false: never.",
    )
    ppo_epochs: int = option(1, "Passes over the batch per update_critic call.")
    shuffle: bool = option(False, "Shuffle samples between mini-batches each epoch.")
    seed: int = option(1, "Seed of the mini-batch shuffle.")
    cliprange_value: float = option(0.5, "Clip of the value update around the old values (PPO, arXiv:1707.06347).")
    loss_agg_mode: str = option("token-mean", "How the per-token value loss becomes a scalar.")
    loss_scale_factor: Optional[float] = option(
        None,
        "Constant divisor of the value loss's seq-mean-token-sum-norm (follows the actor's); None means the padded "
        "response length.",
    )
    grad_clip: float = option(1.0, "Clip the global gradient norm to this value.")
    ulysses_sequence_parallel_size: int = option(1, ULYSSES_HELP)
    optim: OptimConfig = section(OptimConfig, "Optimizer and learning-rate schedule.")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "What checkpoints hold.")
    profiler: ProfilerConfig = section(ProfilerConfig, "torch.profiler traces of the critic's processes.")


@dataclass
class RewardModelModelConfig:
    """The reward model's folder (``reward_model.model``)."""

    path: str = option("", "Hugging Face folder of a model with one output per token (score head).")
    input_tokenizer: Optional[str] = option(
        None,
        "The policy's tokenizer folder (verl's key; by default the actor's folder, as in verl), for a reward model "
        "whose tokenizer or chat template differs: each sample's prompt messages and decoded response are rendered "
        "by the reward model's chat template and tokenized by its tokenizer. None, or a tokenizer the same as the "
        "reward model's: it reads the policy's tokens as they are.",
    )
    dtype: str = option("float32", "Dtype of the reward model's weights.")
    use_remove_padding: bool = option(True, "Pack non-padding tokens into one row.")
    trust_remote_code: bool = option(False, "Allow model code from the model folder.")
    fsdp_config: FSDPConfig = section(FSDPConfig, "FSDP2 sharding of the reward model.")


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment (arXiv 2503.14476, section 3.4), for ``reward_manager=dapo``."""

    enable: bool = option(False, "Penalise responses that reach into the last `len` tokens before the length limit.")
    len: int = option(0, "Tokens before data.max_response_length over which the penalty grows linearly.")
    penalty_factor: float = option(1.0, "Penalty at the length limit, subtracted from the score.")


@dataclass
class JudgeConfig:
    """A generative judge (``reward_model.judge``): the reward model is a causal LM served by a rollout engine,
    shown each sample through ``prompt_template`` and scored by the number its answer gives."""

    enable: bool = option(False, "The reward model is a generative judge (a causal LM), not a score-head model.")
    prompt_template: str = option(
        DEFAULT_TEMPLATE,
        "The judge's user message; placeholders {question} (the prompt's last user message), {response} and "
        "{ground_truth}.",
    )
    score_pattern: str = option(
        DEFAULT_SCORE_PATTERN, "Regular expression for the score in the judge's answer (its first group, if any)."
    )
    max_score: float = option(10.0, "The parsed number over this is the sample's score.")
    max_unparsable_share: float = option(
        0.5, "Stop the run once this share of a batch's answers holds no score (each scores 0 meanwhile)."
    )
    engine: str = option("hf", "Rollout engine serving the judge: 'hf', or 'vllm' where installed.")
    response_length: int = option(16, "Most tokens of the judge's answer.")
    temperature: float = option(0.0, "Sampling temperature of the judge; 0 is greedy.")
    free_cache_engine: bool = option(True, "The judge's engine sleeps between scorings (while the policy trains).")


@dataclass
class RewardModelConfig:
    """A learned reward model and the reward manager (``reward_model``); the model reads the policy's tokens, or
    with ``model.input_tokenizer`` the samples re-tokenized by its own tokenizer. The manager runs in the driver."""

    enable: bool = option(False, "Score samples with the reward model.")
    reward_manager: str = option(
        "naive",
        "Reward manager: naive (gdpo is its verl alias), prime (naive in killable processes), batch (one call per "
        "batch), dapo (with the overlong penalty) or remote (each sample POSTed to a judge server); with "
        "reward_manager_source=importlib, the class's name in reward_manager_module_path.",
    )
    reward_manager_source: str = option(
        "register",
        "Where reward_manager comes from (verl's reward.reward_manager.source): register (a registered name) or "
        "importlib (a class in reward_manager_module_path).",
    )
    reward_manager_module_path: Optional[str] = option(
        None,
        "Python file defining the reward_manager class, a subclass of NaiveRewardManager (verl's "
        "reward.reward_manager.module.path; reward_manager_source=importlib).",
    )
    reward_kwargs: dict = option(
        {},
        "Further reward manager options, e.g. +reward_model.reward_kwargs.timeout_s=60, or max_failed_share=0.5 "
        "(stop once half a batch fails to score; default 1.0); remote takes url, max_concurrent, max_retries and "
        "retry_backoff_s.",
    )
    num_workers: int = option(
        0,
        "Scoring processes (verl's reward.num_workers): 0, the reward function runs on the driver's threads; N > 0, "
        "each sample's call runs in one of N warm processes, killed at its time limit.",
    )
    overlong_buffer: OverlongBufferConfig = section(OverlongBufferConfig, "DAPO's overlong penalty (dapo manager).")
    judge: JudgeConfig = section(JudgeConfig, "A generative judge served by a rollout engine.")
    model: RewardModelModelConfig = section(RewardModelModelConfig, "The reward model.")
    micro_batch_size_per_gpu: Optional[int] = option(None, "Samples per forward on one rank.")
    max_length: Optional[int] = option(
        None,
        "Tokens of a re-tokenized sample (model.input_tokenizer), padded or cut on the right to it as verl does; "
        "None: the policy's prompt + response length.",
    )
    use_dynamic_bsz: bool = option(False, "Form micro-batches by a token budget.")
    forward_max_token_len_per_gpu: int = option(32768, "Token budget of a micro-batch when dynamic.")


def micro_batch_size_per_rank(per_gpu: int | None, global_size: int | None, world_size: int, key: str) -> int | None:
    """One rank's micro-batch size from verl's two spellings of it: ``<key>_per_gpu`` counts one rank's samples,
    the deprecated global ``<key>`` all ranks' samples, of which each rank takes ``global_size // world_size``
    (floored, as verl's ``fsdp_workers.py`` did before verl PR #6067). None (neither set): the rank's whole batch
    in one forward. Differs from verl: verl requires one of the two unless ``use_dynamic_bsz``."""
    if global_size is None:
        return per_gpu
    if per_gpu is not None:
        raise WorkerConfigError(
            f"both {key}={global_size} and {key}_per_gpu={per_gpu} are set; remove {key} (the deprecated global form)"
        )
    if global_size < world_size:
        raise WorkerConfigError(
            f"{key}={global_size} gives each of the {world_size} ranks less than one sample; set it to at least "
            f"{world_size} or use {key}_per_gpu"
        )
    return global_size // world_size


def as_config(cls: type[T], section: Any) -> T:
    """``section`` (dataclass, dict or DictConfig) as a ``cls`` instance; unknown keys raise.

    A ``cls`` instance is returned unchanged; anything else is merged onto ``cls``'s defaults.
    """
    if isinstance(section, cls):
        return section
    if section is None:
        return cls()
    if dataclasses.is_dataclass(section):
        section = dataclasses.asdict(section)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(cls), section)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as error:
        raise WorkerConfigError(f"{cls.__name__} section does not fit the schema: {error}") from error
