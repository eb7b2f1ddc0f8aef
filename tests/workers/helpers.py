"""Helpers of the worker tests: synthetic rollout batches, configs for the tiny model, full weights, and
comparisons of two updates that differ only in the order of float32 sums (bounds from ``float_bounds``)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from hybridflow.protocol import DataProto
from tests.float_bounds import F32_EPS, model_output_bound, reordered_sum_bound


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


def gradient_bound(log_prob_bound: float, num_terms: int) -> float:
    """Relative bound between two runs' policy gradients, a sum over tokens of ``(A ratio / N) grad log pi``:
    the ratio ``e^(log pi - log pi_old)`` carries the log-probs' absolute bound as a relative error, and the
    backward pass runs the forward's sums (at most ``num_terms`` terms) transposed."""
    return log_prob_bound + reordered_sum_bound(1.0, num_terms)


def assert_same_update_metrics(
    metrics: dict,
    expected: dict,
    batch: DataProto,
    log_prob_bound: float,
    num_terms: int,
    mini_batch_rows: int,
    keys=("pg_loss", "ppo_kl", "kl_loss", "entropy", "pg_clipfrac", "grad_norm"),
    clip_ratio: float = 0.2,
) -> None:
    """The actor's update metrics of two runs on ``batch`` (mini-batches of ``mini_batch_rows``) agree within
    what ``log_prob_bound``, the most their log-probs may differ, allows."""
    mask = batch.batch["response_mask"]
    # -A * ratio per token, ratio = e^(log pi - log pi_old) < 1 + clip_ratio where it is not clipped (a clipped
    # token's loss is constant): d ratio / ratio = d log pi; then a mean over the tokens in another order.
    term = float(batch.batch["advantages"].abs().max()) * (1 + clip_ratio)
    tolerances = {
        "pg_loss": lambda: {"abs": term * log_prob_bound + reordered_sum_bound(term, int(mask.sum()))},
        # A mean of log pi_old - log pi with the same pi_old in both runs: each term within the log-prob bound.
        # It is a difference of nearly equal numbers (~1e-2 from log-probs ~6), so only an absolute bound fits.
        "ppo_kl": lambda: {"abs": log_prob_bound},
        # k3 = e^(ref - lp) - (ref - lp) - 1 moves by |1 - e^(ref - lp)| <= 1 per unit of lp while pi >= pi_ref / 2.
        "kl_loss": lambda: {"abs": log_prob_bound},
        "entropy": lambda: {"abs": model_output_bound(batch.batch["entropys"], num_terms)},
        # A share of tokens past a clip bound: rounding can move only a token sitting on the bound.
        "pg_clipfrac": lambda: {"abs": 1 / min(float(rows.sum()) for rows in mask.split(mini_batch_rows))},
        "grad_norm": lambda: {"rel": gradient_bound(log_prob_bound, num_terms)},
    }
    for key in keys:
        tolerance = tolerances[key]()
        assert metrics[key] == pytest.approx(expected[key], rel=tolerance.get("rel", 0), abs=tolerance.get("abs", 0)), (
            key
        )


def assert_same_adamw_steps(
    weights: dict[str, torch.Tensor],
    expected: dict[str, torch.Tensor],
    steps: int,
    lr: float,
    gradient_rel_bound: float,
) -> None:
    """Weights after ``steps`` AdamW steps of two runs whose gradients agree to ``gradient_rel_bound``.

    AdamW moves an entry by ``lr * m / (sqrt(v) + 1e-8)``, a ratio of gradient sums, blind to the gradient's
    size: where ``|g|`` is well above its rounding error the runs' steps differ by at most about
    ``2 * gradient_rel_bound * lr`` and the weights by that plus the rounding of ``w - step`` (2 ulps of
    ``max|w|``) per step. Only entries whose gradient cancels to within rounding of 0 can swing further (up to
    ``lr`` a step); for gradients spread smoothly around 0 their share is of the order of
    ``gradient_rel_bound`` (~2e-4 for the tiny model), so at most 1e-3 of the entries may exceed the bound.
    """
    assert weights.keys() == expected.keys()
    beyond = total = 0
    for name, tensor in expected.items():
        bound = steps * (2 * F32_EPS * float(tensor.abs().max()) + 2 * gradient_rel_bound * lr)
        beyond += int(((weights[name] - tensor).abs() > bound).sum())
        total += tensor.numel()
    assert beyond / total < 1e-3, f"{beyond} of {total} entries differ by more than rounding"
