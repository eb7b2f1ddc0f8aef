"""main_sft end to end on a tiny parquet task: the loss falls, the exported folder loads, LoRA and resume work."""

import sys

import pytest
import torch
from hydra import compose, initialize_config_module
from transformers import AutoModelForCausalLM, AutoTokenizer

from hybridflow.config.load import ConfigError
from hybridflow.config.sft import SFTTrainerConfig, load_sft_config
from hybridflow.tracking.metric_names import is_timing
from hybridflow.tracking.trackers import read_metrics
from hybridflow.trainer import main_sft
from hybridflow.trainer.sft_trainer import worker_optim_config

from .cli import kill_9_at_first_checkpoint, sft_command


def sft_overrides(model_dir, parquet, run_dir, steps):
    """Arithmetic rows' extra_info question/answer as prompt/response, 8 examples a step."""
    train, val = parquet
    return [
        f"data.train_files={train}",
        f"data.val_files={val}",
        "data.prompt_key=extra_info",
        "data.prompt_dict_keys=[question]",
        "data.response_key=extra_info",
        "data.response_dict_keys=[answer]",
        "data.max_length=96",
        "data.train_batch_size=8",
        "data.micro_batch_size_per_gpu=2",
        f"model.partial_pretrain={model_dir}",
        "optim.lr=3e-3",
        "optim.warmup_steps_ratio=0.0",
        "optim.lr_scheduler=constant",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[jsonl]",
    ]


def composed(overrides):
    with initialize_config_module("hybridflow.config.yaml", version_base=None):
        return load_sft_config(compose("sft_trainer", overrides=list(overrides)))


def losses(run_dir, key="train/loss"):
    return {record["step"]: record[key] for record in read_metrics(run_dir) if key in record}


def max_weight_change(model_dir, exported_dir):
    before = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(exported_dir).state_dict()
    assert before.keys() == after.keys()
    return max(float((after[name] - before[name]).abs().max()) for name in before)


