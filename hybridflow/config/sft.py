"""The SFT trainer's config schema (every key ``sft_trainer.yaml`` and the command line may set) and its checks.

Key names follow verl's older ``sft_trainer.yaml`` (``data.prompt_key``, ``data.multiturn.enable``,
``model.partial_pretrain``, ``optim.warmup_steps_ratio``, ``optim.clip_grad``, ``optim.lr_scheduler``,
``use_remove_padding``); the names of verl's current ``sft_trainer_engine.yaml`` (``model.path``,
``engine.param_offload``, ``data.messages_key``, ``optim.lr_scheduler_type``, ...) are aliases of them, and its
other keys are accepted, refused or listed as unread by :mod:`hybridflow.config.verl_sft_compat`. The
optimizer's defaults are verl's current ones (``optim/fsdp.yaml``: lr 1e-3, betas (0.9, 0.999), constant lr,
no warmup). The model's FSDP options are hybridflow's ``FSDPConfig`` (the PPO trainer's keys), not verl's
FSDP1 ones. Differs from verl: ``data.use_dynamic_bsz`` defaults to false (verl: true) and
``model.enable_gradient_checkpointing`` to false (verl: true), CPU-friendly choices that do not change the
math; ``trainer.device`` null means this machine's device (verl: cuda). :func:`load_sft_config` collects every
problem and raises one ``ConfigError``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybridflow.checkpoints.integrity import CONTENTS
from hybridflow.checkpoints.manager import RESUME_MODES
from hybridflow.config.environment import (
    data_file_errors,
    detected_device,
    gpu_count_errors,
    logger_package_errors,
    model_errors,
)
from hybridflow.config.input_checks import model_folder_errors, parquet_errors, run_folder_errors
from hybridflow.config.load import ConfigError
from hybridflow.config.model_structure import sft_model_structure_errors
from hybridflow.config.range_checks import SFT_RANGES, range_errors
from hybridflow.config.rules import DEVICES
from hybridflow.config.schema import DataFiles, RayInitConfig, RunConfig
from hybridflow.config.typed import accepted_forms, unknown_key_errors
from hybridflow.config.verl_sft_compat import SFT_SURFACE
from hybridflow.config.worker_start_checks import fsdp_size_errors, unknown_dtype_errors
from hybridflow.data.sft_dataset import SFT_PAD_MODES, SFT_TRUNCATION_MODES
from hybridflow.help_fields import option, section
from hybridflow.tracking.trackers import LOGGER_BACKENDS
from hybridflow.workers.config import WARMUP_STYLES, CheckpointConfig, FSDPConfig, ModelOptions


@dataclass
class SFTMultiturnConfig:
    """Rows holding whole conversations (``data.multiturn``)."""

    enable: Optional[bool] = option(
        None, "Read a messages column and train on every assistant turn; null: when the rows have messages_key."
    )
    messages_key: str = option("messages", "Column holding the chat messages.")
    tools_key: str = option("tools", "Column of a conversation's tool schemas, rendered by the chat template.")
    enable_thinking_key: str = option("enable_thinking", "Column passing enable_thinking to the chat template.")
    enable_thinking_default: Optional[bool] = option(
        None, "enable_thinking for rows without that column; null passes nothing."
    )


@dataclass
class SFTDataConfig(DataFiles):
    """Training and validation examples (``data``)."""

    prompt_key: str = option("prompt", "Column of the prompt: a string or chat messages.")
    response_key: str = option("response", "Column of the response string.")
    prompt_dict_keys: Optional[list] = option(None, "Keys into a dict prompt column, e.g. ['question'].")
    response_dict_keys: Optional[list] = option(None, "Keys into a dict response column, e.g. ['answer'].")
    multiturn: SFTMultiturnConfig = section(SFTMultiturnConfig, "Multi-turn rows.")
    train_max_samples: int = option(-1, "Keep the first N training rows; -1 keeps all.")
    val_max_samples: int = option(-1, "Keep the first N validation rows; -1 keeps all.")
    max_length: int = option(1024, "Tokens per example after the chat template; longer ones follow `truncation`.")
    truncation: str = option("error", "Over-long examples: error, left (keep end), right (keep start), filter (drop).")
    pad_mode: str = option("no_padding", "Pad batches to their longest example (no_padding) or to max_length (right).")
    train_batch_size: int = option(256, "Examples per optimizer step, over all worker processes.")
    micro_batch_size_per_gpu: int = option(4, "Examples per forward/backward on one worker process.")
    use_dynamic_bsz: bool = option(False, "Cut micro-batches by a token budget instead of micro_batch_size_per_gpu.")
    max_token_len_per_gpu: int = option(8192, "Token budget of a micro-batch when use_dynamic_bsz.")


@dataclass
class SFTModelConfig(ModelOptions):
    """The model to fine-tune (``model``): the PPO roles' model options, from ``partial_pretrain``."""

    partial_pretrain: str = option("", "Local Hugging Face model folder to start from.")
    fsdp_config: FSDPConfig = section(FSDPConfig, "FSDP2 sharding, offload and mixed precision.")


