from dataclasses import fields

import pytest
from omegaconf import OmegaConf

from hybridflow.algos.policy_loss_config import (
    PolicyLossConfig,
    PolicyLossConfigError,
    clip_bounds,
    loss_option,
    policy_loss_config_errors,
)


def test_defaults_equal_verl():
    config = PolicyLossConfig()
    assert (config.loss_mode, config.clip_ratio, config.clip_ratio_low, config.clip_ratio_high) == (
        "vanilla", 0.2, 0.2, 0.2,
    )
    assert (config.clip_ratio_c, config.loss_agg_mode, config.tau_pos, config.tau_neg) == (3.0, "token-mean", 1.0, 1.05)
    assert (config.clip_cov_ratio, config.clip_cov_lb, config.clip_cov_ub) == (0.0002, 1.0, 5.0)
    assert (config.kl_cov_ratio, config.ppo_kl_coef) == (0.0002, 0.1)


def test_every_field_has_help():
    assert all(f.metadata.get("help") for f in fields(PolicyLossConfig))


def test_all_errors_are_collected_into_one_exception():
    with pytest.raises(PolicyLossConfigError) as error:
        PolicyLossConfig(clip_ratio_c=0.5, tau_neg=0.0, loss_agg_mode="mean")
    message = str(error.value)
    assert "clip_ratio_c=0.5 must be > 1" in message
    assert "tau_neg=0.0 must be > 0" in message
    assert "loss_agg_mode='mean' must be one of [" in message


def test_options_from_dataclass_dict_and_dictconfig_alike():
    verl_actor = OmegaConf.create(
        {"clip_ratio": 0.3, "clip_ratio_low": None, "clip_ratio_high": 0.28, "policy_loss": {"kl_cov_ratio": 0.01}}
    )
    assert clip_bounds(verl_actor) == (0.3, 0.28)
    assert loss_option(verl_actor, "kl_cov_ratio") == 0.01
    assert loss_option({"tau_pos": 2.0}, "tau_pos") == 2.0
    assert loss_option(None, "clip_ratio_c") == 3.0
    assert clip_bounds(PolicyLossConfig(clip_ratio_high=0.28)) == (0.2, 0.28)
    assert policy_loss_config_errors(verl_actor) == []


def test_works_as_an_omegaconf_structured_schema():
    schema = OmegaConf.structured(PolicyLossConfig)
    merged = OmegaConf.merge(schema, {"clip_ratio_high": 0.28, "loss_agg_mode": "seq-mean-token-mean"})
    assert clip_bounds(merged) == (0.2, 0.28)
    assert loss_option(merged, "loss_agg_mode") == "seq-mean-token-mean"
