"""Worker config sections: built from dicts or DictConfigs, unknown keys rejected, help on every field."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from hybridflow.algos import PolicyLossConfig, PolicyLossModeConfig
from hybridflow.workers import config as worker_config
from hybridflow.workers.config import ActorConfig, ActorRolloutRefConfig, CriticConfig, WorkerConfigError, as_config


def test_a_nested_dict_config_becomes_typed_sections():
    section = OmegaConf.create(
        {
            "model": {"path": "/m", "lora_rank": 8, "target_modules": ["q_proj", "v_proj"]},
            "actor": {"optim": {"lr": 3e-6, "warmup_style": "cosine"}, "policy_loss": {"loss_mode": "gspo"}},
            "rollout": {"n": 4},
        }
    )
    config = as_config(ActorRolloutRefConfig, section)
    assert config.model.lora_rank == 8 and config.model.target_modules == ["q_proj", "v_proj"]
    assert config.actor.optim.lr == 3e-6 and config.actor.policy_loss.loss_mode == "gspo"
    assert config.rollout.n == 4 and config.actor.fsdp_config.mixed_precision.param_dtype == "float32"
    assert config.model.tokenizer_dir == "/m"
    assert as_config(ActorRolloutRefConfig, config) is config


def test_an_unknown_key_is_rejected_with_its_full_name():
    with pytest.raises(WorkerConfigError, match="actor.optim.learning_rate"):
        as_config(ActorRolloutRefConfig, {"actor": {"optim": {"learning_rate": 1e-6}}})


def test_critic_keeps_fsdp_options_under_model_as_verl_does():
    config = as_config(CriticConfig, {"model": {"path": "/c", "fsdp_config": {"param_offload": True}}, "rollout_n": 2})
    assert config.model.fsdp_config.param_offload and config.rollout_n == 2


def test_every_field_has_help():
    classes = [obj for obj in vars(worker_config).values() if dataclasses.is_dataclass(obj)]
    classes = [cls for cls in classes if cls.__module__ == worker_config.__name__]
    missing = [
        f"{cls.__name__}.{f.name}" for cls in classes for f in dataclasses.fields(cls) if not f.metadata.get("help")
    ]
    assert not missing


def test_a_global_micro_batch_size_is_shared_out_over_the_ranks_as_verl_did():
    key = "actor_rollout_ref.actor.ppo_micro_batch_size"
    assert worker_config.micro_batch_size_per_rank(None, 16, 4, key) == 4
    assert worker_config.micro_batch_size_per_rank(None, 10, 4, key) == 2  # 10 // 4, floored
    assert worker_config.micro_batch_size_per_rank(3, None, 4, key) == 3
    assert worker_config.micro_batch_size_per_rank(None, None, 4, key) is None  # the rank's whole batch
    with pytest.raises(WorkerConfigError, match=rf"both {key}=8 and {key}_per_gpu=2 are set; remove {key}"):
        worker_config.micro_batch_size_per_rank(2, 8, 4, key)
    with pytest.raises(WorkerConfigError, match=rf"{key}=3 gives each of the 4 ranks less than one sample"):
        worker_config.micro_batch_size_per_rank(None, 3, 4, key)


def test_policy_loss_config_takes_the_clip_settings_from_the_actor():
    both = ActorConfig(clip_ratio=0.3).policy_loss_config()
    assert (both.clip_ratio_low, both.clip_ratio_high) == (0.3, 0.3)
    upper = ActorConfig(clip_ratio_high=0.28).policy_loss_config()
    assert (upper.clip_ratio_low, upper.clip_ratio_high) == (0.2, 0.28)
    sapo = PolicyLossModeConfig(loss_mode="sapo", tau_neg=2.0)
    config = ActorConfig(clip_ratio_c=5.0, loss_agg_mode="seq-mean-token-mean", policy_loss=sapo).policy_loss_config()
    assert isinstance(config, PolicyLossConfig)
    assert (config.loss_mode, config.tau_neg, config.tau_pos) == ("sapo", 2.0, 1.0)
    assert (config.clip_ratio_c, config.loss_agg_mode) == (5.0, "seq-mean-token-mean")
