"""Entry point: ``python -m hybridflow.trainer.main_sft key=value ...`` (Hydra overrides on sft_trainer.yaml).

    python -m hybridflow.trainer.main_sft data.train_files=~/data/sorting/train.parquet \\
        data.prompt_key=extra_info data.prompt_dict_keys=[question] \\
        data.response_key=extra_info data.response_dict_keys=[answer] \\
        model.partial_pretrain=/path/to/hf_model_folder trainer.default_local_dir=/tmp/sft_run

(the RL parquet files of ``examples/data_preprocess/`` keep each problem's question and reference answer in
``extra_info``; ``examples/tiny_base_model/build.py`` runs this trainer from Python).

verl's SFT command lines work too: ``torchrun ... -m verl.trainer.sft_trainer <keys>`` becomes
``python -m hybridflow.trainer.main_sft trainer.n_gpus_per_node=<nproc_per_node> <keys>`` (verl's current key names
are aliases, ``engine=fsdp`` is what this config holds; see :mod:`hybridflow.config.verl_sft_compat`).

The config is checked before transformers and Ray are imported and the data tokenized before Ray starts;
``HYBRIDFLOW_CONFIG_CHECK=surface|full`` stops after the check. The final model is written as a Hugging Face
folder to ``<trainer.default_local_dir>/huggingface``.
"""

from __future__ import annotations

import pathlib
import sys
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig

from hybridflow.config.sft import SFTTrainerConfig, load_sft_config_with_notes
from hybridflow.config.verl_sft_compat import SFT_SURFACE
from hybridflow.errors import RunInterrupted
from hybridflow.trainer.entry_point import checked_run, command_line
from hybridflow.trainer.error_boundary import WORKERS_STARTING

if TYPE_CHECKING:
    from hybridflow.data.sft_dataset import SFTDataset
    from hybridflow.trainer.sft_trainer import SFTTrainer


def build_sft_trainer(config: SFTTrainerConfig) -> SFTTrainer:
    """Tokenizer, datasets and loaders for ``config`` (no Ray needed yet)."""
    # Imported once the config is known to be good: they load torch, transformers and Ray (seconds).
    from hybridflow.data.sampler import StatefulDataLoader
    from hybridflow.models.loading import check_vocabulary, load_tokenizer
    from hybridflow.trainer.sft_trainer import SFTTrainer

    data, model = config.data, config.model
    tokenizer_dir = model.tokenizer_path or model.partial_pretrain
    tokenizer = load_tokenizer(
        tokenizer_dir, trust_remote_code=model.trust_remote_code, chat_template=model.custom_chat_template
    )
    check_vocabulary(tokenizer, tokenizer_dir, model.partial_pretrain, model.trust_remote_code)

    def dataset(files: object, max_samples: int) -> SFTDataset:
        return _sft_dataset(config, tokenizer, files, max_samples)

    train_dataset = dataset(data.train_files, data.train_max_samples)
    train_loader = StatefulDataLoader(
        train_dataset, data.train_batch_size, shuffle=data.shuffle, seed=data.seed, drop_last=True
    )
    val_loader = None
    if data.val_files:
        val_dataset = dataset(data.val_files, data.val_max_samples)
        val_loader = StatefulDataLoader(val_dataset, data.train_batch_size, shuffle=False, drop_last=False)
    trainer = SFTTrainer(config, train_loader=train_loader, val_loader=val_loader)
    print(f"[hybridflow] {train_dataset.summary()}")
    print(
        f"[hybridflow] {trainer.total_training_steps} steps of {data.train_batch_size} examples "
        f"({len(train_loader)} steps per epoch, {train_dataset.num_loss_tokens()} loss tokens per epoch) on "
        f"{config.trainer.nnodes * config.trainer.n_gpus_per_node} worker process(es)"
    )
    return trainer


def _sft_dataset(config: SFTTrainerConfig, tokenizer: Any, files: object, max_samples: int) -> SFTDataset:
    from hybridflow.data.sft_dataset import SFTDataset

    data, multiturn = config.data, config.data.multiturn
    return SFTDataset(
        files,
        tokenizer,
        data.max_length,
        prompt_key=data.prompt_key,
        response_key=data.response_key,
        prompt_dict_keys=data.prompt_dict_keys,
        response_dict_keys=data.response_dict_keys,
        multiturn=multiturn.enable,
        messages_key=multiturn.messages_key,
        truncation=data.truncation,
        tools_key=multiturn.tools_key,
        enable_thinking_key=multiturn.enable_thinking_key,
        enable_thinking_default=multiturn.enable_thinking_default,
        apply_chat_template_kwargs=data.apply_chat_template_kwargs,
        max_samples=max_samples,
        pad_mode=data.pad_mode,
    )


def run_sft(config: SFTTrainerConfig, trainer: SFTTrainer | None = None) -> pathlib.Path:
    """Train and export; returns the Hugging Face folder of the fine-tuned model (``trainer``: already built)."""
    from hybridflow.distributed import init_local_ray

    trainer = trainer or build_sft_trainer(config)
    ray_config = config.ray_init
    print(WORKERS_STARTING, flush=True)
    init_local_ray(
        num_cpus=ray_config.num_cpus,
        num_gpus=ray_config.num_gpus,
        object_store_memory=ray_config.object_store_memory,
        temp_dir=ray_config.temp_dir,
        address=ray_config.address,
    )
    try:
        trainer.init_workers()
        exported = trainer.fit()
    except KeyboardInterrupt:
        raise RunInterrupted(
            f"interrupted (Ctrl-C) during step {trainer.global_step}; {trainer.checkpoints.resume_hint()}"
        ) from None
    finally:
        trainer.shutdown()
    print(f"[hybridflow] fine-tuned model written to {exported}")
    return exported


@hydra.main(config_path="../config/yaml", config_name="sft_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    checked_run(
        "main_sft",
        lambda check_environment: load_sft_config_with_notes(cfg, check_environment),
        build_sft_trainer,
        run_sft,
    )


def cli(argv: list[str]) -> None:
    """``python -m hybridflow.trainer.main_sft <argv>``."""
    command_line("main_sft", argv, SFT_SURFACE, SFTTrainerConfig, main)


if __name__ == "__main__":
    cli(sys.argv[1:])