@dataclass
class SFTOptimConfig:
    """AdamW and its schedule (``optim``)."""

    lr: float = option(1e-3, "Peak learning rate.")
    betas: list = option([0.9, 0.999], "AdamW betas.")
    weight_decay: float = option(0.01, "AdamW decoupled weight decay.")
    warmup_steps_ratio: float = option(0.0, "Linear warmup over this fraction of the training steps.")
    lr_warmup_steps: int = option(-1, "Warmup steps; <= 0 means use warmup_steps_ratio.")
    clip_grad: float = option(1.0, "Clip the global gradient norm to this value.")
    lr_scheduler: str = option("constant", "After warmup: constant, or cosine (decay to min_lr_ratio * lr).")
    min_lr_ratio: float = option(0.0, "Cosine schedule's final lr as a fraction of lr.")
    num_cycles: float = option(0.5, "Cosine half-waves over the decay (0.5: decay once, no restart).")


@dataclass
class SFTRunConfig(RunConfig):
    """Run length, placement, logging, validation and checkpoints (``trainer``): the PPO trainer's run keys and
    the SFT trainer's own."""

    experiment_name: str = option("sft", "Run name in the trackers.")
    save_freq: int = option(-1, "Save a checkpoint every N steps (and at the end); -1 only the final model.")
    test_freq: int = option(-1, "Compute the validation loss every N steps (and at the end); -1 only at the end.")
    default_local_dir: str = option("checkpoints/hybridflow/sft", "The run folder: checkpoints, metrics, final model.")
    max_ckpt_to_keep: Optional[int] = option(None, "Keep only the newest N global_step folders; None keeps all.")


@dataclass
class SFTTrainerConfig:
    """Everything ``python -m hybridflow.trainer.main_sft`` reads."""

    data: SFTDataConfig = section(SFTDataConfig, "Training and validation examples.")
    model: SFTModelConfig = section(SFTModelConfig, "Model to fine-tune.")
    optim: SFTOptimConfig = section(SFTOptimConfig, "Optimizer and learning-rate schedule.")
    use_remove_padding: bool = option(True, "Pack the real tokens of a micro-batch into one row (no padding compute).")
    trainer: SFTRunConfig = section(SFTRunConfig, "Run length, placement, logging, checkpoints.")
    checkpoint: CheckpointConfig = section(CheckpointConfig, "What checkpoints hold.")
    ray_init: RayInitConfig = section(RayInitConfig, "Ray cluster.")


def load_sft_config(config: DictConfig | dict, check_environment: bool = True) -> SFTTrainerConfig:
    """``config`` checked against :class:`SFTTrainerConfig` and the cross-key rules; one error lists all problems."""
    return load_sft_config_with_notes(config, check_environment)[0]


