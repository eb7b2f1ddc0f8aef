"""CriticWorker in this process on a 1-rank group: values, clipped value-loss update, checkpoints."""

from __future__ import annotations

import math

import pytest
import torch

from hybridflow.workers import CriticWorker

from .helpers import critic_config, full_parameters, rollout_batch

pytestmark = pytest.mark.usefixtures("process_group")

CRITIC_METRICS = {"vf_loss", "vf_clipfrac", "vpred_mean", "grad_norm", "lr"}


def make_critic(model_dir, **overrides) -> CriticWorker:
    worker = CriticWorker(critic_config(model_dir, **overrides))
    worker.init_model()
    return worker


def test_values_are_per_response_token_and_zero_on_padding(tiny_model_dir):
    critic = make_critic(tiny_model_dir)
    batch = rollout_batch(6, seed=4)
    values = critic.compute_values(batch).batch["values"]
    assert values.shape == batch.batch["responses"].shape
    padding = batch.batch["response_mask"] == 0
    assert torch.all(values[padding] == 0) and torch.any(values[~padding] != 0)


def test_critic_update_reduces_the_value_loss_on_a_fixed_batch(tiny_model_dir):
    critic = make_critic(tiny_model_dir, ppo_epochs=2, cliprange_value=10.0)
    batch = rollout_batch(8, seed=5)
    batch = batch.union(critic.compute_values(batch))
    batch.batch["returns"] = torch.full_like(batch.batch["values"], 0.5) * batch.batch["response_mask"]
    losses = []
    for _ in range(5):
        metrics = critic.update_critic(batch).meta_info["metrics"]
        losses.append(metrics["vf_loss"][0])
    assert CRITIC_METRICS <= set(metrics)
    assert len(metrics["vf_loss"]) == 2
    assert all(math.isfinite(value) for key in CRITIC_METRICS - {"lr"} for value in metrics[key])
    assert losses[-1] < 0.5 * losses[0]
    assert metrics["vpred_mean"][-1] == pytest.approx(0.5, abs=0.3)


def test_value_clipping_is_reported(tiny_model_dir):
    critic = make_critic(tiny_model_dir, cliprange_value=1e-4)
    batch = rollout_batch(8, seed=6)
    batch = batch.union(critic.compute_values(batch))
    batch.batch["returns"] = torch.ones_like(batch.batch["values"])
    critic.update_critic(batch)
    metrics = critic.update_critic(batch).meta_info["metrics"]
    assert metrics["vf_clipfrac"][0] > 0.5


def test_loss_scale_factor_reaches_the_value_loss(tiny_model_dir):
    """seq-mean-token-sum-norm divides by critic.loss_scale_factor: doubling it halves the first step's loss."""
    losses = {}
    for factor in (3.0, 6.0):
        torch.manual_seed(0)  # the same fresh value head for both critics
        critic = make_critic(tiny_model_dir, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=factor)
        batch = rollout_batch(8, seed=8)
        batch = batch.union(critic.compute_values(batch))
        batch.batch["returns"] = torch.ones_like(batch.batch["values"])
        losses[factor] = critic.update_critic(batch).meta_info["metrics"]["vf_loss"][0]
    # Same weights and batch: only the divisor differs (float32 division by 2 is exact).
    assert losses[6.0] == losses[3.0] / 2


def test_critic_checkpoint_round_trip(tiny_model_dir, tmp_path):
    critic = make_critic(tiny_model_dir)
    batch = rollout_batch(8, seed=7)
    batch = batch.union(critic.compute_values(batch))
    batch.batch["returns"] = torch.zeros_like(batch.batch["values"])
    critic.update_critic(batch)
    critic.save_checkpoint(str(tmp_path / "critic"), global_step=1)
    expected = critic.update_critic(batch).meta_info["metrics"]
    weights = full_parameters(critic.critic.module)

    resumed = make_critic(tiny_model_dir)
    resumed.load_checkpoint(str(tmp_path / "critic"))
    assert resumed.update_critic(batch).meta_info["metrics"] == expected
    for name, tensor in full_parameters(resumed.critic.module).items():
        assert torch.equal(tensor, weights[name]), name


def test_override_config_reaches_the_value_model(tiny_model_dir):
    # verl's critic.model.override_config: set on the model's config before its weights are built.
    critic = make_critic(tiny_model_dir, model={"override_config": {"attention_dropout": 0.25}})
    assert critic.critic.module.config.attention_dropout == 0.25
    assert make_critic(tiny_model_dir).critic.module.config.attention_dropout == 0.0
