"""Helpers of the worker tests: synthetic rollout batches, configs for the tiny model, full weights."""

from __future__ import annotations

import torch
from omegaconf import OmegaConf

from hybridflow.protocol import DataProto


def rollout_batch(
    num_samples: int, prompt_length: int = 6, response_length: int = 5, vocab_size: int = 256, seed: int = 0
) -> DataProto:
    """``num_samples`` rows: left-padded prompts of 2..P tokens, right-padded responses of 1..R tokens.

    Keys: ``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``, ``response_mask``,
    ``advantages`` (one random value per sample, on its response tokens).
    """
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(2, prompt_length + 1, (num_samples,), generator=generator)
    response_lengths = torch.randint(1, response_length + 1, (num_samples,), generator=generator)
    prompts = torch.randint(0, vocab_size, (num_samples, prompt_length), generator=generator)
    responses = torch.randint(0, vocab_size, (num_samples, response_length), generator=generator)
    columns_p = torch.arange(prompt_length)
    columns_r = torch.arange(response_length)
    prompt_mask = (columns_p >= prompt_length - prompt_lengths[:, None]).long()
    response_mask = (columns_r < response_lengths[:, None]).long()
    prompts = prompts * prompt_mask
    responses = responses * response_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    position_ids = (torch.cumsum(attention_mask, dim=1) - 1).clamp_min(0)
    advantages = torch.randn(num_samples, 1, generator=generator) * response_mask
    return DataProto.from_dict(
        {
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "response_mask": response_mask,
            "advantages": advantages,
        }
    )


def actor_rollout_ref_config(model_dir, **overrides) -> dict:
    """The ``actor_rollout_ref`` section for the tiny model; ``overrides`` are nested dicts merged on top.

    Defaults: one mini-batch of 8 samples in micro-batches of 4, lr 1e-3, float32, 5-token responses. Unless
    ``overrides`` set it, the old-log-prob pass takes the update's micro-batching (ppo_trainer.yaml's
    interpolations do so for the token budget), so its log-probs equal the update's own bit for bit.
    """
    base = {
        "model": {"path": str(model_dir)},
        "actor": {
            "ppo_mini_batch_size": 8,
            "ppo_micro_batch_size_per_gpu": 4,
            "grad_clip": 1.0,
            "optim": {"lr": 1e-3, "weight_decay": 0.0},
        },
        "ref": {"log_prob_micro_batch_size_per_gpu": 4},
        "rollout": {"prompt_length": 6, "response_length": 5, "max_num_seqs": 16, "seed": 0},
    }
    config = OmegaConf.to_container(OmegaConf.merge(base, overrides))
    actor, rollout = config["actor"], config["rollout"]
    if "log_prob_micro_batch_size" not in rollout:  # verl's global form stands alone
        rollout.setdefault("log_prob_micro_batch_size_per_gpu", actor["ppo_micro_batch_size_per_gpu"])
    rollout.setdefault("log_prob_use_dynamic_bsz", actor.get("use_dynamic_bsz", False))
    rollout.setdefault("log_prob_max_token_len_per_gpu", actor.get("ppo_max_token_len_per_gpu", 16384))
    return config


def critic_config(model_dir, **overrides) -> dict:
    base = {
        "model": {"path": str(model_dir)},
        "ppo_mini_batch_size": 8,
        "ppo_micro_batch_size_per_gpu": 4,
        "forward_micro_batch_size_per_gpu": 4,
        "optim": {"lr": 1e-3, "weight_decay": 0.0},
    }
    return OmegaConf.to_container(OmegaConf.merge(base, overrides))


def full_parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter gathered in full (CPU copies), by name."""
    from hybridflow.workers.fsdp import iter_full_parameters

    return {name: tensor.clone() for name, tensor in iter_full_parameters(module)}
