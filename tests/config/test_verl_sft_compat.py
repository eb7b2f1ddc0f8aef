"""verl's SFT key surface: every key of verl's sft_trainer configs that hybridflow's SFT schema lacks is aliased,
refused naming the missing capability, or accepted and listed as not read; verl-style SFT command lines get
through main_sft's config check."""

import os
import subprocess
import sys

import pytest
import yaml
from hydra import compose, initialize_config_module

from hybridflow.config.command_line import override_errors, without_redundant_plus, without_served_groups
from hybridflow.config.key_surface import ALIAS, LACKS, UNREAD
from hybridflow.config.load import ConfigError
from hybridflow.config.sft import SFTTrainerConfig, load_sft_config_with_notes
from hybridflow.config.verl_sft_compat import SFT_COMPAT_YAML, SFT_SURFACE
from tests.trainer.cli import HANG_GUARD_S

BASE = ["data.train_files=/data/train.parquet", "model.partial_pretrain=/models/base"]


def _compose(args):
    with initialize_config_module("hybridflow.config.yaml", version_base=None):
        return compose("sft_trainer", overrides=list(args))


def _check(overrides, check_environment=False):
    """(config, unread notes) for an SFT command line, as main_sft sees it after its own pre-Hydra pass."""
    args = without_redundant_plus(list(overrides), SFT_SURFACE)
    errors = override_errors(args, SFT_SURFACE, SFTTrainerConfig)
    if errors:
        raise ConfigError(errors)
    composed = _compose(without_served_groups(args, SFT_SURFACE))
    return load_sft_config_with_notes(composed, check_environment=check_environment)


def _refusal(overrides) -> str:
    with pytest.raises(ConfigError) as caught:
        _check(overrides)
    assert len(caught.value.errors) == 1, caught.value.errors
    return caught.value.errors[0]


# ------------------------------------------------------------------------------------------ the key table
def test_every_verl_sft_key_has_a_rule_and_none_shadows_a_schema_key():
    for key in SFT_SURFACE.compat_defaults:
        assert SFT_SURFACE.rule_for(key) is not None, f"{key} has no rule in hybridflow/config/verl_sft_compat.py"
        assert key not in SFT_SURFACE.schema_defaults, f"{key} is both a schema key and a verl-only key"


def test_every_alias_points_at_a_schema_key_and_defaults_to_its_default():
    aliases = [key for key in SFT_SURFACE.compat_defaults if SFT_SURFACE.rule_for(key).kind == ALIAS]
    assert "model.path" in aliases and "engine.param_offload" in aliases
    for key in aliases:
        target = SFT_SURFACE.rule_for(key).target(key)
        assert target in SFT_SURFACE.schema_defaults, f"{key} -> {target}"
        assert SFT_SURFACE.compat_defaults[key] == SFT_SURFACE.schema_defaults[target], key


def test_the_compat_yaml_is_what_hydra_merges_under_the_sft_config():
    assert _compose([]).engine.strategy == "fsdp"
    assert "verl_sft_compat" in yaml.safe_load(SFT_COMPAT_YAML.with_name("sft_trainer.yaml").read_text())["defaults"]


def test_rules_name_what_each_key_is():
    assert SFT_SURFACE.rule_for("engine.strategy").kind == LACKS
    assert SFT_SURFACE.rule_for("profiler.tool_config.torch.discrete").kind == UNREAD
    assert SFT_SURFACE.rule_for("trainer.checkpoint.load_contents").target("trainer.checkpoint.load_contents") == (
        "checkpoint.load_contents"
    )


# --------------------------------------------------------------------------------------------- aliases
@pytest.mark.parametrize(
    "override, read",
    [
        ("model.path=/models/other", lambda c: c.model.partial_pretrain == "/models/other"),
        ("model.use_remove_padding=false", lambda c: c.use_remove_padding is False),
        ("engine.param_offload=true", lambda c: c.model.fsdp_config.param_offload is True),
        ("engine.optimizer_offload=true", lambda c: c.model.fsdp_config.optimizer_offload is True),
        ("engine.reshard_after_forward=false", lambda c: c.model.fsdp_config.reshard_after_forward is False),
        ("engine.fsdp_size=2", lambda c: c.model.fsdp_config.fsdp_size == 2),
        ("engine.dtype=bfloat16", lambda c: c.model.fsdp_config.mixed_precision.param_dtype == "bfloat16"),
        ("engine.model_dtype=bf16", lambda c: c.model.dtype == "bf16"),
        ("model.fsdp_config.offload_params=true", lambda c: c.model.fsdp_config.param_offload is True),
        ("data.messages_key=conversation", lambda c: c.data.multiturn.messages_key == "conversation"),
        ("data.tools_key=functions", lambda c: c.data.multiturn.tools_key == "functions"),
        ("data.enable_thinking_key=think", lambda c: c.data.multiturn.enable_thinking_key == "think"),
        ("data.enable_thinking_default=false", lambda c: c.data.multiturn.enable_thinking_default is False),
        ("data.chat_template=chatml", lambda c: c.model.custom_chat_template == "chatml"),
        ("optim.lr_warmup_steps_ratio=0.2", lambda c: c.optim.warmup_steps_ratio == 0.2),
        ("optim.lr_scheduler_type=cosine", lambda c: c.optim.lr_scheduler == "cosine"),
        ("optim.warmup_style=cosine", lambda c: c.optim.lr_scheduler == "cosine"),
        ("trainer.seed=7", lambda c: c.data.seed == 7),
        ("trainer.checkpoint.save_contents=[model]", lambda c: c.checkpoint.save_contents == ["model"]),
    ],
)
def test_verl_names_reach_the_schema_fields(override, read):
    model = [] if override.startswith("model.path=") else BASE[1:]
    config, unread = _check(BASE[:1] + model + [override])
    assert read(config) and unread == []


