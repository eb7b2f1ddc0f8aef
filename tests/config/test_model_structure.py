"""What a worker would find only once it builds its model is found by the config check, on the model built on
the meta device from its config.json: LoRA modules that match nothing, an attention kernel transformers cannot
run, a tensor-parallel split of an architecture without the Llama-style layers."""

import shutil

import pytest
from transformers import GPT2Config, GPT2LMHeadModel

from tests.trainer.helpers import config_errors

MODEL = "actor_rollout_ref.model"


def test_lora_modules_that_match_nothing_are_refused(base):
    errors = config_errors(base + [f"{MODEL}.lora_rank=4", f"{MODEL}.target_modules=[q_prj]"])
    assert errors == [
        f"{MODEL}.target_modules=['q_prj'] with exclude_modules=None: Target modules {{'q_prj'}} not found in the "
        "base model. Please check the target modules and try again."
    ]
    errors = config_errors(base + [f"{MODEL}.lora_rank=4", f"{MODEL}.exclude_modules=.*"])
    assert len(errors) == 1 and errors[0].startswith(
        f"{MODEL}.target_modules='all-linear' with exclude_modules='.*': All modules were excluded."
    )


def test_an_attention_kernel_transformers_cannot_run_is_refused(base):
    errors = config_errors(base + [f"{MODEL}.attn_implementation=flash_attn"])
    assert len(errors) == 1 and errors[0].startswith(
        f"{MODEL}.attn_implementation='flash_attn': Specified `attn_implementation=\"flash_attn\"` is not supported."
    )


@pytest.fixture(scope="module")
def gpt2_model_dir(tiny_model_dir, tmp_path_factory):
    """A tiny GPT-2 (no q/k/v/o_proj layers) with the tiny model's tokenizer."""
    folder = tmp_path_factory.mktemp("gpt2")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, folder / name)
    GPT2LMHeadModel(GPT2Config(vocab_size=512, n_positions=128, n_embd=32, n_layer=1, n_head=2)).save_pretrained(folder)
    return folder


def test_a_split_of_an_architecture_without_llama_style_layers_is_refused(base, gpt2_model_dir):
    overrides = [f"{MODEL}.path={gpt2_model_dir}", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
    errors = config_errors(base + overrides + ["trainer.n_gpus_per_node=2"])
    assert (
        f"{MODEL}.path='{gpt2_model_dir}': GPT2LMHeadModel has no q/k/v/o_proj and gate/up/down_proj layers to "
        "split; tensor parallelism supports the Llama-style decoders (Llama, Qwen2/3, Qwen3 MoE, Mistral, Gemma 3, "
        "Seed-OSS); set "
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1" in errors
    )
