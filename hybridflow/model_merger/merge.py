"""Rebuild a trained policy from its checkpoint folder and write it as a Hugging Face model folder.

An actor checkpoint (``global_step_N/actor``) holds the model's DCP shards, ``huggingface/`` (config,
generation config, tokenizer) and, for LoRA, peft's ``adapter_config.json`` (``workers/checkpoint.py``).
The policy is rebuilt from those: the model class from the config, the same LoRA layers from the adapter
config, then every shard loaded into it in this process.

Differs from verl (``verl/model_merger``): verl always writes a LoRA checkpoint as the un-merged base
weights plus ``lora_adapter/``; here the adapter is merged in unless ``save_lora_adapter`` asks for that
layout, so the folder alone is the trained policy. verl casts the weights to bfloat16; here they keep the
dtype they were trained in. verl writes into an existing ``target_dir``; here a non-empty one is refused
and the folder appears only once complete.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from dataclasses import dataclass
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from hybridflow.models.adapter_files import ADAPTER_CONFIG_FILE
from hybridflow.models.lora import is_lora_model, merge_lora
from hybridflow.workers.checkpoint import HF_DIR, load_model_offline, model_dtype_offline

LORA_ADAPTER_DIR = "lora_adapter"


class MergerError(ValueError):
    """The checkpoint cannot be merged as asked, or the merged model differs from the one compared with."""


@dataclass
class TrainedPolicy:
    """The policy as it was trained (a peft model for LoRA), its tokenizer and generation config."""

    model: torch.nn.Module
    tokenizer: Any
    generation_config: GenerationConfig | None
    global_step: int | None


def load_trained_policy(local_dir: str | os.PathLike, trust_remote_code: bool = False) -> TrainedPolicy:
    """Rebuild the policy saved in the actor checkpoint folder ``local_dir``, on CPU."""
    folder = pathlib.Path(local_dir)
    hf_dir = folder / HF_DIR
    if not (hf_dir / "config.json").is_file():
        raise MergerError(
            f"{folder} has no {HF_DIR}/config.json; give an actor checkpoint folder (.../global_step_N/actor) "
            "written by hybridflow's trainer"
        )
    config = AutoConfig.from_pretrained(hf_dir, trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_config(
        config, dtype=model_dtype_offline(folder), trust_remote_code=trust_remote_code
    )
    if (folder / ADAPTER_CONFIG_FILE).is_file():
        lora = LoraConfig.from_pretrained(str(folder))
        lora.base_model_name_or_path = model.name_or_path  # the base is rebuilt here, not read from the training path
        model = get_peft_model(model, lora)
    manifest = load_model_offline(folder, model)
    generation_file = hf_dir / "generation_config.json"
    return TrainedPolicy(
        model=model.eval(),
        tokenizer=AutoTokenizer.from_pretrained(hf_dir, trust_remote_code=trust_remote_code),
        generation_config=GenerationConfig.from_pretrained(hf_dir) if generation_file.is_file() else None,
        global_step=manifest.get("global_step"),
    )


def merged_model(policy: TrainedPolicy) -> torch.nn.Module:
    """The plain model computing the trained policy: a LoRA adapter folded into the base weights."""
    return merge_lora(policy.model) if is_lora_model(policy.model) else policy.model


def merge(
    local_dir: str | os.PathLike,
    target_dir: str | os.PathLike,
    save_lora_adapter: bool = False,
    trust_remote_code: bool = False,
) -> pathlib.Path:
    """Write the checkpoint at ``local_dir`` as a Hugging Face folder at ``target_dir``; returns its path.

    ``save_lora_adapter``: verl's layout for a LoRA checkpoint, the base weights (adapter not merged) in
    ``target_dir`` and the adapter, in peft's format, in ``target_dir/lora_adapter`` (loadable with peft,
    by vLLM's LoRA support, or as ``actor_rollout_ref.model.lora_adapter_path`` to train on).
    """
    target = pathlib.Path(target_dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise MergerError(f"--target_dir {target} exists and is not an empty folder; give a new folder")
    policy = load_trained_policy(local_dir, trust_remote_code)
    if save_lora_adapter and not is_lora_model(policy.model):
        raise MergerError(f"--save_lora_adapter: {local_dir} holds no LoRA adapter (every weight was trained)")
    staging = target.with_name(target.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    if save_lora_adapter:
        policy.model.peft_config["default"].base_model_name_or_path = str(target.resolve())
        policy.model.save_pretrained(staging / LORA_ADAPTER_DIR)
        model = policy.model.unload()
    else:
        model = merged_model(policy)
    if policy.generation_config is not None:
        model.generation_config = policy.generation_config
    model.save_pretrained(staging)
    policy.tokenizer.save_pretrained(staging)
    if target.exists():
        target.rmdir()
    os.replace(staging, target)
    return target


def compare_with_hf(
    local_dir: str | os.PathLike, test_hf_dir: str | os.PathLike, trust_remote_code: bool = False
) -> int:
    """Check that the merged checkpoint equals the Hugging Face model at ``test_hf_dir``: same tensor names,
    shapes and dtypes, values equal within ``torch.testing.assert_close``'s tolerance for the dtype (a merge
    computed elsewhere, e.g. the trainer's own export, adds ``B @ A`` in another order). Returns the number
    of tensors compared; raises ``MergerError`` naming the differences."""
    ours = merged_model(load_trained_policy(local_dir, trust_remote_code)).state_dict()
    theirs = AutoModelForCausalLM.from_pretrained(test_hf_dir, trust_remote_code=trust_remote_code).state_dict()
    problems = [f"{name} missing" for name in sorted(theirs.keys() - ours.keys())]
    problems += [f"{name} not in {test_hf_dir}" for name in sorted(ours.keys() - theirs.keys())]
    for name in sorted(ours.keys() & theirs.keys()):
        mine, reference = ours[name], theirs[name]
        if mine.shape != reference.shape or mine.dtype != reference.dtype:
            problems.append(f"{name} is {mine.dtype}{list(mine.shape)}, not {reference.dtype}{list(reference.shape)}")
        elif not torch.allclose(mine, reference, **_tolerance(mine.dtype)):
            problems.append(f"{name} differs by up to {float((mine - reference).abs().max()):.3g}")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise MergerError(
            f"the merged checkpoint {local_dir} differs from {test_hf_dir} in {len(problems)} ways: {shown}"
        )
    return len(ours)


def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    # torch.testing.assert_close's defaults: a few units in the last place of the dtype.
    defaults = {torch.float16: (1e-3, 1e-5), torch.bfloat16: (1.6e-2, 1e-5), torch.float32: (1.3e-6, 1e-5)}
    rtol, atol = defaults.get(dtype, (1e-7, 1e-7))
    return {"rtol": rtol, "atol": atol}