def test_load_contents_follows_save_contents_unless_set():
    config, _ = _check(BASE + ["checkpoint.save_contents=[model,hf_model]"])
    assert config.checkpoint.load_contents == ["model", "hf_model"]
    config, _ = _check(BASE + ["checkpoint.save_contents=[model,hf_model]", "checkpoint.load_contents=[model]"])
    assert config.checkpoint.load_contents == ["model"]


def test_an_alias_and_its_key_set_differently_is_one_error():
    with pytest.raises(ConfigError) as caught:
        _check(BASE + ["model.path=/models/a"])
    assert caught.value.errors == [
        "model.path=/models/a and model.partial_pretrain=/models/base set the same thing; keep one"
    ]


# ------------------------------------------------------------------------------- capabilities refused
@pytest.mark.parametrize(
    "override, capability",
    [
        ("engine=megatron", "Megatron"),
        ("engine=automodel", "Automodel"),
        ("optim=veomni", "VeOmni"),
        ("engine.strategy=megatron", "Megatron"),
        ("model.strategy=fsdp_turbo", "other than FSDP2"),
        ("model=vlm_model", "Hugging Face models"),
        ("trainer.device=npu", "Ascend NPU"),
        ("data.custom_cls.path=/my/dataset.py", "custom dataset classes"),
        ("model.mtp.enable=true", "multi-token prediction"),
        ("optim.optimizer=Muon", "optimizers other than AdamW"),
        ("model.lora_adapter_path=/adapters/a", "saved adapter"),
        ("trainer.default_hdfs_dir=hdfs://ckpt", "HDFS"),
    ],
)
def test_a_capability_hybridflow_lacks_is_refused_in_one_line(override, capability):
    line = _refusal(BASE + [override])
    assert capability in line and "which hybridflow does not have" in line, line


def test_a_megatron_command_line_gets_one_line_not_its_unknown_keys():
    megatron = [
        "engine=megatron",
        "optim=megatron",
        "engine.tensor_model_parallel_size=4",
        "optim.lr_decay_style=cosine",
        "+engine.override_transformer_config.recompute_granularity=full",
        "optim.min_lr=1e-6",
    ]
    assert _refusal(BASE + megatron).startswith("engine=megatron needs a training engine other than FSDP2")


def test_verl_fsdp_choices_and_allowed_values_are_accepted():
    config, unread = _check(
        BASE
        + [
            "engine=fsdp",
            "optim=fsdp",
            "model=hf_model",
            "engine.strategy=fsdp2",
            "model.strategy=fsdp",
            "trainer.device=cuda",
        ]
    )
    assert unread == [] and config.trainer.device == "cuda"


# -------------------------------------------------------------------------------------- read by nothing
def test_a_knob_nothing_reads_is_accepted_and_listed_once():
    _, unread = _check(
        BASE
        + [
            "engine.ulysses_sequence_parallel_size=2",
            "model.use_liger=true",
            "data.ignore_input_ids_mismatch=true",
            "trainer.balance_batch=false",
            "data.num_workers=0",
        ]
    )
    assert sorted(line.split(" ")[0] for line in unread) == [
        "data.ignore_input_ids_mismatch=True",
        "data.num_workers=0",
        "engine.ulysses_sequence_parallel_size=2",
        "model.use_liger=True",
        "trainer.balance_batch=False",
    ]
    assert all(line.endswith(")") for line in unread)