def test_main_sft_on_two_ranks_lowers_the_loss_and_saves_a_loadable_folder(
    ray_cluster, tiny_model_dir, tiny_parquet, tmp_path, monkeypatch
):
    run_dir = tmp_path / "run"
    overrides = sft_overrides(tiny_model_dir, tiny_parquet, run_dir, steps=6) + [
        "trainer.n_gpus_per_node=2",
        "trainer.test_freq=3",
        "data.use_dynamic_bsz=true",
        "data.max_token_len_per_gpu=128",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    monkeypatch.setattr(sys, "argv", ["main_sft", *overrides])
    main_sft.main()

    train_loss, val_loss = losses(run_dir), losses(run_dir, "val/loss")
    assert sorted(train_loss) == [1, 2, 3, 4, 5, 6]
    assert train_loss[6] < 0.8 * train_loss[1], train_loss
    assert sorted(val_loss) == [3, 6] and val_loss[6] < val_loss[3]
    exported = run_dir / "huggingface"
    assert max_weight_change(tiny_model_dir, exported) > 1e-3
    tokenizer = AutoTokenizer.from_pretrained(exported)
    assert tokenizer.chat_template and tokenizer.eos_token == "<|im_end|>"


def test_lora_sft_exports_merged_plain_weights(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    run_dir = tmp_path / "lora"
    config = composed(
        sft_overrides(tiny_model_dir, tiny_parquet, run_dir, steps=4)
        + ["model.lora_rank=8", "model.lora_alpha=16", "optim.lr=1e-2", "use_remove_padding=false"]
    )
    exported = main_sft.run_sft(config)

    train_loss = losses(run_dir)
    # The adapter trains (the loss falls below the first step's); lr 1e-2 on a rank-8 adapter makes the later
    # steps' losses swing, so the last one alone is no measure.
    assert min(train_loss[step] for step in (2, 3, 4)) < train_loss[1], train_loss
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert not any("lora" in name for name in model.state_dict())
    assert max_weight_change(tiny_model_dir, exported) > 1e-4
    # The base model's embedding is not adapted, so LoRA leaves it unchanged.
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.testing.assert_close(model.model.embed_tokens.weight, base.model.embed_tokens.weight)


def test_a_resumed_run_continues_from_the_saved_step(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    run_dir = tmp_path / "resume"
    base = sft_overrides(tiny_model_dir, tiny_parquet, run_dir, steps=2) + [
        "trainer.save_freq=2",
        "checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "checkpoint.load_contents=[model,optimizer,extra]",
    ]
    main_sft.run_sft(composed(base))
    assert (run_dir / "latest").read_text().strip() == "global_step_2"
    # checkpoint.save_contents' hf_model: a Hugging Face folder inside the step's checkpoint.
    assert max_weight_change(tiny_model_dir, run_dir / "global_step_2" / "model" / "huggingface") > 1e-4

    main_sft.run_sft(composed(base + ["trainer.total_training_steps=4"]))

    steps = [record["step"] for record in read_metrics(run_dir) if "train/loss" in record]
    assert steps == [1, 2, 3, 4]
    assert (run_dir / "latest").read_text().strip() == "global_step_4"


def test_kill_9_then_resume_matches_an_uninterrupted_run(ray_cluster, tiny_model_dir, tiny_parquet, tmp_path):
    """``python -m hybridflow.trainer.main_sft`` killed with -9 at its first checkpoint, then the same run again
    (in this process): the steps after the kill log the uninterrupted run's metrics (losses, learning rates,
    gradient norms, epoch), and the exported weights are the same to the bit."""

    def overrides(run_dir):
        return sft_overrides(tiny_model_dir, tiny_parquet, run_dir, steps=4) + [
            "trainer.save_freq=1",
            "optim.lr_scheduler=cosine",  # the schedule's position resumes too
        ]

    reference = main_sft.run_sft(composed(overrides(tmp_path / "uninterrupted")))
    run_dir = tmp_path / "run"
    killed_at = kill_9_at_first_checkpoint(overrides(run_dir), run_dir, cwd=tmp_path, trainer=sft_command)
    assert killed_at < 4, "the run finished before it could be killed"
    resumed = main_sft.run_sft(composed(overrides(run_dir)))

    def logged(folder):
        return {r["step"]: {k: v for k, v in r.items() if not is_timing(k)} for r in read_metrics(folder)}

    expected, steps = logged(tmp_path / "uninterrupted"), logged(run_dir)
    assert sorted(steps) == [1, 2, 3, 4] and "train/lr" in steps[4]
    for step in range(killed_at + 1, 5):
        assert steps[step] == expected[step], f"step {step} differs"
    assert max_weight_change(reference, resumed) == 0


def test_config_problems_are_reported_together_before_anything_starts(tiny_model_dir, tiny_parquet, tmp_path):
    overrides = sft_overrides(tiny_model_dir, tiny_parquet, tmp_path, steps=2)
    with pytest.raises(ConfigError, match="data.promt_key is not a config key; did you mean data.prompt_key"):
        composed(overrides + ["+data.promt_key=question"])
    with pytest.raises(ConfigError) as raised:
        composed(overrides + ["data.train_batch_size=7", "trainer.n_gpus_per_node=2", "optim.lr_scheduler=linear"])
    assert len(raised.value.errors) == 2
    assert "data.train_batch_size=7 must be divisible by the 2 worker processes" in str(raised.value)
    assert "optim.lr_scheduler='linear' is not one of ['constant', 'cosine']" in str(raised.value)


def test_what_the_worker_would_refuse_as_it_builds_the_model_is_refused_before_start(
    tiny_model_dir, tiny_parquet, tmp_path
):
    """Dtype names, an fsdp_size that does not divide the processes, LoRA modules that match nothing (the model
    built on the meta device): each named in the one check, before any worker starts."""
    bad = [
        "model.dtype=fp17",
        "model.fsdp_config.mixed_precision.reduce_dtype=bf17",
        "model.fsdp_config.fsdp_size=3",
        "trainer.n_gpus_per_node=4",
        "model.lora_rank=4",
        "model.target_modules=[gate]",
    ]
    with pytest.raises(ConfigError) as raised:
        composed(sft_overrides(tiny_model_dir, tiny_parquet, tmp_path, steps=2) + bad)
    errors = raised.value.errors
    assert len(errors) == 4, errors
    assert errors[0].startswith("model.dtype='fp17' is not a dtype hybridflow loads")
    assert errors[1].startswith("model.fsdp_config.mixed_precision.reduce_dtype='bf17' is not a dtype")
    assert errors[2].startswith("model.fsdp_config.fsdp_size=3 does not divide the 4 worker processes")
    assert errors[3].startswith("model.target_modules=['gate'] with exclude_modules=None: Target modules {'gate'}")


def test_warmup_steps_come_from_lr_warmup_steps_or_the_ratio():
    config = SFTTrainerConfig()
    config.optim.warmup_steps_ratio = 0.1
    assert worker_optim_config(config, 95).lr_warmup_steps == 9  # int(0.1 * 95)
    config.optim.lr_warmup_steps = 5
    assert worker_optim_config(config, 95).lr_warmup_steps == 5
    config.optim.lr_warmup_steps, config.optim.warmup_steps_ratio = -1, 1.0
    config.optim.lr_scheduler, config.optim.num_cycles = "cosine", 1.5
    optim = worker_optim_config(config, 10)
    # A cosine schedule keeps one step after warmup.
    assert (optim.lr_warmup_steps, optim.num_cycles, optim.warmup_style) == (9, 1.5, "cosine")


def test_the_optimizer_defaults_are_verls_sft_trainer_ones():
    optim = SFTTrainerConfig().optim
    assert (optim.lr, optim.betas, optim.warmup_steps_ratio, optim.lr_scheduler) == (
        1e-3,
        [0.9, 0.999],
        0.0,
        "constant",
    )
