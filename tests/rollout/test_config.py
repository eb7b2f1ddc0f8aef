import dataclasses

import pytest

from hybridflow.rollout.config import RolloutConfig, RolloutConfigError
from hybridflow.rollout.vllm_engine import engine_arguments


def test_from_dict_builds_nested_sections():
    config = RolloutConfig.from_dict(
        {
            "n": 4,
            "stop": ("\n\n",),
            "val_kwargs": {"n": 2, "do_sample": True},
            "multi_turn": {"enable": True, "max_assistant_turns": 3},
        }
    )
    assert config.n == 4 and config.stop == ["\n\n"]
    assert config.val_kwargs.n == 2 and config.val_kwargs.do_sample is True
    assert config.multi_turn.enable and config.multi_turn.max_assistant_turns == 3
    assert config.multi_turn.format == "hermes"


def test_unknown_keys_are_named_with_their_full_path():
    with pytest.raises(RolloutConfigError, match=r"actor_rollout_ref\.rollout\.multi_turn\.max_turns"):
        RolloutConfig.from_dict({"multi_turn": {"max_turns": 3}})


def test_validate_reports_every_problem_at_once():
    config = RolloutConfig.from_dict({"n": 0, "top_p": 1.5, "dtype": "int8", "val_kwargs": {"temperature": -1.0}})
    with pytest.raises(RolloutConfigError) as raised:
        config.validate()
    message = str(raised.value)
    for key in ("rollout.n=0", "rollout.top_p=1.5", "rollout.dtype='int8'", "val_kwargs.temperature=-1.0"):
        assert key in message


def test_sampling_uses_val_kwargs_for_validation():
    config = RolloutConfig.from_dict({"temperature": 0.7, "top_k": 5, "response_length": 9, "stop": ["x"]})
    train = config.sampling()
    val = config.sampling(validate=True)
    assert (train.temperature, train.top_k, train.max_new_tokens, train.greedy) == (0.7, 5, 9, False)
    assert val.greedy and val.top_k == -1 and val.stop == ["x"]


def test_every_field_has_help():
    from hybridflow.rollout.config import MultiTurnConfig, SamplingParams, ValKwargs

    for cls in (RolloutConfig, SamplingParams, ValKwargs, MultiTurnConfig):
        for field in dataclasses.fields(cls):
            assert field.metadata.get("help"), f"{cls.__name__}.{field.name} has no help string"


def test_an_omegaconf_section_is_accepted_as_is():
    from omegaconf import OmegaConf

    section = OmegaConf.create({"n": 2, "stop": ["\n"], "val_kwargs": {"n": 3}})
    config = RolloutConfig.from_dict(section)
    assert (config.n, config.stop, config.val_kwargs.n) == (2, ["\n"], 3) and type(config.stop) is list


def test_vllm_engine_arguments_carry_verls_rollout_keys_and_engine_kwargs():
    config = RolloutConfig.from_dict(
        {
            "name": "vllm",
            "prompt_length": 64,
            "response_length": 32,
            "enforce_eager": True,
            "max_num_batched_tokens": 4096,
            "cudagraph_capture_sizes": [1, 2],
            "load_format": "auto",
            "engine_kwargs": {"vllm": {"swap_space": 4, "enforce_eager": False}},
        }
    )
    arguments = engine_arguments(config)
    assert arguments["max_model_len"] == 96 and arguments["max_num_batched_tokens"] == 4096
    assert arguments["compilation_config"] == {"cudagraph_capture_sizes": [1, 2]}
    assert arguments["load_format"] == "auto" and arguments["swap_space"] == 4
    assert arguments["enforce_eager"] is False, "engine_kwargs.vllm has the last word"
    assert "load_format" not in engine_arguments(RolloutConfig.from_dict({"name": "vllm"}))