def test_this_machines_files_are_checked_only_outside_surface_mode(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    args = ["data.train_files=/nowhere/train.parquet", "model.path=Qwen/Qwen3-8B", "trainer.device=cpu"]
    _check(args)
    with pytest.raises(ConfigError) as caught:
        _check(args, check_environment=True)
    assert any("is a hub id that is not in the local Hugging Face cache" in line for line in caught.value.errors)
    assert any("'/nowhere/train.parquet' does not exist" in line for line in caught.value.errors)


# ---------------------------------------------------------------- verl-style launch lines (our own)
def _conversation_lora_line():
    """A LoRA run on conversations in the shape of verl's current FSDP SFT examples."""
    return [
        "data.train_files=/data/chat/train.parquet",
        "data.val_files=/data/chat/test.parquet",
        "data.messages_key=messages",
        "data.micro_batch_size_per_gpu=2",
        "data.train_batch_size=64",
        "data.max_length=4096",
        "data.truncation=right",
        "data.pad_mode=no_padding",
        "data.train_max_samples=5000",
        "+data.apply_chat_template_kwargs.enable_thinking=False",
        "data.ignore_input_ids_mismatch=True",
        "model=hf_model",
        "model.path=Qwen/Qwen3-4B",
        "model.use_remove_padding=true",
        "model.lora_rank=16",
        "model.lora_alpha=32",
        "model.target_modules=all-linear",
        "engine=fsdp",
        "engine.param_offload=True",
        "engine.ulysses_sequence_parallel_size=2",
        "optim=fsdp",
        "optim.lr=5e-5",
        "optim.lr_warmup_steps_ratio=0.05",
        "optim.lr_scheduler_type=cosine",
        "optim.min_lr_ratio=0.1",
        "optim.betas=[0.9,0.95]",
        "trainer.n_gpus_per_node=4",
        "trainer.project_name=chat-sft",
        "trainer.experiment_name=qwen3-lora",
        "trainer.logger=['console','wandb']",
        "trainer.total_epochs=3",
        "trainer.save_freq=100",
        "trainer.max_ckpt_to_keep=2",
        "trainer.seed=42",
        "checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    ]


def _older_question_answer_line():
    """A prompt/response run in the shape of verl's older fsdp_sft_trainer examples."""
    return [
        "data.train_files=/data/gsm8k/train.parquet",
        "data.val_files=/data/gsm8k/test.parquet",
        "data.prompt_key=extra_info",
        "data.response_key=extra_info",
        "+data.prompt_dict_keys=['question']",
        "+data.response_dict_keys=['answer']",
        "data.micro_batch_size_per_gpu=4",
        "data.multiturn.enable=false",
        "model.partial_pretrain=/models/gemma-2b-it",
        "model.strategy=fsdp2",
        "model.fsdp_config.model_dtype=bf16",
        "ulysses_sequence_parallel_size=1",
        "use_remove_padding=true",
        "optim.lr=1e-4",
        "optim.lr_warmup_steps_ratio=0.1",
        "optim.lr_scheduler=cosine",
        "trainer.logger=console",
        "trainer.total_training_steps=10",
        "trainer.default_local_dir=/tmp/sft-ckpt",
        "trainer.n_gpus_per_node=2",
    ]


def _main_sft(args):
    env = {**os.environ, "HYBRIDFLOW_CONFIG_CHECK": "surface"}
    return subprocess.run(
        [sys.executable, "-m", "hybridflow.trainer.main_sft", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=HANG_GUARD_S,
    )


def test_verl_style_sft_lines_through_the_entry_point_stop_after_the_check():
    conversations = _main_sft(_conversation_lora_line())
    assert conversations.returncode == 0, conversations.stderr[-2000:]
    assert "config check passed (surface)" in conversations.stdout
    assert "engine.ulysses_sequence_parallel_size=2" in conversations.stdout
    older = _main_sft(_older_question_answer_line())
    assert older.returncode == 0, older.stderr[-2000:]
    assert "config check passed (surface)" in older.stdout and "not read by this run" not in older.stdout


def test_the_typed_config_of_a_verl_style_line():
    config, unread = _check(_conversation_lora_line())
    assert (config.model.partial_pretrain, config.model.lora_rank, config.optim.lr_scheduler) == (
        "Qwen/Qwen3-4B",
        16,
        "cosine",
    )
    assert config.data.apply_chat_template_kwargs == {"enable_thinking": False}
    assert (config.data.seed, config.model.fsdp_config.param_offload, config.optim.warmup_steps_ratio) == (
        42,
        True,
        0.05,
    )
    assert [line.split("=")[0] for line in unread] == [
        "data.ignore_input_ids_mismatch",
        "engine.ulysses_sequence_parallel_size",
    ]


def test_an_other_engine_line_through_the_entry_point_is_refused_in_one_line():
    refused = _main_sft(_conversation_lora_line() + ["engine=megatron", "engine.tensor_model_parallel_size=4"])
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hybridflow: error: invalid config: "), refused.stderr
    assert "Megatron" in lines[0], refused.stderr