def load_sft_config_with_notes(
    config: DictConfig | dict, check_environment: bool = True
) -> tuple[SFTTrainerConfig, list[str]]:
    """The checked config and the keys it sets that this run does not read ("key=value (why)").

    verl's keys for capabilities hybridflow lacks are refused first, alone. ``check_environment=False`` checks
    keys and values only, not this machine's files, packages and devices (``HYBRIDFLOW_CONFIG_CHECK=surface``).
    """
    if not isinstance(config, DictConfig):
        config = OmegaConf.create(config)
    config, compat = SFT_SURFACE.split(config)
    if compat.lacks:
        raise ConfigError(list(dict.fromkeys(compat.lacks)))
    config, form_errors = accepted_forms(config)
    errors = compat.errors + form_errors + unknown_key_errors(config, SFTTrainerConfig)
    if errors:
        raise ConfigError(errors)
    try:
        typed = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SFTTrainerConfig), config))
    except OmegaConfBaseException as error:
        key = getattr(error, "full_key", "") or ""
        message = str(error).splitlines()[0]
        raise ConfigError([f"{key}: {message}; give a value of the type in sft_config.py"]) from error
    errors = sft_config_errors(typed)
    if check_environment:
        typed.trainer.device = typed.trainer.device or detected_device()
        errors += sft_environment_errors(typed)
    if errors:
        raise ConfigError(errors)
    return typed, compat.unread


def sft_config_errors(config: SFTTrainerConfig) -> list[str]:
    """Every rule the typed config breaks, one line each (empty when it can run)."""
    data, run, optim = config.data, config.trainer, config.optim
    errors = []
    processes = run.nnodes * run.n_gpus_per_node
    for key, value in [
        ("data.train_batch_size", data.train_batch_size),
        ("data.micro_batch_size_per_gpu", data.micro_batch_size_per_gpu),
        ("data.max_length", data.max_length),
        ("data.max_token_len_per_gpu", data.max_token_len_per_gpu),
        ("trainer.total_epochs", run.total_epochs),
        ("trainer.nnodes", run.nnodes),
        ("trainer.n_gpus_per_node", run.n_gpus_per_node),
    ]:
        if value < 1:
            errors.append(f"{key}={value} must be >= 1")
    if processes >= 1 and data.train_batch_size % processes:
        errors.append(
            f"data.train_batch_size={data.train_batch_size} must be divisible by the {processes} worker processes "
            f"(trainer.nnodes x trainer.n_gpus_per_node); change one of them"
        )
    if data.use_dynamic_bsz and data.max_token_len_per_gpu < data.max_length:
        errors.append(
            f"data.max_token_len_per_gpu={data.max_token_len_per_gpu} is below data.max_length={data.max_length}, "
            f"so one example may not fit a micro-batch; raise it"
        )
    if run.total_training_steps is not None and run.total_training_steps < 1:
        errors.append(f"trainer.total_training_steps={run.total_training_steps} must be >= 1 or null")
    errors += _choice_errors(config) + range_errors(config, SFT_RANGES)
    if run.resume_mode == "resume_path" and not run.resume_from_path:
        errors.append(
            f"trainer.resume_mode='resume_path' needs trainer.resume_from_path (modes: {list(RESUME_MODES)} or a path)"
        )
    if not 0.0 <= optim.warmup_steps_ratio < 1.0:
        errors.append(f"optim.warmup_steps_ratio={optim.warmup_steps_ratio} must be in [0, 1)")
    errors += _model_errors(config, processes)
    if not config.data.train_files:
        errors.append("data.train_files is empty; give one or more parquet files")
    return errors


def _model_errors(config: SFTTrainerConfig, processes: int) -> list[str]:
    """What the worker would refuse as it builds the model: dtype names, an ``fsdp_size`` that does not divide
    the processes, a tensor-parallel split, no model folder."""
    fsdp = config.model.fsdp_config
    mixed = fsdp.mixed_precision
    errors = []
    if fsdp.tensor_parallel_size != 1:
        errors.append(
            f"model.fsdp_config.tensor_parallel_size={fsdp.tensor_parallel_size}: the SFT trainer trains each "
            "rank's own rows on a model split by FSDP2 alone; set it to 1 (the PPO trainer's roles split)"
        )
    errors += unknown_dtype_errors(
        {
            "model.dtype": config.model.dtype,
            "model.fsdp_config.mixed_precision.param_dtype": mixed.param_dtype,
            "model.fsdp_config.mixed_precision.reduce_dtype": mixed.reduce_dtype,
        }
    )
    errors += fsdp_size_errors("model.fsdp_config.fsdp_size", fsdp.fsdp_size, processes, "worker processes")
    if not config.model.partial_pretrain:
        errors.append("model.partial_pretrain is empty; set it (or model.path) to a Hugging Face model folder")
    return errors


def _choice_errors(config: SFTTrainerConfig) -> list[str]:
    """Values outside the names hybridflow knows: modes, schedulers, devices, checkpoint parts, trackers."""
    data, run = config.data, config.trainer
    errors = _choice("data.truncation", data.truncation, SFT_TRUNCATION_MODES)
    errors += _choice("data.pad_mode", data.pad_mode, SFT_PAD_MODES)
    errors += _choice("optim.lr_scheduler", config.optim.lr_scheduler, WARMUP_STYLES)
    if run.device is not None:
        errors += _choice("trainer.device", run.device, DEVICES)
    for key in ("save_contents", "load_contents"):
        unknown = [part for part in getattr(config.checkpoint, key) if part not in CONTENTS]
        if unknown:
            errors.append(f"checkpoint.{key} has {unknown}; choose parts from {list(CONTENTS)}")
    backends = LOGGER_BACKENDS.names()
    return errors + [
        f"trainer.logger has {name!r}, not one of {backends}" for name in run.logger if name not in backends
    ]


def _choice(key: str, value: Any, allowed: Any) -> list[str]:
    return [] if value in allowed else [f"{key}={value!r} is not one of {list(allowed)}"]


def sft_environment_errors(config: SFTTrainerConfig) -> list[str]:
    """One line per model folder, data file, package or device the run needs and this machine lacks."""
    model = config.model
    errors = model_errors("model.partial_pretrain", model.partial_pretrain)
    errors += model_folder_errors("model.partial_pretrain", model.partial_pretrain)
    if not errors:  # a model folder to build the model from
        errors += sft_model_structure_errors(model)
    if model.tokenizer_path and not pathlib.Path(model.tokenizer_path).expanduser().is_dir():
        errors.append(f"model.tokenizer_path={model.tokenizer_path!r} does not exist; point it at a tokenizer folder")
    for key in ("train_files", "val_files"):
        files = getattr(config.data, key)
        errors += data_file_errors(f"data.{key}", files) + parquet_errors(
            f"data.{key}", files, _sft_columns(config.data)
        )
    errors += run_folder_errors("trainer.default_local_dir", config.trainer.default_local_dir)
    errors += logger_package_errors(config.trainer.logger)
    if config.trainer.device == "cuda" and detected_device() != "cuda":
        errors.append("trainer.device=cuda but torch sees no GPU on this machine; use trainer.device=cpu (or null)")
    elif config.trainer.device == "cuda" and not config.ray_init.address:
        errors += gpu_count_errors(config.trainer.n_gpus_per_node)
    return errors


def _sft_columns(data: SFTDataConfig) -> Callable[[list[str]], dict[str, str]]:
    """The columns an SFT file needs: the messages of multi-turn rows (``multiturn.enable``, or null and the
    file has them), else the prompt and the response."""

    def columns(names: list[str]) -> dict[str, str]:
        multiturn = data.multiturn
        if multiturn.enable or (multiturn.enable is None and multiturn.messages_key in names):
            return {"data.multiturn.messages_key": multiturn.messages_key}
        return {"data.prompt_key": data.prompt_key, "data.response_key": data.response_key}

    return columns


def to_plain_dict(config: SFTTrainerConfig) -> dict[str, Any]:
    """The config as nested plain dicts (for the trackers' run record)."""
    return dataclasses.asdict(config)
